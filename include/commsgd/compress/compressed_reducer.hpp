// compress::reducer<Compressor, Scheme, C>: a compressor as the reducer a strategy sums through
// (sync/reducer_concept.hpp). The traits a compressor policy inherits, policy::compressor_traits, are in
// policy/compressor.hpp.
//
// reduce(blocks, out) takes this rank's one block gradient and lets the compressor run its round. Scheme is
// the coding scheme that fixed the block assignment (one block per rank); the reducer owns it and the
// compressor, so the exchange side of a composition stays one movable value.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <cstddef>
#include <span>
#include <utility>

namespace commsgd::inline v1::compress {

template <class Compressor, class Scheme, comm::communicator C>
requires compressor<Compressor, C>
class reducer {
public:
  using compressor_type = Compressor;
  using scheme_type = Scheme;

  // `comm` must outlive the reducer.
  reducer(C& comm, Scheme scheme, Compressor x)
      : comm_(&comm), scheme_(std::move(scheme)), x_(std::move(x)) {}

  const comm::exchange_report& reduce(std::span<const std::span<const float>> blocks, std::span<float> out) {
    if (blocks.size() != 1)
      throw size_mismatch(commsgd::concat("argument 'blocks' holds ", blocks.size(),
                                          " block gradients; a compressor takes one per rank"));
    last_ = x_.reduce(*comm_, blocks[0], out);
    return last_;
  }
  std::size_t block_count() const { return scheme_.block_count(); }

  Scheme& scheme() noexcept { return scheme_; }
  const Scheme& scheme() const noexcept { return scheme_; }
  // data_parallel::compression() reaches the compressor's state through this name.
  Compressor& compression() noexcept { return x_; }
  const Compressor& compression() const noexcept { return x_; }
  const comm::exchange_report& last() const noexcept { return last_; }

private:
  C* comm_;
  Scheme scheme_;
  Compressor x_;
  comm::exchange_report last_{};
};

} // namespace commsgd::inline v1::compress
