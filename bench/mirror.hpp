// bench::mirror: rank 0 of n ranks whose every peer sends exactly what this rank does, for timing one rank's
// local work in a collective without a network or other ranks (bench/diloco_bench.cpp,
// bench/reduce_scatter_bench.cpp). all_gather replicates this rank's contribution, all_reduce_sum multiplies
// by n, broadcast does nothing; point-to-point is a loopback per tag, in order: what this rank sends is what
// its next matching receive gets, so a ring's hops or an all-to-all's blocks do their real codec work on this
// rank's own data instead of a neighbour's.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <vector>

namespace bench {

using namespace commsgd;

// Point-to-point state shared by a mirror and its requests: receives posted and not yet matched, and sends
// that arrived before their receive, per tag, in order.
struct loopback {
  struct recv_slot {
    std::span<std::byte> into;
    bool done = false;
  };
  std::map<int, std::deque<std::shared_ptr<recv_slot>>> posted;
  std::map<int, std::deque<std::vector<std::byte>>> early;

  static void fill(std::span<std::byte> into, std::span<const std::byte> from) {
    // Chunks of a ring differ by at most one value when n does not divide d: the neighbour's chunk is then
    // this rank's own, cut or repeated to the size asked for.
    if (from.empty()) return;
    for (std::size_t at = 0; at < into.size(); at += from.size())
      std::memcpy(into.data() + at, from.data(), std::min(from.size(), into.size() - at));
  }
  void send(std::span<const std::byte> b, int tag) {
    auto& q = posted[tag];
    if (!q.empty()) {
      fill(q.front()->into, b);
      q.front()->done = true;
      q.pop_front();
      return;
    }
    early[tag].emplace_back(b.begin(), b.end());
  }
  std::shared_ptr<recv_slot> post(std::span<std::byte> into, int tag) {
    auto s = std::make_shared<recv_slot>(recv_slot{into});
    auto& e = early[tag];
    if (!e.empty()) {
      fill(into, e.front());
      e.pop_front();
      s->done = true;
    } else {
      posted[tag].push_back(s);
    }
    return s;
  }
};

struct mirror_request {
  std::shared_ptr<loopback::recv_slot> slot; // null for a send (complete at once)
  void wait() {
    if (slot && !slot->done) throw comm_error("bench::mirror: a receive with no matching send");
  }
  bool test() { return !slot || slot->done; }
};

class mirror {
public:
  using request_type = mirror_request;
  explicit mirror(int n) : n_(n), p2p_(std::make_shared<loopback>()) {}

  int rank() const { return 0; }
  int size() const { return n_; }
  void barrier() {}
  // The sum's write in place, at memory speed as a transport's would be: 64 values a group, a loop the
  // compiler vectorises at -O2 (a loop of unknown length stays scalar there, at about half the speed).
  template <comm::reducible T>
  void all_reduce_sum(std::span<T> x) {
    const T n = static_cast<T>(n_);
    T* const p = x.data();
    std::size_t i = 0;
    for (; i + 64 <= x.size(); i += 64)
      for (std::size_t j = i; j < i + 64; ++j)
        p[j] = p[j] * n;
    for (; i < x.size(); ++i)
      p[i] = p[i] * n;
  }
  template <comm::transferable T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    for (int r = 0; r < n_; ++r)
      std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(r * mine.size()));
  }
  template <comm::transferable T>
  std::vector<std::size_t> all_gather_v(std::span<const T> mine, std::vector<T>& all) {
    all.resize(mine.size() * static_cast<std::size_t>(n_));
    all_gather(mine, std::span<T>(all));
    return std::vector<std::size_t>(static_cast<std::size_t>(n_), mine.size());
  }
  template <comm::transferable T>
  void broadcast(std::span<T>, int) {}
  template <comm::transferable T>
  void send(std::span<const T> b, int, int tag) {
    p2p_->send(std::as_bytes(b), tag);
  }
  template <comm::transferable T>
  void recv(std::span<T> b, int, int tag) {
    mirror_request{p2p_->post(std::as_writable_bytes(b), tag)}.wait();
  }
  template <comm::transferable T>
  mirror_request isend(std::span<const T> b, int, int tag) {
    p2p_->send(std::as_bytes(b), tag);
    return {};
  }
  template <comm::transferable T>
  mirror_request irecv(std::span<T> b, int, int tag) {
    return {p2p_->post(std::as_writable_bytes(b), tag)};
  }
  mirror split(int, int) { return mirror(n_); }

private:
  int n_;
  std::shared_ptr<loopback> p2p_;
};

static_assert(comm::communicator<mirror>);

} // namespace bench
