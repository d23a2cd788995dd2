// sync::synchronous: every step every rank exchanges its gradient and applies the mean (SSGD).
//
//   sync::synchronous s(comm, {.lr = 0.1f});                  // or synchronous<C, ordered_exchange<C>>
//   s.start(x); loop { grad at x; s.step(x, grad, {}); } s.finish(x);
//
// With block gradients and a reducer (sync/reducer_concept.hpp), as in data_parallel, the reducer makes the
// sum (a coding scheme's exchange, or a sparsifier's messages summed) and the step applies its mean:
//
//   s.step(x, blocks, reducer, {});
//
// Replicas stay bit-identical because every rank applies the same update to the same bits: the exchange
// hands every rank the same sum (its contract) and start() broadcasts rank 0's model.
//
// Checkpoints (state/strategy.hpp): the state is the learning rate, shared by every rank. After load() call
// start() with the model saved alongside; a loaded strategy's start() does not broadcast.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/dense_exchange.hpp>
#include <commsgd/sync/reducer_concept.hpp>
#include <commsgd/sync/replica_promise.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <istream>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::sync {

struct synchronous_options {
  float lr = 0.01f; // (0, inf)
};

template <comm::communicator C, exchange E = all_reduce_exchange<C>>
class synchronous : public state::checkpointed<synchronous<C, E>> {
public:
  using options = synchronous_options;

  synchronous(C& c, options o) requires std::constructible_from<E, C&> : synchronous(c, o, E(c)) {}

  synchronous(C& c, options o, E ex) : comm_(&c), opt_(o), exchange_(std::move(ex)) {
    detail::check_learning_rate("lr", opt_.lr);
  }

  bool computes_gradients() const { return true; }

  void start(std::span<float> params) {
    if (std::exchange(resumed_, false)) return;
    comm_->broadcast(params, 0);
  }

  step_result step(std::span<float> params, std::span<const float> grad, const step_info& = {}) {
    detail::check_same_size("grad", grad.size(), params.size());
    detail::require_finite("gradient", grad);
    sum_.assign(grad.begin(), grad.end());
    exchange_.sum(std::span<float>(sum_));
    apply_mean_sum(params, sum_, exchange_.size(), opt_.lr);
    return {.exchanged = true, .averaged = false};
  }

  // The reducer checks and sums the blocks; the update is the mean over every block of every rank.
  template <reducer R>
  step_result step(std::span<float> params, block_gradients blocks, R& reduce, const step_info& = {}) {
    sum_.resize(params.size());
    reduce.reduce(blocks, std::span<float>(sum_));
    apply_mean_sum(params, sum_, static_cast<int>(reduce.block_count()), opt_.lr);
    return {.exchanged = true, .averaged = false};
  }

  void finish(std::span<float>) {}

  float learning_rate() const { return opt_.lr; }
  void set_learning_rate(float lr) {
    detail::check_learning_rate("lr", lr);
    opt_.lr = lr;
  }

private:
  friend struct state::access;
  static constexpr const char* state_kind = "sync::synchronous";
  struct saved {
    float lr = 0.0f;
  };
  void save_section(state::writer& w, state::part which) const {
    if (which == state::part::shared) w.put<float>(opt_.lr);
  }
  void parse_section(state::reader& r, state::part which, saved& t) const {
    if (which == state::part::shared) t.lr = state::read_learning_rate(r);
  }
  void commit(saved&& t) noexcept {
    opt_.lr = t.lr;
    resumed_ = true;
  }

  C* comm_;
  options opt_;
  E exchange_;
  std::vector<float> sum_;
  bool resumed_ = false;
};

static_assert(sync_strategy<synchronous<comm::archetype>>);
static_assert(sync_strategy<synchronous<comm::archetype, ordered_exchange<comm::archetype>>>);

// What replica_guard may check (sync/replica_promise.hpp).
template <class C, class E>
struct replica_promise<synchronous<C, E>> {
  static bool after_step(const synchronous<C, E>&, const step_result&) { return true; }
  static bool after_finish(const synchronous<C, E>&) { return true; }
};

} // namespace commsgd::inline v1::sync
