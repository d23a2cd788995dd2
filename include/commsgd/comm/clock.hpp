// comm::clock_of(c): the clock a rank's time is read from, found through the layers of its communicator.
//
//   auto& sim = comm::clock_of(c); // metered<simulated<local>> or simulated<metered<local>>: the virtual clock
//   auto wall = comm::clock_of(l); // comm::local, metered<local>: comm::wall_clock
//
// A stack with a comm::simulated layer anywhere in it runs on that layer's virtual clock, whatever wraps it or
// lies beneath it; any other stack runs on the wall clock. Which layer owns the time is comm/'s knowledge:
// a strategy that spelt out the nestings it knew (sync::first_arrivals once matched metered<simulated<X>>)
// silently took simulated<metered<X>> for real time and slept through its delays.
//
// A layer is seen through when it exposes its inner communicator as `inner()` (comm::metered and
// comm::simulated do), so a wrapper of your own that does the same needs nothing more. A layer is assumed to
// keep its inner communicator's ranks and to pass each call down, as both of ours do. With two simulated
// layers the outermost one's clock is the stack's.
//
// comm::innermost(c) is the communicator beneath every layer: neither charged to a clock nor metered. What a
// model needs only to run itself (ranks telling each other their virtual ready times) travels there, so the
// clock and the byte counts are those of the algorithm alone, in whichever order the layers are stacked.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/simulated.hpp>

#include <chrono>
#include <concepts>
#include <type_traits>
#include <utility>

namespace commsgd::inline v1::comm {

// What a clock gives: this rank's time in seconds. Differences of now() are durations; the origin is the
// clock's own (a simulated clock's starts at 0, the wall clock's at steady_clock's epoch).
template <class K>
concept timekeeper = requires(const K& k) {
  { k.now() } -> std::same_as<double>;
};

// Real time, monotonic: std::chrono::steady_clock in seconds.
struct wall_clock {
  double now() const noexcept {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
};

namespace detail {

template <class C>
inline constexpr bool is_simulated = false;
template <class X>
inline constexpr bool is_simulated<simulated<X>> = true;

// A wrapper: it hands out the communicator it passes its calls to.
template <class C>
concept layer = requires(C& c) {
  requires communicator<std::remove_cvref_t<decltype(c.inner())>>;
};

template <class C>
consteval bool finds_simulated() {
  if constexpr (is_simulated<C>)
    return true;
  else if constexpr (layer<C>)
    return finds_simulated<std::remove_cvref_t<decltype(std::declval<C&>().inner())>>();
  else
    return false;
}

} // namespace detail

// Whether C's stack holds a comm::simulated layer, so that its time is virtual.
template <class C>
inline constexpr bool runs_on_virtual_time = detail::finds_simulated<C>();

// The outermost comm::simulated layer of c's stack (a reference into c).
template <communicator C>
requires runs_on_virtual_time<C>
auto& simulated_layer(C& c) {
  if constexpr (detail::is_simulated<C>)
    return c;
  else
    return simulated_layer(c.inner());
}

// c's clock: its simulated layer (by reference: now(), advance(), network()) where it has one, else a
// wall_clock.
template <communicator C>
decltype(auto) clock_of(C& c) {
  if constexpr (runs_on_virtual_time<C>)
    return simulated_layer(c);
  else
    return wall_clock{};
}

template <communicator C>
using clock_type = std::remove_cvref_t<decltype(clock_of(std::declval<C&>()))>;

// The communicator beneath every layer of c (c itself when it wraps nothing).
template <communicator C>
auto& innermost(C& c) {
  if constexpr (detail::layer<C>)
    return innermost(c.inner());
  else
    return c;
}

static_assert(timekeeper<wall_clock>);
static_assert(timekeeper<simulated<archetype>>);
static_assert(std::same_as<clock_type<archetype>, wall_clock>);
static_assert(std::same_as<clock_type<metered<simulated<archetype>>>, simulated<archetype>>);
static_assert(std::same_as<clock_type<simulated<metered<archetype>>>, simulated<metered<archetype>>>);

} // namespace commsgd::inline v1::comm
