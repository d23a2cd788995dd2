// Float operations rounded one at a time, for maths that host and device code must compute to the same bits.
// On the device they are the _rn intrinsics, which nvcc never fuses into an FMA (a fused multiply-add rounds
// once where the host rounds twice); on the host plain operators, which the commsgd target compiles with
// -ffp-contract=off (a build that does not use the target must pass it too where the CPU has FMA).
#pragma once

#include <commsgd/config.hpp>

namespace commsgd::inline v1::detail {

COMMSGD_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
COMMSGD_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
COMMSGD_HOST_DEVICE inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
COMMSGD_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

} // namespace commsgd::inline v1::detail
