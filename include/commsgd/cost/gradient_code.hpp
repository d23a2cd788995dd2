// Per-node messages and bytes of the gradient-code exchanges, as comm::metered counts them.
//
// sync::first_arrivals sends one message per vector and per sum, each 6 header words and d float words
// (m = 4 (6 + d) bytes), whatever the redundancy: a code costs r times the compute, not r times the bytes.
//   a rank other than the root   per round: one vector sent (none when it was late or stopped), one sum
//                                received; at finish one close message sent
//   the root                     per round: n - 1 sums sent, every message that arrived received (the
//                                round's vectors and late ones of earlier rounds); at finish the rest
// Over a whole run every vector a rank sends reaches the root exactly once, so the totals depend only on how
// many vectors each rank sent (first_arrivals_run). Under policy::synchronous the scheme all-gathers the
// vectors: n - 1 messages of 4 d bytes each way (cost::all_gather).
#pragma once

#include <commsgd/cost/coding_traffic.hpp>

#include <cstdint>
#include <span>

namespace commsgd::inline v1::cost {

inline constexpr std::uint64_t first_arrivals_message_bytes(std::uint64_t d) noexcept {
  return 4 * (6 + d);
}

// One round on `rank`: whether it sent its vector and, on the root, how many messages it took in.
inline comm::traffic first_arrivals_round(int n, std::uint64_t d, int rank, int root, bool sent,
                                          std::uint64_t received = 0) {
  commsgd::coding::check_nodes_and_redundancy(n, 1);
  detail::check_node(n, rank);
  detail::check_node(n, root);
  const std::uint64_t m = first_arrivals_message_bytes(d);
  if (n == 1) return {};
  if (rank == root) {
    const auto peers = static_cast<std::uint64_t>(n - 1);
    return {peers, peers * m, received, received * m};
  }
  return {sent ? 1u : 0u, sent ? m : 0, 1, m};
}

// A real-time run of `rounds` rounds and finish(), where vectors[k] is how many vectors rank k sent.
inline comm::traffic first_arrivals_run(int n, std::uint64_t d, int rank, int root, std::uint64_t rounds,
                                        std::span<const std::uint64_t> vectors) {
  commsgd::coding::check_nodes_and_redundancy(n, 1);
  detail::check_node(n, rank);
  detail::check_node(n, root);
  if (vectors.size() != static_cast<std::size_t>(n))
    throw size_mismatch(commsgd::concat("argument 'vectors' holds ", vectors.size(),
                                        " counts; it must hold one per rank, n = ", n));
  const std::uint64_t m = first_arrivals_message_bytes(d);
  if (n == 1) return {};
  if (rank == root) {
    std::uint64_t in = 0;
    for (int k = 0; k < n; ++k)
      if (k != root) in += vectors[static_cast<std::size_t>(k)] + 1; // its vectors and its close
    const auto out = rounds * static_cast<std::uint64_t>(n - 1);
    return {out, out * m, in, in * m};
  }
  const auto out = vectors[static_cast<std::size_t>(rank)] + 1;
  return {out, out * m, rounds, rounds * m};
}

} // namespace commsgd::inline v1::cost
