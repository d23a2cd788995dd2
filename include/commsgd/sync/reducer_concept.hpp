// The reducer concept: how a strategy that sums block gradients gets the global sum.
//
// A strategy calls it with this rank's block gradients and an output buffer:
//
//   r.reduce(blocks, out);   collective: out <- the sum of every block gradient of every rank, the same bits
//                            on every rank; blocks[j] has out.size() values
//   r.block_count();         how many block gradients that sum adds up (the divisor of the mean)
//
// A strategy that sums block gradients offers a step that takes the reducer (block_strategy below):
//
//   s.step(params, blocks, r, info);
//
// A reducer is where coding and compression meet (coding/block_reducer.hpp, sparsify/sparse_reducer.hpp); the
// strategy only decides when to call it and what to do with the sum. Whoever holds the reducer passes it to
// each step, so neither side keeps a pointer to the other. A reducer checks finiteness as part of its one
// pass over the blocks; the strategy does not scan them again.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/sync/strategy.hpp>

#include <concepts>
#include <cstddef>
#include <span>

namespace commsgd::inline v1::sync {

// Block gradients of one rank (the same type as coding::block_gradients).
using block_gradients = std::span<const std::span<const float>>;

template <class R>
concept reducer = requires(R& r, const R& cr, block_gradients blocks, std::span<float> out) {
  r.reduce(blocks, out);
  { cr.block_count() } -> std::convertible_to<std::size_t>;
};

namespace detail {
struct reducer_archetype {
  void reduce(block_gradients, std::span<float>);
  std::size_t block_count() const;
};
} // namespace detail

static_assert(reducer<detail::reducer_archetype>);

// A strategy that sums block gradients: besides the sync_strategy members, a step that takes this rank's
// blocks and the reducer to sum them with (sync::synchronous has one).
template <class S, class R>
concept block_strategy = sync_strategy<S> && reducer<R> &&
    requires(S& s, std::span<float> params, block_gradients blocks, R& r, const step_info& info) {
  { s.step(params, blocks, r, info) } -> std::same_as<step_result>;
};

} // namespace commsgd::inline v1::sync
