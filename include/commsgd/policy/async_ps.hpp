// policy::async_ps: sync::async_ps (a parameter server) in the sync slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/traits.hpp>
#include <commsgd/sync/async_ps.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// A parameter server on one rank; it exchanges by itself.
struct async_ps {};

template <>
struct sync_traits<async_ps> : exchanges_by_itself {
  template <comm::communicator C>
  using type = sync::async_ps<C>;

  using options = sync::async_ps_options; // its lr is replaced by the composition's

  template <comm::communicator C>
  static type<C> make(C& c, std::size_t, const options& o, float lr) {
    return type<C>(c, with_lr(o, lr));
  }
};

} // namespace commsgd::inline v1::policy
