// The sync-strategy concept: when and what a data-parallel rank exchanges, and how it turns gradients into
// a model update.
//
// A trainer (or data_parallel<Coding, Compression, Sync>) drives every strategy through the same life cycle
// (tests/unit/sync_snippets.cpp compiles and runs it):
//
//   s.start(params);                         // once: ranks agree on the initial model (or a server takes it)
//   while (training) {
//     if (!s.computes_gradients()) break;    // a parameter server rank only serves, in finish()
//     ... gradient of this rank's mini-batch at `params` into `grad` ...
//     s.step(params, grad, {.loss = l});     // exchange (or not) and update `params` in place
//   }
//   s.finish(params);                        // completes everything; `params` is the final model
//
// `params` is this rank's model; after step() it is the model the next forward pass uses. `grad` is the
// gradient this rank computed at `params` (flat, any layer layout the strategy was told about).
//
// Models (each ends its header with a static_assert against comm::archetype):
//   synchronous   exchange the gradient every step                                  (sync/synchronous.hpp)
//   local_sgd     local steps, periodic or adaptive model averaging, correction     (sync/local_sgd.hpp)
//   diloco        DiLoCo: outer steps, streamed fragments, compressed codes         (sync/diloco.hpp)
//   async_ps      parameter server, asynchronous pushes and pulls, soft sync, SSP   (sync/async_ps.hpp)
//   partitioned   per-partition prioritised non-blocking exchange within a credit   (sync/partitioned.hpp)
#pragma once

#include <commsgd/config.hpp>

#include <concepts>
#include <limits>
#include <span>

namespace commsgd::inline v1::sync {

// What the trainer knows about the step besides the gradient.
struct step_info {
  // Mean loss of this rank's mini-batch at `params`; only strategies that adapt to the loss read it (and
  // then refuse a non-finite value), so others may leave it unset.
  double loss = std::numeric_limits<double>::quiet_NaN();
  // Seconds this rank spent computing the step's gradient; strategies that inject delays in units of the
  // compute (first_arrivals) read it, others ignore it.
  double compute_seconds = std::numeric_limits<double>::quiet_NaN();
};

struct step_result {
  bool exchanged = false; // this rank communicated on this step (the schedule tests observe this)
  bool averaged = false;  // models (not gradients) were averaged on this step
};

template <class S>
concept sync_strategy = requires(S& s, const S& cs, std::span<float> params, std::span<const float> grad,
                                 const step_info& info) {
  { cs.computes_gradients() } -> std::same_as<bool>;
  s.start(params);
  { s.step(params, grad, info) } -> std::same_as<step_result>;
  s.finish(params);
};

namespace detail {
// The least a strategy can be; keeps the concept honest about what it demands.
struct strategy_archetype {
  bool computes_gradients() const;
  void start(std::span<float>);
  step_result step(std::span<float>, std::span<const float>, const step_info&);
  void finish(std::span<float>);
};
} // namespace detail

static_assert(sync_strategy<detail::strategy_archetype>);

} // namespace commsgd::inline v1::sync
