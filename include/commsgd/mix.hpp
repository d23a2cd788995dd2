// The 64-bit mixer behind every seeded draw and fingerprint in commsgd: SplitMix64. One copy, so that the
// streams of different parts (compress/'s counter streams and fingerprints, coding/'s cyclic code, sync/'s
// delay model, PowerSGD's initial Q) are all the same function and a seed means the same bits wherever it is
// given. Host and device code share it; public, so that a policy of your own can draw its streams the same way.
#pragma once

#include <commsgd/config.hpp>

#include <cstdint>

namespace commsgd::inline v1 {

// SplitMix64's increment: 2^64 over the golden ratio, made odd.
inline constexpr std::uint64_t golden_gamma = 0x9e3779b97f4a7c15ull;

// SplitMix64's finaliser of x + golden_gamma: a bijection of 64-bit words with full avalanche.
COMMSGD_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += golden_gamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The SplitMix64 generator: the next output of the state s, which it advances.
COMMSGD_HOST_DEVICE constexpr std::uint64_t splitmix64(std::uint64_t& s) noexcept {
  const std::uint64_t z = mix64(s);
  s += golden_gamma;
  return z;
}

// The names these had before they were public: the same entities, for callers not yet moved.
namespace detail {
using commsgd::golden_gamma;
using commsgd::mix64;
using commsgd::splitmix64;
} // namespace detail

} // namespace commsgd::inline v1
