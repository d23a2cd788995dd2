// compress::random_k: k values at positions drawn from (seed, step), the same on every rank, so indices
// never travel: the k values are summed by one all_reduce_sum.
//
// Positions: Floyd's algorithm (k draws, each uniform by rejection, from the counter stream of
// compress/random.hpp keyed by (seed, step)) picks a uniformly random k-subset of [0, d), sent in rising
// order. Every rank computes the same subset from its own step counter, which all ranks advance together.
// With error feedback (the default) the values not sent stay in the residual, exactly; without it they are
// dropped and the message is a biased estimate (no d/k rescaling), which is rarely what a trainer wants.
//
// Bad arguments: k (or density) is checked when the compressor is built, from values every rank is given
// alike; sizes and non-finite values of p = g + e go through the collective verdict (compress/agree.hpp).
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/compressed_reducer.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/random.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <optional>
#include <ostream>
#include <span>
#include <vector>

namespace commsgd::inline v1::compress {

struct random_k_options {
  double density = 0.01;        // in (0, 1]; k = ceil(density * length)
  std::optional<std::size_t> k; // a fixed count instead, in [1, length] (0 only when length is 0)
  std::uint64_t seed = 0;       // the same on every rank
  bool error_feedback = true;
};

// The positions random_k sends at `step`: k distinct indices of [0, d), rising. `marks` is scratch.
inline void random_k_indices(std::uint64_t seed, std::uint64_t step, std::size_t d, std::size_t k,
                             std::vector<std::size_t>& out, std::vector<std::uint64_t>& marks) {
  marks.assign((d + 63) / 64, 0);
  auto marked = [&](std::size_t i) { return (marks[i / 64] >> (i % 64)) & 1u; };
  auto mark = [&](std::size_t i) { marks[i / 64] |= std::uint64_t{1} << (i % 64); };
  detail::counter_stream rng(detail::stream_key(seed, step, 0));
  for (std::size_t j = d - k; j < d; ++j) {
    const auto t = static_cast<std::size_t>(rng.below(j + 1));
    mark(marked(t) ? j : t);
  }
  out.clear();
  for (std::size_t w = 0; w < marks.size(); ++w)
    for (std::uint64_t bits = marks[w]; bits != 0; bits &= bits - 1)
      out.push_back(w * 64 + static_cast<std::size_t>(std::countr_zero(bits)));
}

class random_k : public detail::round_state {
public:
  static constexpr const char* name = "random_k";

  explicit random_k(std::size_t length, random_k_options o = {})
      : round_state(length, o.error_feedback), opt_(o), k_(count(length, o)) {}

  std::size_t k() const noexcept { return k_; }
  const random_k_options& options() const noexcept { return opt_; }
  // The positions of the last round (the same on every rank).
  std::span<const std::size_t> indices() const noexcept { return idx_; }

  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    const auto v = detail::take_input(g, out.size(), length_, ef_, p_);
    detail::agree(c, "compress::random_k", length_, config(), v, verdicts_);
    random_k_indices(opt_.seed, steps_, length_, k_, idx_, marks_);
    vals_.resize(k_);
    for (std::size_t j = 0; j < k_; ++j)
      vals_[j] = p_[idx_[j]];
    c.all_reduce_sum(std::span<float>(vals_));
    std::fill(out.begin(), out.end(), 0.0f);
    std::fill(d_.begin(), d_.end(), 0.0f);
    for (std::size_t j = 0; j < k_; ++j) {
      out[idx_[j]] = vals_[j];
      d_[idx_[j]] = p_[idx_[j]];
    }
    wire_ = cost::random_k_traffic(k_, c.size(), c.rank()).bytes_sent;
    return detail::finish_round(ef_, p_, d_, steps_, static_cast<std::size_t>(c.size()), k_, true);
  }

  void save(std::ostream& os) const { detail::save_state(os, name_in_state, params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "k", "seed"};
    detail::load_state(is, name_in_state, params(), names, length_, steps_, ef_);
  }

private:
  static constexpr const char* name_in_state = "compress::random_k";

  static std::size_t count(std::size_t length, const random_k_options& o) {
    if (o.k) {
      if (length == 0)
        commsgd::check_range("k", *o.k, 0, 0, "[0, 0] (the length is 0)");
      else
        commsgd::check_range("k", *o.k, 1, length, commsgd::concat("[1, length = ", length, "]"));
      return *o.k;
    }
    commsgd::check_range("density", o.density, std::nextafter(0.0, 1.0), 1.0, "(0, 1]");
    return std::min(length, static_cast<std::size_t>(std::ceil(o.density * static_cast<double>(length))));
  }
  std::array<std::uint64_t, 3> params() const noexcept { return {length_, k_, opt_.seed}; }
  std::uint64_t config() const noexcept {
    const std::array<std::uint64_t, 4> p{length_, k_, opt_.seed, ef_.on() ? 1u : 0u};
    return detail::fingerprint(p);
  }

  random_k_options opt_;
  std::size_t k_;
  std::vector<float> vals_;
  std::vector<std::size_t> idx_;
  std::vector<std::uint64_t> marks_;
};

static_assert(compressor<random_k, comm::archetype>);

} // namespace commsgd::inline v1::compress
