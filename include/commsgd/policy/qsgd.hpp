// policy::qsgd: compress::qsgd in the compression slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/qsgd.hpp>
#include <commsgd/policy/compressor.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// QSGD as data_parallel's compressor, with data_parallel_options::qsgd.
struct qsgd {};

template <>
struct compression_traits<qsgd> : compressor_traits<compression_traits<qsgd>, compress::qsgd> {
  template <class Options>
  static compress::qsgd make(std::size_t length, const Options& o) {
    return compress::qsgd(length, o.qsgd);
  }
};

} // namespace commsgd::inline v1::policy
