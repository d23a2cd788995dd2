// policy::sign: compress::sign (EF-SignSGD) in the compression slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/sign.hpp>
#include <commsgd/policy/compressor.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// EF-SignSGD as data_parallel's compressor; its options are compress::sign_options.
struct sign {};

template <>
struct compression_traits<sign> : compressor_traits<compression_traits<sign>, compress::sign> {
  using options = compress::sign_options;

  static compress::sign make(std::size_t length, const options& o) { return compress::sign(length, o); }
};

} // namespace commsgd::inline v1::policy
