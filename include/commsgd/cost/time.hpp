// Per-node link loads and seconds of every exchange in coding/ on comm::simulated's network model.
// comm::simulated charges operations through the same comm::load functions and comm::busy_seconds, so an
// exchange run on a fresh simulated clock reads exactly (bit for bit) the seconds these functions return.
//
// What the medium changes, per node (G = C(n-1, r), L = ceil(d / r), s = element size):
//   all-gather      switched: n-1 transmissions of d*s; multicast: 1 transmission; n-1 receptions either way
//   cssgd           switched: r*G transmissions of L*s (flat broadcast); multicast: G; r*G receptions
//   unicast, ring all-reduce, uncoded shuffle: point-to-point, no change
// Receptions do not shrink on any medium, and a node's time is the larger of its two sides, so a multicast
// medium shortens an exchange only where transmission was the bottleneck.
#pragma once

#include <commsgd/coding/cssgd.hpp>
#include <commsgd/coding/subsets.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/cost/coding_traffic.hpp>

#include <algorithm>
#include <cstdint>

namespace commsgd::inline v1::cost {

inline comm::traffic all_gather_load(int n, std::uint64_t d, std::size_t element_size,
                                     const comm::network_model& net) {
  commsgd::coding::check_nodes_and_redundancy(n, 1);
  return comm::load::all_gather(d * element_size, n, net.medium);
}

// By enumeration of this node's groups, so that binomial-tree broadcasts (whose load depends on where a node
// stands in each group) are exact too.
inline comm::traffic cssgd_load(int n, int r, std::uint64_t d, std::size_t element_size, int rank,
                                const comm::network_model& net) {
  commsgd::coding::check_nodes_and_redundancy(n, r);
  detail::check_node(n, rank);
  using namespace commsgd::coding;
  comm::traffic l;
  if (r == n) return l;
  const std::uint64_t bytes = cssgd_packet_length(d, r) * element_size;
  const std::uint64_t groups = binomial(n - 1, r);
  // Every group has r+1 members and this node stands at some position in it; the load of one group's r+1
  // broadcasts depends only on that position, so count positions over this node's groups.
  std::vector<std::uint64_t> at_position(static_cast<std::size_t>(r + 1), 0);
  if (net.medium == comm::medium::multicast || net.broadcast == comm::broadcast_algorithm::flat) {
    at_position[0] = groups; // every position has the same load under these rules
  } else {
    for (node_set g : subsets_lex(n, r + 1))
      if (contains(g, rank)) ++at_position[static_cast<std::size_t>(position_in(g, rank))];
  }
  for (int pos = 0; pos <= r; ++pos) {
    const auto count = at_position[static_cast<std::size_t>(pos)];
    if (count == 0) continue;
    comm::traffic one;
    for (int root = 0; root <= r; ++root)
      one += comm::load::broadcast(bytes, r + 1, root, pos, net);
    l.messages_sent += count * one.messages_sent;
    l.bytes_sent += count * one.bytes_sent;
    l.messages_received += count * one.messages_received;
    l.bytes_received += count * one.bytes_received;
  }
  return l;
}

// The exchanges the cost model and the benchmarks compare.
enum class exchange_kind { ring_all_reduce, all_gather, unicast, uncoded_shuffle, cssgd };

inline const char* exchange_name(exchange_kind k) noexcept {
  switch (k) {
  case exchange_kind::ring_all_reduce:
    return "ring_all_reduce";
  case exchange_kind::all_gather:
    return "all_gather";
  case exchange_kind::unicast:
    return "unicast";
  case exchange_kind::uncoded_shuffle:
    return "uncoded_shuffle";
  case exchange_kind::cssgd:
    return "cssgd";
  }
  return "unknown";
}

// One node's bytes and messages for an exchange, as comm::metered counts them; r is ignored by the uncoded
// exchanges.
inline comm::traffic exchange_traffic(exchange_kind k, int n, int r, std::uint64_t d,
                                      std::size_t element_size, int rank) {
  switch (k) {
  case exchange_kind::ring_all_reduce:
    return ring_all_reduce(n, d, element_size, rank);
  case exchange_kind::all_gather:
    return all_gather(n, d, element_size);
  case exchange_kind::unicast:
    return unicast(n, d, element_size);
  case exchange_kind::uncoded_shuffle:
    return uncoded_shuffle(n, r, d, element_size, rank);
  case exchange_kind::cssgd:
    return cssgd(n, r, d, element_size);
  }
  return {};
}

// One node's load for an exchange: what exchange_traffic counts, but for the two whose load depends on the
// network (all-gather on a multicast medium, CSSGD's broadcast trees); r is ignored by the uncoded exchanges.
inline comm::traffic exchange_load(exchange_kind k, int n, int r, std::uint64_t d, std::size_t element_size,
                                   int rank, const comm::network_model& net) {
  switch (k) {
  case exchange_kind::all_gather:
    return all_gather_load(n, d, element_size, net);
  case exchange_kind::cssgd:
    return cssgd_load(n, r, d, element_size, rank, net);
  default:
    return exchange_traffic(k, n, r, d, element_size, rank);
  }
}

// Seconds node `rank` is busy with the exchange.
inline double exchange_seconds(exchange_kind k, int n, int r, std::uint64_t d, std::size_t element_size,
                               int rank, const comm::network_model& net) {
  return comm::busy_seconds(exchange_load(k, n, r, d, element_size, rank, net), net);
}

// Seconds until the slowest node is done: the step time when every node starts together.
inline double exchange_seconds_slowest(exchange_kind k, int n, int r, std::uint64_t d,
                                       std::size_t element_size, const comm::network_model& net) {
  double worst = 0;
  for (int i = 0; i < n; ++i)
    worst = std::max(worst, exchange_seconds(k, n, r, d, element_size, i, net));
  return worst;
}

} // namespace commsgd::inline v1::cost
