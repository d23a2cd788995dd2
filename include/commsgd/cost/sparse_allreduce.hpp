// Per-node messages, bytes and seconds of the sparse all-reduce (sparsify/allreduce.hpp), under the
// accounting of comm::metered and comm::simulated, and the rule that picks its dense fallback.
//
// One exchange over n ranks, seen from rank i, with entry_bytes per (index, value) pair (8 with 32-bit
// indices); s[i][j] is the number of pairs rank i holds in region j and g[j] the pairs owner j selects:
//   header      point-to-point, one allreduce_header_bytes message to each of the n-1 peers, each way
//   then the dense fallback: a ring all-reduce of d floats (metered's ring), or the sparse path:
//   scatter     point-to-point: entry_bytes s[i][j] to every owner j != i with s[i][j] > 0, and
//               entry_bytes s[j][i] from every rank j != i with s[j][i] > 0 (empty messages are not sent)
//   histogram   on a step that refreshes the threshold: ring all-reduce of allreduce_histogram_bins uint32
//   gather      all_gather_v of the selected pairs: sends (n-1)(entry_bytes g[i] + 8),
//               receives entry_bytes (sum of g[j], j != i) + (n-1) 8
// The exchange reports s[i][.], s[.][i] and g, so its metered bytes and its simulated clock equal these
// functions exactly. For planning, the balanced form spreads each rank's k pairs and the K selected ones
// evenly over the regions (the same chunks as the ring all-reduce), which is what balanced region boundaries
// aim at: each node then receives about k + K pairs, whatever n is, against (n-1) k for the all-gather
// exchange (cost/sparse.hpp).
#pragma once

#include <commsgd/comm/simulated.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/sparse.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace commsgd::inline v1::cost {

// Header fields each rank sends each peer: its pair count, the vector length, a problem code and its
// position (as sparsify/sparse_exchange.hpp), the pairs it holds in the peer's region, the global k, and how many
// sparse exchanges it has run (region boundaries and the threshold derive from that history).
inline constexpr std::uint64_t allreduce_header_fields = 7;
inline constexpr std::uint64_t allreduce_header_bytes = allreduce_header_fields * 8;
// The threshold histogram bins magnitudes by the top 11 bits of their ordered key (8 exponent bits and 3
// mantissa bits): 1/8 of an octave per bin.
inline constexpr unsigned allreduce_histogram_shift = 20;
inline constexpr std::uint64_t allreduce_histogram_bins = std::uint64_t{1}
                                                          << (31 - allreduce_histogram_shift);

// Point-to-point loads of the per-peer header round.
inline comm::traffic allreduce_header_load(int n) noexcept {
  const auto peers = static_cast<std::uint64_t>(n > 1 ? n - 1 : 0);
  return {peers, peers * allreduce_header_bytes, peers, peers * allreduce_header_bytes};
}

// Estimated bytes (sent + received) of the busiest node on the sparse path, from the pair counts every rank
// announces: its own pairs out, an even share of everybody's pairs in, and the selected pairs in and out.
inline std::uint64_t sparse_allreduce_estimate(std::span<const std::uint64_t> counts, std::uint64_t k_global,
                                               std::uint64_t entry_bytes = pair_bytes_32) noexcept {
  const auto n = static_cast<std::uint64_t>(counts.size());
  if (n <= 1) return 0;
  std::uint64_t total = 0, most = 0;
  for (auto c : counts) {
    total += c;
    most = std::max(most, c);
  }
  const std::uint64_t selected = std::min(k_global, total);
  return entry_bytes * (most + (total + n - 1) / n + 2 * selected);
}

// The switch: dense when the busiest node of the ring moves strictly fewer bytes than the estimate above.
// Every input is known identically on every rank once the headers are in.
inline bool sparse_allreduce_prefers_dense(std::span<const std::uint64_t> counts, std::uint64_t d,
                                           std::uint64_t k_global,
                                           std::uint64_t entry_bytes = pair_bytes_32) noexcept {
  const int n = static_cast<int>(counts.size());
  if (n <= 1) return false;
  std::uint64_t dense_max = 0;
  for (int r = 0; r < n; ++r)
    dense_max = std::max(dense_max, dense_ring_traffic(d, n, r).bytes());
  return dense_max < sparse_allreduce_estimate(counts, k_global, entry_bytes);
}

inline bool sparse_allreduce_uses_dense(sparse_path path, std::span<const std::uint64_t> counts,
                                        std::uint64_t d, std::uint64_t k_global,
                                        std::uint64_t entry_bytes = pair_bytes_32) noexcept {
  return takes_dense_path(path,
                          [&] { return sparse_allreduce_prefers_dense(counts, d, k_global, entry_bytes); });
}

// What one rank saw in one exchange: the inputs of its exact load.
struct sparse_allreduce_shape {
  bool dense = false;                           // the dense fallback carried the sum
  bool refreshed = false;                       // the threshold histogram was all-reduced
  std::span<const std::uint64_t> sent_to;       // pairs this rank held in each region (its own included)
  std::span<const std::uint64_t> received_from; // pairs each rank held in this rank's region
  std::span<const std::uint64_t> selected;      // pairs each owner selected
};

// The exact load at `rank` of one exchange over n ranks of vectors of length d.
inline comm::traffic sparse_allreduce_load(const sparse_allreduce_shape& s, int n, int rank, std::uint64_t d,
                                           std::uint64_t entry_bytes = pair_bytes_32) noexcept {
  comm::traffic l = allreduce_header_load(n);
  if (n <= 1) return l;
  if (s.dense) return l += comm::load::all_reduce(d, sizeof(float), n, rank);
  for (int j = 0; j < n; ++j) {
    if (j == rank) continue;
    const auto out = s.sent_to[static_cast<std::size_t>(j)],
               in = s.received_from[static_cast<std::size_t>(j)];
    if (out > 0) l += comm::load::send(entry_bytes * out);
    if (in > 0) l += comm::load::receive(entry_bytes * in);
  }
  if (s.refreshed) l += comm::load::all_reduce(allreduce_histogram_bins, sizeof(std::uint32_t), n, rank);
  std::uint64_t all = 0;
  for (auto g : s.selected)
    all += g;
  const std::uint64_t mine = s.selected[static_cast<std::size_t>(rank)];
  l += comm::load::all_gather_v(entry_bytes * mine, entry_bytes * (all - mine), n, comm::medium::switched);
  return l;
}

// Planning form: every rank holds k pairs and the owners select K in all, both spread evenly over the n
// regions (region j gets m (j+1)/n - m j/n of m). `refreshed` adds the histogram of a refresh step.
inline comm::traffic sparse_allreduce_balanced_load(int n, std::uint64_t d, std::uint64_t k,
                                                    std::uint64_t k_global, bool refreshed, int rank = 0,
                                                    std::uint64_t entry_bytes = pair_bytes_32) {
  if (n <= 1) return {};
  const auto un = static_cast<std::uint64_t>(n);
  auto share = [&](std::uint64_t m, int j) { return comm::ring_chunk(m, n, static_cast<std::uint64_t>(j)); };
  std::vector<std::uint64_t> to(un), from(un), selected(un);
  for (int j = 0; j < n; ++j) {
    to[static_cast<std::size_t>(j)] = share(k, j);
    from[static_cast<std::size_t>(j)] = share(k, rank);
    selected[static_cast<std::size_t>(j)] = share(k_global, j);
  }
  return sparse_allreduce_load({false, refreshed, to, from, selected}, n, rank, d, entry_bytes);
}

// Seconds per exchange averaged over a refresh period of T steps (one refresh, T-1 reuses), balanced form.
inline double sparse_allreduce_balanced_seconds(int n, std::uint64_t d, std::uint64_t k,
                                                std::uint64_t k_global, std::uint64_t refresh_steps,
                                                const comm::network_model& net,
                                                std::uint64_t entry_bytes = pair_bytes_32) {
  const auto t = static_cast<double>(std::max<std::uint64_t>(refresh_steps, 1));
  const double fresh =
      comm::busy_seconds(sparse_allreduce_balanced_load(n, d, k, k_global, true, 0, entry_bytes), net);
  const double reuse =
      comm::busy_seconds(sparse_allreduce_balanced_load(n, d, k, k_global, false, 0, entry_bytes), net);
  return (fresh + (t - 1.0) * reuse) / t;
}

// The all-gather exchange (sparsify/sparse_exchange.hpp) with k pairs on every rank, for comparison: its header
// all_gather and the all_gather_v of the pairs (or its dense fallback, when `dense`).
inline comm::traffic sparse_gather_balanced_load(int n, std::uint64_t d, std::uint64_t k, bool dense,
                                                 int rank = 0, std::uint64_t entry_bytes = pair_bytes_32) {
  comm::traffic l = comm::load::all_gather(sparse_header_bytes, n, comm::medium::switched);
  if (dense) return l += comm::load::all_reduce(d, sizeof(float), n, rank);
  const auto peers = static_cast<std::uint64_t>(n > 1 ? n - 1 : 0);
  return l += comm::load::all_gather_v(entry_bytes * k, entry_bytes * k * peers, n, comm::medium::switched);
}

} // namespace commsgd::inline v1::cost
