// Standalone check of an input for NaN and inf (the selections also count them in their first pass).
#pragma once

#include <commsgd/cuda/engine/dispatch.cuh>

namespace commsgd::inline v1::cuda {

struct non_finite_count {
  unsigned long long count;
  unsigned long long first_index; // no_nonfinite_index when count == 0
};

namespace detail {

template <class = void>
__global__ void __launch_bounds__(block_threads)
    count_non_finite_kernel(const float* __restrict__ x, u64 n, non_finite_count* out) {
  for_each_input(x, n, [&](u32 key, u64 i) {
    if (key >= select::infinite_key) {
      atomicAdd(&out->count, 1ull);
      atomicMin(&out->first_index, i);
    }
  });
}

} // namespace detail

// Stream-ordered: *d_out holds the count and the first index once the stream reaches this point.
inline void count_non_finite(const float* x, std::size_t n, non_finite_count* d_out,
                             cudaStream_t stream = nullptr) {
  check(cudaMemsetAsync(d_out, 0, sizeof(unsigned long long), stream), "cudaMemsetAsync");
  static_assert(no_nonfinite_index == ~0ull); // what a memset of 0xff writes
  check(cudaMemsetAsync(&d_out->first_index, 0xff, sizeof(unsigned long long), stream), "cudaMemsetAsync");
  if (n == 0) return;
  detail::count_non_finite_kernel<><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(x, n, d_out);
  check_launch("count_non_finite_kernel");
}

// Synchronises the stream; throws commsgd::non_finite naming `what`.
inline void check_finite(const float* x, std::size_t n, cudaStream_t stream = nullptr,
                         std::string_view what = "x") {
  device_buffer<non_finite_count> d(1);
  count_non_finite(x, n, d.data(), stream);
  non_finite_count h{};
  check(cudaMemcpyAsync(&h, d.data(), sizeof h, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (h.count > 0) throw non_finite(what, h.count, h.first_index);
}

} // namespace commsgd::inline v1::cuda
