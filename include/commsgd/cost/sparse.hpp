// Per-node bytes of the sparse exchange (sparsify/sparse_exchange.hpp) and of its dense fallback, under the byte
// accounting of comm::metered, and the rule that picks between them. The exchange calls the same rule, so
// the model and what is measured agree by construction and tests check that they agree to the byte.
//
// One sparse exchange over n ranks where rank i sends k_i pairs of `entry_bytes` (8 with 32-bit indices):
//   header   all_gather of sparse_header_fields u64 per rank:  sends and receives (n-1) * 32
//   sparse   all_gather_v of the pairs:  sends (n-1)(entry_bytes k_i + 8),
//                                        receives entry_bytes * (sum of the others' k) + (n-1) * 8
//   dense    ring all-reduce of d floats (comm::ring_all_reduce_traffic): about 2 (n-1)/n * 4d each way
// With equal k on every rank, the sparse path costs 2 (n-1)(8k + 8) against 8 (n-1) d / n for the ring, so
// the switch sits near density 1/n: the gathered union, not one rank's message, is what must stay small.
#pragma once

#include <commsgd/comm/traffic.hpp>
#include <commsgd/config.hpp>

#include <algorithm>
#include <cstdint>
#include <span>

namespace commsgd::inline v1::cost {

// Which way a sparse exchange goes: by the rule below, or forced.
enum class sparse_path : std::uint8_t { automatic, sparse, dense };

// Fields every rank contributes to the header: pair count, vector length, a problem code and its position.
inline constexpr std::uint64_t sparse_header_fields = 4;
inline constexpr std::uint64_t sparse_header_bytes = sparse_header_fields * 8;
// all_gather_v sends each rank's element count ahead of its data, as a 64-bit integer.
inline constexpr std::uint64_t gather_count_bytes = 8;
// Bytes of one (index, value) pair with 32-bit indices and float values.
inline constexpr std::uint64_t pair_bytes_32 = 8;

constexpr comm::traffic sparse_header_traffic(int n) noexcept {
  return comm::all_gather_traffic(sparse_header_bytes, n);
}

// The all_gather_v of the pairs, seen from `rank`; counts[j] is rank j's pair count.
inline comm::traffic sparse_gather_traffic(std::span<const std::uint64_t> counts, int rank,
                                           std::uint64_t entry_bytes = pair_bytes_32) noexcept {
  const int n = static_cast<int>(counts.size());
  if (n <= 1) return {};
  std::uint64_t all = 0;
  for (auto c : counts)
    all += c;
  const std::uint64_t mine = counts[static_cast<std::size_t>(rank)];
  return comm::all_gather_v_traffic(entry_bytes * mine, entry_bytes * (all - mine), n);
}

// The dense fallback: a ring all-reduce of d values of `value_bytes`, seen from `rank`.
inline comm::traffic dense_ring_traffic(std::uint64_t d, int n, int rank,
                                        std::uint64_t value_bytes = 4) noexcept {
  return comm::ring_all_reduce_traffic(d, value_bytes, n, rank);
}

// The switch: dense when the busiest node of the ring moves strictly fewer bytes than the busiest node of
// the gather. Every input is known identically on every rank once the header is gathered, so every rank
// reaches the same verdict without a further message.
inline bool sparse_prefers_dense(std::span<const std::uint64_t> counts, std::uint64_t d,
                                 std::uint64_t entry_bytes = pair_bytes_32) noexcept {
  const int n = static_cast<int>(counts.size());
  if (n <= 1) return false;
  std::uint64_t sparse_max = 0, dense_max = 0;
  for (int r = 0; r < n; ++r) {
    sparse_max = std::max(sparse_max, sparse_gather_traffic(counts, r, entry_bytes).bytes());
    dense_max = std::max(dense_max, dense_ring_traffic(d, n, r).bytes());
  }
  return dense_max < sparse_max;
}

// The path a step takes: the forced one, or under `automatic` what `prefers_dense()` says (asked only then).
template <class PrefersDense>
bool takes_dense_path(sparse_path path, PrefersDense&& prefers_dense) noexcept {
  return path != sparse_path::sparse && (path == sparse_path::dense || prefers_dense());
}

inline bool sparse_uses_dense(sparse_path path, std::span<const std::uint64_t> counts, std::uint64_t d,
                              std::uint64_t entry_bytes = pair_bytes_32) noexcept {
  return takes_dense_path(path, [&] { return sparse_prefers_dense(counts, d, entry_bytes); });
}

// Everything one sparse exchange moves at `rank`: the header, then the path the rule (or `path`) picks.
inline comm::traffic sparse_exchange_traffic(std::span<const std::uint64_t> counts, std::uint64_t d, int rank,
                                             std::uint64_t entry_bytes = pair_bytes_32,
                                             sparse_path path = sparse_path::automatic) noexcept {
  const int n = static_cast<int>(counts.size());
  const auto body = sparse_uses_dense(path, counts, d, entry_bytes)
                        ? dense_ring_traffic(d, n, rank)
                        : sparse_gather_traffic(counts, rank, entry_bytes);
  return sparse_header_traffic(n) + body;
}

// A dense message (sparsify::none) goes straight to the ring, with no header.
inline comm::traffic dense_exchange_traffic(std::uint64_t d, int n, int rank) noexcept {
  return dense_ring_traffic(d, n, rank);
}

} // namespace commsgd::inline v1::cost
