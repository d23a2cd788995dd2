// coding::block_reducer<Scheme>: a coding scheme as the reducer a strategy sums through
// (sync/reducer_concept.hpp).
//
// It owns the scheme, so whoever holds it (data_parallel) can move freely: the strategy is handed the
// reducer on every step and calls reduce(blocks, out), which is the scheme's exchange; the report of the
// last exchange stays here for the caller. The scheme's exchange is the one pass that checks the blocks'
// values; the strategy does not scan them again.
#pragma once

#include <commsgd/coding/scheme.hpp>
#include <commsgd/config.hpp>

#include <cstddef>
#include <span>
#include <utility>

namespace commsgd::inline v1::coding {

template <class Scheme>
class block_reducer {
public:
  using scheme_type = Scheme;

  explicit block_reducer(Scheme scheme) : scheme_(std::move(scheme)) {}

  // out <- the sum of every rank's block gradients; blocks in the order of scheme().my_blocks().
  const exchange_result& reduce(block_gradients blocks, std::span<float> out) {
    last_ = scheme_.exchange(blocks, out);
    return last_;
  }
  std::size_t block_count() const { return scheme_.block_count(); }

  Scheme& scheme() noexcept { return scheme_; }
  const Scheme& scheme() const noexcept { return scheme_; }
  const exchange_result& last() const noexcept { return last_; }

private:
  Scheme scheme_;
  exchange_result last_{};
};

} // namespace commsgd::inline v1::coding
