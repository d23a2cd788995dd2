// The plain SGD update every strategy applies, and the argument checks they share.
//
// Every strategy that ends with "the mean of n gradient sums" goes through apply_mean_sum, so two strategies
// that reduce in the same order produce the same bits, and a test's single-process reference can call the
// same function to compare bit for bit.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/validate.hpp>

#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>

namespace commsgd::inline v1::sync {

// params <- params - lr * (sum / n), element by element. Dividing before scaling keeps the mean (a value
// users inspect and log) the quantity that is rounded first.
inline void apply_mean_sum(std::span<float> params, std::span<const float> sum, int n, float lr) noexcept {
  const float count = static_cast<float>(n);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const float mean = sum[i] / count;
    params[i] = params[i] - lr * mean;
  }
}

namespace detail {

inline void check_learning_rate(std::string_view name, double lr) {
  if (!(lr > 0.0) || !std::isfinite(lr))
    throw invalid_argument(
        commsgd::concat("argument '", name, "' = ", lr, " is outside the allowed range (0, inf)"));
}

inline void check_same_size(std::string_view what, std::size_t got, std::size_t expected) {
  if (got != expected)
    throw size_mismatch(commsgd::concat("argument '", what, "' has ", got, " elements, expected ", expected));
}

// Design rule: a NaN or inf gradient is never sent; say how many and where the first one is.
inline void require_finite(std::string_view what, std::span<const float> data, std::size_t offset = 0) {
  const auto bad = select::find_non_finite(data);
  if (bad.count > 0) throw non_finite(what, bad.count, offset + bad.first);
}

} // namespace detail
} // namespace commsgd::inline v1::sync
