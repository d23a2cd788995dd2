// The sparsifier concept: turns this rank's gradient into the message it sends, keeping whatever it
// holds back as state for later steps.
//
// Models (each checked by a static_assert in its own header):
//   sparsify::none           sends the gradient as is (dense_view)                 (sparsify/none.hpp)
//   sparsify::top_k<S, I>    top-k by magnitude with error feedback (sparse_view)  (sparsify/top_k.hpp)
//
// Contract every model keeps:
// - step(g) takes a gradient of exactly length() finite values (non_finite otherwise, unless an opt-in
//   policy says how to treat them) and returns a view valid until the next step or load.
// - Nothing is lost: what a step does not send stays in the state, bit for bit.
// - save/load round-trip the whole state bit-exactly through a versioned, checksummed stream; a truncated,
//   corrupt or foreign stream raises commsgd::corrupt_data and leaves the state untouched.
// - message_type is dense_view or sparse_view<I>; sparsify/sparse_exchange.hpp sums either across ranks.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>

namespace commsgd::inline v1::sparsify {

template <class M>
concept message = std::same_as<M, dense_view> || std::same_as<M, sparse_view<std::uint32_t>> ||
    std::same_as<M, sparse_view<std::uint64_t>>;

template <class S>
concept sparsifier = std::movable<S> && message<typename S::message_type> &&
    requires(S& s, const S& cs, std::span<const float> g, std::ostream& os, std::istream& is) {
  { S::name } -> std::convertible_to<const char*>;
  { cs.length() } -> std::same_as<std::size_t>;
  { cs.steps() } -> std::same_as<std::uint64_t>;
  { s.step(g) } -> std::same_as<typename S::message_type>;
  cs.save(os);
  s.load(is);
};

namespace detail {

// The smallest thing that is a sparsifier: the concept's own check, independent of the real models.
struct sparsifier_archetype {
  using message_type = dense_view;
  static constexpr const char* name = "archetype";
  std::size_t length() const noexcept { return 0; }
  std::uint64_t steps() const noexcept { return 0; }
  dense_view step(std::span<const float> g) { return {g}; }
  void save(std::ostream&) const {}
  void load(std::istream&) {}
};

} // namespace detail

static_assert(sparsifier<detail::sparsifier_archetype>);

} // namespace commsgd::inline v1::sparsify
