// comm::send_recv: one send and one receive at once, of sizes both ends know, the step of a ring.
//
// Every rank runs the same schedule on lengths it has agreed on (comm::narrow_ring_sum's ring), so neither end
// needs the size from the message. A communicator that can use that says so with a member
//   c.send_recv_sized(send, dest, recv, source, tag)
// (comm::process_group: the payloads alone, posted together and waited for on the caller's thread, where its
// isend/irecv frame each message with a header and wait on threads of their own); any other goes through
// irecv and isend. Both ends of a tag must take the same path: a tag carries sized traffic or framed
// traffic, never both.
#pragma once

#include <commsgd/comm/communicator.hpp>

#include <span>

namespace commsgd::inline v1::comm {

template <class C, class T>
concept sized_exchange = requires(C& c, std::span<const T> s, std::span<T> r, int peer, int tag) {
  c.send_recv_sized(s, peer, r, peer, tag);
};

// Sends `send` to dest and receives exactly recv.size() values from source, both on `tag`; returns when both
// are done.
template <communicator C, transferable T>
void send_recv(C& c, std::span<const T> send, int dest, std::span<T> recv, int source, int tag) {
  if constexpr (sized_exchange<C, T>) {
    c.send_recv_sized(send, dest, recv, source, tag);
  } else {
    auto rr = c.irecv(recv, source, tag);
    auto rs = c.isend(send, dest, tag);
    rs.wait();
    rr.wait();
  }
}

} // namespace commsgd::inline v1::comm
