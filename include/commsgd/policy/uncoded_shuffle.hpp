// policy::uncoded_shuffle: coding::uncoded_shuffle in the coding slot.
#pragma once

#include <commsgd/coding/uncoded_shuffle.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// CSSGD's redundant assignment without the coding (coding/uncoded_shuffle.hpp).
struct uncoded_shuffle {};

template <>
struct coding_traits<uncoded_shuffle> : codes_dense_blocks {
  template <comm::communicator C>
  using type = coding::uncoded_shuffle<C>;

  template <comm::communicator C>
  static type<C> make(C& c, std::size_t, const options& o) {
    return type<C>(c, o.redundancy);
  }
};

} // namespace commsgd::inline v1::policy
