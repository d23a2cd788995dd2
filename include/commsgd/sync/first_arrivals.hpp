// sync::first_arrivals: synchronous SGD that proceeds with the first n - s answers of a gradient code
// (coding/gradient_code.hpp): exact full-batch gradients without waiting for the s = r - 1 slowest ranks.
//
//   data_parallel<policy::gradient_code<coding::cyclic>, policy::dense, policy::first_arrivals> dp(c, d, o);
//   dp.start(x); for (...) { grads of dp.my_blocks(); dp.step(x, blocks, {.compute_seconds = t}); }
//   dp.finish(x);                                      // drains late messages; required before c goes away
//
// Topology: a decoding root, then a fan-out. Every rank sends its one coded vector to the root (rank
// `root`); the root decodes as soon as it holds n - s of them and sends the sum to every other rank. Why not
// decentralised: with every rank sending to every rank, each would receive n - 1 vectors (the root does that
// alone here), and a ring or tree reduction passes through the slow ranks it is meant to skip; a root needs
// one message from each rank that answers and one message to each rank, and any rank can take the role.
// The root is the bandwidth bottleneck: it receives and sends (n - 1) d values per step, against the ring
// all-reduce's 2 (n - 1) / n d, so this pays where compute, not the network, bounds a step. The root's own
// computing does not hold the step back: if n - s vectors arrive before its own is ready it decodes without
// it (as a communication thread would), and a rank still waiting out its delay when the sum arrives gives
// up its vector for that step.
//
// Wire: each message is 6 header words (round, status, count, responder set) and d words of float bits,
// for the upward vectors and the downward sums alike (status: vector, sum, failed, close). The root keeps
// one receive posted per rank; a message of an earlier round found there is late: it is drained (counted in
// report().late) and never decoded, and messages of one pair arrive in order, so none is counted twice or in
// the wrong round. If n - s answers have not arrived within timeout_s, the root sends "failed" to every rank
// and every rank throws coding::stragglers_exceeded for that round; a rank that hears nothing from the root
// within its own timeout throws comm_error. Nothing waits unboundedly.
//
// Delays (sync/delays.hpp) are drawn per (step, rank) in units of step_info::compute_seconds when given,
// else options.unit_s. Over comm::local and comm::mpi a delay is a real sleep before the vector leaves
// (in 1 ms slices, watching for the sum). Over a stack with a comm::simulated layer anywhere in it (its
// clock found by comm::clock_of, comm/clock.hpp) it is charged to the virtual clock instead: ranks exchange
// their ready times over the innermost communicator (neither charged nor metered), every rank computes the
// same arrival order (ready time + one message), the first n - s send their vectors (charged), the root
// decodes after its receiver has taken them in arrival order, and every clock ends the step at decode
// time + the root's n - 1 sends (one on a multicast medium). Late ranks send nothing there: the model knows
// at once that they are late.
//
// Checkpoints: the shared part is the learning rate, the step count and the options that change results
// (delay model, root), which a loading strategy must match; nothing is local. A resumed run draws the same
// delays and reaches the same bits. finish() drains every message in flight (each rank sends a last "close"
// vector to the root), so it is required before the communicator is reused or destroyed.
#pragma once

#include <commsgd/coding/gradient_code.hpp>
#include <commsgd/coding/gradient_code_scheme.hpp>
#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/clock.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/poll.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/comm/tags.hpp>
#include <commsgd/error.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/delays.hpp>
#include <commsgd/sync/reducer_concept.hpp>
#include <commsgd/sync/replica_promise.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <istream>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <span>
#include <thread>
#include <utility>
#include <vector>

namespace commsgd::inline v1::sync {

struct first_arrivals_options {
  float lr = 0.01f;        // (0, inf)
  delay_model delays{};    // injected straggler delays (none by default)
  double unit_s = 0.0;     // seconds of one delay unit when step_info::compute_seconds is not given
  double timeout_s = 30.0; // real seconds the root waits for n - s answers, and a rank for the sum; (0, inf)
  int root = 0;            // the decoding rank, [0, n)
  int tag_base = -1;       // first of 2 tags; -1: reserved on the communicator (comm/tags.hpp)
};

// What the last round did, as this rank saw it.
struct round_report {
  std::uint64_t round = 0;
  coding::node_set responders = 0; // the first n - s to answer, the root's choice (every rank learns it)
  coding::node_set used = 0;       // the responders the decode read
  std::uint64_t late = 0;          // root: messages of earlier rounds drained during this round
  bool sent = false;               // this rank's vector took part (false: late or stopped)
  double delay_s = 0.0;            // the delay drawn for this rank
};

namespace detail {

inline constexpr std::size_t arrival_header_words = 6;
enum class arrival_status : std::uint32_t { vector = 0, sum = 1, failed = 2, close = 3 };

struct arrival_header {
  std::uint64_t round = 0;
  arrival_status status = arrival_status::vector;
  std::uint32_t count = 0;
  coding::node_set set = 0;
};

inline void put_header(std::span<std::uint32_t> msg, const arrival_header& h) noexcept {
  msg[0] = static_cast<std::uint32_t>(h.round);
  msg[1] = static_cast<std::uint32_t>(h.round >> 32);
  msg[2] = static_cast<std::uint32_t>(h.status);
  msg[3] = h.count;
  msg[4] = static_cast<std::uint32_t>(h.set);
  msg[5] = static_cast<std::uint32_t>(h.set >> 32);
}

inline arrival_header get_header(std::span<const std::uint32_t> msg) noexcept {
  arrival_header h;
  h.round = static_cast<std::uint64_t>(msg[0]) | static_cast<std::uint64_t>(msg[1]) << 32;
  h.status = static_cast<arrival_status>(msg[2]);
  h.count = msg[3];
  h.set = static_cast<std::uint64_t>(msg[4]) | static_cast<std::uint64_t>(msg[5]) << 32;
  return h;
}

} // namespace detail

template <comm::communicator C>
class first_arrivals : public state::checkpointed<first_arrivals<C>> {
public:
  using options = first_arrivals_options;
  static constexpr bool virtual_clock = comm::runs_on_virtual_time<C>;

  // `length` is the model's length d; `c` must outlive the strategy.
  first_arrivals(C& c, std::size_t length, options o) : comm_(&c), opt_(o), d_(length) {
    detail::check_learning_rate("lr", opt_.lr);
    const int n = c.size();
    commsgd::check_range("root", opt_.root, 0, n - 1, commsgd::concat("[0, n - 1 = ", n - 1, "]"));
    if (!(std::isfinite(opt_.timeout_s) && opt_.timeout_s > 0))
      throw invalid_argument(commsgd::concat("argument 'timeout_s' = ", opt_.timeout_s,
                                             " is outside the allowed range (0, inf)"));
    if (!(std::isfinite(opt_.unit_s) && opt_.unit_s >= 0))
      throw invalid_argument(
          commsgd::concat("argument 'unit_s' = ", opt_.unit_s, " is outside the allowed range [0, inf)"));
    opt_.delays.validate(n);
    tags_ = opt_.tag_base < 0 ? comm::reserve_tags(c, 2, "first_arrivals")
                              : comm::reserve_tags_at(c, opt_.tag_base, 2, "first_arrivals");
    const std::size_t words = detail::arrival_header_words + d_;
    if (c.rank() == opt_.root) {
      up_.resize(static_cast<std::size_t>(n));
      for (auto& u : up_)
        u.buffer.resize(words);
    } else {
      down_.resize(words);
    }
  }

  first_arrivals(first_arrivals&&) noexcept = default;
  first_arrivals& operator=(first_arrivals&&) noexcept = default;

  bool computes_gradients() const { return true; }

  void start(std::span<float> params) {
    detail::check_same_size("params", params.size(), d_);
    if (std::exchange(resumed_, false)) return;
    comm_->broadcast(params, 0);
  }

  // One gradient per rank is not a code's input: the strategy needs the blocks and the code.
  step_result step(std::span<float>, std::span<const float>, const step_info& = {}) {
    throw unsupported("sync::first_arrivals decodes block gradients through a gradient code: call "
                      "step(params, blocks, reducer) with a coding::gradient_code_scheme reducer, or use "
                      "data_parallel<policy::gradient_code<Kind>, policy::dense, policy::first_arrivals>");
  }

  // The reducer's scheme is a coding::gradient_code_scheme: its code encodes this rank's blocks and decodes.
  template <reducer R>
  step_result step(std::span<float> params, block_gradients blocks, R& reduce, const step_info& info = {}) {
    auto& code = reduce.scheme().code();
    detail::check_same_size("params", params.size(), d_);
    if (code.nodes() != comm_->size())
      throw size_mismatch(commsgd::concat("the gradient code has n = ", code.nodes(),
                                          " nodes; the communicator has ", comm_->size(), " ranks"));
    mine_.resize(d_);
    code.encode(comm_->rank(), blocks, mine_);
    const double unit =
        std::isfinite(info.compute_seconds) && info.compute_seconds >= 0 ? info.compute_seconds : opt_.unit_s;
    report_ = {};
    report_.round = step_;
    report_.delay_s = opt_.delays.delay(step_, comm_->rank(), unit);
    sum_.resize(d_);
    if constexpr (virtual_clock)
      virtual_round(code);
    else
      real_round(code);
    ++step_;
    apply_mean_sum(params, sum_, static_cast<int>(code.block_count()), opt_.lr);
    return {.exchanged = true, .averaged = false};
  }

  // Drains every message in flight: each rank sends "close" to the root, which reads until it has every
  // rank's close. Collective; the strategy may take further steps afterwards.
  void finish(std::span<float>) {
    if constexpr (virtual_clock) return;
    if (comm_->size() == 1) return;
    const std::size_t words = detail::arrival_header_words + d_;
    if (comm_->rank() != opt_.root) {
      auto& b = send_buffer(sends_, words);
      detail::put_header(b.buffer, {step_, detail::arrival_status::close, 0, 0});
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
        const auto h = detail::get_header(u.buffer);
        if (h.status == detail::arrival_status::close) break;
        ++drained_;
      }
    }
    for (auto& s : sends_)
      if (s.busy) wait_bounded(s.request, "the ranks to take the last sums at finish");
  }

  float learning_rate() const { return opt_.lr; }
  void set_learning_rate(float lr) {
    detail::check_learning_rate("lr", lr);
    opt_.lr = lr;
  }
  std::uint64_t steps() const noexcept { return step_; }
  const round_report& report() const noexcept { return report_; }
  // The sum the last step applied (the decoded sum of every block gradient).
  std::span<const float> last_sum() const noexcept { return sum_; }
  // Root: late messages drained so far, in rounds and at finish.
  std::uint64_t drained() const noexcept { return drained_; }
  const options& settings() const noexcept { return opt_; }

private:
  friend struct state::access;
  static constexpr const char* state_kind = "sync::first_arrivals";
  struct saved {
    float lr = 0.0f;
    std::uint64_t step = 0;
  };
  void save_section(state::writer& w, state::part which) const {
    if (which != state::part::shared) return;
    w.put<float>(opt_.lr);
    w.put<std::uint64_t>(step_);
    const auto& m = opt_.delays;
    w.put<std::uint32_t>(static_cast<std::uint32_t>(m.kind));
    w.put<std::int32_t>(m.node);
    w.put<double>(m.factor);
    w.put<double>(m.mean);
    w.put<double>(m.shape);
    w.put<std::uint64_t>(m.from_step);
    w.put<std::uint64_t>(m.seed);
    w.put<std::int32_t>(opt_.root);
  }
  void parse_section(state::reader& r, state::part which, saved& t) const {
    if (which != state::part::shared) return;
    t.lr = state::read_learning_rate(r);
    t.step = r.get<std::uint64_t>();
    delay_model m;
    m.kind = static_cast<delay_kind>(r.get<std::uint32_t>());
    m.node = r.get<std::int32_t>();
    m.factor = r.get<double>();
    m.mean = r.get<double>();
    m.shape = r.get<double>();
    m.from_step = r.get<std::uint64_t>();
    m.seed = r.get<std::uint64_t>();
    const auto root = r.get<std::int32_t>();
    if (!(m == opt_.delays))
      throw corrupt_data(commsgd::concat("saved state: the delay model (", delay_kind_name(m.kind), ", seed ",
                                         m.seed, ") differs from this strategy's (",
                                         delay_kind_name(opt_.delays.kind), ", seed ", opt_.delays.seed,
                                         ")"));
    state::expect_same(root, opt_.root, "root");
  }
  void commit(saved&& t) noexcept {
    opt_.lr = t.lr;
    step_ = t.step;
    resumed_ = true;
  }

  using request_type = comm::request_t<C>;
  using clock = comm::poll_clock;

  struct receive_slot {
    std::vector<std::uint32_t> buffer;
    request_type request{};
    bool posted = false;
  };
  struct send_slot {
    std::vector<std::uint32_t> buffer;
    request_type request{};
    bool busy = false;
  };

  // A buffer whose earlier send has completed (sends to ranks still computing may stay open under MPI).
  send_slot& send_buffer(std::deque<send_slot>& pool, std::size_t words) {
    for (auto& s : pool) {
      if (s.busy && s.request.test()) s.busy = false;
      if (!s.busy) {
        s.buffer.resize(words);
        return s;
      }
    }
    pool.emplace_back();
    pool.back().buffer.resize(words);
    return pool.back();
  }

  void post(int k) {
    auto& u = up_[static_cast<std::size_t>(k)];
    if (u.posted) return;
    u.request = comm_->irecv(std::span<std::uint32_t>(u.buffer), k, tags_[0]);
    u.posted = true;
  }

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

  static void copy_payload(std::span<const std::uint32_t> msg, std::span<float> out) noexcept {
    std::memcpy(out.data(), msg.data() + detail::arrival_header_words, out.size_bytes());
  }
  static void put_payload(std::span<std::uint32_t> msg, std::span<const float> in) noexcept {
    std::memcpy(msg.data() + detail::arrival_header_words, in.data(), in.size_bytes());
  }

  template <class Code>
  coding::stragglers_exceeded too_few(const Code& code, int answered) const {
    return coding::stragglers_exceeded(
        commsgd::concat("first_arrivals: round ", step_, ": ", answered, " of ", comm_->size(),
                        " ranks answered within the time allowed; the ", code.redundancy(),
                        "-redundant code needs n - s = ", code.needed(),
                        " (it tolerates s = ", code.stragglers(), " missing)"),
        step_, answered, code.needed());
  }

  template <class Code>
  void decode_into(Code& code, coding::node_set responders) {
    std::vector<std::span<const float>> coded;
    const auto who = coding::members(responders);
    staged_.resize(who.size());
    for (std::size_t k = 0; k < who.size(); ++k) {
      if (who[k] == opt_.root) {
        coded.emplace_back(mine_);
        continue;
      }
      staged_[k].resize(d_);
      copy_payload(up_[static_cast<std::size_t>(who[k])].buffer, staged_[k]);
      coded.emplace_back(staged_[k]);
    }
    report_.used = code.used(responders);
    code.decode(responders, std::span<const std::span<const float>>(coded), sum_);
  }

  // Real time: sleeps, the first n - s arrivals at the root, late messages drained.
  template <class Code>
  void real_round(Code& code) {
    const int n = comm_->size(), me = comm_->rank(), root = opt_.root;
    const std::size_t words = detail::arrival_header_words + d_;
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
        detail::put_header(b.buffer, {step_, detail::arrival_status::vector, 0, 0});
        put_payload(b.buffer, mine_);
        b.request = comm_->isend(std::span<const std::uint32_t>(b.buffer), root, tags_[0]);
        b.busy = true;
        report_.sent = true;
      }
      const auto deadline = after(stopped ? start : ready, opt_.timeout_s * 2);
      if (!have_sum) wait_until([&] { return down_request_.test(); }, deadline, "the root's sum");
      const auto h = detail::get_header(down_);
      if (h.round != step_ ||
          (h.status != detail::arrival_status::sum && h.status != detail::arrival_status::failed))
        throw corrupt_data(commsgd::concat("first_arrivals: rank ", me, " expected the sum of round ", step_,
                                           " from the root and got status ",
                                           static_cast<std::uint32_t>(h.status), " of round ", h.round));
      report_.responders = h.set;
      if (h.status == detail::arrival_status::failed) throw too_few(code, static_cast<int>(h.count));
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
        const auto h = detail::get_header(u.buffer);
        if (h.status != detail::arrival_status::vector || h.round > step_)
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
    auto fan_out = [&](detail::arrival_header h, bool with_sum) {
      for (int k = 0; k < n; ++k) {
        if (k == root) continue;
        auto& b = send_buffer(results_, words);
        detail::put_header(b.buffer, h);
        if (with_sum)
          put_payload(b.buffer, sum_);
        else
          std::fill(b.buffer.begin() + detail::arrival_header_words, b.buffer.end(), 0u);
        b.request = comm_->isend(std::span<const std::uint32_t>(b.buffer), k, tags_[1]);
        b.busy = true;
      }
    };
    if (answered < needed) {
      for (int k = 0; k < n; ++k)
        if (k != root) post(k);
      fan_out({step_, detail::arrival_status::failed, static_cast<std::uint32_t>(answered), responders},
              false);
      throw too_few(code, answered);
    }
    decode_into(code, responders);
    for (int k = 0; k < n; ++k)
      if (k != root) post(k);
    fan_out({step_, detail::arrival_status::sum, static_cast<std::uint32_t>(answered), responders}, true);
  }

  // Virtual time: ready times shared over the innermost communicator, the clock charged by the model.
  template <class Code>
  void virtual_round(Code& code) {
    auto& sim = comm::clock_of(*comm_);
    auto& plain = comm::innermost(*comm_); // neither charged nor metered: the model's own bookkeeping
    const auto& net = sim.network();
    const int n = comm_->size(), me = comm_->rank(), root = opt_.root;
    const std::size_t words = detail::arrival_header_words + d_;
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
        detail::put_header(b.buffer, {step_, detail::arrival_status::vector, 0, 0});
        put_payload(b.buffer, mine_);
        b.request = comm_->isend(std::span<const std::uint32_t>(b.buffer), root, tags_[0]);
        b.busy = true;
      }
      comm_->recv(std::span<std::uint32_t>(down_), root, tags_[1]);
      const auto h = detail::get_header(down_);
      if (h.round != step_ || h.status != detail::arrival_status::sum)
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
          const auto h = detail::get_header(up_[static_cast<std::size_t>(k)].buffer);
          if (h.round != step_ || h.status != detail::arrival_status::vector)
            throw corrupt_data(commsgd::concat("first_arrivals: the root expected rank ", k,
                                               "'s vector of round ", step_, " and got round ", h.round));
        }
      decode_into(code, responders);
      std::vector<request_type> pending;
      auto& b = send_buffer(results_, words);
      detail::put_header(
          b.buffer, {step_, detail::arrival_status::sum, static_cast<std::uint32_t>(needed), responders});
      put_payload(b.buffer, sum_);
      for (int k = 0; k < n; ++k)
        if (k != root) pending.push_back(comm_->isend(std::span<const std::uint32_t>(b.buffer), k, tags_[1]));
      for (auto& r : pending)
        r.wait();
    }
    sim.advance(std::max(0.0, end - sim.now()));
  }

  C* comm_;
  options opt_;
  std::size_t d_;
  comm::tag_lease tags_;
  std::vector<receive_slot> up_;    // root: one posted receive per rank
  std::vector<std::uint32_t> down_; // others: the root's message
  request_type down_request_{};
  std::deque<send_slot> sends_, results_;
  std::vector<float> mine_, sum_;
  std::vector<std::vector<float>> staged_;
  std::uint64_t step_ = 0;
  std::uint64_t drained_ = 0;
  round_report report_{};
  bool resumed_ = false;
};

static_assert(sync_strategy<first_arrivals<comm::archetype>>);

// Replicas apply the same decoded bits every step.
template <class C>
struct replica_promise<first_arrivals<C>> {
  static bool after_step(const first_arrivals<C>&, const step_result&) { return true; }
  static bool after_finish(const first_arrivals<C>&) { return true; }
};

} // namespace commsgd::inline v1::sync
