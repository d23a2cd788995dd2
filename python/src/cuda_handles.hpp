// What commsgd_torch._cuda receives from Python in place of tensors and streams: integers holding a device
// pointer or a cudaStream_t (torch's data_ptr() and cuda_stream), so no torch header reaches the module.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace commsgd_torch_cuda {

inline cudaStream_t stream_of(std::uintptr_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

template <class T>
T* pointer_of(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

} // namespace commsgd_torch_cuda
