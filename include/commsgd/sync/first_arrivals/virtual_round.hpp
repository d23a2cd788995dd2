// The round of sync::first_arrivals over a stack with a comm::simulated layer anywhere in it (its clock
// found by comm::clock_of, comm/clock.hpp): delays are charged to the virtual clock instead of slept.
//
// Ranks exchange their ready times over the innermost communicator (neither charged nor metered), every rank
// computes the same arrival order (ready time + one message), the first n - s send their vectors (charged),
// the root decodes after its receiver has taken them in arrival order, and every clock ends the step at
// decode time + the root's n - 1 sends (one on a multicast medium). Late ranks send nothing: the model knows
// at once that they are late, so nothing is ever in flight between rounds and drain() has nothing to do.
#pragma once

#include <commsgd/coding/gradient_code.hpp>
#include <commsgd/comm/clock.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sync/first_arrivals/options.hpp>
#include <commsgd/sync/first_arrivals/wire.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace commsgd::inline v1::sync {

namespace detail {

template <comm::communicator C>
class first_arrivals_virtual_round : protected first_arrivals_wire<C> {
  using base = first_arrivals_wire<C>;

protected:
  using base::comm_, base::opt_, base::d_, base::tags_, base::up_, base::down_, base::sends_, base::results_,
      base::mine_, base::sum_, base::step_, base::drained_, base::report_;
  using base::send_buffer, base::put_payload, base::copy_payload, base::too_few, base::decode_into;
  using typename base::request_type;

  first_arrivals_virtual_round(C& c, std::size_t length, const first_arrivals_options& o)
      : base(c, length, o) {}

  // Virtual time: ready times shared over the innermost communicator, the clock charged by the model.
  template <class Code>
  void run_round(Code& code) {
    auto& sim = comm::clock_of(*comm_);
    auto& plain = comm::innermost(*comm_); // neither charged nor metered: the model's own bookkeeping
    const auto& net = sim.network();
    const int n = comm_->size(), me = comm_->rank(), root = opt_.root;
    const std::size_t words = arrival_header_words + d_;
    const std::uint64_t bytes = words * sizeof(std::uint32_t);
    const double now = sim.now();
    const double mine[2] = {now, now + report_.delay_s};
    std::vector<double> times(2 * static_cast<std::size_t>(n));
    plain.all_gather(std::span<const double>(mine, 2), std::span<double>(times));
    auto ready = [&](int k) { return times[2 * static_cast<std::size_t>(k) + 1]; };
    const double one = net.seconds(1, bytes);
    std::vector<int> order;
    for (int k = 0; k < n; ++k)
      if (std::isfinite(ready(k))) order.push_back(k);
    auto arrival = [&](int k) { return ready(k) + (k == root ? 0.0 : one); };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return arrival(a) < arrival(b); });
    const int needed = code.needed();
    if (static_cast<int>(order.size()) < needed) throw too_few(code, static_cast<int>(order.size()));
    order.resize(static_cast<std::size_t>(needed));
    coding::node_set responders = 0;
    for (int k : order)
      responders |= coding::node_bit(k);
    // The root's receiver takes the vectors one after the other, in arrival order.
    double decode_at = times[2 * static_cast<std::size_t>(root)];
    for (int k : order) {
      if (k == root)
        decode_at = std::max(decode_at, ready(k));
      else
        decode_at = std::max(decode_at, ready(k)) + one;
    }
    const double fan_out =
        net.medium == comm::medium::multicast
            ? (n > 1 ? one : 0.0)
            : net.seconds(static_cast<std::uint64_t>(n - 1), static_cast<std::uint64_t>(n - 1) * bytes);
    const double end = decode_at + fan_out;
    report_.responders = responders;
    report_.sent = coding::contains(responders, me);

    if (me != root) {
      if (report_.sent) {
        auto& b = send_buffer(sends_, words);
        put_header(b.buffer, {step_, arrival_status::vector, 0, 0});
        put_payload(b.buffer, mine_);
        b.request = comm_->isend(std::span<const std::uint32_t>(b.buffer), root, tags_[0]);
        b.busy = true;
      }
      comm_->recv(std::span<std::uint32_t>(down_), root, tags_[1]);
      const auto h = get_header(down_);
      if (h.round != step_ || h.status != arrival_status::sum)
        throw corrupt_data(commsgd::concat("first_arrivals: rank ", me, " expected the sum of round ", step_,
                                           " and got status ", static_cast<std::uint32_t>(h.status),
                                           " of round ", h.round));
      report_.used = code.used(h.set);
      copy_payload(down_, sum_);
      for (auto& s : sends_)
        if (s.busy) {
          s.request.wait();
          s.busy = false;
        }
    } else {
      for (int k : order)
        if (k != root) {
          comm_->recv(std::span<std::uint32_t>(up_[static_cast<std::size_t>(k)].buffer), k, tags_[0]);
          const auto h = get_header(up_[static_cast<std::size_t>(k)].buffer);
          if (h.round != step_ || h.status != arrival_status::vector)
            throw corrupt_data(commsgd::concat("first_arrivals: the root expected rank ", k,
                                               "'s vector of round ", step_, " and got round ", h.round));
        }
      decode_into(code, responders);
      std::vector<request_type> pending;
      auto& b = send_buffer(results_, words);
      put_header(b.buffer, {step_, arrival_status::sum, static_cast<std::uint32_t>(needed), responders});
      put_payload(b.buffer, sum_);
      for (int k = 0; k < n; ++k)
        if (k != root) pending.push_back(comm_->isend(std::span<const std::uint32_t>(b.buffer), k, tags_[1]));
      for (auto& r : pending)
        r.wait();
    }
    sim.advance(std::max(0.0, end - sim.now()));
  }

  // Every round completes its own messages.
  void drain() {}
};

} // namespace detail

} // namespace commsgd::inline v1::sync
