// The wait loop of the strategies that run point-to-point exchanges (async_ps's server, partitioned).
//
// Polling is the only portable way to wait on any of n pending operations: a communicator's requests offer
// test() and wait() on one request, not a wait on the first of many. The loop yields for a while after a
// pass that moved nothing, then sleeps `back_off` between passes, so a rank that waits on peers still
// computing does not burn a core they may share.
#pragma once

#include <commsgd/config.hpp>

#include <chrono>
#include <thread>

namespace commsgd::inline v1::sync::detail {

// Passes without progress that only yield before the loop starts sleeping.
inline constexpr int yields_before_sleep = 64;

// Calls progress() until done(); progress() returns whether anything moved.
template <class Done, class Progress>
void poll_until(Done&& done, Progress&& progress, std::chrono::microseconds back_off) {
  int idle = 0;
  while (!done()) {
    if (progress()) {
      idle = 0;
    } else if (++idle < yields_before_sleep) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(back_off);
    }
  }
}

} // namespace commsgd::inline v1::sync::detail
