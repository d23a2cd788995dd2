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
// Outer optimizer (sync/outer_optimizer.hpp, where the sign convention lives): with options.outer other than
// plain_average (lr 1, momentum 0, the default), a sync point is an outer step on local SGD's schedule
// (DiLoCo itself, with rounds of H whole steps, streaming and compressed codes, is sync::diloco):
// each rank's pseudo-gradient theta_global - theta_r is summed over ranks, the outer step moves the common
// model theta_global with the mean, and every rank restarts from it (at_sync correction: is pulled toward it
// by alpha; every_step correction pulls toward it after every local step). theta_global is the model every
// rank started the round from; the trainer's own inner optimizer (AdamW...) passes a zero gradient to step(),
// as commsgd_torch's local SGD does, and keeps its own state: only the models travel.
//
// Compressed pseudo-gradients: X, any compress::compressor (fp16, bf16, int8, e3m0, top_k_ef, ...),
// carries each rank's pseudo-gradient, keeps what its message did not carry in its own residual, and sums
// the decoded messages in float; with X = uncompressed (the default) the exchange E sums floats. The
// ADACOMM loss rides in the float sum, or, compressed, in one extra float all-reduce.
//
// Refusal: a pseudo-gradient (or, plain, a model) with NaN or inf raises commsgd::non_finite on every rank,
// before anything the strategy keeps has changed (counter, schedule, common model, momentum, residual):
// uncompressed, the bad values ride in the sum, so every rank sees them (and the rank they came from says
// so); compressed, the compressor's verdicts agree on it (compress/agree.hpp). `params` is this rank's local
// model after the step's local update.
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
#include <commsgd/compress/compressor.hpp>
#include <commsgd/error.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/dense_exchange.hpp>
#include <commsgd/sync/outer_optimizer.hpp>
#include <commsgd/sync/replica_promise.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <istream>
#include <limits>
#include <optional>
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
  float alpha = 0.5f;                      // pull strength: [0, 1]
  bool average_on_finish = true;           // finish() averages local steps taken since the last sync
  outer_sgd_options outer = plain_average; // {} for DiLoCo's lr 0.7, momentum 0.9
};

// The pseudo-gradient slot of local_sgd left empty: the exchange sums floats.
struct uncompressed {};

template <comm::communicator C, exchange E = all_reduce_exchange<C>, class X = uncompressed>
requires std::same_as<X, uncompressed> || compress::compressor<X, C>
class local_sgd : public state::checkpointed<local_sgd<C, E, X>> {
public:
  using options = local_sgd_options;
  static constexpr bool compressed = !std::same_as<X, uncompressed>;

  local_sgd(C& c, options o) requires std::constructible_from<E, C&> &&(!compressed)
      : local_sgd(c, o, E(c)) {}
  local_sgd(C& c, options o, X x) requires std::constructible_from<E, C&> && compressed
      : local_sgd(c, o, E(c), std::move(x)) {}

  local_sgd(C& c, options o, E ex, X x = {})
      : comm_(&c), opt_(o), exchange_(std::move(ex)), outer_(opt_.outer), x_(std::move(x)) {
    detail::check_learning_rate("lr", opt_.lr);
    commsgd::check_range("warmup_steps", opt_.warmup_steps, 0, std::numeric_limits<int>::max(), "[0, inf)");
    commsgd::check_range("max_period", opt_.max_period, 1, std::numeric_limits<int>::max(), "[1, inf)");
    if (opt_.adaptive)
      commsgd::check_range("period", opt_.period, 1, opt_.max_period,
                           commsgd::concat("[1, max_period = ", opt_.max_period, "]"));
    else
      commsgd::check_range("period", opt_.period, 1, std::numeric_limits<int>::max(), "[1, inf)");
    commsgd::check_range("alpha", opt_.alpha, 0.0f, 1.0f, "[0, 1]");
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
    if constexpr (compressed) detail::check_same_size("params", params.size(), x_.length());
    if (std::exchange(resumed_, false) && !(keeps_global() && global_.empty())) {
      if (keeps_global()) detail::check_same_size("params", params.size(), global_.size());
      return;
    }
    comm_->broadcast(params, 0);
    if (keeps_global()) global_.assign(params.begin(), params.end());
  }

  step_result step(std::span<float> params, std::span<const float> grad, const step_info& info = {}) {
    detail::check_same_size("grad", grad.size(), params.size());
    detail::require_finite("gradient", grad);
    // The counter moves only once the step has succeeded, so that a refused round changes nothing.
    const std::int64_t t = step_;
    if (t < opt_.warmup_steps) {
      buffer_.assign(grad.begin(), grad.end());
      exchange_.sum(std::span<float>(buffer_));
      apply_mean_sum(params, buffer_, exchange_.size(), opt_.lr);
      if (keeps_global()) global_.assign(params.begin(), params.end());
      step_ = t + 1;
      return {.exchanged = true, .averaged = false};
    }

    for (std::size_t i = 0; i < params.size(); ++i)
      params[i] = params[i] - opt_.lr * grad[i];
    if (t != next_sync_) {
      step_ = t + 1;
      local_steps_ = true;
      if (opt_.correction == correction_mode::every_step) pull_toward(params, global_);
      return {};
    }
    average(params, info.loss, true, t);
    step_ = t + 1;
    next_sync_ = t + period_;
    return {.exchanged = true, .averaged = true};
  }

  void finish(std::span<float> params) {
    if (opt_.average_on_finish && local_steps_) average(params, 0.0, false, step_);
  }

  // Steps taken so far, the gap to the next sync point, and where that is (for schedules and tests).
  std::int64_t steps() const { return step_; }
  int current_period() const { return period_; }
  std::int64_t next_sync_step() const { return next_sync_; }
  // Mean loss over ranks at the last sync point (adaptive only; NaN before the first).
  double last_mean_loss() const { return last_loss_; }

  // The common model every rank started this round from (DiLoCo's theta_global; every_step correction's
  // target); empty when neither is on.
  std::span<const float> global_model() const noexcept { return global_; }
  // The outer optimizer, its options and momentum.
  const outer_sgd& outer() const noexcept { return outer_; }
  // The pseudo-gradient compressor (X = uncompressed: an empty tag).
  const X& compressor() const noexcept { return x_; }

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
    std::vector<float> velocity;
    std::optional<X> x; // the compressor, loaded aside
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
    if (which == state::part::local) {
      // The compressor's residual is this rank's own; its frame nests here.
      if constexpr (compressed) w.put_array(std::span<const std::byte>(state::to_bytes(x_)));
      return;
    }
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
    w.put<float>(outer_.opts().lr);
    w.put<float>(outer_.opts().momentum);
    w.put_array(outer_.velocity());
  }

  static bool saved_flag(state::reader& r, const char* what) {
    const auto v = r.get<std::uint32_t>();
    if (v > 1) throw corrupt_data(commsgd::concat("saved state: ", what, " = ", v, " is neither 0 nor 1"));
    return v == 1;
  }

  void parse_section(state::reader& r, state::part which, saved& t) const {
    if (which == state::part::local) {
      if constexpr (compressed) {
        const auto bytes = r.get_bytes();
        auto is = state::from_bytes(bytes);
        t.x.emplace(x_);
        t.x->load(is);
      }
      return;
    }
    state::expect_same(r.get<std::int32_t>(), opt_.period, "option 'period'");
    state::expect_same(r.get<std::int32_t>(), opt_.warmup_steps, "option 'warmup_steps'");
    state::expect_same(saved_flag(r, "option 'adaptive'"), opt_.adaptive, "option 'adaptive'");
    state::expect_same(r.get<std::int32_t>(), opt_.max_period, "option 'max_period'");
    state::expect_same(r.get<std::uint32_t>(), static_cast<std::uint32_t>(opt_.correction),
                       "option 'correction' (0 none, 1 at_sync, 2 every_step)");
    state::expect_same_bits(r.get<float>(), opt_.alpha, "alpha");
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
      throw corrupt_data(commsgd::concat("saved state: step ", t.step, " and next sync step ", t.next_sync,
                                         " are out of order (0 <= step <= next sync)"));
    const int top = opt_.adaptive ? opt_.max_period : opt_.period;
    if (t.period < 1 || t.period > top || (!opt_.adaptive && t.period != opt_.period))
      throw corrupt_data(commsgd::concat("saved state: current period ", t.period,
                                         " is outside the allowed range [1, ", top, "]"));
    if (t.have_first && (!std::isfinite(t.first_loss) || !(t.first_lr > 0.0f) || !std::isfinite(t.first_lr)))
      throw corrupt_data(commsgd::concat("saved state: the first sync point's loss ", t.first_loss,
                                         " and learning rate ", t.first_lr, " are not usable"));
    state::expect_same_bits(r.get<float>(), outer_.opts().lr, "outer.lr");
    state::expect_same_bits(r.get<float>(), outer_.opts().momentum, "outer.momentum");
    t.velocity = r.get_vector<float>();
    if (!keeps_global() && !t.global.empty())
      throw corrupt_data(commsgd::concat("saved state: holds a common model of ", t.global.size(),
                                         " values, which only every_step correction and an outer "
                                         "optimizer other than plain averaging keep"));
    if (!t.velocity.empty() && (!outer_.has_momentum() || t.velocity.size() != t.global.size()))
      throw corrupt_data(commsgd::concat("saved state: holds an outer momentum of ", t.velocity.size(),
                                         " values beside a common model of ", t.global.size(), " (momentum ",
                                         outer_.opts().momentum, ")"));
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
    outer_.replace_velocity(std::move(t.velocity));
    if constexpr (compressed)
      if (t.x) x_ = std::move(*t.x);
    resumed_ = true;
  }

  void pull_toward(std::span<float> x, std::span<const float> target) const noexcept {
    pull_toward(x, target, opt_.alpha);
  }

  // DiLoCo's common model is kept beside the local one; so is every_step correction's target.
  bool averages_models() const noexcept { return !compressed && outer_.plain(); }
  bool keeps_global() const noexcept {
    return opt_.correction == correction_mode::every_step || !averages_models();
  }

  // The sum in buffer_[0, d) holds NaN or inf: every rank holds the same sum, so every rank raises.
  void refuse_non_finite_sum(std::size_t d, const char* what) const {
    const auto bad = select::find_non_finite(std::span<const float>(buffer_.data(), d));
    if (bad.count > 0) throw non_finite(what, bad.count, bad.first);
  }

  // A sync point (step t): the ranks' models averaged, or an outer step on their pseudo-gradients. Throws
  // before anything this object keeps has changed.
  void average(std::span<float> params, double loss, bool adapt, std::int64_t t) {
    const bool with_loss = adapt && opt_.adaptive;
    if (with_loss && !std::isfinite(loss))
      throw invalid_argument(commsgd::concat(
          "step_info::loss = ", loss, " at sync step ", t,
          " is outside the allowed range (finite); the adaptive interval needs the mini-batch loss"));
    const std::size_t d = params.size();
    if (averages_models()) {
      buffer_.assign(params.begin(), params.end());
      if (with_loss) buffer_.push_back(static_cast<float>(loss));
      exchange_.sum(std::span<float>(buffer_));
      refuse_non_finite_sum(d,
                            "sync::local_sgd: the sum of the ranks' models (some rank's model, or the sum)");
    } else {
      detail::check_same_size("params", d, global_.size());
      delta_.resize(d);
      pseudo_gradient(global_, params, delta_);
      buffer_.resize(d + (with_loss ? 1 : 0));
      if constexpr (compressed) {
        // The loss first: the compressor commits its residual in reduce, which must be the last call
        // that can fail.
        if (with_loss) {
          buffer_[d] = static_cast<float>(loss);
          comm_->all_reduce_sum(std::span<float>(buffer_).subspan(d, 1));
        }
        try {
          x_.reduce(*comm_, std::span<const float>(delta_), std::span<float>(buffer_.data(), d));
        } catch (const non_finite& e) {
          throw non_finite(commsgd::concat("sync::local_sgd: the pseudo-gradients (theta_global - "
                                           "theta_local) compressed by ",
                                           X::name, " (", e.what(), ")"),
                           e.count(), e.first_index());
        }
      } else {
        std::copy(delta_.begin(), delta_.end(), buffer_.begin());
        if (with_loss) buffer_[d] = static_cast<float>(loss);
        // A rank whose pseudo-gradient is not finite still takes part: its NaN or inf reaches the sum on
        // every rank, and every rank refuses the round (this one naming itself).
        exchange_.sum(std::span<float>(buffer_));
        detail::require_finite("sync::local_sgd: this rank's pseudo-gradient (theta_global - theta_local)",
                               delta_);
      }
      refuse_non_finite_sum(d, "sync::local_sgd: the sum of the ranks' pseudo-gradients (theta_global - "
                               "theta_local; some rank's model, or the sum)");
    }
    const float n = static_cast<float>(compressed ? comm_->size() : exchange_.size());
    for (std::size_t i = 0; i < d; ++i)
      buffer_[i] = buffer_[i] / n;
    const std::span<const float> mean(buffer_.data(), d);
    if (averages_models()) {
      if (opt_.correction == correction_mode::at_sync)
        pull_toward(params, mean);
      else
        std::copy(mean.begin(), mean.end(), params.begin());
      if (keeps_global()) global_.assign(mean.begin(), mean.end());
    } else {
      outer_.step(global_, mean);
      if (opt_.correction == correction_mode::at_sync)
        pull_toward(params, global_);
      else
        std::copy(global_.begin(), global_.end(), params.begin());
    }
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
  outer_sgd outer_;
  [[no_unique_address]] X x_;
  std::vector<float> buffer_, delta_;
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
template <class C, class E, class X>
struct replica_promise<local_sgd<C, E, X>> {
  static bool after_step(const local_sgd<C, E, X>& s, const step_result& r) {
    return s.replicas_identical(r);
  }
  static bool after_finish(const local_sgd<C, E, X>& s) { return s.replicas_identical_after_finish(); }
};

} // namespace commsgd::inline v1::sync
