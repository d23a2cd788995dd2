// A network model measured on the communicator itself, for a choice (choose_exchange.hpp) whose user does not
// state latency and bandwidth. Two ring all-reduces are timed: a tiny one, where messages cost only their
// latency, and a large one, where bytes dominate; the model's two numbers follow from the ring's message and
// byte counts (comm::load::all_reduce). Every rank returns the same model: each number is the worst over the
// ranks, since a synchronous exchange waits for its slowest link.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::sync {

struct measure_network_options {
  std::size_t large_floats = std::size_t{1} << 20; // the large all-reduce: 4 MiB
  int repeats = 5;                                 // each timing is the fastest of this many
};

// Collective.
template <comm::communicator C>
comm::network_model measure_network(C& comm, measure_network_options o = {}) {
  commsgd::check_range("large_floats", o.large_floats, std::size_t{1024}, std::size_t{1} << 30,
                       "[1024, 2^30]");
  commsgd::check_range("repeats", o.repeats, 1, 1000, "[1, 1000]");
  comm::network_model net;
  const int n = comm.size();
  if (n <= 1) return {0, std::numeric_limits<double>::infinity()};
  const auto fastest = [&](std::size_t floats) {
    std::vector<float> buf(floats, 1.0f);
    double best = std::numeric_limits<double>::infinity();
    for (int t = 0; t < o.repeats; ++t) {
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      comm.all_reduce_sum(std::span<float>(buf));
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double small = fastest(1), large = fastest(o.large_floats);
  const auto ring = comm::load::all_reduce(o.large_floats, sizeof(float), n, comm.rank());
  const double messages = static_cast<double>(ring.messages_sent);
  const double bytes = static_cast<double>(std::max(ring.bytes_sent, ring.bytes_received));
  const std::array<double, 2> mine{small / messages, (large - small) / bytes}; // latency, seconds a byte
  std::vector<double> all(2 * static_cast<std::size_t>(n));
  comm.all_gather(std::span<const double>(mine), std::span<double>(all));
  double latency = 0, per_byte = 0;
  for (int r = 0; r < n; ++r) {
    latency = std::max(latency, all[2 * static_cast<std::size_t>(r)]);
    per_byte = std::max(per_byte, all[2 * static_cast<std::size_t>(r) + 1]);
  }
  net.latency_s = latency;
  // A large all-reduce no slower than a tiny one means bytes cost nothing measurable.
  net.bandwidth_bytes_per_s = per_byte > 0 ? 1.0 / per_byte : std::numeric_limits<double>::infinity();
  return net;
}

} // namespace commsgd::inline v1::sync
