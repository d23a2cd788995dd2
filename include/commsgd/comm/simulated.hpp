// comm::simulated<C>: wraps any communicator and keeps a virtual clock per rank, charged from a network
// model, so a 2-core machine can report what n nodes on a given network would see, reproducibly.
//
// The model (network_model) is deliberately simple, so that cost/ can state it in closed form and a reader
// can check it by hand:
// - Every node has a full-duplex link: a transmitter and a receiver that work at the same time. Sending or
//   receiving one message of m bytes keeps that side busy for alpha + m / bandwidth seconds.
// - A rank's clock is base + max(transmit time, receive time) over the traffic since the last advance():
//   traffic is assumed perfectly overlapped and never waiting on a peer. This is the NIC-bound time, a lower
//   bound for a good implementation; who waits for whom is not modelled unless you call align_to_slowest().
// - duplex::half (not the default) charges transmit time + receive time instead: a transport that moves one
//   direction at a time, such as Open MPI's ob1 over TCP: its default RDMA-emulating PUT protocol (taken
//   for large messages) serialises the two directions of an exchange between two processes, so its pairwise
//   algorithms (every 2-rank exchange, recursive doubling, Rabenseifner) take the sum; a ring of 3 or more
//   ranks sends and receives on different connections and keeps full duplex. Without the PUT flag
//   (btl_tcp_flags send,inplace,need-ack,need-csum,hetero-rdma) the same exchanges are full duplex again.
// - medium::switched: a message to k receivers is k transmissions. medium::multicast: one transmission
//   reaches any number of receivers (broadcast and all_gather use it); point-to-point is unchanged.
// - Collectives are charged by fixed algorithms, per rank:
//     all_reduce_sum, all_gather, all_gather_v  as comm::metered counts them (comm/traffic.hpp); on a
//                     multicast medium an all-gather is one transmission and p-1 receptions.
//     broadcast       flat: the root transmits p-1 copies; binomial_tree: each rank transmits to its
//                     children in the tree rooted at root; every other rank receives once. On a multicast
//                     medium the root transmits once whatever the algorithm.
//     barrier, split  dissemination: ceil(log2 p) empty messages each way.
// - advance(t) adds compute time: base becomes now() + t and the link load starts again from zero, since
//   the step's communication cannot overlap computation that comes after it.
// The clock is shared with every communicator split from this one (it is the rank's clock, not the group's).
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace commsgd::inline v1::comm {

enum class medium { switched, multicast };
enum class broadcast_algorithm { flat, binomial_tree };
// How a node's link carries its two directions (see the header comment): full, both at once, busy for the
// longer side; half, one at a time, busy for their sum.
enum class duplex { full, half };

struct network_model {
  double latency_s = 50e-6;             // alpha, per message
  double bandwidth_bytes_per_s = 125e6; // 1 Gbit/s
  comm::medium medium = comm::medium::switched;
  broadcast_algorithm broadcast = broadcast_algorithm::flat;
  comm::duplex duplex = comm::duplex::full;

  // The one formula every charge goes through, so cost/ can reproduce a clock bit for bit.
  double seconds(std::uint64_t messages, std::uint64_t bytes) const noexcept {
    return latency_s * static_cast<double>(messages) + static_cast<double>(bytes) / bandwidth_bytes_per_s;
  }

  static network_model gigabit(comm::medium m = comm::medium::switched) { return {50e-6, 125e6, m}; }

  // A link of `bits_per_s` as TCP sees it: of every full frame of `mtu` bytes of IP plus `framing` bytes that
  // the shaper or the wire also counts, TCP delivers mtu - 52 (IPv4 20, TCP with timestamps 32). framing = 14
  // for a token bucket on a veth (it counts the Ethernet header); 38 on a physical Ethernet port (header,
  // frame check, preamble and inter-frame gap). 1500 and 14: 1448 of 1514 bytes, 95.6 % of the rate.
  static network_model tcp_link(double bits_per_s, double latency_s = 50e-6, int mtu = 1500, int framing = 14,
                                comm::medium m = comm::medium::switched) {
    if (!(mtu > 52 && mtu <= 65536))
      throw invalid_argument(commsgd::concat("network_model::tcp_link: 'mtu' = ", mtu,
                                             " is outside the allowed range [53, 65536]"));
    if (framing < 0)
      throw invalid_argument(commsgd::concat("network_model::tcp_link: 'framing' = ", framing,
                                             " is outside the allowed range [0, inf)"));
    const double payload = static_cast<double>(mtu - 52) / static_cast<double>(mtu + framing);
    network_model net{latency_s, bits_per_s / 8 * payload, m};
    net.validate();
    return net;
  }

  void validate() const {
    if (!(std::isfinite(latency_s) && latency_s >= 0))
      throw invalid_argument(commsgd::concat("network_model: 'latency_s' = ", latency_s,
                                             " is outside the allowed range [0, inf)"));
    if (!(std::isfinite(bandwidth_bytes_per_s) && bandwidth_bytes_per_s > 0))
      throw invalid_argument(
          commsgd::concat("network_model: 'bandwidth_bytes_per_s' = ", bandwidth_bytes_per_s,
                          " is outside the allowed range (0, inf)"));
    if (duplex != comm::duplex::full && duplex != comm::duplex::half)
      throw invalid_argument(commsgd::concat("network_model: 'duplex' = ", static_cast<int>(duplex),
                                             " is neither duplex::full nor duplex::half"));
  }
};

// Seconds a load keeps a node busy: its transmitter and receiver work in parallel (duplex::full), or one
// after the other (duplex::half).
inline double busy_seconds(const traffic& l, const network_model& net) noexcept {
  const double tx = net.seconds(l.messages_sent, l.bytes_sent);
  const double rx = net.seconds(l.messages_received, l.bytes_received);
  return net.duplex == duplex::half ? tx + rx : std::max(tx, rx);
}

// Per-rank loads of each operation, as simulated<C> charges them (cost/ uses the same functions).
namespace load {

inline std::uint64_t log2_ceil(int p) noexcept {
  return p <= 1 ? 0 : static_cast<std::uint64_t>(std::bit_width(static_cast<unsigned>(p - 1)));
}

inline traffic barrier(int p) noexcept {
  const auto k = log2_ceil(p);
  return {k, 0, k, 0};
}

inline traffic all_reduce(std::uint64_t elements, std::size_t element_size, int p, int rank) noexcept {
  return ring_all_reduce_traffic(elements, element_size, p, rank);
}

// A multicast medium changes only the transmit side: one transmission reaches every peer.
inline traffic all_gather(std::uint64_t bytes, int p, medium m) noexcept {
  auto t = all_gather_traffic(bytes, p);
  if (m == medium::multicast && p > 1) {
    t.messages_sent = 1;
    t.bytes_sent = bytes;
  }
  return t;
}

inline traffic all_gather_v(std::uint64_t my_bytes, std::uint64_t others_bytes, int p, medium m) noexcept {
  auto t = all_gather_v_traffic(my_bytes, others_bytes, p);
  if (m == medium::multicast && p > 1) {
    t.messages_sent = 1;
    t.bytes_sent = my_bytes + sizeof(std::uint64_t);
  }
  return t;
}

inline traffic broadcast(std::uint64_t bytes, int p, int root, int rank, const network_model& net) noexcept {
  if (p <= 1) return {};
  traffic l;
  if (rank != root) {
    l.messages_received = 1;
    l.bytes_received = bytes;
  }
  std::uint64_t sends = 0;
  if (net.medium == medium::multicast) {
    sends = rank == root ? 1 : 0;
  } else if (net.broadcast == broadcast_algorithm::flat) {
    sends = rank == root ? static_cast<std::uint64_t>(p - 1) : 0;
  } else {
    // Binomial tree on ranks relative to the root: v sends to v + 2^k for every 2^k > v below p.
    const auto v = static_cast<unsigned>((rank - root + p) % p);
    for (unsigned step = 1; step < static_cast<unsigned>(p); step <<= 1)
      if (step > v && v + step < static_cast<unsigned>(p)) ++sends;
  }
  l.messages_sent = sends;
  l.bytes_sent = sends * bytes;
  return l;
}

inline traffic send(std::uint64_t bytes) noexcept {
  return {1, bytes, 0, 0};
}
inline traffic receive(std::uint64_t bytes) noexcept {
  return {0, 0, 1, bytes};
}

} // namespace load

// One rank's virtual clock.
struct virtual_clock {
  double base = 0;
  traffic load;
};

template <communicator C>
class simulated {
public:
  using request_type = request_t<C>;

  simulated(C inner, network_model net)
      : inner_(std::move(inner)), net_(net), clock_(std::make_shared<virtual_clock>()) {
    net_.validate();
  }

  int rank() const noexcept { return inner_.rank(); }
  int size() const noexcept { return inner_.size(); }
  C& inner() noexcept { return inner_; }
  const network_model& network() const noexcept { return net_; }

  // This rank's virtual time in seconds.
  double now() const noexcept { return clock_->base + busy_seconds(clock_->load, net_); }
  // Traffic charged since the last advance(), reset() or align_to_slowest().
  const traffic& load() const noexcept { return clock_->load; }

  // Adds measured or modelled computation after the communication charged so far.
  void advance(double seconds) {
    if (!(std::isfinite(seconds) && seconds >= 0))
      throw invalid_argument(
          commsgd::concat("argument 'seconds' = ", seconds, " is outside the allowed range [0, inf)"));
    clock_->base = now() + seconds;
    clock_->load = {};
  }

  void reset() noexcept { *clock_ = {}; }

  // Collective: every rank's clock becomes the latest now() of the group, as if all waited for the slowest.
  // It travels over the inner communicator and is not charged: wrap metered<> outside simulated<> to keep
  // byte counts clean.
  double align_to_slowest() {
    const double mine = now();
    std::vector<double> all(static_cast<std::size_t>(size()));
    inner_.all_gather(std::span<const double>(&mine, 1), std::span<double>(all));
    clock_->base = *std::max_element(all.begin(), all.end());
    clock_->load = {};
    return clock_->base;
  }

  void barrier() {
    inner_.barrier();
    charge(load::barrier(size()));
  }

  template <reducible T>
  void all_reduce_sum(std::span<T> data) {
    inner_.all_reduce_sum(data);
    charge(load::all_reduce(data.size(), sizeof(T), size(), rank()));
  }

  template <transferable T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    inner_.all_gather(mine, all);
    charge(load::all_gather(mine.size_bytes(), size(), net_.medium));
  }

  template <transferable T>
  std::vector<std::size_t> all_gather_v(std::span<const T> mine, std::vector<T>& all) {
    auto counts = inner_.all_gather_v(mine, all);
    charge(
        load::all_gather_v(mine.size_bytes(), (all.size() - mine.size()) * sizeof(T), size(), net_.medium));
    return counts;
  }

  template <transferable T>
  void broadcast(std::span<T> data, int root) {
    inner_.broadcast(data, root);
    charge(load::broadcast(data.size_bytes(), size(), root, rank(), net_));
  }

  template <transferable T>
  void send(std::span<const T> data, int dest, int tag) {
    inner_.send(data, dest, tag);
    charge(load::send(data.size_bytes()));
  }

  template <transferable T>
  void recv(std::span<T> data, int source, int tag) {
    inner_.recv(data, source, tag);
    charge(load::receive(data.size_bytes()));
  }

  // Charged when posted, like comm::metered: the size is known then.
  template <transferable T>
  request_type isend(std::span<const T> data, int dest, int tag) {
    auto r = inner_.isend(data, dest, tag);
    charge(load::send(data.size_bytes()));
    return r;
  }

  template <transferable T>
  request_type irecv(std::span<T> data, int source, int tag) {
    auto r = inner_.irecv(data, source, tag);
    charge(load::receive(data.size_bytes()));
    return r;
  }

  simulated split(int color, int key) {
    auto sub = inner_.split(color, key);
    charge(load::barrier(size()));
    return simulated(std::move(sub), net_, clock_);
  }

private:
  simulated(C inner, network_model net, std::shared_ptr<virtual_clock> clock)
      : inner_(std::move(inner)), net_(net), clock_(std::move(clock)) {}

  void charge(const traffic& l) noexcept { clock_->load += l; }

  C inner_;
  network_model net_;
  std::shared_ptr<virtual_clock> clock_;
};

static_assert(communicator<simulated<archetype>>);

} // namespace commsgd::inline v1::comm
