// policy::random_k: compress::random_k in the compression slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/random_k.hpp>
#include <commsgd/policy/compressor.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// random-k as data_parallel's compressor; its options are compress::random_k_options.
struct random_k {};

template <>
struct compression_traits<random_k> : compressor_traits<compression_traits<random_k>, compress::random_k> {
  using options = compress::random_k_options;

  static compress::random_k make(std::size_t length, const options& o) {
    return compress::random_k(length, o);
  }
};

} // namespace commsgd::inline v1::policy
