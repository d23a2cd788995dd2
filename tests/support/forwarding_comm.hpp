// A communicator that hands every call to an inner one: the base of the tests' communicators that change a
// single call (damage a gathered message, corrupt a broadcast, hold back a send's completion). A test derives,
// hides the call it changes with one of the same name, and gives split, which must return its own type.
#pragma once

#include <commsgd/comm/communicator.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace test_comm {

template <class Inner>
struct forwarding {
  using request_type = typename Inner::request_type;
  Inner inner;

  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  void barrier() { inner.barrier(); }
  template <commsgd::comm::reducible T>
  void all_reduce_sum(std::span<T> d) {
    inner.all_reduce_sum(d);
  }
  template <commsgd::comm::transferable T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    inner.all_gather(mine, all);
  }
  template <commsgd::comm::transferable T>
  std::vector<std::size_t> all_gather_v(std::span<const T> mine, std::vector<T>& all) {
    return inner.all_gather_v(mine, all);
  }
  template <commsgd::comm::transferable T>
  void broadcast(std::span<T> d, int root) {
    inner.broadcast(d, root);
  }
  template <commsgd::comm::transferable T>
  void send(std::span<const T> d, int peer, int tag) {
    inner.send(d, peer, tag);
  }
  template <commsgd::comm::transferable T>
  void recv(std::span<T> d, int peer, int tag) {
    inner.recv(d, peer, tag);
  }
  template <commsgd::comm::transferable T>
  request_type isend(std::span<const T> d, int peer, int tag) {
    return inner.isend(d, peer, tag);
  }
  template <commsgd::comm::transferable T>
  request_type irecv(std::span<T> d, int peer, int tag) {
    return inner.irecv(d, peer, tag);
  }
};

} // namespace test_comm
