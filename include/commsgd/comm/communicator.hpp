// The communicator concept: everything an exchange in commsgd needs from a transport.
//
// Models (each satisfies `communicator`, checked by static_asserts in its own header):
//   comm::local          ranks are threads of one process           (comm/local.hpp)
//   comm::mpi            Boost.MPI over an existing MPI_Comm          (comm/mpi.hpp, target commsgd::mpi)
//   comm::process_group  a torch.distributed (c10d) process group    (comm/process_group.hpp, commsgd::torch)
//   comm::metered<C>     counts bytes and messages of any C          (comm/metered.hpp)
//   comm::over_messages<C> any C's collectives run out of its own messages  (comm/over_messages.hpp)
//   comm::simulated<C>   charges a modelled network clock for any C  (comm/simulated.hpp)
//
// Semantics every model keeps:
// - Collectives are called by every rank of the communicator in the same order with compatible sizes.
// - all_reduce_sum is in place and deterministic: every rank receives the same bits.
// - all_gather takes equal contributions; `all.size() == size() * mine.size()`, rank-major.
// - all_gather_v takes any contribution (empty too), resizes `all` to the total and returns each rank's
// count.
// - Point-to-point messages between a pair of ranks with the same tag arrive in the order they were sent;
//   a receive names its exact element count, and a message of another size is a comm_error.
// - isend/irecv return a request; the buffer must stay alive and untouched until wait() or a true test().
// - split(color, key) is collective; ranks with equal color form a new communicator ordered by (key, rank).
// - Invalid ranks, roots, tags or colors raise commsgd::invalid_argument; counts are 64-bit.
#pragma once

#include <commsgd/config.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

namespace commsgd::inline v1::comm {

// Element types all_reduce_sum supports natively (MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T, MPI_UINT32_T).
template <class T>
concept reducible = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
    std::same_as<T, std::uint32_t>;

// Anything sent as raw bytes.
template <class T>
concept transferable = std::is_trivially_copyable_v<T> && !std::is_const_v<T>;

// The handle of a non-blocking operation.
template <class R>
concept request = std::movable<R> && requires(R& r) {
  r.wait();
  { r.test() } -> std::same_as<bool>;
};

// Operation kinds, used by the byte meter and the network model.
enum class op_kind : int { barrier, all_reduce, all_gather, all_gather_v, broadcast, point_to_point, count_ };
inline constexpr int op_kind_count = static_cast<int>(op_kind::count_);

inline constexpr const char* op_kind_name(op_kind k) noexcept {
  switch (k) {
  case op_kind::barrier:
    return "barrier";
  case op_kind::all_reduce:
    return "all_reduce";
  case op_kind::all_gather:
    return "all_gather";
  case op_kind::all_gather_v:
    return "all_gather_v";
  case op_kind::broadcast:
    return "broadcast";
  case op_kind::point_to_point:
    return "point_to_point";
  default:
    return "unknown";
  }
}

template <class C>
concept communicator = std::movable<C> &&
    requires(C& c, const C& cc, std::span<float> f, std::span<double> d, std::span<std::int32_t> i32,
             std::span<std::uint32_t> u32, std::span<const std::byte> cbytes, std::span<std::byte> bytes,
             std::span<const float> cf, std::vector<float>& vf, int peer, int tag) {
  { cc.rank() } -> std::same_as<int>;
  { cc.size() } -> std::same_as<int>;
  c.barrier();
  c.all_reduce_sum(f);
  c.all_reduce_sum(d);
  c.all_reduce_sum(i32);
  c.all_reduce_sum(u32);
  c.all_gather(cbytes, bytes);
  c.all_gather(cf, f);
  { c.all_gather_v(cf, vf) } -> std::same_as<std::vector<std::size_t>>;
  c.broadcast(f, peer);
  c.broadcast(bytes, peer);
  c.send(cf, peer, tag);
  c.recv(f, peer, tag);
  { c.isend(cbytes, peer, tag) } -> request;
  { c.irecv(bytes, peer, tag) } -> request;
  { c.split(peer, tag) } -> std::same_as<C>;
};

// The request type a communicator's isend/irecv return.
template <communicator C>
using request_t = decltype(std::declval<C&>().isend(std::span<const std::byte>{}, 0, 0));

} // namespace commsgd::inline v1::comm
