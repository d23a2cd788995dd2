// How sparsifiers treat NaN and infinity in a gradient, and the checks they share.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/validate.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace commsgd::inline v1::sparsify {

enum class non_finite_policy : std::uint8_t {
  refuse, // throw commsgd::non_finite with the count and first index (the default: a NaN is a bug upstream)
  zero,   // treat each NaN or inf entry as 0 this step, so one bad sample does not poison the residual
};

namespace detail {

inline bool is_finite_bits(float x) noexcept {
  return select::magnitude_key(x) < select::infinite_key;
}

// Throws non_finite naming `what` when x holds NaN or inf: the selectors' check (count and first index),
// run as a separate slow pass only once a fused pass has already seen a bad key.
inline void throw_non_finite(std::span<const float> x, std::string_view what) {
  select::check_finite(x, what);
}

inline void check_gradient_size(std::size_t got, std::size_t length) {
  if (got != length)
    throw size_mismatch(
        commsgd::concat("argument 'gradient' has ", got, " elements, the sparsifier's length is ", length));
}

} // namespace detail
} // namespace commsgd::inline v1::sparsify
