// policy::partitioned: sync::partitioned (prioritised partitions in flight) in the sync slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/traits.hpp>
#include <commsgd/sync/partitioned.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// Exchanges partitions as backward produces them; it exchanges by itself.
struct partitioned {};

template <>
struct sync_traits<partitioned> : exchanges_by_itself {
  template <comm::communicator C>
  using type = sync::partitioned<C>;

  // Options::partitioned with its lr replaced by Options::lr; Options::layer_sizes, or one layer.
  template <comm::communicator C, class Options>
  static type<C> make(C& c, std::size_t length, const Options& o) {
    return type<C>(c, o.layer_sizes.empty() ? std::vector<std::size_t>{length} : o.layer_sizes,
                   with_lr(o.partitioned, o.lr));
  }
};

} // namespace commsgd::inline v1::policy
