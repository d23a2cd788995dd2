// policy::cssgd<Combiner>: coding::cssgd (coded multicast) in the coding slot.
#pragma once

#include <commsgd/coding/cssgd.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// Redundancy r (options::redundancy), coded multicasts in (r+1)-groups (coding/cssgd.hpp).
template <coding::combiner Combiner = coding::xor_bits>
struct cssgd {};

template <class Combiner>
struct coding_traits<cssgd<Combiner>> : codes_dense_blocks {
  template <comm::communicator C>
  using type = coding::cssgd<Combiner, C>;

  template <comm::communicator C>
  static type<C> make(C& c, std::size_t, const options& o) {
    return type<C>(c, o.redundancy);
  }
};

} // namespace commsgd::inline v1::policy
