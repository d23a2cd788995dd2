// Per-node messages and bytes of every exchange in coding/, as comm::metered counts them, in closed form
// or by exact enumeration. A multicast on a switched network is r unicasts, so it is counted r times here;
// cost/time.hpp states what a true multicast medium changes.
//
// Per node, d values of `element_size` bytes, L = ceil(d / r), G = C(n-1, r):
//   ring all-reduce   comm::ring_all_reduce_traffic: 2(n-1) messages each way, about 2(n-1)/n d values
//   all-gather        comm::all_gather_traffic: n-1 messages of d values each way
//   unicast           the same as all-gather, as n-1 point-to-point messages
//   uncoded shuffle   r*G messages each way; receives G*d values exactly, sends the balanced segments
//                     [d*j/r, d*(j+1)/r) its positions pick (about G*d values; exact by enumeration)
//   cssgd             r*G messages each way (G multicasts of L words, r copies each); r*G*L words each way
#pragma once

#include <commsgd/coding/assignment.hpp>
#include <commsgd/coding/cssgd.hpp>
#include <commsgd/coding/subsets.hpp>
#include <commsgd/coding/uncoded_shuffle.hpp>
#include <commsgd/comm/traffic.hpp>

#include <cstddef>
#include <cstdint>

namespace commsgd::inline v1::cost {

// What a meter counted, as a model states it: models do not count calls.
inline comm::traffic measured(comm::traffic t) noexcept {
  t.calls = 0;
  return t;
}

namespace detail {
inline void check_node(int n, int rank) {
  commsgd::check_range("rank", rank, 0, n - 1, commsgd::concat("[0, n - 1 = ", n - 1, "]"));
}
} // namespace detail

inline comm::traffic ring_all_reduce(int n, std::uint64_t d, std::size_t element_size, int rank) {
  commsgd::coding::check_nodes_and_redundancy(n, 1);
  detail::check_node(n, rank);
  return comm::ring_all_reduce_traffic(d, element_size, n, rank);
}

inline comm::traffic all_gather(int n, std::uint64_t d, std::size_t element_size) {
  commsgd::coding::check_nodes_and_redundancy(n, 1);
  return comm::all_gather_traffic(d * element_size, n);
}

inline comm::traffic unicast(int n, std::uint64_t d, std::size_t element_size) {
  return all_gather(n, d, element_size);
}

inline comm::traffic uncoded_shuffle(int n, int r, std::uint64_t d, std::size_t element_size, int rank) {
  commsgd::coding::check_nodes_and_redundancy(n, r);
  detail::check_node(n, rank);
  using namespace commsgd::coding;
  comm::traffic t;
  if (r == n) return t;
  const std::uint64_t groups = binomial(n - 1, r);
  t.messages_sent = t.messages_received = static_cast<std::uint64_t>(r) * groups;
  t.bytes_received = groups * d * element_size;
  for (node_set g : subsets_lex(n, r + 1)) {
    if (!contains(g, rank)) continue;
    for (int k : members(g)) {
      if (k == rank) continue;
      const node_set b = g & ~node_bit(k);
      const auto [lo, hi] = balanced_segment(d, r, position_in(b, rank));
      t.bytes_sent += (hi - lo) * element_size;
    }
  }
  return t;
}

inline comm::traffic cssgd(int n, int r, std::uint64_t d, std::size_t element_size = 4) {
  commsgd::coding::check_nodes_and_redundancy(n, r);
  const std::uint64_t copies = static_cast<std::uint64_t>(r) * coding::binomial(n - 1, r);
  const std::uint64_t bytes = copies * coding::cssgd_packet_length(d, r) * element_size;
  return {copies, bytes, copies, bytes};
}

} // namespace commsgd::inline v1::cost
