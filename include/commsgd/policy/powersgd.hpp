// policy::powersgd: compress::powersgd in the compression slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/powersgd.hpp>
#include <commsgd/policy/compressor.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// PowerSGD as data_parallel's compressor. Its settings come from the options' `powersgd` member
// (data_parallel_options::powersgd: rank and layer shapes).
struct powersgd {};

template <>
struct compression_traits<powersgd> : compressor_traits<compression_traits<powersgd>, compress::powersgd> {
  template <class Options>
  static compress::powersgd make(std::size_t length, const Options& o) {
    return compress::powersgd(length, o.powersgd);
  }
};

} // namespace commsgd::inline v1::policy
