// comm::archetype: the least a type must provide to be a communicator. Declared only, never defined: generic
// code checked against it uses nothing beyond the concept.
#pragma once

#include <commsgd/comm/communicator.hpp>

namespace commsgd::inline v1::comm {

struct archetype_request {
  void wait();
  bool test();
};

struct archetype {
  using request_type = archetype_request;
  int rank() const;
  int size() const;
  void barrier();
  template <reducible T>
  void all_reduce_sum(std::span<T>);
  template <transferable T>
  void all_gather(std::span<const T>, std::span<T>);
  template <transferable T>
  std::vector<std::size_t> all_gather_v(std::span<const T>, std::vector<T>&);
  template <transferable T>
  void broadcast(std::span<T>, int root);
  template <transferable T>
  void send(std::span<const T>, int dest, int tag);
  template <transferable T>
  void recv(std::span<T>, int source, int tag);
  template <transferable T>
  archetype_request isend(std::span<const T>, int dest, int tag);
  template <transferable T>
  archetype_request irecv(std::span<T>, int source, int tag);
  archetype split(int color, int key);
};

static_assert(communicator<archetype>);

} // namespace commsgd::inline v1::comm
