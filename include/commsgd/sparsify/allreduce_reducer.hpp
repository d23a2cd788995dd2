// sparsify::allreduce_reducer<Sparsifier, Scheme, C>: top-k with error feedback and the sparse all-reduce
// (sparsify/allreduce.hpp) as the reducer a strategy sums through (sync/reducer_concept.hpp).
//
// reduce(blocks, out): K = the sparsifier's planned count for this step (the same on every rank, checked by
// the exchange); the sparsifier's step gives this rank's local top-k of gradient + residual; the exchange
// sums and selects; the pairs it did not apply go back into the residual (top_k::restore_unsent). So, per
// rank and index, bit for bit: p = fl(g + e) either went into out's sum (and the new residual holds +0
// there) or is the new residual. If the exchange throws, every pair goes back before the error propagates.
// If the sparsifier refuses this rank's gradient (a NaN, a wrong size), the other ranks raise comm_aborted
// from the exchange's first round instead of waiting for this rank; their step then counts as one whose
// pairs all went back to the residual, and the refusing rank's state is as before its step.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sparsify/allreduce.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>
#include <commsgd/sparsify/sparsifier.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace commsgd::inline v1::sparsify {

// A sparsifier whose values the sparse all-reduce can hand back: sparse messages, a planned count per step,
// and restore_unsent (sparsify::top_k).
template <class S>
concept returnable_sparsifier =
    sparsifier<S> && !std::same_as<typename S::message_type, dense_view> &&
    requires(S & s, const S& cs, std::span<const typename S::index_type> i, std::span<const float> v) {
  { cs.k_at(cs.steps()) } -> std::convertible_to<std::size_t>;
  s.restore_unsent(i, v);
};

template <returnable_sparsifier Sparsifier, class Scheme, comm::communicator C>
class allreduce_reducer {
public:
  using sparsifier_type = Sparsifier;
  using scheme_type = Scheme;
  using index_type = typename Sparsifier::index_type;

  // `comm` must outlive the reducer.
  allreduce_reducer(C& comm, Scheme scheme, Sparsifier sparsifier, allreduce_options o = {})
      : comm_(&comm), scheme_(std::move(scheme)), sparsifier_(std::move(sparsifier)), exchange_(o) {}

  const allreduce_report& reduce(std::span<const std::span<const float>> blocks, std::span<float> out) {
    if (blocks.size() != 1)
      throw size_mismatch(commsgd::concat("argument 'blocks' holds ", blocks.size(),
                                          " block gradients; a sparsifier takes one per rank"));
    const std::uint64_t k = sparsifier_.k_at(sparsifier_.steps());
    typename Sparsifier::message_type mine;
    try {
      mine = sparsifier_.step(blocks[0]);
    } catch (const commsgd::error&) {
      // The other ranks are about to wait for this rank's header: tell them, then raise the reason here.
      exchange_.abandon(*comm_, sparsifier_.length(), k);
      throw;
    }
    try {
      exchange_.sum(*comm_, mine, k, out);
    } catch (...) {
      sparsifier_.restore_unsent(exchange_.returned_indices(), exchange_.returned_values());
      throw;
    }
    sparsifier_.restore_unsent(exchange_.returned_indices(), exchange_.returned_values());
    return exchange_.last();
  }
  std::size_t block_count() const { return scheme_.block_count(); }

  Scheme& scheme() noexcept { return scheme_; }
  const Scheme& scheme() const noexcept { return scheme_; }
  Sparsifier& compression() noexcept { return sparsifier_; }
  const Sparsifier& compression() const noexcept { return sparsifier_; }
  const allreducer<index_type>& exchange() const noexcept { return exchange_; }
  const allreduce_report& last() const noexcept { return exchange_.last(); }

private:
  C* comm_;
  Scheme scheme_;
  Sparsifier sparsifier_;
  allreducer<index_type> exchange_;
};

static_assert(returnable_sparsifier<top_k<detail::selector_archetype>>);
static_assert(returnable_sparsifier<top_k<detail::selector_archetype, std::uint64_t>>);

} // namespace commsgd::inline v1::sparsify
