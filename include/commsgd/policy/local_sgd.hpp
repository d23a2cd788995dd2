// policy::local_sgd: sync::local_sgd (local steps, then model averaging) in the sync slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/traits.hpp>
#include <commsgd/sync/local_sgd.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// Averages models now and then; it exchanges by itself.
struct local_sgd {};

template <>
struct sync_traits<local_sgd> : exchanges_by_itself {
  template <comm::communicator C>
  using type = sync::local_sgd<C>;

  // Options::local_sgd with its lr replaced by Options::lr.
  template <comm::communicator C, class Options>
  static type<C> make(C& c, std::size_t, const Options& o) {
    return type<C>(c, with_lr(o.local_sgd, o.lr));
  }
};

} // namespace commsgd::inline v1::policy
