// The exchange concept: how a strategy sums a dense float buffer across the ranks of its group.
//
// Strategies call an exchange instead of the communicator so that a sparsifier or a coding scheme can be put
// in between later without touching the strategy. Contract of every model:
//   sum(data)  collective and in place: every rank ends with the element-wise sum over ranks, the same bits
//              on every rank (strategies rely on this to keep replicas identical and to agree on schedules).
//   size()     how many ranks contribute to the sum.
//
// Models:
//   all_reduce_exchange<C>  the communicator's all_reduce_sum (the transport picks the reduction order).
//   ordered_exchange<C>     all_gather, then sum in rank order on every rank: the same bits on every
//                           transport and equal to a single-process sum of the per-rank buffers in rank
//                           order. Costs n times the receive volume of a ring all-reduce; use it where
//                           reproducibility matters.
//
//   sync::synchronous<C, sync::ordered_exchange<C>> s(comm, {.lr = 0.1f});   // tests/unit/sync_snippets.cpp
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/config.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

namespace commsgd::inline v1::sync {

template <class E>
concept exchange = requires(E& e, const E& ce, std::span<float> data) {
  e.sum(data);
  { ce.size() } -> std::convertible_to<int>;
};

template <comm::communicator C>
class all_reduce_exchange {
public:
  explicit all_reduce_exchange(C& c) : comm_(&c) {}
  void sum(std::span<float> data) { comm_->all_reduce_sum(data); }
  int size() const { return comm_->size(); }

private:
  C* comm_;
};

template <comm::communicator C>
class ordered_exchange {
public:
  explicit ordered_exchange(C& c) : comm_(&c) {}

  void sum(std::span<float> data) {
    const std::size_t n = static_cast<std::size_t>(comm_->size());
    if (n == 1) return;
    gathered_.resize(n * data.size());
    comm_->all_gather(std::span<const float>(data), std::span<float>(gathered_));
    for (std::size_t i = 0; i < data.size(); ++i) {
      float acc = gathered_[i];
      for (std::size_t r = 1; r < n; ++r)
        acc += gathered_[r * data.size() + i];
      data[i] = acc;
    }
  }
  int size() const { return comm_->size(); }

private:
  C* comm_;
  std::vector<float> gathered_;
};

static_assert(exchange<all_reduce_exchange<comm::archetype>>);
static_assert(exchange<ordered_exchange<comm::archetype>>);

} // namespace commsgd::inline v1::sync
