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

  // Options::async_ps with its lr replaced by Options::lr.
  template <comm::communicator C, class Options>
  static type<C> make(C& c, std::size_t, const Options& o) {
    return type<C>(c, with_lr(o.async_ps, o.lr));
  }
};

} // namespace commsgd::inline v1::policy
