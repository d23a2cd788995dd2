// The checks the top-k codes of compress/ (top_k_ef, shared_top_k, region_top_k) make of their arguments when
// they are built, before any state is allocated: one message for each, whichever code is built.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/selector.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>

namespace commsgd::inline v1::compress::detail {

// Indices travel as u32.
inline std::size_t checked_top_k_length(std::size_t length) {
  commsgd::check_range("length", length, std::size_t{0},
                       std::size_t{std::numeric_limits<std::uint32_t>::max()}, "[0, 2^32 - 1]");
  return length;
}

// A chunk of [1, 2^32 - 1] values or 0 (one chunk of the whole length), a residual decay in [0, 1].
inline void check_top_k_options(std::size_t chunk, float decay) {
  commsgd::check_range("chunk", chunk, std::size_t{0}, std::size_t{std::numeric_limits<std::uint32_t>::max()},
                       "[0, 2^32 - 1] (0: one chunk of the whole length)");
  commsgd::check_range("decay", decay, 0.0f, 1.0f, "[0, 1]");
}

// A selector that selects exactly k, or the refusal naming it: an approximate one would send a count that
// varies with the data, where every message must have the one size the exchange expects.
template <select::selector S>
S exact_selector(S s) {
  if (!select::selects_exactly(s))
    throw invalid_argument(commsgd::concat("argument 'selector' = ", S::name,
                                           " does not select exactly k; allowed: a selector that does "
                                           "(exact, radix, hierarchical, or laplace_bisect / sampled "
                                           "with options.trim)"));
  return s;
}

} // namespace commsgd::inline v1::compress::detail
