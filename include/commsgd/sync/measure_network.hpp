// A network model measured on the communicator itself, for a choice (choose_exchange.hpp) whose user does not
// state latency and bandwidth. Two ring all-reduces are timed: a tiny one, where messages cost only their
// latency, and a large one, where bytes dominate; the model's two numbers follow from the ring's message and
// byte counts (comm::ring_all_reduce_traffic). Every rank returns the same model: each number is the worst
// over the ranks, since a synchronous exchange waits for its slowest link.
//
// The arithmetic is fit_network, apart from the timing, so that a caller timing its own collectives (the
// PyTorch package times torch.distributed's, commsgd_torch._C.fit_network) reads the same model from them.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::sync {

struct measure_network_options {
  std::size_t large_floats = std::size_t{1} << 20; // the large all-reduce: 4 MiB
  int repeats = 5;                                 // each timing is the fastest of this many
};

// The model from timed ring all-reduces of floats on n = small_s.size() ranks: small_s[r] and large_s[r]
// are rank r's seconds for a one-float all-reduce and for one of `large_floats` floats. Rank r's latency is
// its small time over its ring's messages and its seconds a byte the large time's excess over the small one,
// over the bytes of the busier direction of its link (chunks differ by an element between ranks); each is
// the worst over the ranks.
inline comm::network_model fit_network(std::span<const double> small_s, std::span<const double> large_s,
                                       std::size_t large_floats) {
  if (small_s.size() != large_s.size())
    throw size_mismatch(commsgd::concat("fit_network: ", small_s.size(), " small timings and ",
                                        large_s.size(), " large ones (one of each per rank)"));
  commsgd::check_range("n", small_s.size(), std::size_t{1}, std::size_t{1} << 20, "[1, 2^20] (one per rank)");
  commsgd::check_range("large_floats", large_floats, std::size_t{1}, std::size_t{1} << 40, "[1, 2^40]");
  for (const auto times : {small_s, large_s})
    for (const double t : times)
      if (!(std::isfinite(t) && t >= 0))
        throw invalid_argument(
            commsgd::concat("fit_network: a timing = ", t, " is outside the allowed range [0, inf)"));
  const int n = static_cast<int>(small_s.size());
  if (n <= 1) return {0, std::numeric_limits<double>::infinity()};
  double latency = 0, per_byte = 0;
  for (int r = 0; r < n; ++r) {
    const auto ring = comm::ring_all_reduce_traffic(large_floats, sizeof(float), n, r);
    const double messages = static_cast<double>(ring.messages_sent);
    const double bytes = static_cast<double>(std::max(ring.bytes_sent, ring.bytes_received));
    const auto k = static_cast<std::size_t>(r);
    latency = std::max(latency, small_s[k] / messages);
    per_byte = std::max(per_byte, (large_s[k] - small_s[k]) / bytes);
  }
  comm::network_model net;
  net.latency_s = latency;
  // A large all-reduce no slower than a tiny one means bytes cost nothing measurable.
  net.bandwidth_bytes_per_s = per_byte > 0 ? 1.0 / per_byte : std::numeric_limits<double>::infinity();
  return net;
}

// Collective.
template <comm::communicator C>
comm::network_model measure_network(C& comm, measure_network_options o = {}) {
  commsgd::check_range("large_floats", o.large_floats, std::size_t{1024}, std::size_t{1} << 30,
                       "[1024, 2^30]");
  commsgd::check_range("repeats", o.repeats, 1, 1000, "[1, 1000]");
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
  const std::array<double, 2> mine{small, large};
  std::vector<double> all(2 * static_cast<std::size_t>(n));
  comm.all_gather(std::span<const double>(mine), std::span<double>(all));
  std::vector<double> small_s(static_cast<std::size_t>(n)), large_s(static_cast<std::size_t>(n));
  for (std::size_t r = 0; r < small_s.size(); ++r) {
    small_s[r] = all[2 * r];
    large_s[r] = all[2 * r + 1];
  }
  return fit_network(small_s, large_s, o.large_floats);
}

} // namespace commsgd::inline v1::sync
