// policy::top_k<Selector, Index>: sparsify::top_k as data_parallel's compression (a sparsifier).
//
// Built from top_k_settings::top_k; its messages carry Index indices, and the exchange that sums them
// follows (sparsify/sparse_reducer.hpp). It sends one sparse set per rank, so it pairs with policy::uncoded<>
// only (the coding policies' traits say why).
#pragma once

#include <commsgd/policy/traits.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/sparsify/sparse_exchange.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <cstddef>
#include <cstdint>

namespace commsgd::inline v1::policy {

template <select::selector Selector, sparsify::sparse_index Index = std::uint32_t>
struct top_k {};

// What policy::top_k reads: the sparsifier's settings and how its messages are summed.
struct top_k_settings {
  sparsify::top_k_options top_k{};
  sparsify::exchange_options exchange{};
};

template <class Selector, class Index>
struct compression_traits<top_k<Selector, Index>> {
  using options = top_k_settings;
  static constexpr bool dense_blocks = false;
  using type = sparsify::top_k<Selector, Index>;

  static type make(std::size_t length, const options& o) { return type(length, o.top_k); }
};

} // namespace commsgd::inline v1::policy
