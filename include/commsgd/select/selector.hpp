// The selector concept: find the magnitude threshold of the k largest |x_i|.
//
// Models (select/<name>.hpp, each with a CUDA counterpart behind commsgd/cuda.cuh):
//   exact           nth_element on |x|; exact
//   radix           radix select on magnitude keys with a candidate buffer; exact
//   laplace_bisect  Laplace tail estimate, then multi-candidate bisection; approximate (or exact with trim)
//   hierarchical    per-segment top candidates, then an exact select among them; exact
//   sampled         threshold from a strided sample, corrected; approximate
//
// Contract:
// - x must be finite (NaN or inf raise commsgd::non_finite with the count and first index); 0 <= k <=
// x.size().
// - Order is by |x| with -0 == +0. The selection is {i : |x_i| > value} plus the first `at` indices with
//   |x_i| == value, so a result is always a definite set of indices.
// - Exact methods select exactly k (ties at the threshold go to the lowest indices: deterministic, and the
//   same set on CPU and GPU).
// - Approximate methods select every |x_i| >= value and land in [k, ceil((1 + tol) k)]; where they cannot
//   (more than tol k values tie at the threshold) they raise commsgd::unsupported saying so.
// - k == 0 gives value = +inf and an empty set; k == N selects everything.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <span>

namespace commsgd::inline v1::select {

struct threshold {
  float value = std::numeric_limits<float>::infinity(); // magnitude threshold t
  std::size_t above = 0;                                // #{i : |x_i| > t}, all selected
  std::size_t at = 0; // selected entries with |x_i| == t, lowest indices first
  constexpr std::size_t count() const noexcept { return above + at; }
  friend constexpr bool operator==(const threshold&, const threshold&) = default;
};

template <class S>
concept selector = requires(S& s, std::span<const float> x, std::size_t k) {
  { s.select(x, k) } -> std::same_as<threshold>;
  { S::is_exact } -> std::convertible_to<bool>;
  { S::name } -> std::convertible_to<const char*>;
};

// k for a density in (0, 1]: ceil(density * n), so a positive density never selects nothing from a
// non-empty vector.
inline std::size_t k_for_density(std::size_t n, double density) {
  commsgd::detail::check_range("density", density, std::nextafter(0.0, 1.0), 1.0, "(0, 1]");
  const double k = std::ceil(density * static_cast<double>(n));
  return k >= static_cast<double>(n) ? n : static_cast<std::size_t>(k);
}

// The largest count an approximate method may return for k and tolerance tol: ceil((1 + tol) k). The
// product is formed so that round-off cannot push an exact integer one above (k = 100, tol = 0.01 -> 101).
inline std::size_t count_limit(std::size_t k, double tol) {
  commsgd::detail::check_range("tol", tol, 0.0, 1e9, "[0, 1e9]");
  const double extra = std::ceil(tol * static_cast<double>(k) * (1.0 - 1e-12));
  return k + static_cast<std::size_t>(extra);
}

inline void check_k(std::size_t k, std::size_t n) {
  if (k > n)
    throw invalid_argument(
        commsgd::detail::concat("argument 'k' = ", k, " is outside the allowed range [0, N = ", n, "]"));
}

} // namespace commsgd::inline v1::select
