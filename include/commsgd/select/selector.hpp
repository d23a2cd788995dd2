// The selector concept: find the magnitude threshold of the k largest |x_i|.
//
// Models (select/<name>.hpp, each with a CUDA counterpart behind commsgd/cuda.cuh):
//   exact           nth_element on |x|; exact
//   radix           radix select on magnitude keys with a candidate buffer; exact
//   laplace_bisect  Laplace tail estimate, then multi-candidate bisection; approximate (or exact with trim)
//   hierarchical    per-segment top candidates, then an exact select among them; exact
//   sampled         threshold from a strided sample, corrected; approximate
// and on the host only:
//   chunked         every chunk of a vector in one call (select_chunks), each warm-started from its own last
//                   threshold, its pairs written as they are found; exact (the top-k codes' small chunks)
//
// Contract:
// - x must be finite (NaN or inf raise commsgd::non_finite with the count and first index);
//   0 <= k <= x.size().
// - Order is by |x| with -0 == +0. The selection is {i : |x_i| > value} plus the first `at` indices with
//   |x_i| == value, so a result is always a definite set of indices.
// - Exact methods select exactly k (ties at the threshold go to the lowest indices: deterministic, and the
//   same set on CPU and GPU).
// - Approximate methods select every |x_i| >= value and land in [k, ceil((1 + tol) k)]; where they cannot
//   (more than tol k values tie at the threshold) they raise commsgd::unsupported saying so.
// - k == 0 gives value = +inf and an empty set; k == N selects everything.
// - Exactness: S::is_exact says every object of S is exact, whatever its options; an object of a method
//   that options can make exact (laplace_bisect and sampled with trim) says so through exact(), and
//   selects_exactly(s) asks whichever the object has. Code that sizes buffers for, or checks the count of,
//   one selector's results asks selects_exactly, not is_exact.
// - Determinism: exact methods are deterministic (the same set on every run, on CPU and GPU). Approximate
//   methods need not be run to run: the CUDA laplace_bisect's cold call sums |x| with double atomics, whose
//   order varies, so the threshold can differ in its last bits between runs (every result still meets the
//   [k, ceil((1 + tol) k)] contract). Where ranks or runs must agree bit for bit, use an exact method or
//   trim (trimmed results are the exact set whatever threshold the search found).
// - Warm start: a call that raises (non-finite input, ties beyond the tolerance) does not become the next
//   call's warm start; the state stays what the last successful call left.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
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

// A selector that also takes every chunk of a vector in one call (select/chunked.hpp): chunk j of x is
// x[j size, min((j + 1) size, x.size())), k_of(j) of its values go to idx (relative to the chunk, rising) and
// val, chunk after chunk. The top-k codes call it once a round instead of once a chunk, or once for each run
// of chunks as their values are formed (select_chunk_range: chunks [j0, j1) alone).
template <class S>
concept chunk_selector = selector<S> &&
    requires(S& s, std::span<const float> x, std::span<std::uint32_t> i, std::span<float> v) {
  {s.select_chunks(
      x, std::size_t{}, [](std::size_t) { return std::size_t{}; }, i, v)};
  {s.select_chunk_range(
      x, std::size_t{}, [](std::size_t) { return std::size_t{}; }, std::size_t{}, std::size_t{}, i, v)};
};

// Whether this selector object selects exactly k (see the contract above); host and device selectors alike.
template <class S>
constexpr bool selects_exactly(const S& s) noexcept {
  if constexpr (requires {
                  { s.exact() } -> std::convertible_to<bool>;
                })
    return s.exact();
  else
    return S::is_exact;
}

// k for a density in (0, 1]: ceil(density * n), so a positive density never selects nothing from a
// non-empty vector.
inline std::size_t k_for_density(std::size_t n, double density) {
  commsgd::check_range("density", density, std::nextafter(0.0, 1.0), 1.0, "(0, 1]");
  const double k = std::ceil(density * static_cast<double>(n));
  return k >= static_cast<double>(n) ? n : static_cast<std::size_t>(k);
}

// The one check of a tolerance, shared by every approximate method on host and device.
inline void check_tolerance(double tol) {
  commsgd::check_range("tol", tol, 0.0, 1e9, "[0, 1e9]");
}

// The largest count an approximate method may return for k and tolerance tol: ceil((1 + tol) k), with tol
// read as the fraction it stands for. A double is rarely the decimal a user wrote (0.1 is
// 0.1000000000000000055...), so (1 + tol) k rounded or taken literally can land one above the intended
// integer (k = 100, tol = 0.1 gives 111). The extra count is instead the least m with m / k >= tol in double
// arithmetic (correctly rounded, the same on host and device): exact whenever tol is the double nearest to
// m / k, and otherwise ceil(tol k). Saturates at the largest std::size_t.
//
// Host and device code share this function. On the host it first checks tol (commsgd::invalid_argument
// outside [0, 1e9]); device code, which cannot throw, takes a tolerance the host has already checked.
COMMSGD_HOST_DEVICE inline std::size_t count_limit(std::size_t k, double tol) {
#if !defined(__CUDA_ARCH__)
  check_tolerance(tol);
#endif
  constexpr std::uint64_t most = ~std::uint64_t{0};
  if (k == 0 || !(tol > 0.0)) return k;
  const double kd = static_cast<double>(k);
  const double product = tol * kd;
  if (!(product < 18446744073709551616.0)) return most; // 2^64
  std::uint64_t m = static_cast<std::uint64_t>(product);
  if (product < 4503599627370496.0 && k <= (std::uint64_t{1} << 53)) {
    // Below 2^52 both m and k are exact doubles and m / k is correctly rounded: step m to the least one
    // whose quotient reaches tol. It starts within one or two of it.
    while (m > 0 && static_cast<double>(m - 1) / kd >= tol)
      --m;
    while (static_cast<double>(m) / kd < tol)
      ++m;
  } else if (static_cast<double>(m) < product) {
    ++m; // ceil; the product's own rounding already exceeds any representation error of tol
  }
  return m > most - k ? most : k + m;
}

inline void check_k(std::size_t k, std::size_t n) {
  if (k > n)
    throw invalid_argument(
        commsgd::concat("argument 'k' = ", k, " is outside the allowed range [0, N = ", n, "]"));
}

} // namespace commsgd::inline v1::select
