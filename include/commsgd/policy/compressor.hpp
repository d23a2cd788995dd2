// policy::compressor_traits: what the traits of every compressor policy inherit.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/compressed_reducer.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// What a compressor policy's compression_traits inherit (CRTP): Derived supplies
//   using options = <the compressor's settings>; static Compressor make(std::size_t length, const options&);
// and the round runs through compress::reducer. One block per rank, so only policy::uncoded<> pairs.
template <class Derived, class Compressor>
struct compressor_traits {
  static constexpr bool dense_blocks = false;

  template <class Scheme, comm::communicator C>
  using reducer = compress::reducer<Compressor, Scheme, C>;

  template <comm::communicator C, class Scheme, class Options>
  static reducer<Scheme, C> make_reducer(C& c, Scheme scheme, std::size_t length, const Options& o) {
    return reducer<Scheme, C>(c, std::move(scheme), Derived::make(length, o));
  }
};

} // namespace commsgd::inline v1::policy
