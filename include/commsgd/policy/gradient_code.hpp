// policy::gradient_code<Kind>: a straggler code's block assignment in the coding slot.
#pragma once

#include <commsgd/coding/gradient_code_scheme.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// A gradient code of redundancy r (options::redundancy): fractional_repetition, cyclic, or the
// uncoded backup_workers baseline that waits for n - r + 1 answers (coding/gradient_code.hpp).
template <coding::gradient_code_kind Kind = coding::fractional_repetition>
struct gradient_code {};

template <class Kind>
struct coding_traits<gradient_code<Kind>> {
  template <comm::communicator C>
  using type = coding::gradient_code_scheme<Kind, C>;

  using options = redundancy_options;

  template <comm::communicator C>
  static type<C> make(C& c, std::size_t, const options& o) {
    return type<C>(c, o.redundancy);
  }

  static constexpr bool plain = false;

  template <class Compression>
  static consteval bool accepts() {
    static_assert(is_dense<Compression>,
                  "commsgd::data_parallel<gradient_code, Compression, Sync>: a gradient code decodes the sum "
                  "from fixed linear combinations of dense block gradients, which a sparsifier's per-rank "
                  "selections would break; use policy::dense");
    return true;
  }
};

} // namespace commsgd::inline v1::policy
