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
// The parts, under first_arrivals/: options.hpp (first_arrivals_options, round_report), wire.hpp (the message
// format and the buffers both rounds use), real_round.hpp (real sleeps and deadlines, over comm::local and
// comm::mpi) and virtual_round.hpp (delays charged to the clock of a comm::simulated layer). The communicator's
// type picks the round: comm::runs_on_virtual_time<C>. Include this header: it is the one users name.
//
// Delays (sync/delays.hpp) are drawn per (step, rank) in units of step_info::compute_seconds when given,
// else options.unit_s.
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
#include <commsgd/error.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/delays.hpp>
#include <commsgd/sync/first_arrivals/options.hpp>
#include <commsgd/sync/first_arrivals/real_round.hpp>
#include <commsgd/sync/first_arrivals/virtual_round.hpp>
#include <commsgd/sync/first_arrivals/wire.hpp>
#include <commsgd/sync/reducer_concept.hpp>
#include <commsgd/sync/replica_promise.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

namespace commsgd::inline v1::sync {

namespace detail {

// The round a communicator runs: real time unless a comm::simulated layer keeps the clock.
template <class C>
using first_arrivals_round =
    std::conditional_t<comm::runs_on_virtual_time<C>, first_arrivals_virtual_round<C>,
                       first_arrivals_real_round<C>>;

} // namespace detail

template <comm::communicator C>
class first_arrivals : public detail::first_arrivals_round<C>, public state::checkpointed<first_arrivals<C>> {
  using base = detail::first_arrivals_round<C>;
  using base::comm_, base::opt_, base::d_, base::mine_, base::sum_, base::step_, base::drained_,
      base::report_;

public:
  using options = first_arrivals_options;
  static constexpr bool virtual_clock = comm::runs_on_virtual_time<C>;

  // `length` is the model's length d; `c` must outlive the strategy.
  first_arrivals(C& c, std::size_t length, options o) : base(c, length, o) {}

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
    this->run_round(code);
    ++step_;
    apply_mean_sum(params, sum_, static_cast<int>(code.block_count()), opt_.lr);
    return {.exchanged = true, .averaged = false};
  }

  // Drains every message in flight: each rank sends "close" to the root, which reads until it has every
  // rank's close. Collective; the strategy may take further steps afterwards.
  // Drains every message in flight: each rank sends "close" to the root, which reads until it has every
  // rank's close. Collective; the strategy may take further steps afterwards.
  void finish(std::span<float>) { this->drain(); }

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
