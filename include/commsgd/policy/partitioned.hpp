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

// What policy::partitioned reads: the strategy's settings (its lr is replaced by the composition's) and the
// sizes of the layers in forward order (empty: one layer).
struct partitioned_settings {
  sync::partitioned_options partitioned{};
  std::vector<std::size_t> layer_sizes;
};

template <>
struct sync_traits<partitioned> : exchanges_by_itself {
  template <comm::communicator C>
  using type = sync::partitioned<C>;

  using options = partitioned_settings;

  template <comm::communicator C>
  static type<C> make(C& c, std::size_t length, const options& o, float lr) {
    return type<C>(c, o.layer_sizes.empty() ? std::vector<std::size_t>{length} : o.layer_sizes,
                   with_lr(o.partitioned, lr));
  }
};

} // namespace commsgd::inline v1::policy
