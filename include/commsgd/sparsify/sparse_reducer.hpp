// sparsify::sparse_reducer<Sparsifier, Scheme, C>: a sparsifier and the sparse exchange as the reducer a
// strategy sums through (sync/reducer_concept.hpp).
//
// reduce(blocks, out) takes this rank's one block gradient, lets the sparsifier turn it into its message
// (the sparsifier's fused pass is the one check of the values this step) and sums every rank's message into
// out with an exchanger whose index type is the message's, so top_k<S, std::uint64_t> exchanges 64-bit
// indices. Scheme is the coding scheme that fixed the block assignment (one block per rank); the reducer
// owns it, the sparsifier and the exchanger, so the whole exchange side of a composition is one movable
// value.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sparsify/sparse_exchange.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>
#include <commsgd/sparsify/sparsifier.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace commsgd::inline v1::sparsify {

// The index type an exchanger needs for a message: a dense message has none, and any exchanger sums it.
template <message M>
struct message_index {
  using type = std::uint32_t;
};
template <sparse_index I>
struct message_index<sparse_view<I>> {
  using type = I;
};
template <message M>
using message_index_t = typename message_index<M>::type;

template <sparsifier Sparsifier, class Scheme, comm::communicator C>
class sparse_reducer {
public:
  using sparsifier_type = Sparsifier;
  using scheme_type = Scheme;
  using index_type = message_index_t<typename Sparsifier::message_type>;

  // `comm` must outlive the reducer.
  sparse_reducer(C& comm, Scheme scheme, Sparsifier sparsifier, exchange_options o = {})
      : comm_(&comm), scheme_(std::move(scheme)), sparsifier_(std::move(sparsifier)), exchanger_(o) {}

  const comm::exchange_report& reduce(std::span<const std::span<const float>> blocks, std::span<float> out) {
    if (blocks.size() != 1)
      throw size_mismatch(commsgd::concat("argument 'blocks' holds ", blocks.size(),
                                          " block gradients; a sparsifier takes one per rank"));
    last_ = exchanger_.sum(*comm_, sparsifier_.step(blocks[0]), out);
    return last_;
  }
  std::size_t block_count() const { return scheme_.block_count(); }

  Scheme& scheme() noexcept { return scheme_; }
  const Scheme& scheme() const noexcept { return scheme_; }
  Sparsifier& compression() noexcept { return sparsifier_; }
  const Sparsifier& compression() const noexcept { return sparsifier_; }
  const exchanger<index_type>& exchange() const noexcept { return exchanger_; }
  const comm::exchange_report& last() const noexcept { return last_; }

private:
  C* comm_;
  Scheme scheme_;
  Sparsifier sparsifier_;
  exchanger<index_type> exchanger_;
  comm::exchange_report last_{};
};

} // namespace commsgd::inline v1::sparsify
