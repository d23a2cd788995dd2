// The round of sync::first_arrivals on a communicator that runs in real time (comm::local, comm::mpi): real
// sleeps, real deadlines, the first n - s arrivals at the root.
//
// A delay (sync/delays.hpp) is a real sleep before the vector leaves, in 1 ms slices, watching for the sum.
// A message of an earlier round found in one of the root's receives is late: it is drained (counted in
// report().late) and never decoded, and messages of one pair arrive in order, so none is counted twice or in
// the wrong round. If n - s answers have not arrived within timeout_s, the root sends "failed" to every rank
// and every rank throws coding::stragglers_exceeded for that round; a rank that hears nothing from the root
// within its own timeout throws comm_error. Nothing waits unboundedly. drain() (the strategy's finish())
// takes in every message in flight: each rank sends a last "close" vector to the root.
#pragma once

#include <commsgd/coding/gradient_code.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/poll.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sync/first_arrivals/options.hpp>
#include <commsgd/sync/first_arrivals/wire.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>

namespace commsgd::inline v1::sync {

namespace detail {

template <comm::communicator C>
class first_arrivals_real_round : protected first_arrivals_wire<C> {
  using base = first_arrivals_wire<C>;

protected:
  using typename base::request_type;
  using clock = comm::poll_clock;
  using base::comm_, base::opt_, base::d_, base::tags_, base::up_, base::down_, base::sends_, base::results_,
      base::mine_, base::sum_, base::step_, base::drained_, base::report_;
  using base::send_buffer, base::post, base::copy_payload, base::put_payload, base::too_few,
      base::decode_into;

  first_arrivals_real_round(C& c, std::size_t length, const first_arrivals_options& o) : base(c, length, o) {}

  // Real time: sleeps, the first n - s arrivals at the root, late messages drained.
  template <class Code>
  void run_round(Code& code) {
    const int n = comm_->size(), me = comm_->rank(), root = opt_.root;
    const std::size_t words = arrival_header_words + d_;
    const auto start = clock::now();
    const double delay = report_.delay_s;
    const bool stopped = !std::isfinite(delay);
    const auto ready = stopped ? clock::time_point::max() : after(start, delay);
    if (n == 1) {
      if (stopped) throw too_few(code, 0);
      std::this_thread::sleep_until(ready);
      report_.responders = report_.used = 1;
      report_.sent = true;
      const std::span<const float> own[1] = {mine_};
      code.decode(1, std::span<const std::span<const float>>(own), sum_);
      return;
    }
    if (me != root) {
      down_request_ = comm_->irecv(std::span<std::uint32_t>(down_), root, tags_[1]);
      bool have_sum = false;
      // Wait out the delay in slices, giving up if the sum comes first.
      while (!stopped && clock::now() < ready) {
        if ((have_sum = down_request_.test())) break;
        std::this_thread::sleep_for(
            std::min<clock::duration>(std::chrono::milliseconds(1), ready - clock::now()));
      }
      if (!stopped && !have_sum) {
        auto& b = send_buffer(sends_, words);
        put_header(b.buffer, {step_, arrival_status::vector, 0, 0});
        put_payload(b.buffer, mine_);
        b.request = comm_->isend(std::span<const std::uint32_t>(b.buffer), root, tags_[0]);
        b.busy = true;
        report_.sent = true;
      }
      const auto deadline = after(stopped ? start : ready, opt_.timeout_s * 2);
      if (!have_sum) wait_until([&] { return down_request_.test(); }, deadline, "the root's sum");
      const auto h = get_header(down_);
      if (h.round != step_ || (h.status != arrival_status::sum && h.status != arrival_status::failed))
        throw corrupt_data(commsgd::concat("first_arrivals: rank ", me, " expected the sum of round ", step_,
                                           " from the root and got status ",
                                           static_cast<std::uint32_t>(h.status), " of round ", h.round));
      report_.responders = h.set;
      if (h.status == arrival_status::failed) throw too_few(code, static_cast<int>(h.count));
      report_.used = code.used(h.set);
      copy_payload(down_, sum_);
      return;
    }

    // The root.
    for (int k = 0; k < n; ++k)
      if (k != root) post(k);
    const int needed = code.needed();
    coding::node_set responders = 0;
    int answered = 0;
    const auto deadline = after(start, opt_.timeout_s);
    auto progress = [&] {
      for (int k = 0; k < n; ++k) {
        if (k == root || coding::contains(responders, k)) continue;
        auto& u = up_[static_cast<std::size_t>(k)];
        if (!u.posted || !u.request.test()) continue;
        u.posted = false;
        const auto h = get_header(u.buffer);
        if (h.status != arrival_status::vector || h.round > step_)
          throw corrupt_data(commsgd::concat("first_arrivals: the root got status ",
                                             static_cast<std::uint32_t>(h.status), " of round ", h.round,
                                             " from rank ", k, " in round ", step_));
        if (h.round == step_ && answered < needed) {
          responders |= coding::node_bit(k);
          ++answered;
          continue; // its buffer is read by the decode, then posted again
        }
        ++report_.late;
        ++drained_;
        post(k);
      }
      if (!coding::contains(responders, root) && answered < needed && clock::now() >= ready) {
        responders |= coding::node_bit(root);
        ++answered;
        report_.sent = true;
      }
      return answered >= needed;
    };
    comm::poll_until(progress, deadline); // on the deadline, answered < needed says so below
    report_.responders = responders;
    auto fan_out = [&](arrival_header h, bool with_sum) {
      for (int k = 0; k < n; ++k) {
        if (k == root) continue;
        auto& b = send_buffer(results_, words);
        put_header(b.buffer, h);
        if (with_sum)
          put_payload(b.buffer, sum_);
        else
          std::fill(b.buffer.begin() + arrival_header_words, b.buffer.end(), 0u);
        b.request = comm_->isend(std::span<const std::uint32_t>(b.buffer), k, tags_[1]);
        b.busy = true;
      }
    };
    if (answered < needed) {
      for (int k = 0; k < n; ++k)
        if (k != root) post(k);
      fan_out({step_, arrival_status::failed, static_cast<std::uint32_t>(answered), responders}, false);
      throw too_few(code, answered);
    }
    decode_into(code, responders);
    for (int k = 0; k < n; ++k)
      if (k != root) post(k);
    fan_out({step_, arrival_status::sum, static_cast<std::uint32_t>(answered), responders}, true);
  }

  // Each rank sends "close" to the root, which reads until it has every rank's close. Collective.
  void drain() {
    if (comm_->size() == 1) return;
    const std::size_t words = arrival_header_words + d_;
    if (comm_->rank() != opt_.root) {
      auto& b = send_buffer(sends_, words);
      put_header(b.buffer, {step_, arrival_status::close, 0, 0});
      b.request = comm_->isend(std::span<const std::uint32_t>(b.buffer), opt_.root, tags_[0]);
      b.busy = true;
      for (auto& s : sends_)
        if (s.busy) wait_bounded(s.request, "the root to take this rank's messages at finish");
      return;
    }
    for (int k = 0; k < comm_->size(); ++k) {
      if (k == opt_.root) continue;
      auto& u = up_[static_cast<std::size_t>(k)];
      for (;;) {
        post(k);
        wait_bounded(u.request, "a rank's close message at finish");
        u.posted = false;
        const auto h = get_header(u.buffer);
        if (h.status == arrival_status::close) break;
        ++drained_;
      }
    }
    for (auto& s : sends_)
      if (s.busy) wait_bounded(s.request, "the ranks to take the last sums at finish");
  }

private:
  static clock::time_point after(clock::time_point t, double seconds) {
    return t + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  }

  void wait_bounded(request_type& r, const char* what) {
    const auto deadline = after(clock::now(), opt_.timeout_s);
    wait_until([&] { return r.test(); }, deadline, what);
  }

  // The message gives the time really waited: a rank's wait for the sum may start before its delay ends
  // and lasts 2 x timeout_s (the root's own wait, then the sum's way down).
  template <class Done>
  void wait_until(Done&& done, clock::time_point deadline, const char* what) {
    const auto entered = clock::now();
    if (!comm::poll_until(done, deadline))
      throw comm_error(commsgd::concat("first_arrivals: rank ", comm_->rank(), " waited ",
                                       std::chrono::duration<double>(clock::now() - entered).count(),
                                       " s for ", what, " in round ", step_, " (timeout_s = ", opt_.timeout_s,
                                       "; the root's sum is waited for twice that)"));
  }

  request_type down_request_{};
};

} // namespace detail

} // namespace commsgd::inline v1::sync
