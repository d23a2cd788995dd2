// Maximum-likelihood Laplace and Gaussian fits of a gradient, and the Wasserstein-1 distance between the
// empirical distribution and each fit: the trainer's check of whether its gradients look more like Laplace,
// the law select::laplace_bisect assumes, than like a Gaussian. An experiment's tool, not library code.
//
// W1 = integral over t of |F_emp(t) - F_fit(t)|. F_emp is a step function, so the integral splits into the
// two tails and one piece per gap between sorted samples, on each of which F_emp is the constant c = i / n.
// Each piece is integrated in closed form from the antiderivatives of F and of 1 - F, split where F
// crosses c: the result is exact up to floating-point round-off, with no grid.
#pragma once

#include <commsgd/error.hpp>
#include <commsgd/select/validate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <span>
#include <vector>

namespace fmnist {

struct laplace_fit {
  double mu = 0.0; // median
  double b = 0.0;  // mean |x - mu|
};

struct gaussian_fit {
  double mean = 0.0;
  double stddev = 0.0; // maximum likelihood: divides by n
};

struct fit_report {
  laplace_fit laplace;
  gaussian_fit gaussian;
  double w1_laplace = 0.0;
  double w1_gaussian = 0.0;
};

namespace detail {

inline void check_fit_input(std::span<const float> x) {
  if (x.empty())
    throw commsgd::invalid_argument("fit: argument 'x' is empty; a fit needs at least one value");
  commsgd::select::check_finite(x);
}

inline std::vector<double> sorted_copy(std::span<const float> x) {
  std::vector<double> s(x.begin(), x.end());
  std::sort(s.begin(), s.end());
  return s;
}

// A fitted distribution as W1 needs it: F, its density, its quantile inside a bracket, and the tail
// integrals G(t) = int_{-inf}^t F and H(t) = int_t^inf (1 - F), each used on the side of `center` where it is
// small, so that no piece is the difference of two large numbers.
struct laplace_model {
  double mu, b;
  double center() const { return mu; }
  double cdf(double t) const {
    const double z = (t - mu) / b;
    return z < 0 ? 0.5 * std::exp(z) : 1.0 - 0.5 * std::exp(-z);
  }
  double lower_area(double t) const { return 0.5 * b * std::exp((t - mu) / b); }  // G, t <= mu
  double upper_area(double t) const { return 0.5 * b * std::exp(-(t - mu) / b); } // H, t >= mu
  double quantile(double c, double, double) const {
    return c < 0.5 ? mu + b * std::log(2.0 * c) : mu - b * std::log(2.0 * (1.0 - c));
  }
};

struct gaussian_model {
  double m, s;
  static double phi(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2.0 * std::numbers::pi); }
  static double upper_tail(double z) { return 0.5 * std::erfc(z / std::numbers::sqrt2); } // 1 - Phi(z)
  double center() const { return m; }
  double cdf(double t) const { return upper_tail(-(t - m) / s); }
  double lower_area(double t) const {
    const double z = (t - m) / s;
    return s * (z * upper_tail(-z) + phi(z));
  }
  double upper_area(double t) const {
    const double z = (t - m) / s;
    return s * (phi(z) - z * upper_tail(z));
  }
  // No closed form: safeguarded Newton inside [lo, hi], where F(lo) <= c <= F(hi).
  double quantile(double c, double lo, double hi) const {
    double q = 0.5 * (lo + hi);
    for (int it = 0; it < 200 && hi - lo > 1e-15 * (std::fabs(lo) + std::fabs(hi)) + 1e-300; ++it) {
      const double f = cdf(q) - c;
      if (f == 0.0) return q;
      (f > 0 ? hi : lo) = q;
      const double d = phi((q - m) / s) / s;
      const double next = d > 0 ? q - f / d : lo - 1.0;
      q = next > lo && next < hi ? next : 0.5 * (lo + hi);
    }
    return q;
  }
};

// int_a^b F, a <= b.
template <class M>
double cdf_area(const M& f, double a, double b) {
  const double c = f.center();
  if (b <= c) return f.lower_area(b) - f.lower_area(a);
  if (a >= c) return (b - a) - (f.upper_area(a) - f.upper_area(b));
  return cdf_area(f, a, c) + cdf_area(f, c, b);
}

template <class M>
double wasserstein1_sorted(const std::vector<double>& s, const M& f) {
  const std::size_t n = s.size();
  // Left tail: int_{-inf}^{s_0} F; right tail: int_{s_{n-1}}^inf (1 - F).
  auto left = [&](double t) {
    return t <= f.center() ? f.lower_area(t) : f.lower_area(f.center()) + cdf_area(f, f.center(), t);
  };
  auto right = [&](double t) {
    return t >= f.center() ? f.upper_area(t)
                           : f.upper_area(f.center()) + (f.center() - t) - cdf_area(f, t, f.center());
  };
  double w = left(s.front()) + right(s.back());
  for (std::size_t i = 1; i < n; ++i) {
    const double a = s[i - 1], b = s[i];
    if (!(b > a)) continue;
    const double c = static_cast<double>(i) / static_cast<double>(n);
    const double fa = f.cdf(a), fb = f.cdf(b);
    double q;
    if (fa >= c)
      q = a;
    else if (fb <= c)
      q = b;
    else
      q = std::clamp(f.quantile(c, a, b), a, b);
    // Below q the empirical CDF is above the fit, beyond q below it.
    w += (c * (q - a) - cdf_area(f, a, q)) + (cdf_area(f, q, b) - c * (b - q));
  }
  return w;
}

inline double mean_abs_deviation(const std::vector<double>& s, double about) {
  double sum = 0.0;
  for (double v : s)
    sum += std::fabs(v - about);
  return sum / static_cast<double>(s.size());
}

inline laplace_fit fit_laplace_sorted(const std::vector<double>& s) {
  const std::size_t n = s.size();
  laplace_fit f;
  // Any point between the two middle samples maximises the likelihood; the midpoint is the usual choice.
  f.mu = n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  f.b = mean_abs_deviation(s, f.mu);
  return f;
}

inline gaussian_fit fit_gaussian_sorted(const std::vector<double>& s) {
  gaussian_fit f;
  double sum = 0.0;
  for (double v : s)
    sum += v;
  f.mean = sum / static_cast<double>(s.size());
  double sq = 0.0;
  for (double v : s)
    sq += (v - f.mean) * (v - f.mean);
  f.stddev = std::sqrt(sq / static_cast<double>(s.size()));
  return f;
}

inline double wasserstein1_sorted(const std::vector<double>& s, const laplace_fit& f) {
  // A zero scale is a point mass: the distance is the mean distance to it.
  if (!(f.b > 0)) return mean_abs_deviation(s, f.mu);
  return wasserstein1_sorted(s, laplace_model{f.mu, f.b});
}

inline double wasserstein1_sorted(const std::vector<double>& s, const gaussian_fit& f) {
  if (!(f.stddev > 0)) return mean_abs_deviation(s, f.mean);
  return wasserstein1_sorted(s, gaussian_model{f.mean, f.stddev});
}

} // namespace detail

inline laplace_fit fit_laplace(std::span<const float> x) {
  detail::check_fit_input(x);
  return detail::fit_laplace_sorted(detail::sorted_copy(x));
}

inline gaussian_fit fit_gaussian(std::span<const float> x) {
  detail::check_fit_input(x);
  return detail::fit_gaussian_sorted(detail::sorted_copy(x));
}

inline double laplace_cdf(double t, const laplace_fit& f) {
  return detail::laplace_model{f.mu, f.b}.cdf(t);
}
inline double gaussian_cdf(double t, const gaussian_fit& f) {
  return detail::gaussian_model{f.mean, f.stddev}.cdf(t);
}

// W1 between the empirical distribution of x and a given distribution (fitted to x or not).
inline double wasserstein1(std::span<const float> x, const laplace_fit& f) {
  detail::check_fit_input(x);
  return detail::wasserstein1_sorted(detail::sorted_copy(x), f);
}

inline double wasserstein1(std::span<const float> x, const gaussian_fit& f) {
  detail::check_fit_input(x);
  return detail::wasserstein1_sorted(detail::sorted_copy(x), f);
}

// Both fits and both distances, sorting x once.
inline fit_report fit(std::span<const float> x) {
  detail::check_fit_input(x);
  const std::vector<double> s = detail::sorted_copy(x);
  fit_report r;
  r.laplace = detail::fit_laplace_sorted(s);
  r.gaussian = detail::fit_gaussian_sorted(s);
  r.w1_laplace = detail::wasserstein1_sorted(s, r.laplace);
  r.w1_gaussian = detail::wasserstein1_sorted(s, r.gaussian);
  return r;
}

} // namespace fmnist
