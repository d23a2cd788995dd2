// policy::qsgd: compress::qsgd in the compression slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/qsgd.hpp>
#include <commsgd/policy/compressor.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// QSGD as data_parallel's compressor; its options are compress::qsgd_options.
struct qsgd {};

template <>
struct compression_traits<qsgd> : compressor_traits<compression_traits<qsgd>, compress::qsgd> {
  using options = compress::qsgd_options;

  static compress::qsgd make(std::size_t length, const options& o) { return compress::qsgd(length, o); }
};

} // namespace commsgd::inline v1::policy
