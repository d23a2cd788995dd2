// The exchanges an automatic choice weighs, by name, and the network seconds each takes on one bucket.
//
//   name                      exchange per bucket (b = the bucket's values, n ranks)
//   dense                     ring all-reduce of b floats (comm::metered's ring)
//   fp16, bf16                the same ring of 2-byte values (PyTorch's fp16 and bf16 hooks)
//   powersgd-r<k>             PyTorch's PowerSGD: the 1-D values and the matrices that would not shrink
//                             ((rows + cols) k >= rows cols) in one ring, then every P (rows x k), then every
//                             Q (cols x k): three rounds one after the other, each skipped when empty
//   topk-<density>            k = ceil(density b) pairs per rank through the all-gather exchange with its
//                             header, or its dense fallback where that moves fewer bytes (cost/sparse.hpp)
//   sparse-allreduce-<d>      the sparse all-reduce with K = k, averaged over a refresh period of 8 steps,
//                             or its dense fallback where the exchange would take it
//   qsgd<s>                   the all-gather of compress::qsgd (one norm for the bucket) with its header
//   localsgd-h<H>             a dense ring every H steps, charged as a share of 1/H every step
//
// Every ring is charged at its slowest rank (chunks differ by one element), since the step waits for it.
// Latency 0 and bandwidth +inf are allowed: they model a free network, on which dense always wins.
#pragma once

#include <commsgd/comm/simulated.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/cost/sparse.hpp>
#include <commsgd/cost/sparse_allreduce.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace commsgd::inline v1::cost {

enum class candidate_kind { dense, fp16, bf16, powersgd, topk, sparse_allreduce, qsgd, localsgd };

struct candidate {
  candidate_kind kind = candidate_kind::dense;
  std::string name;        // as given
  std::uint64_t count = 0; // powersgd: k; qsgd: levels; localsgd: H
  double density = 0;      // topk, sparse-allreduce: in (0, 1]
};

// The sparse all-reduce refreshes its threshold every this many steps when the choice plans for it.
inline constexpr std::uint64_t candidate_refresh_steps = 8;

inline constexpr const char* candidate_forms =
    "dense, fp16, bf16, powersgd-r<k>, topk-<density>, sparse-allreduce-<density>, qsgd<levels>, "
    "localsgd-h<H> (k, levels, H whole numbers >= 1; density in (0, 1])";

namespace detail {

inline invalid_argument unknown_candidate(std::string_view name, std::string_view why = {}) {
  return invalid_argument(commsgd::concat("argument 'candidate' = '", name, "' is not a known exchange", why,
                                          "; the allowed forms are ", candidate_forms));
}

inline std::uint64_t parse_count(std::string_view name, std::string_view digits) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc{} || end != digits.data() + digits.size() || v < 1)
    throw unknown_candidate(name, " (the number must be a whole number >= 1)");
  return v;
}

inline double parse_density(std::string_view name, std::string_view digits) {
  double v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc{} || end != digits.data() + digits.size() || !(v > 0 && v <= 1))
    throw unknown_candidate(name, " (the density must lie in (0, 1])");
  return v;
}

} // namespace detail

inline candidate parse_candidate(std::string_view name) {
  candidate c;
  c.name = std::string(name);
  const auto after = [&](std::string_view prefix) -> std::pair<bool, std::string_view> {
    if (name.size() > prefix.size() && name.starts_with(prefix)) return {true, name.substr(prefix.size())};
    return {false, {}};
  };
  if (name == "dense") return c;
  if (name == "fp16" || name == "bf16") {
    c.kind = name == "fp16" ? candidate_kind::fp16 : candidate_kind::bf16;
    return c;
  }
  if (auto [ok, rest] = after("powersgd-r"); ok) {
    c.kind = candidate_kind::powersgd;
    c.count = detail::parse_count(name, rest);
  } else if (auto [ok2, rest2] = after("topk-"); ok2) {
    c.kind = candidate_kind::topk;
    c.density = detail::parse_density(name, rest2);
  } else if (auto [ok3, rest3] = after("sparse-allreduce-"); ok3) {
    c.kind = candidate_kind::sparse_allreduce;
    c.density = detail::parse_density(name, rest3);
  } else if (auto [ok4, rest4] = after("qsgd"); ok4) {
    c.kind = candidate_kind::qsgd;
    c.count = detail::parse_count(name, rest4);
    if (c.count > 65535) throw detail::unknown_candidate(name, " (qsgd takes at most 65535 levels)");
  } else if (auto [ok5, rest5] = after("localsgd-h"); ok5) {
    c.kind = candidate_kind::localsgd;
    c.count = detail::parse_count(name, rest5);
  } else {
    throw detail::unknown_candidate(name);
  }
  return c;
}

// One DDP bucket: its values, and the 2-D views (rows x cols) of its parameters with more than one
// dimension; the values outside them are 1-D (biases, norms' scales).
struct bucket_shape {
  std::uint64_t values = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> matrices;
};

// The checks every cost entry point makes of its inputs, public so that the exchange choice (sync/choose_*.hpp)
// refuses the same inputs with the same words.
inline void check_network(const comm::network_model& net) {
  if (!(std::isfinite(net.latency_s) && net.latency_s >= 0))
    throw invalid_argument(
        commsgd::concat("argument 'latency_s' = ", net.latency_s, " is outside the allowed range [0, inf)"));
  if (!(net.bandwidth_bytes_per_s > 0)) // +inf passes: a free network
    throw invalid_argument(commsgd::concat("argument 'bandwidth_bytes_per_s' = ", net.bandwidth_bytes_per_s,
                                           " is outside the allowed range (0, inf]"));
}

inline void check_ranks(int n) {
  if (n < 1)
    throw invalid_argument(commsgd::concat("argument 'n' = ", n, " is outside the allowed range [1, inf)"));
}

inline void check_shape(const bucket_shape& s) {
  if (s.values < 1) throw invalid_argument("argument 'values' = 0 is outside the allowed range [1, inf)");
  std::uint64_t in_matrices = 0;
  for (std::size_t m = 0; m < s.matrices.size(); ++m) {
    const auto [rows, cols] = s.matrices[m];
    if (rows < 1 || cols < 1 || rows > s.values / cols || rows * cols > s.values - in_matrices)
      throw size_mismatch(commsgd::concat("argument 'matrices': matrix ", m, " (", rows, " x ", cols,
                                          ") is empty or does not fit in the bucket's ", s.values,
                                          " values beside the matrices before it"));
    in_matrices += rows * cols;
  }
}

namespace detail {

// A ring all-reduce of d values of `size` bytes, at its slowest rank; an empty buffer is not sent.
inline double ring_seconds(std::uint64_t d, std::size_t size, int n, const comm::network_model& net) {
  if (d == 0) return 0;
  double worst = 0;
  for (int r = 0; r < n; ++r)
    worst = std::max(worst, comm::busy_seconds(comm::load::all_reduce(d, size, n, r), net));
  return worst;
}

inline double powersgd_seconds(std::uint64_t k, const bucket_shape& s, int n,
                               const comm::network_model& net) {
  std::uint64_t dense = s.values, p = 0, q = 0;
  for (const auto& [rows, cols] : s.matrices) {
    // Compressed when the factors are smaller than the matrix (PyTorch's rule at min_compression_rate 1).
    // When k exceeds min(rows, cols) this cannot hold, so clamping k as PyTorch does changes nothing.
    const double compressed = static_cast<double>(rows + cols) * static_cast<double>(k);
    if (compressed < static_cast<double>(rows) * static_cast<double>(cols)) {
      dense -= rows * cols;
      p += rows * k;
      q += cols * k;
    }
  }
  return ring_seconds(dense, 4, n, net) + ring_seconds(p, 4, n, net) + ring_seconds(q, 4, n, net);
}

inline std::uint64_t pairs_per_rank(double density, std::uint64_t values) {
  const auto k = static_cast<std::uint64_t>(std::ceil(density * static_cast<double>(values)));
  return std::clamp<std::uint64_t>(k, 1, values);
}

inline double topk_seconds(double density, const bucket_shape& s, int n, const comm::network_model& net) {
  const std::uint64_t k = pairs_per_rank(density, s.values);
  const std::vector<std::uint64_t> counts(static_cast<std::size_t>(n), k);
  const bool dense = sparse_prefers_dense(counts, s.values);
  double worst = 0;
  for (int r = 0; r < n; ++r)
    worst = std::max(worst, comm::busy_seconds(sparse_gather_balanced_load(n, s.values, k, dense, r), net));
  return worst;
}

inline double sparse_allreduce_seconds(double density, const bucket_shape& s, int n,
                                       const comm::network_model& net) {
  if (n <= 1) return 0;
  const std::uint64_t k = pairs_per_rank(density, s.values);
  const std::vector<std::uint64_t> counts(static_cast<std::size_t>(n), k);
  if (sparse_allreduce_prefers_dense(counts, s.values, k)) {
    double worst = 0;
    for (int r = 0; r < n; ++r) {
      auto l = allreduce_header_load(n);
      l += comm::load::all_reduce(s.values, sizeof(float), n, r);
      worst = std::max(worst, comm::busy_seconds(l, net));
    }
    return worst;
  }
  return sparse_allreduce_balanced_seconds(n, s.values, k, k, candidate_refresh_steps, net);
}

inline double qsgd_seconds(std::uint64_t levels, const bucket_shape& s, int n,
                           const comm::network_model& net) {
  auto l = comm::load::all_gather(compress_header_bytes, n, net.medium);
  l += comm::load::all_gather(qsgd_message_bytes(s.values, 1, levels), n, net.medium);
  return comm::busy_seconds(l, net);
}

} // namespace detail

// Network seconds of one bucket's exchange over n ranks.
inline double exchange_seconds(const candidate& c, const bucket_shape& s, int n,
                               const comm::network_model& net) {
  check_ranks(n);
  check_network(net);
  check_shape(s);
  switch (c.kind) {
  case candidate_kind::dense:
    return detail::ring_seconds(s.values, 4, n, net);
  case candidate_kind::fp16:
  case candidate_kind::bf16:
    return detail::ring_seconds(s.values, 2, n, net);
  case candidate_kind::powersgd:
    return detail::powersgd_seconds(c.count, s, n, net);
  case candidate_kind::topk:
    return detail::topk_seconds(c.density, s, n, net);
  case candidate_kind::sparse_allreduce:
    return detail::sparse_allreduce_seconds(c.density, s, n, net);
  case candidate_kind::qsgd:
    return detail::qsgd_seconds(c.count, s, n, net);
  case candidate_kind::localsgd:
    return detail::ring_seconds(s.values, 4, n, net) / static_cast<double>(c.count);
  }
  throw internal_error("exchange_seconds: a candidate kind without a model");
}

inline double exchange_seconds(std::string_view name, const bucket_shape& s, int n,
                               const comm::network_model& net) {
  return exchange_seconds(parse_candidate(name), s, n, net);
}

} // namespace commsgd::inline v1::cost
