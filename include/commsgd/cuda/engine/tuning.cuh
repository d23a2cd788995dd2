// Tuning parameters of the CUDA selection engine, the compaction and the top-k sparsifier, as plain
// aggregates of constants (CUB's policies): the kernels and the dispatch read their sizes from here, so a
// retuning for another GPU touches this file only. The values suit GPUs with HBM-class memory bandwidth;
// every one is a speed choice, none changes a result.
#pragma once

#include <cstddef>
#include <cstdint>

namespace commsgd::inline v1::cuda {

// Shared by every kernel of the selection engine (block.cuh, kernels.cuh).
struct engine_tuning {
  // Threads per block of every engine kernel.
  static constexpr int block_threads = 256;
  // Radix digit width: 11-bit digits resolve the 31 key bits in 3 passes with a 2048-bin histogram (16 KiB
  // of shared counters and edges).
  static constexpr std::uint32_t digit_bits = 11;
  // The window pass of laplace_bisect and sampled counts 2^window_bits buckets around an estimate (plus one
  // below and one above): 4096 bins, 32 KiB of shared counters and edges.
  static constexpr std::uint32_t window_bits = 12;
  // A grid-stride pass launches about one block per block_threads * tile_items entries, and at most
  // blocks_per_sm blocks per multiprocessor: enough loads in flight to saturate HBM, few enough blocks that
  // flushing the shared histograms stays cheap.
  static constexpr std::size_t tile_items = 16;
  static constexpr std::size_t blocks_per_sm = 4;
  // Candidate buffers hold at least this many keys (and at most n).
  static constexpr std::size_t min_candidates = std::size_t{1} << 16;
};

// Candidate buffers hold n / candidate_divisor keys: enough for the bucket chosen by a first 11-bit digit on
// any smooth distribution; heavier ties fall back to reading x again.
struct radix_tuning {
  static constexpr std::size_t candidate_divisor = 8;
};

struct laplace_bisect_tuning {
  static constexpr std::size_t candidate_divisor = 8;
  // Half-width of the cold window pass in binary orders of magnitude (log2 of the binades each side): a
  // Laplace estimate needs +-16x (buckets ~0.2 % wide).
  static constexpr std::uint32_t cold_span_log2 = 2;
  // Buckets of a warm window pass are 2^warm_shift keys (1/1024 of an octave, ~0.07 % in value); the 4096 of
  // them span 4 octaves up from the floor, so a rise never leaves the window short of 12x.
  static constexpr std::uint32_t warm_shift = 13;
};

struct sampled_tuning {
  static constexpr std::size_t candidate_divisor = 8;
  // A 1 % sample puts the k-th key within a few percent: +-2 binades is ample and keeps buckets narrow.
  static constexpr std::uint32_t span_log2 = 1;
};

struct hierarchical_tuning {
  // The segments' candidates add up to well over k (each keeps whole top-digit buckets down to its cut), so
  // this buffer is larger than the other methods'.
  static constexpr std::size_t candidate_divisor = 4;
  // A segment is block_threads * segment_items keys, each thread holding segment_items in registers.
  static constexpr int segment_items = 16;
  // Each segment keeps ceil(its share of k) + slack_fixed + slack_sigmas * sqrt(share) keys: a segment
  // holding more than its share of the top k (Poisson-likely at a small share) is rare, so the fallback
  // pass stays rare.
  static constexpr double slack_fixed = 8.0;
  static constexpr double slack_sigmas = 4.0;
};

struct compact_tuning {
  // Items per thread of a compaction tile (a tile is block_threads * items_per_thread entries).
  static constexpr int items_per_thread = 16;
};

struct top_k_tuning {
  // Blocks per multiprocessor of the kernel that zeroes the sent positions.
  static constexpr std::size_t zero_blocks_per_sm = 8;
  // Pair buffers of an approximate selector start at k + k / margin_divisor + margin_extra and grow by
  // count / margin_divisor when a step overflows them.
  static constexpr std::size_t margin_divisor = 16;
  static constexpr std::size_t margin_extra = 64;
};

} // namespace commsgd::inline v1::cuda
