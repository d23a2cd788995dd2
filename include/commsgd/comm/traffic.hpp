// comm::traffic: the messages and bytes one rank sends and receives. comm::metered counts it, comm::simulated
// charges a rank's links with it, and the cost models in cost/ predict it, so a measurement and its model
// compare with ==.
//
// The per-rank traffic of the collective algorithms they all assume lives here too, once, so the meter,
// the simulator and every cost model charge a collective by the same arithmetic:
//   ring all-reduce  reduce-scatter + all-gather over n chunks (chunk j holds m*(j+1)/n - m*j/n elements):
//                    rank i sends every chunk but i+1 and then every chunk but i+2, receives every chunk but
//                    i and then every chunk but i+1 (indices mod n); 2(n-1) messages each way, about
//                    2(n-1)/n of the buffer each way.
//   all-gather       its block to each of the n-1 others and theirs back, ring or direct alike.
//   all-gather-v     likewise, with each rank's own size, and an 8-byte count ahead of every message.
#pragma once

#include <cstddef>
#include <cstdint>

namespace commsgd::inline v1::comm {

struct traffic {
  std::uint64_t messages_sent = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t bytes_received = 0;
  // Collective calls, where the one counting sees them (comm::metered); links and models leave it 0.
  std::uint64_t calls = 0;

  constexpr std::uint64_t bytes() const noexcept { return bytes_sent + bytes_received; }

  constexpr traffic& operator+=(const traffic& o) noexcept {
    messages_sent += o.messages_sent;
    bytes_sent += o.bytes_sent;
    messages_received += o.messages_received;
    bytes_received += o.bytes_received;
    calls += o.calls;
    return *this;
  }
  friend constexpr traffic operator+(traffic a, const traffic& b) noexcept { return a += b; }
  friend constexpr bool operator==(const traffic&, const traffic&) = default;
};

// Elements of chunk j (mod n) when the ring cuts m elements into n chunks.
constexpr std::uint64_t ring_chunk(std::uint64_t m, int n, std::uint64_t j) noexcept {
  const auto un = static_cast<std::uint64_t>(n);
  j %= un;
  return m * (j + 1) / un - m * j / un;
}

// Elements rank `i` sends and receives in a ring all-reduce of m elements over n ranks.
struct ring_share {
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
};
constexpr ring_share ring_all_reduce_share(std::uint64_t m, int n, int i) noexcept {
  if (n <= 1) return {};
  const auto ui = static_cast<std::uint64_t>(i);
  return {2 * m - ring_chunk(m, n, ui + 1) - ring_chunk(m, n, ui + 2),
          2 * m - ring_chunk(m, n, ui) - ring_chunk(m, n, ui + 1)};
}

// A ring all-reduce of `elements` values of `element_size` bytes, seen from `rank` (chunks differ by one
// element between ranks). An empty buffer is still charged its 2(n-1) messages: a wrapper cannot see
// whether the transport skips them.
constexpr traffic ring_all_reduce_traffic(std::uint64_t elements, std::size_t element_size, int n,
                                          int rank) noexcept {
  if (n <= 1) return {};
  const auto share = ring_all_reduce_share(elements, n, rank);
  const auto messages = 2 * static_cast<std::uint64_t>(n - 1);
  return {messages, share.sent * element_size, messages, share.received * element_size};
}

// An all-gather where every rank contributes `bytes`.
constexpr traffic all_gather_traffic(std::uint64_t bytes, int n) noexcept {
  const auto peers = static_cast<std::uint64_t>(n > 1 ? n - 1 : 0);
  return {peers, peers * bytes, peers, peers * bytes};
}

// An all-gather-v where this rank contributes `my_bytes` and the others `others_bytes` in all.
constexpr traffic all_gather_v_traffic(std::uint64_t my_bytes, std::uint64_t others_bytes, int n) noexcept {
  const auto peers = static_cast<std::uint64_t>(n > 1 ? n - 1 : 0);
  constexpr std::uint64_t count = sizeof(std::uint64_t);
  return {peers, peers * (my_bytes + count), peers, others_bytes + peers * count};
}

// An all-to-all of `bytes` a block: its block to each of the n-1 others, theirs back (comm/all_to_all.hpp).
// A broadcast of `bytes` from `root`: the root sends the buffer to the n - 1 others, each other rank receives it
// once.
constexpr traffic broadcast_traffic(std::uint64_t bytes, int n, int rank, int root) noexcept {
  const auto peers = static_cast<std::uint64_t>(n > 1 ? n - 1 : 0);
  if (rank == root) return {peers, peers * bytes, 0, 0};
  return {0, 0, 1, bytes};
}

constexpr traffic all_to_all_traffic(std::uint64_t bytes, int n) noexcept { return all_gather_traffic(bytes, n); }

} // namespace commsgd::inline v1::comm
