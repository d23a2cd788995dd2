// The one wait loop for point-to-point exchanges: comm::mpi's bounded waits, the strategies that wait on any
// of n pending operations (async_ps's server, partitioned, first_arrivals).
//
// Polling is the only portable way to wait on any of n pending operations: a communicator's requests offer
// test() and wait() on one request, not a wait on the first of many; and MPI cannot cancel a blocking call, so
// a wait with a deadline has to poll too. The loop yields for a while after a pass that moved nothing, then
// sleeps `back_off` between passes, so a rank that waits on peers still computing (or on a slow link) does
// not burn a core they may share.
#pragma once

#include <commsgd/config.hpp>

#include <chrono>
#include <thread>
#include <type_traits>

namespace commsgd::inline v1::comm {

// What one pass of a poll loop found.
enum class poll_step {
  done,  // what was waited for has happened
  moved, // something progressed: poll again at once
  idle,  // nothing moved: back off before the next pass
};

using poll_clock = std::chrono::steady_clock;

// Passes without progress that only yield before the loop starts sleeping.
inline constexpr int yields_before_sleep = 64;

// The sleep between idle passes once the loop stops yielding: short against any exchange worth waiting on,
// long enough that a waiting rank leaves the core to its neighbours.
inline constexpr std::chrono::microseconds default_back_off{50};

// Calls pass() until it returns poll_step::done (true) or `deadline` has passed (false: the caller words
// the timeout, it knows what was waited for). pass() may also return a bool: true for done, false for idle.
// The deadline is checked after every pass that was not done, so a pass that always moves cannot outrun it.
template <class Pass>
bool poll_until(Pass&& pass, poll_clock::time_point deadline = poll_clock::time_point::max(),
                std::chrono::microseconds back_off = default_back_off) {
  int idle = 0;
  for (;;) {
    poll_step s;
    if constexpr (std::is_same_v<decltype(pass()), bool>)
      s = pass() ? poll_step::done : poll_step::idle;
    else
      s = pass();
    if (s == poll_step::done) return true;
    if (poll_clock::now() > deadline) return false;
    if (s == poll_step::moved) {
      idle = 0;
    } else if (++idle < yields_before_sleep) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(back_off);
    }
  }
}

} // namespace commsgd::inline v1::comm
