// CUDA status codes turned into commsgd exceptions, so device code reports errors the way host code does.
#pragma once

#include <commsgd/error.hpp>

#include <cuda_runtime.h>

namespace commsgd::inline v1::cuda {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw error(commsgd::concat("CUDA error in ", what, ": ", cudaGetErrorName(status), ": ",
                                cudaGetErrorString(status)));
}

// Launch errors are sticky in cudaGetLastError until read: read right after each launch so the message
// names the kernel that failed, not a later call.
inline void check_launch(const char* what) {
  check(cudaGetLastError(), what);
}

} // namespace commsgd::inline v1::cuda
