// Block-level pieces of the selection engine: grid-stride visits of keys, the candidate append, the
// last-block handshake and the block-wide search for the bin where a count crosses k. They know nothing of
// any method's state.
//
// Keys are commsgd::select::magnitude_key values: 31 significant bits, order of |x|, -0 == +0.
#pragma once

#include <commsgd/cuda/engine/tuning.cuh>
#include <commsgd/select/key.hpp>

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>

#include <cstdint>

namespace commsgd::inline v1::cuda::detail {

using u32 = std::uint32_t;
using u64 = unsigned long long;

inline constexpr int block_threads = engine_tuning::block_threads;
inline constexpr u32 key_bits = 31;
inline constexpr u32 max_digit_bits = engine_tuning::digit_bits;
inline constexpr u32 digit_bins = 1u << max_digit_bits;
inline constexpr u32 window_bits = engine_tuning::window_bits;
inline constexpr u32 window_bins = 1u << window_bits;
// The window's bins plus one below and one above it; the global histograms have this many bins.
inline constexpr u32 hist_bins = window_bins + 2;
inline constexpr int scan_items = (hist_bins + block_threads - 1) / block_threads;
static_assert(digit_bins <= hist_bins, "a digit pass uses the global histograms too");

// A block's shared pair of histograms: entries per bin, and entries whose bits below the bin are all zero
// (the lowest key of the bin, which the crossing search needs to place a threshold exactly on a bin edge).
// Cleared before a counting pass; flushed into the global pair after it (non-zero bins only).
__device__ inline void clear_histograms(u32* s_hist, u32* s_edge, u32 bins) {
  for (u32 b = threadIdx.x; b < bins; b += blockDim.x) {
    s_hist[b] = 0;
    s_edge[b] = 0;
  }
}

// Keys below a window pass's window all land in its bin 0, and they are nearly all of the input: counted in
// registers and added once per warp, they never queue on one shared counter (32 lanes incrementing the same
// shared word are serialised). flush() is called by every thread of the block, converged, after the pass.
struct below_window {
  u32 keys = 0;
  u32 edges = 0;
  __device__ void add(u32 key, u32 low_mask) {
    ++keys;
    edges += (key & low_mask) == 0;
  }
  __device__ void flush(u32* s_hist, u32* s_edge) const {
    const u32 k = __reduce_add_sync(0xffffffffu, keys);
    const u32 e = __reduce_add_sync(0xffffffffu, edges);
    if ((threadIdx.x & 31u) == 0) {
      if (k) atomicAdd(&s_hist[0], k);
      if (e) atomicAdd(&s_edge[0], e);
    }
  }
};

__device__ inline void count_key(u32* s_hist, u32* s_edge, u32 bin, u32 key, u32 low_mask) {
  atomicAdd(&s_hist[bin], 1u);
  if ((key & low_mask) == 0) atomicAdd(&s_edge[bin], 1u);
}

__device__ inline void flush_histograms(const u32* s_hist, const u32* s_edge, u32 bins, u64* g_hist,
                                        u64* g_edge) {
  for (u32 b = threadIdx.x; b < bins; b += blockDim.x) {
    if (s_hist[b]) atomicAdd(&g_hist[b], static_cast<u64>(s_hist[b]));
    if (s_edge[b]) atomicAdd(&g_edge[b], static_cast<u64>(s_edge[b]));
  }
}

// Grid-stride visit of every key of x (with its index), in float4 loads when x is 16-byte aligned.
template <class F>
__device__ void for_each_input(const float* __restrict__ x, u64 n, F&& f) {
  const u64 tid = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x;
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  u64 head = 0;
  if ((reinterpret_cast<std::uintptr_t>(x) & 15u) == 0) {
    const u64 n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (u64 i = tid; i < n4; i += stride) {
      const float4 v = x4[i];
      f(select::magnitude_key(v.x), 4 * i);
      f(select::magnitude_key(v.y), 4 * i + 1);
      f(select::magnitude_key(v.z), 4 * i + 2);
      f(select::magnitude_key(v.w), 4 * i + 3);
    }
    head = 4 * n4;
  }
  for (u64 i = head + tid; i < n; i += stride)
    f(select::magnitude_key(x[i]), i);
}

// Candidate buffers are carved at 256-byte boundaries, so uint4 loads are always aligned.
template <class F>
__device__ void for_each_key(const u32* __restrict__ keys, u64 n, F&& f) {
  const u64 tid = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x;
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  const u64 n4 = n / 4;
  const uint4* k4 = reinterpret_cast<const uint4*>(keys);
  for (u64 i = tid; i < n4; i += stride) {
    const uint4 v = k4[i];
    f(v.x);
    f(v.y);
    f(v.z);
    f(v.w);
  }
  for (u64 i = 4 * n4 + tid; i < n; i += stride)
    f(keys[i]);
}

// One atomic per group of threads that reach the append together, instead of one per key.
__device__ inline void append_key(u32* buf, u64* count, u64 cap, u32 key, u32* overflow) {
  namespace cg = cooperative_groups;
  cg::coalesced_group g = cg::coalesced_threads();
  u64 base = 0;
  if (g.thread_rank() == 0) base = atomicAdd(count, static_cast<u64>(g.size()));
  base = g.shfl(base, 0);
  const u64 slot = base + g.thread_rank();
  if (slot < cap)
    buf[slot] = key;
  else
    atomicOr(overflow, 1u);
}

// The classic threadfence reduction handshake: true in the one block that finishes last, which then sees
// every other block's global atomics.
__device__ inline bool arrive_last(u32* ticket) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  return last;
}

struct crossing {
  u32 bin;    // the bin holding the k_rem-th largest key; ~0u if the bins hold fewer than k_rem
  u64 before; // keys in higher bins
  u64 count;  // keys in this bin
  u64 edge;   // keys equal to the bin's lowest key
};

// Block-wide: with the bins read from the top, the bin where the running count reaches k_rem. Clears the
// global bins for the next pass.
__device__ inline crossing find_crossing(u64* g_hist, u64* g_edge, u32 bins, u64 k_rem) {
  using scan_t = cub::BlockScan<u64, block_threads>;
  __shared__ typename scan_t::TempStorage scan_storage;
  __shared__ crossing found;
  u64 local[scan_items];
  u64 sum = 0;
  for (int i = 0; i < scan_items; ++i) {
    const u32 rank = threadIdx.x * scan_items + i;
    local[i] = rank < bins ? __ldcg(&g_hist[bins - 1 - rank]) : 0;
    sum += local[i];
  }
  if (threadIdx.x == 0) found = crossing{~0u, 0, 0, 0};
  u64 before = 0;
  scan_t(scan_storage).ExclusiveSum(sum, before);
  __syncthreads();
  for (int i = 0; i < scan_items; ++i) {
    const u32 rank = threadIdx.x * scan_items + i;
    if (before < k_rem && k_rem <= before + local[i])
      found = crossing{bins - 1 - rank, before, local[i], __ldcg(&g_edge[bins - 1 - rank])};
    before += local[i];
  }
  __syncthreads();
  for (u32 b = threadIdx.x; b < bins; b += blockDim.x) {
    g_hist[b] = 0;
    g_edge[b] = 0;
  }
  return found;
}

// The end of a block's counting pass: its histograms go into the global pair, and the last block to arrive
// finds the crossing of the state's k_rem-th largest key into `c`. False on every other block, which then
// has nothing left to do in this kernel.
template <class State>
__device__ bool last_block_crossing(const u32* s_hist, const u32* s_edge, u32 bins, u64* g_hist, u64* g_edge,
                                    State* st, crossing& c) {
  __syncthreads();
  flush_histograms(s_hist, s_edge, bins, g_hist, g_edge);
  if (!arrive_last(&st->ticket)) return false;
  c = find_crossing(g_hist, g_edge, bins, st->k_rem);
  return true;
}

} // namespace commsgd::inline v1::cuda::detail
