// comm::all_to_all: block j of what every rank sends goes to rank j, which keeps the blocks from all ranks in
// rank order. Blocks have one size, the same on every rank (a reduce-scatter's parts, say, coded).
//
//   comm::all_to_all(c, send, recv, tag);   // send: n blocks, recv: n blocks of the same size
//
// Built on the concept's isend and irecv, so every communicator has it and comm::metered counts what it puts
// on the wire as point-to-point bytes; a rank's own block is copied, never sent. Every receive is posted
// before any send, so no rank waits on a peer that is itself waiting. `tag` must be one that nothing else
// posts receives on while the call runs (comm/tags.hpp).
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace commsgd::inline v1::comm {

// comm::all_to_all_traffic (comm/traffic.hpp) is what one rank sends and receives.
template <communicator C, transferable T>
void all_to_all(C& c, std::span<const T> send, std::span<T> recv, int tag) {
  const auto n = static_cast<std::size_t>(c.size());
  if (send.size() % n != 0)
    throw invalid_argument(commsgd::concat("comm::all_to_all: argument 'send' holds ", send.size(),
                                           " elements; the allowed sizes are multiples of the ", n, " ranks"));
  if (recv.size() != send.size())
    throw invalid_argument(commsgd::concat("comm::all_to_all: argument 'recv' holds ", recv.size(),
                                           " elements; the allowed size is send's, ", send.size()));
  const std::size_t block = send.size() / n;
  const auto me = static_cast<std::size_t>(c.rank());
  using request = decltype(c.irecv(recv.first(0), 0, tag));
  std::vector<request> pending;
  pending.reserve(2 * n);
  for (std::size_t r = 0; r < n; ++r)
    if (r != me) pending.push_back(c.irecv(recv.subspan(r * block, block), static_cast<int>(r), tag));
  for (std::size_t r = 0; r < n; ++r)
    if (r != me) pending.push_back(c.isend(send.subspan(r * block, block), static_cast<int>(r), tag));
  std::copy_n(send.begin() + static_cast<std::ptrdiff_t>(me * block), block,
              recv.begin() + static_cast<std::ptrdiff_t>(me * block));
  for (auto& p : pending)
    p.wait();
}

} // namespace commsgd::inline v1::comm
