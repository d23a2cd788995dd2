// sparsify::top_k<Selector, Index>: send the k largest magnitudes of gradient + residual, keep the rest.
//
// Per step, with e the residual (zero at start):
//   p = g + e                 computed once, in float, into a scratch buffer
//   s = top_k(p)              by the Selector, per layer or over the whole model
//   e <- p with the sent positions set to +0
// so every position of p ends up either sent or kept with its exact bits: nothing is rounded away and
// sent + new residual == old residual + gradient holds bit for bit.
// With momentum correction (momentum m > 0), u is a local momentum and v takes the role of e:
//   u <- m u + g; v <- v + u; s = top_k(v); zero v where sent, and (DGC's momentum factor masking, the
//   default) zero u there too.
// momentum_masking::keep lets u run on where sent, so that sent plus held back add up, bit for bit, to
// momentum SGD's updates. Masking is the default because keeping u trains worse at low densities: a
// coordinate held back for many steps is released as one burst of stale momentum, and masking damps the
// next one; at higher densities, where coordinates are sent often, keeping u loses less of their momentum.
// The new state and message are built in scratch buffers and swapped in only once the step has succeeded,
// so a step that throws (a NaN, a selector that refuses) leaves state and last message as they were (a
// selector's own warm-start memory aside).
//
// The CUDA counterpart is cuda::top_k (commsgd/cuda/select/top_k.cuh, behind commsgd/cuda.cuh): the same step on
// gradients in device memory (one fused elementwise kernel for p, a device selector, cuda::compact for the
// pairs), with the same tie rule (select::is_selected) and the same checkpoint codec (state/top_k.hpp); its
// header says which states move between the two.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/compact.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/sparsify/finite.hpp>
#include <commsgd/sparsify/momentum_masking.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>
#include <commsgd/sparsify/sparsifier.hpp>
#include <commsgd/state/top_k.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace commsgd::inline v1::sparsify {

// One stage of a density warm-up: `density` for the next `steps` steps.
struct warmup_stage {
  std::uint64_t steps = 0;
  double density = 1.0;
};

// DGC's warm-up: densities 25 %, 6.25 %, 1.5625 %, 0.390625 %, each for `steps_per_stage` steps (DGC uses
// one epoch per stage), after which the sparsifier's own density applies (DGC: 0.1 %).
inline std::vector<warmup_stage> dgc_warmup(std::uint64_t steps_per_stage) {
  return {{steps_per_stage, 0.25},
          {steps_per_stage, 0.0625},
          {steps_per_stage, 0.015625},
          {steps_per_stage, 0.00390625}};
}

struct top_k_options {
  double density = 0.01;                  // in (0, 1]; k = ceil(density * size) per layer
  std::optional<std::size_t> k;           // a fixed count over the whole model instead (0 allowed)
  std::vector<std::size_t> layer_offsets; // empty: one layer; else 0 = o_0 <= o_1 <= ... <= o_L = length
  double momentum = 0.0;                  // momentum correction when > 0; in [0, 1)
  momentum_masking masking = momentum_masking::dgc; // zero u where sent, or keep it
  std::vector<warmup_stage> warmup;                 // densities of the first steps, before `density`
  double clip_norm = 0.0;                           // > 0: scale g so that ||g||_2 <= clip_norm first; 0: off
  non_finite_policy on_non_finite = non_finite_policy::refuse;
};

// A selector may keep state between calls (a warm-start threshold). When it offers one of these two kinds
// of hook, that state is saved and loaded with the sparsifier's: stream hooks save(os)/load(is), or value
// hooks saved_state()/restore(state) with a trivially copyable state (select::laplace_bisect).
template <class S>
concept selector_with_stream_state = requires(const S& cs, S& s, std::ostream& os, std::istream& is) {
  cs.save(os);
  s.load(is);
};

template <class S>
concept selector_with_value_state = requires(const S& cs, S& s) {
  { cs.saved_state() } -> std::copyable;
  s.restore(cs.saved_state());
}
&&std::is_trivially_copyable_v<decltype(std::declval<const S&>().saved_state())>;

template <select::selector Selector, sparse_index Index = std::uint32_t>
class top_k {
public:
  using message_type = sparse_view<Index>;
  using selector_type = Selector;
  using index_type = Index;
  using options = top_k_options;
  static constexpr const char* name = "top_k";

  explicit top_k(std::size_t length, options opt = {}, const Selector& prototype = Selector{})
      : length_(length), opt_(std::move(opt)), sent_(length), next_(length) {
    validate();
    selectors_.assign(layers_.size() - 1, prototype);
    residual_.assign(length_, 0.0f);
    if (has_momentum()) momentum_.assign(length_, 0.0f);
  }

  std::size_t length() const noexcept { return length_; }
  std::uint64_t steps() const noexcept { return steps_; }
  const options& config() const noexcept { return opt_; }
  bool has_momentum() const noexcept { return opt_.momentum > 0.0; }
  std::size_t layer_count() const noexcept { return layers_.size() - 1; }

  // What is held back: e, or v under momentum correction.
  std::span<const float> residual() const noexcept { return residual_; }
  // DGC's u; empty without momentum correction.
  std::span<const float> momentum() const noexcept { return momentum_; }
  // The last step's message, as an owning vector.
  const basic_sparse_vector<Index>& last() const noexcept { return sent_; }
  std::span<Selector> selectors() noexcept { return selectors_; }

  double density_at(std::uint64_t step) const noexcept {
    for (const auto& s : opt_.warmup) {
      if (step < s.steps) return s.density;
      step -= s.steps;
    }
    return opt_.density;
  }

  // Entries planned for `step` (an approximate selector may send a few more).
  std::size_t k_at(std::uint64_t step) const {
    if (opt_.k) return *opt_.k;
    std::size_t k = 0;
    for (std::size_t l = 0; l + 1 < layers_.size(); ++l)
      k += select::k_for_density(layers_[l + 1] - layers_[l], density_at(step));
    return k;
  }

  sparse_view<Index> step(std::span<const float> g) {
    detail::check_gradient_size(g.size(), length_);
    work_.resize(length_);
    if (has_momentum()) work_u_.resize(length_);
    const float scale = clip_scale(g);
    const bool zero = opt_.on_non_finite == non_finite_policy::zero;
    std::uint32_t hi;
    if (scale != 1.0f)
      hi = zero ? accumulate<true, true>(g, scale) : accumulate<true, false>(g, scale);
    else
      hi = zero ? accumulate<false, true>(g, scale) : accumulate<false, false>(g, scale);
    if (hi >= select::infinite_key) {
      if (!zero) detail::throw_non_finite(g, "gradient");
      if (has_momentum()) detail::throw_non_finite(work_u_, "momentum m u + g (overflow)");
      detail::throw_non_finite(work_, has_momentum() ? "error-feedback sum v + u (overflow)"
                                                     : "error-feedback sum g + e (overflow)");
    }

    next_.clear();
    const double density = density_at(steps_);
    for (std::size_t l = 0; l + 1 < layers_.size(); ++l) {
      const std::size_t lo = layers_[l], n = layers_[l + 1] - lo;
      const std::size_t k = opt_.k ? *opt_.k : select::k_for_density(n, density);
      const std::span<const float> p(work_.data() + lo, n);
      const select::threshold t = selectors_[l].select(p, k);
      if (t.count() > 0) compact(lo, n, t);
    }
    std::swap(sent_, next_);
    residual_.swap(work_);
    if (has_momentum()) momentum_.swap(work_u_);
    ++steps_;
    return sent_.view();
  }

  // Takes back values of the last message that the exchange did not apply (a sparse all-reduce keeps only
  // the global top-k of the sums): residual[indices[j]] += values[j]. A sent position holds +0 after the
  // step, so the value comes back with its exact bits (a -0 is copied, not added, to keep its sign); under
  // momentum correction it returns to v, and u stays masked where it was sent. Every index must be below
  // length() and every value finite; all are checked before anything changes.
  void restore_unsent(std::span<const Index> indices, std::span<const float> values) {
    if (indices.size() != values.size())
      throw size_mismatch(commsgd::concat("argument 'indices' holds ", indices.size(),
                                          " entries but 'values' holds ", values.size()));
    for (std::size_t j = 0; j < indices.size(); ++j)
      if (static_cast<std::uint64_t>(indices[j]) >= length_)
        throw invalid_argument(commsgd::concat("argument 'indices' at position ", j, " = ", indices[j],
                                               " is outside the allowed range [0, ", length_, ")"));
    detail::throw_non_finite(values, "returned values");
    for (std::size_t j = 0; j < indices.size(); ++j) {
      float& e = residual_[static_cast<std::size_t>(indices[j])];
      e = std::bit_cast<std::uint32_t>(e) == 0 ? values[j] : e + values[j];
    }
  }

  // Forgets everything held back, as at construction.
  void reset() {
    std::fill(residual_.begin(), residual_.end(), 0.0f);
    std::fill(momentum_.begin(), momentum_.end(), 0.0f);
    steps_ = 0;
    sent_.clear();
  }

  // Replaces what is held back and the step count, keeping the selectors' warm-start state: for a host that
  // regroups parameters between sparsifiers (DDP rebuilding its buckets) and moves their residuals along.
  // `momentum` is empty unless momentum correction is on. Checked before anything changes.
  void assign(std::uint64_t steps, std::span<const float> residual, std::span<const float> momentum = {}) {
    if (residual.size() != length_)
      throw size_mismatch(commsgd::concat("argument 'residual' holds ", residual.size(),
                                          " values; this top_k's length is ", length_));
    if (momentum.size() != momentum_.size())
      throw size_mismatch(commsgd::concat("argument 'momentum' holds ", momentum.size(),
                                          " values; this top_k holds ", momentum_.size()));
    detail::throw_non_finite(residual, "residual");
    detail::throw_non_finite(momentum, "momentum");
    std::copy(residual.begin(), residual.end(), residual_.begin());
    std::copy(momentum.begin(), momentum.end(), momentum_.begin());
    steps_ = steps;
    sent_.clear();
  }

  void save(std::vector<std::byte>& out) const {
    out = state::write_top_k_state(name, layout(), steps_, residual_, momentum_, [&](std::size_t i) {
      std::vector<std::byte> bytes;
      const Selector& s = selectors_[i];
      if constexpr (selector_with_value_state<Selector>) {
        const auto st = s.saved_state();
        const auto raw = std::as_bytes(std::span(&st, 1));
        bytes.assign(raw.begin(), raw.end());
      } else if constexpr (selector_with_stream_state<Selector>) {
        std::ostringstream os(std::ios::binary);
        s.save(os);
        const std::string text = std::move(os).str();
        const auto raw = std::as_bytes(std::span<const char>(text));
        bytes.assign(raw.begin(), raw.end());
      }
      return bytes;
    });
  }
  void save(std::ostream& os) const { state::write_saved(os, *this); }

  // Everything is parsed and checked before anything is replaced, so a bad stream changes nothing.
  void load(std::span<const std::byte> blob) {
    std::vector<Selector> selectors = selectors_;
    state::top_k_contents c =
        state::read_top_k_state(blob, name, layout(), [&](std::size_t i, std::span<const std::byte> bytes) {
          Selector& s = selectors[i];
          if constexpr (selector_with_value_state<Selector>) {
            using state_t = decltype(s.saved_state());
            if (bytes.size() != sizeof(state_t))
              throw corrupt_data(commsgd::concat("saved state: selector state of ", bytes.size(),
                                                 " bytes, selector '", Selector::name, "' keeps ",
                                                 sizeof(state_t)));
            state_t st;
            std::memcpy(&st, bytes.data(), sizeof st);
            try {
              s.restore(st);
            } catch (const invalid_argument& e) {
              throw corrupt_data(std::string("saved state: selector state rejected: ") + e.what());
            }
          } else if constexpr (selector_with_stream_state<Selector>) {
            std::istringstream is(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                                  std::ios::binary);
            s.load(is);
          } else if (!bytes.empty()) {
            throw corrupt_data(commsgd::concat("saved state: holds selector state, but selector '",
                                               Selector::name, "' keeps none"));
          }
        });
    residual_.swap(c.residual);
    momentum_.swap(c.momentum);
    selectors_.swap(selectors);
    steps_ = c.steps;
    sent_.clear();
  }
  void load(std::istream& is) { load(state::read_frame(is)); }

private:
  void validate() {
    check_index_fits<Index>(length_);
    commsgd::check_range("density", opt_.density, std::nextafter(0.0, 1.0), 1.0, "(0, 1]");
    for (std::size_t j = 0; j < opt_.warmup.size(); ++j)
      commsgd::check_range("warmup[" + std::to_string(j) + "].density", opt_.warmup[j].density,
                           std::nextafter(0.0, 1.0), 1.0, "(0, 1]");
    commsgd::check_range("momentum", opt_.momentum, 0.0, std::nextafter(1.0, 0.0), "[0, 1)");
    if (opt_.masking != momentum_masking::keep && opt_.masking != momentum_masking::dgc)
      throw invalid_argument(commsgd::concat("argument 'masking' = ", static_cast<int>(opt_.masking),
                                             " is not one of keep (0), dgc (1)"));
    if (!(opt_.clip_norm >= 0.0) || std::isinf(opt_.clip_norm))
      throw invalid_argument(commsgd::concat("argument 'clip_norm' = ", opt_.clip_norm,
                                             " is outside the allowed range [0, inf) (0: off)"));
    if (opt_.k) {
      select::check_k(*opt_.k, length_);
      if (!opt_.layer_offsets.empty())
        throw invalid_argument("argument 'k' is a whole-model count and cannot be combined with "
                               "'layer_offsets'; give a density for per-layer selection");
    }
    if (opt_.layer_offsets.empty()) {
      layers_ = {0, length_};
      return;
    }
    const auto& o = opt_.layer_offsets;
    if (o.size() < 2 || o.front() != 0 || o.back() != length_)
      throw invalid_argument(commsgd::concat(
          "argument 'layer_offsets' must start at 0 and end at length = ", length_, " (it has ", o.size(),
          " entries", o.empty() ? std::string() : commsgd::concat(", from ", o.front(), " to ", o.back()),
          ")"));
    for (std::size_t j = 1; j < o.size(); ++j)
      if (o[j] < o[j - 1])
        throw invalid_argument(commsgd::concat("argument 'layer_offsets' must not decrease, but [", j - 1,
                                               "] = ", o[j - 1], " > [", j, "] = ", o[j]));
    layers_ = o;
  }

  // What the saved state must agree on.
  state::top_k_layout layout() const noexcept {
    return {length_, sizeof(Index), has_momentum(), layer_count(), selectors_.size()};
  }

  // 1 unless clipping is on and the gradient's norm exceeds the bound.
  float clip_scale(std::span<const float> g) const {
    if (opt_.clip_norm <= 0.0) return 1.0f;
    const bool zero = opt_.on_non_finite == non_finite_policy::zero;
    double ss = 0.0;
    for (float x : g)
      if (!zero || detail::is_finite_bits(x)) ss += static_cast<double>(x) * static_cast<double>(x);
    const double norm = std::sqrt(ss);
    // A non-finite norm means a non-finite gradient, which the fused pass reports.
    if (!std::isfinite(norm) || norm <= opt_.clip_norm) return 1.0f;
    return static_cast<float>(opt_.clip_norm / norm);
  }

  // Writes p (and u' under momentum) into the scratch buffers in one pass and returns the largest magnitude
  // key seen, so the finiteness test costs no extra pass.
  template <bool Clip, bool Zero>
  std::uint32_t accumulate(std::span<const float> g, float scale) {
    const float* gp = g.data();
    const float* e = residual_.data();
    float* p = work_.data();
    std::uint32_t hi = 0;
    auto grad = [&](std::size_t i) {
      float x = gp[i];
      if constexpr (Zero) x = detail::is_finite_bits(x) ? x : 0.0f;
      if constexpr (Clip) x *= scale;
      return x;
    };
    if (has_momentum()) {
      const float m = static_cast<float>(opt_.momentum);
      const float* u = momentum_.data();
      float* nu = work_u_.data();
      for (std::size_t i = 0; i < length_; ++i) {
        const float ui = m * u[i] + grad(i);
        nu[i] = ui;
        p[i] = e[i] + ui;
        hi = std::max(hi, std::max(select::magnitude_key(p[i]), select::magnitude_key(ui)));
      }
    } else {
      for (std::size_t i = 0; i < length_; ++i) {
        p[i] = grad(i) + e[i];
        hi = std::max(hi, select::magnitude_key(p[i]));
      }
    }
    return hi;
  }

  // Emits the selected positions of layer [lo, lo + n) in index order and clears them from the new state.
  void compact(std::size_t lo, std::size_t n, const select::threshold& t) {
    float* p = work_.data() + lo;
    float* u = has_momentum() && opt_.masking == momentum_masking::dgc ? work_u_.data() + lo : nullptr;
    const std::size_t before = next_.size();
    next_.reserve(before + t.count());
    const select::compaction r =
        select::for_each_selected(std::span<const float>(p, n), t, [&](std::size_t i) {
          next_.push_back_unchecked(static_cast<Index>(lo + i), p[i]);
          p[i] = 0.0f;
          if (u) u[i] = 0.0f;
        });
    if (r.more || r.taken != t.count())
      throw error(commsgd::concat("selector '", Selector::name, "' broke its contract: it reported ",
                                  t.count(), " entries (", t.above, " above ", t.value, ", ", t.at,
                                  " at it) but the layer at offset ", lo, " holds ",
                                  r.more ? std::string("more than that") : std::to_string(r.taken)));
  }

  std::size_t length_;
  options opt_;
  std::vector<std::size_t> layers_;
  std::vector<Selector> selectors_;
  std::vector<float> residual_, momentum_; // the state
  std::vector<float> work_, work_u_;       // the next state, built during a step
  basic_sparse_vector<Index> sent_, next_; // this step's message, and the one being built
  std::uint64_t steps_ = 0;
};

namespace detail {
// The least a selector can be, so the concept check below does not depend on any real selection method.
struct selector_archetype {
  static constexpr bool is_exact = true;
  static constexpr const char* name = "archetype";
  select::threshold select(std::span<const float>, std::size_t) { return {}; }
};
} // namespace detail

static_assert(select::selector<detail::selector_archetype>);
static_assert(sparsifier<top_k<detail::selector_archetype>>);
static_assert(sparsifier<top_k<detail::selector_archetype, std::uint64_t>>);

} // namespace commsgd::inline v1::sparsify
