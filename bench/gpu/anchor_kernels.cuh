// The anchors' device pieces that select_gpu_bench.cu and sequence_gpu_bench.cu share: the magnitude keys the
// CUB radix sort orders, and, where the CCCL on the include path has cub::DeviceTopK, the key transform it
// reads x through, the gather of the values it selected, and the check of its output against x.
// Include after <cub/device/device_topk.cuh> (when present) and the COMMSGD_BENCH_HAS_DEVICE_TOPK it sets.
#pragma once

#include <commsgd/cuda.cuh>

#include <cstdint>

namespace anchors {

__global__ void keys_kernel(const float* x, std::uint32_t* keys, std::uint64_t n) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    keys[i] = commsgd::select::magnitude_key(x[i]);
}

#ifdef COMMSGD_BENCH_HAS_DEVICE_TOPK
struct magnitude {
  __host__ __device__ std::uint32_t operator()(float v) const { return commsgd::select::magnitude_key(v); }
};

__global__ void gather_kernel(const float* x, const int* index, float* value, std::uint64_t k) {
  for (std::uint64_t j = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; j < k;
       j += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    value[j] = x[index[j]];
}

// counts[0]: entries whose index is out of range, repeated, or whose key or value disagrees with x;
// counts[1]: keys above `kth`; counts[2]: keys below it.
__global__ void check_topk_kernel(const float* x, std::uint64_t n, const std::uint32_t* keys,
                                  const int* index, const float* value, std::uint64_t k, std::uint32_t kth,
                                  std::uint32_t* seen, unsigned long long* counts) {
  for (std::uint64_t j = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; j < k;
       j += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const int i = index[j];
    bool bad = i < 0 || static_cast<std::uint64_t>(i) >= n;
    if (!bad) {
      const std::uint32_t bit = 1u << (i & 31);
      bad = (atomicOr(&seen[i >> 5], bit) & bit) != 0 || commsgd::select::magnitude_key(x[i]) != keys[j] ||
            __float_as_uint(x[i]) != __float_as_uint(value[j]);
    }
    if (bad) atomicAdd(&counts[0], 1ull);
    if (keys[j] > kth) atomicAdd(&counts[1], 1ull);
    if (keys[j] < kth) atomicAdd(&counts[2], 1ull);
  }
}
#endif

} // namespace anchors
