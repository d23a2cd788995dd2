// The compressor concept: a gradient compression scheme that runs its own exchange.
//
// A sparsifier (sparsify/sparsifier.hpp) hands one message per rank to sparsify::exchanger; a compressor
// owns the whole round instead, because each scheme sums in its own way: PowerSGD all-reduces two factor
// matrices with an orthogonalisation between them, fp16/bf16 all-reduce in a narrow type, signs and
// quantised values are gathered and decoded rank by rank. Models live one per header in compress/.
//
// Contract every model keeps:
// - x.reduce(c, g, out) is collective: g is this rank's gradient (exactly length() values), out (length()
//   values) receives the sum over ranks of what each rank's message decodes to, the same bits on every
//   rank; the comm::exchange_report says what went on the wire (dense: carried by an all-reduce; total and counts: values
//   or pairs over all ranks and per rank).
// - Error feedback, where the model has it: what a message does not carry stays in the rank's state.
// - Bad input (wrong sizes, non-finite values) raises a commsgd::error on every rank, never a hang.
// - save/load round-trip the whole state through a versioned, checksummed stream (state/stream.hpp);
//   a truncated, corrupt or foreign stream raises commsgd::corrupt_data and leaves the state untouched.
// - wire_bytes() is what this rank sent in the last round, equal to the model's cost function in cost/.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/exchange_report.hpp>
#include <commsgd/config.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <vector>

namespace commsgd::inline v1::compress {

template <class X, class C>
concept compressor = std::movable<X> && comm::communicator<C> &&
    requires(X& x, const X& cx, C& c, std::span<const float> g, std::span<float> out, std::ostream& os,
             std::istream& is) {
  { X::name } -> std::convertible_to<const char*>;
  { cx.length() } -> std::same_as<std::size_t>;
  { cx.steps() } -> std::same_as<std::uint64_t>;
  { cx.wire_bytes() } -> std::same_as<std::uint64_t>;
  { x.reduce(c, g, out) } -> std::same_as<comm::exchange_report>;
  cx.save(os);
  x.load(is);
};

// A compressor whose round comes in two halves and leaves its sum unwritten. x.code(in) codes this rank's
// input of length() values with no communication, taking it a stretch at a time: in(first, m) returns a
// span of the input's values [first, first + m), called for adjacent stretches in rising order (so a caller
// can form the input as it is read, and change the memory it came from once code() returns). Then
// x.reduce_coded(c) is the collective rest of reduce() (the verdicts, the exchange, the residual committed),
// and x.for_each_sum_part(scratch, f) calls f(first, part) for parts that cover [0, length()) in rising
// order, part[j] the value reduce() would have written at first + j, each made in `scratch`; valid until the
// next round. x.sum_surely_finite() says that no value of that sum is NaN or inf (false: they must be
// tested). For a caller that forms the input and reads the sum once each (sync::diloco's pseudo-gradient and
// outer step): neither goes to memory and back.
namespace detail {
// The callables summed_in_parts is checked with (named types: nvcc takes no lambda in a requires-expression).
struct input_stretch_archetype {
  std::span<const float> operator()(std::size_t, std::size_t) const { return {}; }
};
struct sum_part_archetype {
  void operator()(std::size_t, std::span<const float>) const {}
};
} // namespace detail

template <class X, class C>
concept summed_in_parts = compressor<X, C> &&
    requires(X& x, const X& cx, C& c, std::vector<float>& scratch, detail::input_stretch_archetype in,
             detail::sum_part_archetype f) {
  x.code(in);
  { x.reduce_coded(c) } -> std::same_as<comm::exchange_report>;
  { cx.sum_surely_finite() } -> std::same_as<bool>;
  cx.for_each_sum_part(scratch, f);
};

namespace detail {

// The smallest thing that is a compressor: the concept's own check, independent of the real models.
struct compressor_archetype {
  static constexpr const char* name = "archetype";
  std::size_t length() const noexcept { return 0; }
  std::uint64_t steps() const noexcept { return 0; }
  std::uint64_t wire_bytes() const noexcept { return 0; }
  template <comm::communicator C>
  comm::exchange_report reduce(C&, std::span<const float>, std::span<float>) {
    return {};
  }
  void save(std::ostream&) const {}
  void load(std::istream&) {}
};

} // namespace detail

static_assert(compressor<detail::compressor_archetype, comm::archetype>);

} // namespace commsgd::inline v1::compress
