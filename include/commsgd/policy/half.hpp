// policy::fp16 and policy::bf16: compress::half in the compression slot.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/policy/compressor.hpp>
#include <commsgd/policy/traits.hpp>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::policy {

// fp16 / bf16 as data_parallel's compressor; their options are compress::half_options.
struct fp16 {};
struct bf16 {};

template <>
struct compression_traits<fp16> : compressor_traits<compression_traits<fp16>, compress::fp16> {
  using options = compress::half_options;

  static compress::fp16 make(std::size_t length, const options& o) { return compress::fp16(length, o); }
};

template <>
struct compression_traits<bf16> : compressor_traits<compression_traits<bf16>, compress::bf16> {
  using options = compress::half_options;

  static compress::bf16 make(std::size_t length, const options& o) { return compress::bf16(length, o); }
};

} // namespace commsgd::inline v1::policy
