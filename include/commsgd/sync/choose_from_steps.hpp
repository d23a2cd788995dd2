// The automatic choice of exchange (choose_exchange.hpp) for a data_parallel trainer, from steps it ran with
// the dense exchange: sync::step_timer records them, sync::choose_from_steps turns them into a profile and
// candidate plans and makes the choice collectively.
//
//   data_parallel<policy::uncoded<>, policy::dense, policy::synchronous> warm(comm, d, opt);
//   sync::step_timer timer;                                     // skips the first step (allocations)
//   for (profiled steps) {
//     timer.compute([&] { gradient at x into g; });
//     timer.exchange([&] { return warm.step(x, g); });
//   }
//   const std::vector<sync::candidate_plan> plans{{.name = "fp16"}, {.name = "topk-0.01"}};
//   const auto c = sync::choose_from_steps(comm, timer, g, sync::buckets_of(d), plans, net);
//   // every rank holds the same c.name: build that composition (its own type) and go on from x, keeping
//   // the strategy's state:
//   std::stringstream s; warm.strategy().save(s); next.strategy().load(s); next.start(x);
//
// tests/unit/sync_choose_from_steps.cpp switches that way through a std::variant of the candidates'
// trainers. A compressor starts with empty error feedback, which is what the dense steps leave behind.
//
// What the model (cost/overlap.hpp) is told, and why:
//   backward_s   the median compute of a profiled step: data_parallel takes the gradient whole, so forward
//                and backward are one phase here (forward_s = 0)
//   ready_s      backward_s for every bucket: the step exchanges only once the gradient is complete, and
//                every plan is blocking (data_parallel::step returns when its exchange is done)
//   optimizer_s  the synchronous strategy's update (sync::apply_mean_sum), which follows every exchange
//                alike, timed here on a scratch vector of the gradient's length
//   compute      each candidate's local work per bucket, timed here on this rank's slice of `grad`, the
//                fastest of choice_timing_repeats runs:
//                  dense       none: the ring's additions are part of the exchange it is charged for
//                  fp16, bf16  every value converted to 16 bits and back (the per-value work of
//                              compress::half_compressor's encode and decode)
//                  topk-<d>    steps of sparsify::top_k<Selector> at density d on the slice (Selector:
//                              the trainer's, select::exact unless given)
//                  other kinds not timed here: a plan of those must bring its compute (one local_compute
//                              per bucket), else invalid_argument, since a compressor assumed free would
//                              be chosen for a speed it does not have. A plan that brings compute keeps it.
// The exchange a profiled step measured is not fed in: the model predicts exchanges for the network `net`
// planned for, while the measured one is this communicator's today (threads, for comm::local); the timer
// keeps it to compare with the prediction.
//
// Buckets: data_parallel exchanges the whole vector in one round, so one bucket (buckets_of(length)) matches
// that round; one bucket per layer charges a round, and its latency, per layer, which is DDP's way, and
// the shapes PowerSGD needs go into the buckets' matrices.
//
// Errors: the settings (network, margin, candidate names and compute, buckets against grad, a timer with a
// profiled step) are checked before any timing or message, so settings that are bad on every rank raise
// on every rank; choose_exchange then agrees on the profiles as it says.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/candidate.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/sparsify/top_k.hpp>
#include <commsgd/sync/choose_exchange.hpp>
#include <commsgd/sync/choose_from_plans.hpp>
#include <commsgd/sync/sgd.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace commsgd::inline v1::sync {

// One profiled step: the gradient's computation and data_parallel::step (exchange and update).
struct step_times {
  double compute_s = 0;
  double exchange_s = 0;
};

class step_timer {
public:
  // The first `skip` steps are not recorded: they allocate the exchange's buffers (and a compressor's first
  // round agrees on its settings).
  explicit step_timer(std::size_t skip = 1) : skip_(skip) {}

  // Adds f's time to this step's compute; a step may compute in several calls (one per block).
  template <class F>
  decltype(auto) compute(F&& f) {
    const auto t0 = clock::now();
    if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
      std::invoke(std::forward<F>(f));
      pending_ += since(t0);
    } else {
      decltype(auto) r = std::invoke(std::forward<F>(f));
      pending_ += since(t0);
      return r;
    }
  }

  // Times f (the trainer's step) and ends the step. A call that throws ends nothing: the step's compute
  // stays pending.
  template <class F>
  decltype(auto) exchange(F&& f) {
    const auto t0 = clock::now();
    if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
      std::invoke(std::forward<F>(f));
      end_step(since(t0));
    } else {
      decltype(auto) r = std::invoke(std::forward<F>(f));
      end_step(since(t0));
      return r;
    }
  }

  std::span<const step_times> steps() const noexcept { return steps_; }
  // Medians over the recorded steps; 0 when there is none.
  double compute_s() const { return median(&step_times::compute_s); }
  double exchange_s() const { return median(&step_times::exchange_s); }

  void clear() noexcept {
    steps_.clear();
    pending_ = 0;
    seen_ = 0;
  }

private:
  using clock = std::chrono::steady_clock;
  static double since(clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  }

  void end_step(double exchange) {
    if (seen_++ >= skip_) steps_.push_back({pending_, exchange});
    pending_ = 0;
  }

  double median(double step_times::*field) const {
    if (steps_.empty()) return 0;
    std::vector<double> v;
    v.reserve(steps_.size());
    for (const auto& s : steps_)
      v.push_back(s.*field);
    std::sort(v.begin(), v.end());
    const std::size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
  }

  std::size_t skip_;
  std::size_t seen_ = 0;
  double pending_ = 0;
  std::vector<step_times> steps_;
};

// One 1-D bucket per layer (layer_sizes in the parameter vector's order), or one of the whole vector when
// layer_sizes is empty; the layers must cover the vector exactly.
inline std::vector<cost::bucket_shape> buckets_of(std::size_t length,
                                                  std::span<const std::size_t> layer_sizes = {}) {
  if (layer_sizes.empty()) layer_sizes = std::span<const std::size_t>(&length, 1);
  std::vector<cost::bucket_shape> out;
  std::size_t total = 0;
  for (const auto s : layer_sizes) {
    if (s == 0)
      throw invalid_argument("argument 'layer_sizes' holds a layer of 0 values; every layer has one or more");
    total += s;
    out.push_back({static_cast<std::uint64_t>(s), {}});
  }
  if (total != length)
    throw size_mismatch(commsgd::concat("argument 'layer_sizes' covers ", total,
                                        " values; the parameter vector holds ", length));
  return out;
}

// Every candidate's local work is the fastest of this many timed runs.
inline constexpr int choice_timing_repeats = 3;

// What choose_exchange (or exchange_chooser::decide) takes: this rank's profile and the plans, dense first.
struct choice_inputs {
  base_profile profile;
  std::vector<candidate_plan> plans;
};

namespace detail {

template <class F>
double fastest_of(F&& f) {
  double best = std::numeric_limits<double>::infinity();
  for (int t = 0; t < choice_timing_repeats; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Read once after a timed loop so that the compiler keeps the loop's stores. One per thread: ranks that are
// threads time at once, and a shared sink would be a data race.
inline thread_local volatile float timing_sink = 0;
inline void keep(float v) {
  timing_sink = v;
}

template <class Format>
double half_seconds(std::span<const float> g) {
  std::vector<std::uint16_t> msg(g.size());
  std::vector<float> back(g.size());
  const double s = fastest_of([&] {
    for (std::size_t i = 0; i < g.size(); ++i)
      msg[i] = Format::encode(g[i]);
    for (std::size_t i = 0; i < g.size(); ++i)
      back[i] = Format::decode(msg[i]);
  });
  keep(back[g.size() / 2]);
  return s;
}

template <class Selector>
double top_k_seconds(std::span<const float> g, double density) {
  sparsify::top_k_options o;
  o.density = density;
  sparsify::top_k<Selector> x(g.size(), std::move(o));
  std::size_t sent = 0;
  const double s = fastest_of([&] { sent += x.step(g).indices.size(); });
  keep(static_cast<float>(sent));
  return s;
}

inline void check_settings(const step_timer& timer, std::span<const float> grad,
                           std::span<const cost::bucket_shape> buckets,
                           std::span<const candidate_plan> candidates) {
  if (timer.steps().empty())
    throw invalid_argument(
        "choose_from_steps: the timer holds no profiled step; run more steps than its skip");
  std::uint64_t total = 0;
  for (const auto& b : buckets) {
    cost::check_shape(b);
    total += b.values;
  }
  if (buckets.empty() || total != grad.size())
    throw size_mismatch(commsgd::concat("argument 'buckets' covers ", total, " values in ", buckets.size(),
                                        " buckets; 'grad' holds ", grad.size()));
  for (const auto& p : candidates) {
    const auto c = cost::parse_candidate(p.name);
    detail::check_factor(p.name, p.steps_factor);
    if (!p.compute.empty() && p.compute.size() != buckets.size())
      throw size_mismatch(commsgd::concat("argument 'compute' of '", p.name, "' has ", p.compute.size(),
                                          " buckets; 'buckets' has ", buckets.size()));
    const bool timed = c.kind == cost::candidate_kind::dense || c.kind == cost::candidate_kind::fp16 ||
                       c.kind == cost::candidate_kind::bf16 || c.kind == cost::candidate_kind::topk;
    if (!timed && p.compute.empty())
      throw invalid_argument(commsgd::concat(
          "choose_from_steps: the local work of '", p.name,
          "' is not timed here (dense, fp16, bf16 and topk-<density> are); give its plan one local_compute "
          "per bucket"));
  }
}

} // namespace detail

// This rank's profile and the plans (dense added where absent; every plan blocking), from the timer's
// steps and this rank's gradient `grad` cut into `buckets`. Local: no message.
template <select::selector Selector = select::exact>
choice_inputs measure_choice_inputs(const step_timer& timer, std::span<const float> grad,
                                    std::span<const cost::bucket_shape> buckets,
                                    std::span<const candidate_plan> candidates) {
  detail::check_settings(timer, grad, buckets, candidates);
  choice_inputs in;
  auto& p = in.profile;
  p.backward_s = timer.compute_s();
  p.ready_s.assign(buckets.size(), p.backward_s);
  p.shapes.assign(buckets.begin(), buckets.end());
  {
    std::vector<float> scratch(grad.begin(), grad.end());
    p.optimizer_s = detail::fastest_of([&] { apply_mean_sum(scratch, grad, 1, 1e-3f); });
    detail::keep(scratch[scratch.size() / 2]);
  }

  in.plans.assign(candidates.begin(), candidates.end());
  if (std::none_of(in.plans.begin(), in.plans.end(), [](const auto& q) {
        return cost::parse_candidate(q.name).kind == cost::candidate_kind::dense;
      }))
    in.plans.insert(in.plans.begin(), candidate_plan{"dense", {}, true, 1.0});
  for (auto& plan : in.plans) {
    plan.blocking = true;
    if (!plan.compute.empty()) continue;
    const auto c = cost::parse_candidate(plan.name);
    if (c.kind == cost::candidate_kind::dense) continue;
    std::size_t at = 0;
    for (const auto& b : buckets) {
      const auto slice = grad.subspan(at, static_cast<std::size_t>(b.values));
      at += slice.size();
      double s = 0;
      if (c.kind == cost::candidate_kind::fp16)
        s = detail::half_seconds<compress::fp16_format>(slice);
      else if (c.kind == cost::candidate_kind::bf16)
        s = detail::half_seconds<compress::bf16_format>(slice);
      else
        s = detail::top_k_seconds<Selector>(slice, c.density);
      plan.compute.push_back({s, 0});
    }
  }
  return in;
}

// Collective over `comm`: every rank passes the same buckets, candidates, network and margin, and its own
// timer and gradient; every rank returns the same choice (choose_exchange.hpp).
template <select::selector Selector = select::exact, comm::communicator C>
exchange_choice choose_from_steps(C& comm, const step_timer& timer, std::span<const float> grad,
                                  std::span<const cost::bucket_shape> buckets,
                                  std::span<const candidate_plan> candidates, const comm::network_model& net,
                                  double margin = default_choice_margin) {
  cost::check_network(net);
  detail::check_margin(margin);
  const auto in = measure_choice_inputs<Selector>(timer, grad, buckets, candidates);
  return choose_exchange(comm, in.profile, in.plans, net, margin);
}

} // namespace commsgd::inline v1::sync
