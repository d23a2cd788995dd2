// What a modelled cluster would take: compute measured on this machine, communication charged by a model.
#pragma once

#include <commsgd/comm/metered.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>

namespace fmnist {

// Compute time of the calling thread. Ranks are threads sharing two cores with other work, so wall time
// (steady_clock) would charge each rank for the time it waited for a core; the thread's CPU clock is what
// one dedicated core per node would spend. `--clock steady` switches to wall time.
class compute_clock {
public:
  explicit compute_clock(bool use_wall) : wall_(use_wall) {}
  double now() const {
    if (wall_)
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }

private:
  bool wall_;
};

// Latency-bandwidth model of one full-duplex port per node on a switch: each message pays alpha, and the
// busier direction of the port sets the transfer time. It reproduces the textbook figures of the collectives
// the meter charges (ring all-reduce: 2(n-1) alpha + 2(n-1)/n d/B; all-gather by unicast: (n-1)(alpha +
// d/B)).
struct alpha_beta {
  double alpha_s = 20e-6; // per message
  double gbit_per_s = 1.0;

  double seconds(const commsgd::comm::traffic& t) const {
    const double msgs = static_cast<double>(std::max(t.messages_sent, t.messages_received));
    const double bytes = static_cast<double>(std::max(t.bytes_sent, t.bytes_received));
    return msgs * alpha_s + bytes * 8.0 / (gbit_per_s * 1e9);
  }
};

inline commsgd::comm::traffic operator-(commsgd::comm::traffic a, const commsgd::comm::traffic& b) {
  a.calls -= b.calls;
  a.messages_sent -= b.messages_sent;
  a.messages_received -= b.messages_received;
  a.bytes_sent -= b.bytes_sent;
  a.bytes_received -= b.bytes_received;
  return a;
}

} // namespace fmnist
