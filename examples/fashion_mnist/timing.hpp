// What a modelled cluster would take: compute measured on this machine, communication charged by
// commsgd::comm::simulated.
#pragma once

#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/simulated.hpp>

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

// The modelled network. Communication time is not computed here: the per-rank communicator is wrapped in
// comm::simulated, whose network_model charges every message (alpha + bytes / bandwidth on each side of a
// full-duplex link, the busier side sets the time; a switched medium, so a multicast to k nodes is k
// transmissions). This struct only holds the two bandwidths the trainer reports: the one the simulated clock
// runs on, and a second one evaluated from the same per-step link loads with the same formula.
struct network_options {
  double gbit_per_s = 1.0;
  double alpha_s = 50e-6; // network_model::gigabit()'s latency
  double alt_gbit_per_s = 10.0;

  commsgd::comm::network_model model(double gbps) const {
    commsgd::comm::network_model m;
    m.latency_s = alpha_s;
    m.bandwidth_bytes_per_s = gbps * 1e9 / 8.0;
    m.medium = commsgd::comm::medium::switched;
    return m;
  }
  commsgd::comm::network_model primary() const { return model(gbit_per_s); }
  commsgd::comm::network_model alternative() const { return model(alt_gbit_per_s); }
};

} // namespace fmnist
