// Kernels of the compaction: (index, value) pairs of the selected set, in index order.
#pragma once

#include <commsgd/cuda/engine/block.cuh>
#include <commsgd/cuda/engine/tuning.cuh>
#include <commsgd/cuda/result.cuh>
#include <commsgd/select/key.hpp>

#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

namespace commsgd::inline v1::cuda::detail {

inline constexpr int compact_items = compact_tuning::items_per_thread;
inline constexpr u32 compact_tile = block_threads * compact_items;

// Per tile: keys above the threshold, and keys tied with it (ties are taken in index order, so a tile's
// ties are selected only up to what the tiles before it left of `at`).
template <class = void>
__global__ void __launch_bounds__(block_threads)
    compact_count_kernel(const float* __restrict__ x, u64 n, const device_result* thr, u64* tile_above,
                         u64* tile_ties) {
  using reduce_t = cub::BlockReduce<u32, block_threads>;
  __shared__ typename reduce_t::TempStorage storage;
  const u32 t = select::magnitude_key(thr->value);
  const u64 start = static_cast<u64>(blockIdx.x) * compact_tile;
  u32 above = 0;
  u32 ties = 0;
  for (int i = 0; i < compact_items; ++i) {
    const u64 idx = start + static_cast<u64>(i) * block_threads + threadIdx.x;
    if (idx < n) {
      const u32 key = select::magnitude_key(x[idx]);
      above += key > t;
      ties += key == t;
    }
  }
  const u32 a = reduce_t(storage).Sum(above);
  __syncthreads();
  const u32 e = reduce_t(storage).Sum(ties);
  if (threadIdx.x == 0) {
    tile_above[blockIdx.x] = a;
    tile_ties[blockIdx.x] = e;
  }
}

template <class Index>
__global__ void __launch_bounds__(block_threads)
    compact_write_kernel(const float* __restrict__ x, u64 n, const device_result* thr,
                         const u64* above_before, const u64* ties_before, Index* out_index, float* out_value,
                         u64 capacity, u64* out_count) {
  using load_t = cub::BlockLoad<float, block_threads, compact_items, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using scan_t = cub::BlockScan<u32, block_threads>;
  __shared__ union {
    typename load_t::TempStorage load;
    typename scan_t::TempStorage scan;
  } storage;
  const u32 t = select::magnitude_key(thr->value);
  const u64 at = thr->at;
  const u64 start = static_cast<u64>(blockIdx.x) * compact_tile;
  const u64 remaining = n - start;
  const int valid = remaining < compact_tile ? static_cast<int>(remaining) : static_cast<int>(compact_tile);
  // Blocked arrangement: thread j holds items [j * compact_items, (j + 1) * compact_items) of the tile, so
  // ranks follow index order.
  float v[compact_items];
  load_t(storage.load).Load(x + start, v, valid, 0.0f);
  __syncthreads();
  u32 my_ties = 0;
  for (int i = 0; i < compact_items; ++i) {
    const int pos = threadIdx.x * compact_items + i;
    my_ties += pos < valid && select::magnitude_key(v[i]) == t;
  }
  u32 tie_rank = 0;
  scan_t(storage.scan).ExclusiveSum(my_ties, tie_rank);
  __syncthreads();
  const u64 ties_start = ties_before[blockIdx.x];
  bool take[compact_items];
  u32 my_selected = 0;
  for (int i = 0; i < compact_items; ++i) {
    const int pos = threadIdx.x * compact_items + i;
    const u32 key = select::magnitude_key(v[i]);
    take[i] = false;
    if (pos < valid) {
      take[i] = select::is_selected(key, t, ties_start + tie_rank, at);
      tie_rank += key == t;
    }
    my_selected += take[i];
  }
  u32 rank = 0;
  u32 tile_selected = 0;
  scan_t(storage.scan).ExclusiveSum(my_selected, rank, tile_selected);
  const u64 ties_taken_before = ties_start < at ? ties_start : at;
  const u64 base = above_before[blockIdx.x] + ties_taken_before;
  for (int i = 0; i < compact_items; ++i) {
    if (!take[i]) continue;
    const u64 slot = base + rank++;
    if (slot < capacity) {
      out_index[slot] = static_cast<Index>(start + threadIdx.x * compact_items + i);
      out_value[slot] = v[i];
    }
  }
  if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) *out_count = base + tile_selected;
}

} // namespace commsgd::inline v1::cuda::detail
