// The gradient types the batched top-k step reads: float, and the 16-bit formats training runs in (fp16 and
// bf16, as torch.topk and cub::DeviceTopK take them). The residual stays in float: a 16-bit residual would
// lose the small updates error feedback exists to keep.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace commsgd::inline v1::cuda {

template <class T>
concept gradient_type =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

namespace detail {

// Exact: every fp16 and bf16 value is a float.
__device__ inline float to_float(float x) {
  return x;
}
__device__ inline float to_float(__half x) {
  return __half2float(x);
}
__device__ inline float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

} // namespace detail
} // namespace commsgd::inline v1::cuda
