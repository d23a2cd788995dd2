// The order-preserving key of a magnitude, shared by host and device code.
#pragma once

#include <commsgd/config.hpp>

#include <cstdint>
#include <cstring>

namespace commsgd::inline v1::select {

// For finite floats, the IEEE-754 bits of |x| read as an unsigned integer order exactly as |x| does, and
// clearing the sign bit maps -0 onto +0. Radix methods work on these keys.
COMMSGD_HOST_DEVICE inline std::uint32_t magnitude_key(float x) noexcept {
  std::uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(x);
#else
  std::memcpy(&bits, &x, sizeof bits);
#endif
  return bits & 0x7fffffffu;
}

COMMSGD_HOST_DEVICE inline float key_magnitude(std::uint32_t key) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(key);
#else
  float x;
  std::memcpy(&x, &key, sizeof x);
  return x;
#endif
}

// Keys of finite values are below this; the key of +inf.
inline constexpr std::uint32_t infinite_key = 0x7f800000u;

// The contract's selection rule, entry by entry in index order: every key above the threshold's, and the
// first `at` keys equal to it. `ties_before` counts the keys equal to it at lower indices. Host and device
// compaction both decide by this, so they select the same set.
COMMSGD_HOST_DEVICE constexpr bool is_selected(std::uint32_t key, std::uint32_t threshold_key,
                                               std::uint64_t ties_before, std::uint64_t at) noexcept {
  return key > threshold_key || (key == threshold_key && ties_before < at);
}

} // namespace commsgd::inline v1::select
