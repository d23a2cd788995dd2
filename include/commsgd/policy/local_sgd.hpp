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

  using options = sync::local_sgd_options; // its lr is replaced by the composition's

  template <comm::communicator C>
  static type<C> make(C& c, std::size_t, const options& o, float lr) {
    return type<C>(c, with_lr(o, lr));
  }
};

} // namespace commsgd::inline v1::policy
