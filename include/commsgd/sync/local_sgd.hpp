// sync::local_sgd: ranks take local SGD steps and average their models now and then.
//
//   sync::local_sgd s(comm, {.lr = 0.1f, .period = 8, .warmup_steps = 20});
//   s.start(x); loop { grad and loss at x; s.step(x, grad, {.loss = l}); } s.finish(x);
//
// Schedule (PyTorch's PeriodicModelAverager together with its post-local-SGD hook): steps are counted from 0;
// a step t < warmup_steps is synchronous (gradients averaged, models stay identical); from t = warmup_steps
// on, every step is local and is followed by model averaging when t is a sync point. The first sync point is
// t = warmup_steps, then every `period` steps (fixed), or every tau_l steps (adaptive).
//
// Adaptive interval (ADACOMM): at sync point l, F_l is the mean over ranks of the loss the trainer passed on
// that step and lr_l the current learning rate; the gap to the next sync point is
//   tau_l = ceil(sqrt(lr_0 * F_l / (lr_l * F_0)) * tau_0)  clamped to [1, max_period],  tau_0 = period,
// with F_0, lr_0 taken at the first sync point. The loss rides along in the model average (one extra float),
// so the rule costs no extra collective and every rank computes the same tau from the same bits.
//
// Correction (EASGD's elastic pull, keeps local models from drifting apart):
//   at_sync     at a sync point x <- x - alpha (x - x_avg) instead of x <- x_avg (alpha = 1 is plain
//               averaging);
//   every_step  after every local step x <- x - alpha (x - x_global), x_global the last common model; at
//               sync points x <- x_avg as usual.
//
// Checkpoints (state/strategy.hpp): everything that decides the trajectory is shared by every rank (the step
// counter, the current interval and the next sync point, ADACOMM's F_0 and lr_0, the learning rate, the last
// common model of every_step correction); the options are saved too and a stream saved under other options
// is refused. The local models themselves are the trainer's `params`, saved by the trainer. After load()
// call start() with each rank's own saved model: a loaded strategy's start() does not broadcast, since
// between sync points the replicas differ on purpose.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/error.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/dense_exchange.hpp>
#include <commsgd/sync/replica_promise.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::sync {

enum class correction_mode { none, at_sync, every_step };

struct local_sgd_options {
  float lr = 0.01f;      // (0, inf)
  int period = 4;        // H, or tau_0 when adaptive: [1, inf) ([1, max_period] adaptive)
  int warmup_steps = 0;  // W: [0, inf)
  bool adaptive = false; // ADACOMM interval; needs step_info::loss at sync points
  int max_period = 64;   // H_max: [1, inf)
  correction_mode correction = correction_mode::none;
  float alpha = 0.5f;            // pull strength: [0, 1]
  bool average_on_finish = true; // finish() averages local steps taken since the last sync
};

template <comm::communicator C, exchange E = all_reduce_exchange<C>>
class local_sgd : public state::checkpointed<local_sgd<C, E>> {
public:
  using options = local_sgd_options;

  local_sgd(C& c, options o) requires std::constructible_from<E, C&> : local_sgd(c, o, E(c)) {}

  local_sgd(C& c, options o, E ex) : comm_(&c), opt_(o), exchange_(std::move(ex)) {
    detail::check_learning_rate("lr", opt_.lr);
    commsgd::detail::check_range("warmup_steps", opt_.warmup_steps, 0, std::numeric_limits<int>::max(),
                                 "[0, inf)");
    commsgd::detail::check_range("max_period", opt_.max_period, 1, std::numeric_limits<int>::max(),
                                 "[1, inf)");
    if (opt_.adaptive)
      commsgd::detail::check_range("period", opt_.period, 1, opt_.max_period,
                                   commsgd::detail::concat("[1, max_period = ", opt_.max_period, "]"));
    else
      commsgd::detail::check_range("period", opt_.period, 1, std::numeric_limits<int>::max(), "[1, inf)");
    commsgd::detail::check_range("alpha", opt_.alpha, 0.0f, 1.0f, "[0, 1]");
    period_ = opt_.period;
    next_sync_ = opt_.warmup_steps;
  }

  bool computes_gradients() const { return true; }

  // Whether every rank holds the same model bits after a step that returned `r`, or after finish (what
  // sync::replica_guard checks): after warm-up and averaging steps, unless at_sync correction keeps each
  // rank's own pulled model.
  bool replicas_identical(const step_result& r) const noexcept {
    return r.exchanged && (!r.averaged || opt_.correction != correction_mode::at_sync);
  }
  bool replicas_identical_after_finish() const noexcept {
    return opt_.correction != correction_mode::at_sync && (!local_steps_ || opt_.average_on_finish);
  }

  void start(std::span<float> params) {
    // A state saved before start() holds no common model yet: that start still has to agree on one.
    if (std::exchange(resumed_, false) &&
        !(opt_.correction == correction_mode::every_step && global_.empty())) {
      if (opt_.correction == correction_mode::every_step)
        detail::check_same_size("params", params.size(), global_.size());
      return;
    }
    comm_->broadcast(params, 0);
    if (opt_.correction == correction_mode::every_step) global_.assign(params.begin(), params.end());
  }

  step_result step(std::span<float> params, std::span<const float> grad, const step_info& info = {}) {
    detail::check_same_size("grad", grad.size(), params.size());
    detail::require_finite("gradient", grad);
    const std::int64_t t = step_++;
    if (t < opt_.warmup_steps) {
      buffer_.assign(grad.begin(), grad.end());
      exchange_.sum(std::span<float>(buffer_));
      apply_mean_sum(params, buffer_, exchange_.size(), opt_.lr);
      if (opt_.correction == correction_mode::every_step) global_.assign(params.begin(), params.end());
      return {.exchanged = true, .averaged = false};
    }

    for (std::size_t i = 0; i < params.size(); ++i)
      params[i] = params[i] - opt_.lr * grad[i];
    if (t != next_sync_) {
      local_steps_ = true;
      if (opt_.correction == correction_mode::every_step) pull_toward(params, global_);
      return {};
    }
    average(params, info.loss, true);
    next_sync_ = t + period_;
    return {.exchanged = true, .averaged = true};
  }

  void finish(std::span<float> params) {
    if (opt_.average_on_finish && local_steps_) average(params, 0.0, false);
  }

  // Steps taken so far, the gap to the next sync point, and where that is (for schedules and tests).
  std::int64_t steps() const { return step_; }
  int current_period() const { return period_; }
  std::int64_t next_sync_step() const { return next_sync_; }
  // Mean loss over ranks at the last sync point (adaptive only; NaN before the first).
  double last_mean_loss() const { return last_loss_; }

  float learning_rate() const { return opt_.lr; }
  void set_learning_rate(float lr) {
    detail::check_learning_rate("lr", lr);
    opt_.lr = lr;
  }

  // x <- x - alpha (x - target): the elastic pull, exposed so that tests and trainers apply the same bits.
  static void pull_toward(std::span<float> x, std::span<const float> target, float alpha) noexcept {
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = x[i] - alpha * (x[i] - target[i]);
  }

private:
  friend struct state::access;
  static constexpr const char* state_kind = "sync::local_sgd";
  struct saved {
    float lr = 0.0f;
    std::int64_t step = 0, next_sync = 0;
    int period = 1;
    bool local_steps = false, have_first = false;
    double first_loss = 0.0;
    float first_lr = 0.0f;
    double last_loss = 0.0;
    std::vector<float> global;
  };

  void save_section(state::writer& w, state::part which) const {
    if (which != state::part::shared) return;
    w.put<std::int32_t>(opt_.period);
    w.put<std::int32_t>(opt_.warmup_steps);
    w.put<std::uint32_t>(opt_.adaptive ? 1u : 0u);
    w.put<std::int32_t>(opt_.max_period);
    w.put<std::uint32_t>(static_cast<std::uint32_t>(opt_.correction));
    w.put<float>(opt_.alpha);
    w.put<std::uint32_t>(opt_.average_on_finish ? 1u : 0u);
    w.put<float>(opt_.lr);
    w.put<std::int64_t>(step_);
    w.put<std::int64_t>(next_sync_);
    w.put<std::int32_t>(period_);
    w.put<std::uint32_t>(local_steps_ ? 1u : 0u);
    w.put<std::uint32_t>(have_first_ ? 1u : 0u);
    w.put<double>(first_loss_);
    w.put<float>(first_lr_);
    w.put<double>(last_loss_);
    w.put_array(std::span<const float>(global_));
  }

  static bool saved_flag(state::reader& r, const char* what) {
    const auto v = r.get<std::uint32_t>();
    if (v > 1)
      throw corrupt_data(commsgd::detail::concat("saved state: ", what, " = ", v, " is neither 0 nor 1"));
    return v == 1;
  }

  void parse_section(state::reader& r, state::part which, saved& t) const {
    if (which != state::part::shared) return;
    state::expect_same(r.get<std::int32_t>(), opt_.period, "option 'period'");
    state::expect_same(r.get<std::int32_t>(), opt_.warmup_steps, "option 'warmup_steps'");
    state::expect_same(saved_flag(r, "option 'adaptive'"), opt_.adaptive, "option 'adaptive'");
    state::expect_same(r.get<std::int32_t>(), opt_.max_period, "option 'max_period'");
    state::expect_same(r.get<std::uint32_t>(), static_cast<std::uint32_t>(opt_.correction),
                       "option 'correction' (0 none, 1 at_sync, 2 every_step)");
    const float alpha = r.get<float>();
    if (std::bit_cast<std::uint32_t>(alpha) != std::bit_cast<std::uint32_t>(opt_.alpha))
      throw corrupt_data(
          commsgd::detail::concat("saved state: option 'alpha' is ", alpha, ", this one's is ", opt_.alpha));
    state::expect_same(saved_flag(r, "option 'average_on_finish'"), opt_.average_on_finish,
                       "option 'average_on_finish'");
    t.lr = state::read_learning_rate(r);
    t.step = r.get<std::int64_t>();
    t.next_sync = r.get<std::int64_t>();
    t.period = r.get<std::int32_t>();
    t.local_steps = saved_flag(r, "local steps since the last sync");
    t.have_first = saved_flag(r, "first sync point seen");
    t.first_loss = r.get<double>();
    t.first_lr = r.get<float>();
    t.last_loss = r.get<double>();
    t.global = r.get_vector<float>();
    if (t.step < 0 || t.next_sync < t.step)
      throw corrupt_data(commsgd::detail::concat("saved state: step ", t.step, " and next sync step ",
                                                 t.next_sync, " are out of order (0 <= step <= next sync)"));
    const int top = opt_.adaptive ? opt_.max_period : opt_.period;
    if (t.period < 1 || t.period > top || (!opt_.adaptive && t.period != opt_.period))
      throw corrupt_data(commsgd::detail::concat("saved state: current period ", t.period,
                                                 " is outside the allowed range [1, ", top, "]"));
    if (t.have_first && (!std::isfinite(t.first_loss) || !(t.first_lr > 0.0f) || !std::isfinite(t.first_lr)))
      throw corrupt_data(commsgd::detail::concat("saved state: the first sync point's loss ", t.first_loss,
                                                 " and learning rate ", t.first_lr, " are not usable"));
    if (opt_.correction != correction_mode::every_step && !t.global.empty())
      throw corrupt_data(commsgd::detail::concat("saved state: holds a common model of ", t.global.size(),
                                                 " values, which only every_step correction keeps"));
  }

  void commit(saved&& t) noexcept {
    opt_.lr = t.lr;
    step_ = t.step;
    next_sync_ = t.next_sync;
    period_ = t.period;
    local_steps_ = t.local_steps;
    have_first_ = t.have_first;
    first_loss_ = t.first_loss;
    first_lr_ = t.first_lr;
    last_loss_ = t.last_loss;
    global_ = std::move(t.global);
    resumed_ = true;
  }

  void pull_toward(std::span<float> x, std::span<const float> target) const noexcept {
    pull_toward(x, target, opt_.alpha);
  }

  void average(std::span<float> params, double loss, bool adapt) {
    const bool with_loss = adapt && opt_.adaptive;
    if (with_loss && !std::isfinite(loss))
      throw invalid_argument(commsgd::detail::concat(
          "step_info::loss = ", loss, " at sync step ", step_ - 1,
          " is outside the allowed range (finite); the adaptive interval needs the mini-batch loss"));
    buffer_.assign(params.begin(), params.end());
    if (with_loss) buffer_.push_back(static_cast<float>(loss));
    exchange_.sum(std::span<float>(buffer_));
    const float n = static_cast<float>(exchange_.size());
    const std::size_t d = params.size();
    for (std::size_t i = 0; i < d; ++i)
      buffer_[i] = buffer_[i] / n;
    const std::span<const float> avg(buffer_.data(), d);
    if (opt_.correction == correction_mode::at_sync)
      pull_toward(params, avg);
    else
      std::copy(avg.begin(), avg.end(), params.begin());
    if (opt_.correction == correction_mode::every_step) global_.assign(avg.begin(), avg.end());
    local_steps_ = false;
    if (with_loss) adapt_period(static_cast<double>(buffer_[d] / n));
  }

  void adapt_period(double mean_loss) {
    last_loss_ = mean_loss;
    if (!have_first_) {
      have_first_ = true;
      first_loss_ = mean_loss;
      first_lr_ = opt_.lr;
      return; // tau_0 stands for the first interval
    }
    // A first loss of zero leaves the ratio undefined: keep tau_0 (the model was already at an optimum).
    if (!(first_loss_ > 0.0)) {
      period_ = opt_.period;
      return;
    }
    const double ratio =
        (first_lr_ * std::max(mean_loss, 0.0)) / (static_cast<double>(opt_.lr) * first_loss_);
    const double tau = std::ceil(std::sqrt(ratio) * static_cast<double>(opt_.period));
    period_ = static_cast<int>(std::clamp(tau, 1.0, static_cast<double>(opt_.max_period)));
  }

  C* comm_;
  options opt_;
  E exchange_;
  std::vector<float> buffer_;
  std::vector<float> global_;
  std::int64_t step_ = 0;
  std::int64_t next_sync_ = 0;
  int period_ = 1;
  bool local_steps_ = false;
  bool have_first_ = false;
  double first_loss_ = 0.0;
  float first_lr_ = 0.0f;
  double last_loss_ = std::numeric_limits<double>::quiet_NaN();
  bool resumed_ = false;
};

static_assert(sync_strategy<local_sgd<comm::archetype>>);

// What replica_guard may check (sync/replica_promise.hpp).
template <class C, class E>
struct replica_promise<local_sgd<C, E>> {
  static bool after_step(const local_sgd<C, E>& s, const step_result& r) { return s.replicas_identical(r); }
  static bool after_finish(const local_sgd<C, E>& s) { return s.replicas_identical_after_finish(); }
};

} // namespace commsgd::inline v1::sync
