// How Laplace-like a gradient is: Wasserstein-1 distances between its empirical distribution and its
// Laplace and Gaussian maximum-likelihood fits (the evidence seed 001 gives for the Laplace threshold).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

namespace fmnist {

struct fit_report {
  double laplace_mu = 0, laplace_b = 0, gauss_mean = 0, gauss_sd = 0;
  double w1_laplace = 0, w1_gauss = 0;
  double zero_fraction = 0;
};

namespace detail {

// W1 = integral of |F_n(x) - F(x)| dx, with F_n the step function of the sorted sample. The tails beyond the
// extreme samples are integrated in closed form (`below(x)` = E[(x - X)+], `above(x)` = E[(X - x)+]); between
// samples the trapezoid rule suffices because F moves by about 1/N there.
template <class Cdf, class Below, class Above>
double wasserstein1(const std::vector<float>& sorted, Cdf cdf, Below below, Above above) {
  const std::size_t n = sorted.size();
  double w = below(sorted.front()) + above(sorted.back());
  double f_prev = cdf(sorted[0]);
  for (std::size_t i = 1; i < n; ++i) {
    const double x0 = sorted[i - 1], x1 = sorted[i];
    const double f1 = cdf(x1);
    if (x1 > x0) {
      const double c = static_cast<double>(i) / static_cast<double>(n);
      w += 0.5 * (std::abs(c - f_prev) + std::abs(c - f1)) * (x1 - x0);
    }
    f_prev = f1;
  }
  return w;
}

} // namespace detail

inline fit_report fit_gradient(std::span<const float> g) {
  fit_report r;
  if (g.size() < 2) return r;
  std::vector<float> s(g.begin(), g.end());
  std::sort(s.begin(), s.end());
  const std::size_t n = s.size();
  r.laplace_mu = 0.5 * (static_cast<double>(s[(n - 1) / 2]) + s[n / 2]);
  double sum = 0, sq = 0, dev = 0;
  std::size_t zeros = 0;
  for (float v : s) {
    sum += v;
    sq += static_cast<double>(v) * v;
    dev += std::abs(v - r.laplace_mu);
    zeros += v == 0.0f;
  }
  r.laplace_b = std::max(dev / static_cast<double>(n), 1e-30);
  r.gauss_mean = sum / static_cast<double>(n);
  r.gauss_sd =
      std::max(std::sqrt(std::max(sq / static_cast<double>(n) - r.gauss_mean * r.gauss_mean, 0.0)), 1e-30);
  r.zero_fraction = static_cast<double>(zeros) / static_cast<double>(n);

  const double mu = r.laplace_mu, b = r.laplace_b;
  auto lap_cdf = [&](double x) {
    return x < mu ? 0.5 * std::exp((x - mu) / b) : 1.0 - 0.5 * std::exp(-(x - mu) / b);
  };
  auto lap_below = [&](double x) {
    return x < mu ? 0.5 * b * std::exp((x - mu) / b) : (x - mu) + 0.5 * b * std::exp(-(x - mu) / b);
  };
  auto lap_above = [&](double x) {
    return x > mu ? 0.5 * b * std::exp(-(x - mu) / b) : (mu - x) + 0.5 * b * std::exp((x - mu) / b);
  };
  r.w1_laplace = detail::wasserstein1(s, lap_cdf, lap_below, lap_above);

  const double m = r.gauss_mean, sd = r.gauss_sd;
  auto phi = [](double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * 3.141592653589793); };
  auto cdf_std = [](double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); };
  auto g_cdf = [&](double x) { return cdf_std((x - m) / sd); };
  auto g_below = [&](double x) {
    const double z = (x - m) / sd;
    return (x - m) * cdf_std(z) + sd * phi(z);
  };
  auto g_above = [&](double x) {
    const double z = (x - m) / sd;
    return (m - x) * cdf_std(-z) + sd * phi(z);
  };
  r.w1_gauss = detail::wasserstein1(s, g_cdf, g_below, g_above);
  return r;
}

} // namespace fmnist
