// policy::dense: nothing in the compression slot; the block gradients reach the coding scheme as they are.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/policy/traits.hpp>
#include <commsgd/sparsify/none.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// No sparsifier: every coding scheme sums the dense block gradients.
struct dense {};

template <>
struct compression_traits<dense> {
  using options = no_options;
  static constexpr bool dense_blocks = true;
};

} // namespace commsgd::inline v1::policy
