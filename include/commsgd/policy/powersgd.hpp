// policy::powersgd: compress::powersgd in the compression slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/powersgd.hpp>
#include <commsgd/policy/compressor.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// PowerSGD as data_parallel's compressor; its options are compress::powersgd_options (rank and layer
// shapes), the type of the options' `compression` field.
struct powersgd {};

template <>
struct compression_traits<powersgd> : compressor_traits<compression_traits<powersgd>, compress::powersgd> {
  using options = compress::powersgd_options;

  static compress::powersgd make(std::size_t length, const options& o) {
    return compress::powersgd(length, o);
  }
};

} // namespace commsgd::inline v1::policy
