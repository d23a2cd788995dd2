// Kernels of `exact`: keys for the sort, and the threshold read off the sorted keys.
#pragma once

#include <commsgd/cuda/engine/kernels.cuh>

namespace commsgd::inline v1::cuda::detail {

template <class = void>
__global__ void __launch_bounds__(block_threads)
    magnitude_keys_kernel(const float* __restrict__ x, u32* keys, exact_state* st) {
  for_each_input(x, st->n, [&](u32 key, u64 i) {
    if (key >= select::infinite_key) note_nonfinite(st, i);
    keys[i] = key;
  });
}

// sorted is ascending: the k-th largest is sorted[n - k]; the keys above it are those past its last copy.
template <class = void>
__global__ void sorted_threshold_kernel(const u32* sorted, exact_state* st) {
  const u64 n = st->n;
  const u64 k = st->k;
  const u32 t = sorted[n - k];
  u64 lo = n - k;
  u64 hi = n;
  while (lo < hi) { // first index with key > t
    const u64 mid = lo + (hi - lo) / 2;
    if (sorted[mid] > t)
      hi = mid;
    else
      lo = mid + 1;
  }
  const u64 above = n - lo;
  st->value = select::key_magnitude(t);
  st->res_above = above;
  st->res_at = k - above;
  st->done = 1;
}

} // namespace commsgd::inline v1::cuda::detail
