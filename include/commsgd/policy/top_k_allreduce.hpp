// policy::top_k_allreduce<Selector, Index>: sparsify::top_k summed by the sparse all-reduce
// (sparsify/allreduce.hpp) instead of the all-gather exchange, as data_parallel's sparsifier.
//
// It builds its own reducer (policy::builds_reducer), since the exchange hands values back to the
// sparsifier. Its options are top_k_allreduce_settings. Like policy::top_k it pairs with policy::uncoded<>
// only.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/traits.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/sparsify/allreduce.hpp>
#include <commsgd/sparsify/allreduce_reducer.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace commsgd::inline v1::policy {

template <select::selector Selector, sparsify::sparse_index Index = std::uint32_t>
struct top_k_allreduce {};

// What policy::top_k_allreduce reads: the sparsifier's settings and the sparse all-reduce's (its path:
// sparse, dense or automatic; the threshold's refresh period and drift bound).
struct top_k_allreduce_settings {
  sparsify::top_k_options top_k{};
  sparsify::allreduce_options allreduce{};
};

template <class Selector, class Index>
struct compression_traits<top_k_allreduce<Selector, Index>> {
  using options = top_k_allreduce_settings;
  static constexpr bool dense_blocks = false;
  using sparsifier_type = sparsify::top_k<Selector, Index>;
  template <class Scheme, comm::communicator C>
  using reducer = sparsify::allreduce_reducer<sparsifier_type, Scheme, C>;

  template <comm::communicator C, class Scheme>
  static reducer<Scheme, C> make_reducer(C& c, Scheme scheme, std::size_t length, const options& o) {
    return reducer<Scheme, C>(c, std::move(scheme), sparsifier_type(length, o.top_k), o.allreduce);
  }
};

} // namespace commsgd::inline v1::policy
