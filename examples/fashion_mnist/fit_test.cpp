// Laplace and Gaussian fits, and the Wasserstein-1 distance that tells them apart (fit.hpp).
#include "fit.hpp"
#include "select_data.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace sel = fmnist;

namespace {

// W1 by brute force: a fine Riemann sum of |F_emp - F| over a range that holds nearly all the mass.
template <class Cdf>
double w1_numeric(std::vector<float> x, Cdf cdf, double lo, double hi, int steps) {
  std::sort(x.begin(), x.end());
  const double h = (hi - lo) / steps;
  double w = 0.0;
  std::size_t below = 0;
  for (int i = 0; i < steps; ++i) {
    const double t = lo + (i + 0.5) * h;
    while (below < x.size() && x[below] <= t)
      ++below;
    w += std::fabs(static_cast<double>(below) / static_cast<double>(x.size()) - cdf(t)) * h;
  }
  return w;
}

} // namespace

TEST_CASE("maximum-likelihood fits recover the parameters") {
  const auto lap = select_data::make(select_data::shape::laplace, 200001, 1, 2.0f);
  const auto f = sel::fit_laplace(lap);
  CHECK(f.mu == doctest::Approx(0.0).epsilon(0.0).scale(1.0).epsilon(0.02));
  CHECK(f.b == doctest::Approx(2.0).epsilon(0.01));
  const auto gau = select_data::make(select_data::shape::gaussian, 200000, 2, 3.0f);
  const auto g = sel::fit_gaussian(gau);
  CHECK(std::fabs(g.mean) < 0.03);
  CHECK(g.stddev == doctest::Approx(3.0).epsilon(0.01));
  // Even count: the median is the midpoint of the two middle samples.
  const std::vector<float> four{4, 1, 3, 2};
  CHECK(sel::fit_laplace(four).mu == 2.5);
  CHECK(sel::fit_laplace(four).b == doctest::Approx(1.0));
}

TEST_CASE("the closed-form W1 agrees with a brute-force integral") {
  const auto x = select_data::make(select_data::shape::relu_like, 400, 3, 1.0f);
  const sel::laplace_fit lf{0.1, 0.7};
  const sel::gaussian_fit gf{-0.2, 1.3};
  const double wl = sel::wasserstein1(x, lf);
  const double wg = sel::wasserstein1(x, gf);
  // Heavy tails: integrate from well below the smallest sample to well above the largest.
  const double lo = *std::min_element(x.begin(), x.end()) - 60.0,
               hi = *std::max_element(x.begin(), x.end()) + 60.0;
  const double nl = w1_numeric(
      x, [&](double t) { return sel::laplace_cdf(t, lf); }, lo, hi, 4000000);
  const double ng = w1_numeric(
      x, [&](double t) { return sel::gaussian_cdf(t, gf); }, lo, hi, 4000000);
  CHECK(wl == doctest::Approx(nl).epsilon(1e-4));
  CHECK(wg == doctest::Approx(ng).epsilon(1e-4));
  // Known values: a single sample at 0 against Laplace(0, b) is E|X| = b; against N(0, s), s sqrt(2 / pi).
  const std::vector<float> zero{0.0f};
  CHECK(sel::wasserstein1(zero, sel::laplace_fit{0.0, 2.0}) == doctest::Approx(2.0));
  CHECK(sel::wasserstein1(zero, sel::gaussian_fit{0.0, 2.0}) == doctest::Approx(2.0 * std::sqrt(2.0 / M_PI)));
  // A point mass fit: the mean distance to it.
  const std::vector<float> two{1.0f, 3.0f};
  CHECK(sel::wasserstein1(two, sel::laplace_fit{2.0, 0.0}) == doctest::Approx(1.0));
}

TEST_CASE("W1 tells Laplace samples from Gaussian samples") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    const auto lap = select_data::make(select_data::shape::laplace, 50000, seed);
    const auto rl = sel::fit(lap);
    CHECK(rl.w1_laplace < 0.5 * rl.w1_gaussian);
    const auto gau = select_data::make(select_data::shape::gaussian, 50000, seed + 10);
    const auto rg = sel::fit(gau);
    CHECK(rg.w1_gaussian < 0.5 * rg.w1_laplace);
    // Scale-free: W1 scales with the data.
    CHECK(rl.w1_laplace < 0.05 * rl.laplace.b);
  }
}

TEST_CASE("fits refuse empty and non-finite input") {
  CHECK_THROWS_AS(sel::fit(std::span<const float>{}), commsgd::invalid_argument);
  std::vector<float> x{1, 2, std::numeric_limits<float>::infinity(), 4,
                       std::numeric_limits<float>::quiet_NaN()};
  try {
    sel::fit(x);
    FAIL("no exception");
  } catch (const commsgd::non_finite& e) {
    CHECK(e.count() == 2);
    CHECK(e.first_index() == 2);
  }
}
