// policy::uncoded<Exchange>: coding::uncoded (one block per rank) in the coding slot.
#pragma once

#include <commsgd/coding/uncoded.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// 1/n of the batch per rank, summed by the Exchange (coding/uncoded.hpp).
template <coding::uncoded_exchange Exchange = coding::by_ring_all_reduce>
struct uncoded {};

template <class Exchange>
struct coding_traits<uncoded<Exchange>> {
  template <comm::communicator C>
  using type = coding::uncoded<C, Exchange>;

  using options = no_options;

  template <comm::communicator C>
  static type<C> make(C& c, std::size_t, const options&) {
    return type<C>(c);
  }

  static constexpr bool plain = std::same_as<Exchange, coding::by_ring_all_reduce>;

  template <class Compression>
  static consteval bool accepts() {
    static_assert(is_dense<Compression> || plain,
                  "commsgd::data_parallel<uncoded<all-gather or unicast>, Compression, Sync>: a sparsifier "
                  "(top_k) brings its own sparse exchange (all_gather_v with a dense fallback), so it pairs "
                  "only with the default policy::uncoded<>");
    return true;
  }
};

} // namespace commsgd::inline v1::policy
