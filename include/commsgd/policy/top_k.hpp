// policy::top_k<Selector, Index>: sparsify::top_k as data_parallel's compression (a sparsifier).
//
// Built from data_parallel_options::top_k; its messages carry Index indices, and the exchange that sums them
// follows (sparsify/sparse_reducer.hpp). It sends one sparse set per rank, so it pairs with policy::uncoded<>
// only (the coding policies' traits say why).
#pragma once

#include <commsgd/policy/traits.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <cstddef>
#include <cstdint>

namespace commsgd::inline v1::policy {

template <select::selector Selector, sparsify::sparse_index Index = std::uint32_t>
struct top_k {};

template <class Selector, class Index>
struct compression_traits<top_k<Selector, Index>> {
  static constexpr bool dense_blocks = false;
  using type = sparsify::top_k<Selector, Index>;

  template <class Options>
  static type make(std::size_t length, const Options& o) {
    return type(length, o.top_k);
  }
};

} // namespace commsgd::inline v1::policy
