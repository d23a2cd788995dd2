// The outer optimizer of local SGD (DiLoCo): what turns the ranks' local progress
// over a round into the next common model.
//
// The sign convention and the step are written once, per value, in sync/diloco_math.hpp (math::delta,
// math::nesterov_step, math::sgd_step), which the loops here and the device round call:
//   delta_r = theta_global - theta_r      old minus new, so delta acts as a gradient: an outer step with
//                                         positive lr moves theta_global toward the ranks' models
//   v            <- mu v + delta          SGD with Nesterov momentum as PyTorch's SGD(nesterov=True) writes
//   theta_global <- theta_global - lr (delta + mu v)      it, on the mean delta over ranks
// lr = 1, mu = 0 is plain model averaging: theta_global - (theta_global - mean theta_r) = mean theta_r.
// Computed that way the mean would be rounded twice, so sync::local_sgd recognises plain() and averages the
// models themselves, which is today's local_sgd bit for bit.
//
// Models of the concept: outer_sgd (below). Its state (v) is shared: every rank applies the same mean to the
// same v, so every rank holds the same bits.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/prefetch.hpp>
#include <commsgd/sync/diloco_math.hpp>
#include <commsgd/sync/streaming_store.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::sync {

// out <- global - local: the pseudo-gradient of one rank (old minus new).
inline void pseudo_gradient(std::span<const float> global, std::span<const float> local,
                            std::span<float> out) noexcept {
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = math::delta(global[i], local[i]);
}

namespace detail {
// 64 values of global - local, and how many of them are NaN or inf (restrict parameters and a known length:
// GCC vectorises the loop at -O2 only then).
inline std::size_t pseudo_gradient_group(const float* __restrict global, const float* __restrict local,
                                         float* __restrict out) noexcept {
  std::uint32_t bad = 0;
  for (std::size_t j = 0; j < 64; ++j) {
    out[j] = math::delta(global[j], local[j]);
    bad += std::fabs(out[j]) <= std::numeric_limits<float>::max() ? 0u : 1u;
  }
  return bad;
}
} // namespace detail

// pseudo_gradient, returning how many of the values it wrote are NaN or inf: the finiteness test in the same
// pass.
inline std::size_t pseudo_gradient_counted(std::span<const float> global, std::span<const float> local,
                                           std::span<float> out) noexcept {
  std::size_t bad = 0, i = 0;
  for (; i + 64 <= out.size(); i += 64) {
    commsgd::detail::prefetch_group(global.data() + i);
    commsgd::detail::prefetch_group(local.data() + i);
    bad += detail::pseudo_gradient_group(global.data() + i, local.data() + i, out.data() + i);
  }
  for (; i < out.size(); ++i) {
    out[i] = math::delta(global[i], local[i]);
    bad += std::fabs(out[i]) <= std::numeric_limits<float>::max() ? 0u : 1u;
  }
  return bad;
}

struct outer_sgd_options {
  float lr = 0.7f;       // eta: (0, inf), finite
  float momentum = 0.9f; // mu: [0, 1); 0 is plain outer SGD
};

// Outer SGD with lr 1 and no momentum: the ranks' models averaged (local_sgd's default).
inline constexpr outer_sgd_options plain_average{.lr = 1.0f, .momentum = 0.0f};

template <class O>
concept outer_optimizer = requires(O& o, const O& co, std::span<float> global, std::span<const float> mean) {
  { co.plain() } -> std::same_as<bool>;
  o.step(global, mean);
};

class outer_sgd {
public:
  using options = outer_sgd_options;

  outer_sgd() : outer_sgd(plain_average) {}
  explicit outer_sgd(options o) : opt_(o) { check(o); }

  // Refuses what the update is undefined or divergent for, naming the field.
  static void check(const options& o) {
    if (!(o.lr > 0.0f) || !std::isfinite(o.lr))
      throw invalid_argument(
          commsgd::concat("argument 'outer.lr' = ", o.lr, " is outside the allowed range (0, inf)"));
    if (!(o.momentum >= 0.0f && o.momentum < 1.0f))
      throw invalid_argument(commsgd::concat("argument 'outer.momentum' = ", o.momentum,
                                             " is outside the allowed range [0, 1)"));
  }

  const options& opts() const noexcept { return opt_; }
  bool plain() const noexcept { return opt_.lr == 1.0f && opt_.momentum == 0.0f; }
  bool has_momentum() const noexcept { return opt_.momentum != 0.0f; }
  // v, empty until the first step (and always without momentum).
  std::span<const float> velocity() const noexcept { return v_; }

  // global <- global - lr (mean + mu v) after v <- mu v + mean. Sizes are the caller's to check.
  void step(std::span<float> global, std::span<const float> mean) {
    const float lr = opt_.lr, mu = opt_.momentum;
    if (!has_momentum()) {
      for (std::size_t i = 0; i < global.size(); ++i)
        global[i] = math::sgd_step(global[i], mean[i], lr);
      return;
    }
    if (v_.empty()) v_.assign(global.size(), 0.0f);
    for (std::size_t i = 0; i < global.size(); ++i)
      global[i] = math::nesterov_step(global[i], mean[i], lr, mu, v_[i]);
  }

  // The same step on [first, first + count) of the model, its mean sum[i] / n computed on the way, calling
  // after(i, global[i]) once each value is final: one pass where a caller would otherwise divide, step and
  // then read the model again. The same bits as step() on the divided sums, and as the device round's
  // (sync/diloco_math.hpp).
  template <class After>
  void step_on_sum(std::span<float> global, std::span<const float> sum, float n, std::size_t first,
                   std::size_t count, After&& after) {
    const float lr = opt_.lr, mu = opt_.momentum;
    if (!has_momentum()) {
      for (std::size_t i = first; i < first + count; ++i) {
        global[i] = math::outer_step(global[i], sum[i], n, lr, 0.0f, nullptr);
        after(i, global[i]);
      }
      return;
    }
    if (v_.empty()) v_.assign(global.size(), 0.0f);
    for (std::size_t i = first; i < first + count; ++i) {
      global[i] = math::outer_step(global[i], sum[i], n, lr, mu, &v_[i]);
      after(i, global[i]);
    }
  }

  // step_on_sum with the merge as its `after`: x[i - first] <- math::merge(global[i], x[i - first], alpha),
  // x being a rank's model, apart from global, sum and v. The same bits, in loops that vectorise: groups of 64
  // values through restrict pointers (GCC's -O2 vectorises a loop only with a known trip count and no
  // possible overlap), the momentum and alpha = 0 chosen outside them.
  void step_and_merge(std::span<float> global, std::span<const float> sum, float n, std::size_t first,
                      std::size_t count, float* x, float alpha) {
    step_and_merge_part(global, sum.data() + first, n, first, count, x, alpha);
  }
  // The same, the sums of [first, first + count) read from `part` (part[0] the sum at first): for a caller
  // that holds the sum a part at a time (a compressor's compress::summed_in_parts).
  void step_and_merge_part(std::span<float> global, const float* part, float n, std::size_t first,
                           std::size_t count, float* x, float alpha) {
    if (alpha == 0.0f)
      run<merge_kind::restart>(global, part, n, first, count, x, nullptr, alpha);
    else
      run<merge_kind::mix>(global, part, n, first, count, x, nullptr, alpha);
  }

  // The same step, the merge math::carry: x[i - first] <- global[i] + (x[i - first] - start[i - first]),
  // start being x when the exchange started (the steps taken since kept whole).
  void step_and_carry(std::span<float> global, std::span<const float> sum, float n, std::size_t first,
                      std::size_t count, float* x, const float* start) {
    step_and_carry_part(global, sum.data() + first, n, first, count, x, start);
  }
  void step_and_carry_part(std::span<float> global, const float* part, float n, std::size_t first,
                           std::size_t count, float* x, const float* start) {
    run<merge_kind::carry>(global, part, n, first, count, x, start, 0.0f);
  }

  // The common model's length from which step_and_merge at alpha = 0 writes the local model by streaming
  // stores (sync/streaming_store.hpp): 8 MiB of floats, past what a core's share of a cache keeps.
  static constexpr std::size_t streamed_length = std::size_t{1} << 21;

  // For a loaded state: the caller has checked the length (0, or the model's with momentum).
  void replace_velocity(std::vector<float> v) noexcept { v_ = std::move(v); }

private:
  enum class merge_kind { restart, mix, carry, none }; // none: global and v alone

  // math::outer_step and the merge on `count` values, the choices they make per value made here once.
  template <bool Momentum, merge_kind M>
  static void merge_values(float* __restrict g, const float* __restrict s, float* __restrict v,
                           float* __restrict x, const float* __restrict start, std::size_t count, float n,
                           float lr, float mu, float alpha) {
    for (std::size_t j = 0; j < count; ++j) {
      const float mean = math::div_rn(s[j], n);
      float gj;
      if constexpr (Momentum)
        gj = math::nesterov_step(g[j], mean, lr, mu, v[j]);
      else
        gj = math::sgd_step(g[j], mean, lr);
      g[j] = gj;
      if constexpr (M == merge_kind::restart)
        x[j] = gj;
      else if constexpr (M == merge_kind::mix)
        x[j] = math::add_rn(gj, math::mul_rn(alpha, math::sub_rn(x[j], gj)));
      else if constexpr (M == merge_kind::carry)
        x[j] = math::carry(gj, x[j], start[j]);
    }
  }
  template <bool Momentum, merge_kind M>
  static void merge_group(float* __restrict g, const float* __restrict s, float* __restrict v,
                          float* __restrict x, const float* __restrict start, float n, float lr, float mu,
                          float alpha) {
    merge_values<Momentum, M>(g, s, v, x, start, 64, n, lr, mu, alpha);
  }
  template <merge_kind M>
  void run(std::span<float> global, const float* s, float n, std::size_t first, std::size_t count, float* x,
           const float* start, float alpha) {
    if (has_momentum()) {
      if (v_.empty()) v_.assign(global.size(), 0.0f);
      merge_run<true, M>(global, s, n, first, count, x, start, alpha);
    } else {
      merge_run<false, M>(global, s, n, first, count, x, start, alpha);
    }
  }
  // s: the sums of [first, first + count).
  template <bool Momentum, merge_kind M>
  void merge_run(std::span<float> global, const float* s, float n, std::size_t first, std::size_t count,
                 float* x, const float* start, float alpha) {
    const float lr = opt_.lr, mu = opt_.momentum;
    float* const v = Momentum ? v_.data() + first : nullptr;
    float* const g = global.data() + first;
    std::size_t i = 0;
    const auto at = [&](std::size_t k) { return start ? start + k : nullptr; };
    // alpha = 0 on a large model: each group's new common values copied to x by streaming stores (x is the
    // new values alone, so its old lines need not be read into the cache first).
    if constexpr (M == merge_kind::restart)
      if (global.size() >= streamed_length && count >= 64 + 3 && detail::can_stream(x, i)) {
        // i: the values before x's first 16-byte boundary, merged as they are.
        merge_values<Momentum, M>(g, s, v, x, nullptr, i, n, lr, mu, alpha);
        for (; i + 64 <= count; i += 64) {
          commsgd::detail::prefetch_group<true>(g + i);
          if constexpr (Momentum) commsgd::detail::prefetch_group<true>(v + i);
          merge_group<Momentum, merge_kind::none>(g + i, s + i, Momentum ? v + i : nullptr, nullptr, nullptr,
                                                  n, lr, mu, alpha);
          detail::stream_64(x + i, g + i);
        }
        detail::stream_fence();
      }
    const bool large = global.size() >= streamed_length;
    for (; i + 64 <= count; i += 64) {
      if (large) {
        commsgd::detail::prefetch_group<true>(g + i);
        if constexpr (Momentum) commsgd::detail::prefetch_group<true>(v + i);
        if constexpr (M != merge_kind::none) commsgd::detail::prefetch_group<true>(x + i);
      }
      merge_group<Momentum, M>(g + i, s + i, Momentum ? v + i : nullptr, x + i, at(i), n, lr, mu, alpha);
    }
    merge_values<Momentum, M>(g + i, s + i, Momentum ? v + i : nullptr, x + i, at(i), count - i, n, lr, mu,
                              alpha);
  }

  options opt_;
  std::vector<float> v_;
};

static_assert(outer_optimizer<outer_sgd>);

} // namespace commsgd::inline v1::sync
