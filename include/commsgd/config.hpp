// Version, feature macros and the inline ABI namespace shared by every commsgd header.
#pragma once

#define COMMSGD_VERSION_MAJOR 0
#define COMMSGD_VERSION_MINOR 1
#define COMMSGD_VERSION_PATCH 0

// Small maths (key mappings, threshold formulas) is written once and compiled for both host and device.
#if defined(__CUDACC__)
#define COMMSGD_HOST_DEVICE __host__ __device__
#else
#define COMMSGD_HOST_DEVICE
#endif

// Set to 1 by the commsgd::cuda target; code that needs CUDA must also include commsgd/cuda.cuh.
#ifndef COMMSGD_HAS_CUDA
#define COMMSGD_HAS_CUDA 0
#endif

namespace commsgd {
// The inline namespace versions the ABI: a future v2 can live beside v1 without link clashes.
inline namespace v1 {}
} // namespace commsgd
