// policy::synchronous: sync::synchronous (an exchange every step) in the sync slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/traits.hpp>
#include <commsgd/sync/synchronous.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// Sums block gradients every step, so it takes any coding scheme and any sparsifier.
struct synchronous {};

template <>
struct sync_traits<synchronous> {
  template <comm::communicator C>
  using type = sync::synchronous<C>;

  using options = no_options;

  template <comm::communicator C>
  static type<C> make(C& c, std::size_t, const options&, float lr) {
    return type<C>(c, sync::synchronous_options{.lr = lr});
  }

  template <class Coding, class Compression>
  static consteval bool accepts() {
    return true;
  }
};

} // namespace commsgd::inline v1::policy
