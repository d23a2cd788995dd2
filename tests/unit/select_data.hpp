// Test and benchmark data for the selectors, and the sorted reference they are checked against.
#pragma once

#include <commsgd/select/key.hpp>
#include <commsgd/select/selector.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string_view>
#include <vector>

namespace select_data {

enum class shape { laplace, gaussian, relu_like };

inline constexpr shape shapes[] = {shape::laplace, shape::gaussian, shape::relu_like};

inline const char* shape_name(shape s) {
  switch (s) {
  case shape::laplace:
    return "laplace";
  case shape::gaussian:
    return "gaussian";
  default:
    return "relu_like";
  }
}

// relu_like imitates gradients of a ReLU network: about 13 % exact zeros (dead units), and magnitudes that
// are Laplace scaled by a lognormal factor, so the tails are much heavier than Laplace.
inline std::vector<float> make(shape s, std::size_t n, std::uint64_t seed, float scale = 1e-3f) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<float> expo(1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) {
    const float sign = (rng() & 1) ? 1.0f : -1.0f;
    switch (s) {
    case shape::laplace:
      v = sign * scale * expo(rng);
      break;
    case shape::gaussian:
      v = scale * normal(rng);
      break;
    case shape::relu_like:
      if (unit(rng) < 0.13f)
        v = (rng() & 1) ? 0.0f : -0.0f;
      else
        v = sign * scale * expo(rng) * std::exp(1.2f * normal(rng));
      break;
    }
  }
  return x;
}

// Nudges every entry a little, as consecutive training steps do.
inline void perturb(std::vector<float>& x, std::uint64_t seed, float relative = 0.02f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, relative);
  for (auto& v : x)
    v *= 1.0f + normal(rng);
}

// The reference: sort the magnitudes, read the k-th, count what lies strictly above.
inline commsgd::select::threshold reference(std::span<const float> x, std::size_t k) {
  if (k == 0) return {};
  std::vector<float> m(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    m[i] = std::fabs(x[i]);
  std::sort(m.begin(), m.end(), std::greater<>{});
  const float t = m[k - 1];
  std::size_t above = 0;
  while (above < m.size() && m[above] > t)
    ++above;
  return {t, above, k - above};
}

// #{i : |x_i| >= t} and #{i : |x_i| > t}, counted the slow obvious way.
inline std::size_t count_at_least(std::span<const float> x, float t) {
  std::size_t c = 0;
  for (float v : x)
    c += std::fabs(v) >= t;
  return c;
}
inline std::size_t count_above(std::span<const float> x, float t) {
  std::size_t c = 0;
  for (float v : x)
    c += std::fabs(v) > t;
  return c;
}

} // namespace select_data
