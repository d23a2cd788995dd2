// compress::difference: a stretch of a compressor's input given as a - b, value by value. DiLoCo's input is
// the pseudo-gradient theta_global - theta_local; a code that forms p = g + e from it reads both models and
// the residual where they lie and writes p in one pass, instead of one pass writing the difference to a
// buffer and a second reading it back (two of a round's passes over every value, each its own trip through
// the cache).
//
// The protocol of compress::summed_in_parts's code(in): in(first, m) returns the input's values [first,
// first + m) as a span. An input that can also give them as a difference answers in(first, m,
// as_difference); a code that fuses asks through stretch_of(), which falls back on the span. The values are
// sub_rn(a[i], b[i]) (math::delta's bits) either way.
#pragma once

#include <commsgd/rounded.hpp>

#include <cstddef>
#include <span>
#include <type_traits>

namespace commsgd::inline v1::compress {

struct difference {
  std::span<const float> a;
  const float* b = nullptr; // null: the values are a's own

  difference() = default;
  difference(std::span<const float> values) noexcept : a(values) {} // implicit: a span, nothing taken away
  difference(std::span<const float> minuend, const float* subtrahend) noexcept : a(minuend), b(subtrahend) {}

  std::size_t size() const noexcept { return a.size(); }
  float operator[](std::size_t i) const noexcept { return b ? commsgd::detail::sub_rn(a[i], b[i]) : a[i]; }
  difference subspan(std::size_t first, std::size_t m) const noexcept {
    return {a.subspan(first, m), b ? b + first : nullptr};
  }
};

struct as_difference_t {};
inline constexpr as_difference_t as_difference{};

// An input for code(in) made of two callables: `formed`, in(first, m) returning a span, and `as_difference`,
// in(first, m, as_difference) returning a difference.
template <class Formed, class AsDifference>
struct difference_input : Formed, AsDifference {
  using Formed::operator();
  using AsDifference::operator();
};
template <class Formed, class AsDifference>
difference_input(Formed, AsDifference) -> difference_input<Formed, AsDifference>;

// The input's stretch [first, first + m) as a difference: in's own where it gives one, else its span.
template <class In>
difference stretch_of(In& in, std::size_t first, std::size_t m) {
  if constexpr (std::is_invocable_r_v<difference, In&, std::size_t, std::size_t, as_difference_t>)
    return in(first, m, as_difference);
  else
    return difference(std::span<const float>(in(first, m)));
}

} // namespace commsgd::inline v1::compress
