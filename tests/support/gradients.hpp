// Test data shared by the sparsifier tests on threads and under MPI.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace test_data {

// Heavy-tailed, with about 12 % exact zeros, like real gradients: a product of two exponentials, random sign.
inline std::vector<float> gradient(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<float> mag(1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> g(n);
  for (auto& x : g) {
    const float r = u(rng);
    x = r < 0.12f ? 0.0f : (r < 0.56f ? -1.0f : 1.0f) * mag(rng) * mag(rng) * 1e-3f;
  }
  return g;
}

// Equal as bit patterns: tells -0 from +0 and compares NaNs by payload.
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return std::ranges::equal(a, b, [](float x, float y) {
    return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
  });
}

} // namespace test_data
