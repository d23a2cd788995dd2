// comm::metered<C>: wraps any communicator and counts the bytes and messages each rank sends and receives.
//
// Point-to-point traffic is counted as it is. A collective's traffic depends on the algorithm the transport
// picks, which a wrapper cannot see, so collectives are charged by fixed, documented algorithms: the ones a
// cost model (cost/) states and a reader can check by hand.
//   all_reduce_sum  the ring (comm/traffic.hpp: ring_all_reduce_traffic).
//   all_gather      each rank sends its block to the n-1 others and receives theirs (all_gather_traffic).
//   all_gather_v    likewise, with each rank's own count; sizes travel as 8-byte counts to every other rank
//                   (all_gather_v_traffic).
//   broadcast       the root sends the buffer to the n-1 others; each other rank receives it once.
//   barrier         counted as calls only.
// Counters are per rank and shared with every communicator split from this one, so a rank's total covers
// its sub-communicators too.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/send_recv.hpp>
#include <commsgd/comm/traffic.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

namespace commsgd::inline v1::comm {

// One rank's counters, by operation kind.
class meter {
public:
  const traffic& operator[](op_kind k) const noexcept { return per_op_[static_cast<std::size_t>(k)]; }
  traffic& operator[](op_kind k) noexcept { return per_op_[static_cast<std::size_t>(k)]; }
  traffic total() const noexcept {
    traffic t;
    for (const auto& p : per_op_)
      t += p;
    return t;
  }
  void reset() noexcept { per_op_ = {}; }

private:
  std::array<traffic, static_cast<std::size_t>(op_kind_count)> per_op_{};
};

template <communicator C>
class metered {
public:
  using request_type = request_t<C>;

  explicit metered(C inner) : inner_(std::move(inner)), meter_(std::make_shared<meter>()) {}

  int rank() const noexcept { return inner_.rank(); }
  int size() const noexcept { return inner_.size(); }

  // This rank's counters (shared with communicators split from this one).
  const meter& counters() const noexcept { return *meter_; }
  void reset() noexcept { meter_->reset(); }
  C& inner() noexcept { return inner_; }

  void barrier() {
    inner_.barrier();
    ++(*meter_)[op_kind::barrier].calls;
  }

  template <reducible T>
  void all_reduce_sum(std::span<T> data) {
    inner_.all_reduce_sum(data);
    charge(op_kind::all_reduce, ring_all_reduce_traffic(data.size(), sizeof(T), size(), rank()));
  }

  template <transferable T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    inner_.all_gather(mine, all);
    charge(op_kind::all_gather, all_gather_traffic(mine.size_bytes(), size()));
  }

  template <transferable T>
  std::vector<std::size_t> all_gather_v(std::span<const T> mine, std::vector<T>& all) {
    auto counts = inner_.all_gather_v(mine, all);
    charge(op_kind::all_gather_v,
           all_gather_v_traffic(mine.size_bytes(), (all.size() - mine.size()) * sizeof(T), size()));
    return counts;
  }

  template <transferable T>
  void broadcast(std::span<T> data, int root) {
    inner_.broadcast(data, root);
    charge(op_kind::broadcast, broadcast_traffic(data.size_bytes(), size(), rank(), root));
  }

  template <transferable T>
  void send(std::span<const T> data, int dest, int tag) {
    inner_.send(data, dest, tag);
    charge(op_kind::point_to_point, 1, 0, data.size_bytes(), 0);
  }

  template <transferable T>
  void recv(std::span<T> data, int source, int tag) {
    inner_.recv(data, source, tag);
    charge(op_kind::point_to_point, 0, 1, 0, data.size_bytes());
  }

  // Present where the inner communicator has it (comm/send_recv.hpp), charged as an isend and an irecv.
  template <transferable T>
  void send_recv_sized(std::span<const T> send, int dest, std::span<T> recv, int source,
                       int tag) requires sized_exchange<C, T> {
    inner_.send_recv_sized(send, dest, recv, source, tag);
    charge(op_kind::point_to_point, 1, 0, send.size_bytes(), 0);
    charge(op_kind::point_to_point, 0, 1, 0, recv.size_bytes());
  }

  // Non-blocking traffic is charged when posted: the sizes are known then, and a posted operation either
  // completes or the group fails.
  template <transferable T>
  request_type isend(std::span<const T> data, int dest, int tag) {
    auto r = inner_.isend(data, dest, tag);
    charge(op_kind::point_to_point, 1, 0, data.size_bytes(), 0);
    return r;
  }

  template <transferable T>
  request_type irecv(std::span<T> data, int source, int tag) {
    auto r = inner_.irecv(data, source, tag);
    charge(op_kind::point_to_point, 0, 1, 0, data.size_bytes());
    return r;
  }

  metered split(int color, int key) {
    ++(*meter_)[op_kind::barrier].calls;
    return metered(inner_.split(color, key), meter_);
  }

private:
  metered(C inner, std::shared_ptr<meter> m) : inner_(std::move(inner)), meter_(std::move(m)) {}

  void charge(op_kind k, const traffic& t) {
    auto& c = (*meter_)[k];
    c += t;
    ++c.calls;
  }

  void charge(op_kind k, std::uint64_t msent, std::uint64_t mrecv, std::uint64_t bsent, std::uint64_t brecv) {
    auto& t = (*meter_)[k];
    ++t.calls;
    t.messages_sent += msent;
    t.messages_received += mrecv;
    t.bytes_sent += bsent;
    t.bytes_received += brecv;
  }

  C inner_;
  std::shared_ptr<meter> meter_;
};

static_assert(communicator<metered<archetype>>);

} // namespace commsgd::inline v1::comm
