// policy::first_arrivals: sync::first_arrivals (a straggler code's first answers) in the sync slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/gradient_code.hpp>
#include <commsgd/policy/traits.hpp>
#include <commsgd/sync/first_arrivals.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// Proceeds with the first n - s answers of a gradient code (sync/first_arrivals.hpp); options in
// sync::first_arrivals_options, learning rate from the composition.
struct first_arrivals {};

template <class P>
inline constexpr bool is_gradient_code = false;
template <class K>
inline constexpr bool is_gradient_code<gradient_code<K>> = true;

template <>
struct sync_traits<first_arrivals> {
  template <comm::communicator C>
  using type = sync::first_arrivals<C>;

  using options = sync::first_arrivals_options; // its lr is replaced by the composition's

  template <comm::communicator C>
  static type<C> make(C& c, std::size_t length, const options& o, float lr) {
    return type<C>(c, length, with_lr(o, lr));
  }

  template <class Coding, class Compression>
  static consteval bool accepts() {
    static_assert(
        is_gradient_code<Coding> && is_dense<Compression>,
        "commsgd::data_parallel<Coding, Compression, first_arrivals>: proceeding with the first n - s "
        "answers needs a code that decodes the sum from any n - s ranks; use "
        "policy::gradient_code<fractional_repetition | cyclic | backup_workers> with policy::dense");
    return true;
  }
};

} // namespace commsgd::inline v1::policy
