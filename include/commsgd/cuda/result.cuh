// The threshold as it lands in device memory, and its conversion to the host `select::threshold`.
#pragma once

#include <commsgd/cuda/error.cuh>
#include <commsgd/select/selector.hpp>

#include <cstdint>
#include <string_view>

namespace commsgd::inline v1::cuda {

enum result_flag : std::uint32_t {
  // An approximate method found more than ceil((1 + tol) k) entries tied at its threshold.
  ties_exceed_tolerance = 1u,
  // The engine's histograms held fewer keys than its own counts said they must: a fault of the engine.
  internal_inconsistency = 2u,
};

// "No non-finite value": the first index every device-side count of NaN and inf reports while its count is 0
// (device_result, non_finite_count, the top-k steps' statuses). Counts start from it and atomicMin down to
// the first bad index, so no record can read as index 0; all bits set, a memset of 0xff writes it.
inline constexpr unsigned long long no_nonfinite_index = ~0ull;

// Plain data so that it can live in device memory, in a pinned host copy, or in a caller's struct. The
// non-finite count travels with the threshold: a selection never has to stop the stream to check its input,
// the check happens where the caller reads the result.
struct device_result {
  float value;
  std::uint32_t flags;
  unsigned long long above;
  unsigned long long at;
  unsigned long long nonfinite_count;
  unsigned long long first_nonfinite; // no_nonfinite_index when nonfinite_count is 0
};

// Throws non_finite or unsupported as the host selectors would (internal_error on a fault of the engine);
// otherwise the threshold.
inline select::threshold to_threshold(const device_result& r, std::string_view what = "x") {
  if (r.nonfinite_count > 0) throw non_finite(what, r.nonfinite_count, r.first_nonfinite);
  if (r.flags & internal_inconsistency)
    throw internal_error("the CUDA selection engine's histogram counts disagreed with its own search state "
                         "(fewer keys in the bins than still to select); the threshold is unknown");
  if (r.flags & ties_exceed_tolerance)
    throw unsupported(commsgd::concat("more entries tie at threshold ", r.value,
                                      " than the tolerance allows (", r.above + r.at, " selected)"));
  return select::threshold{r.value, static_cast<std::size_t>(r.above), static_cast<std::size_t>(r.at)};
}

// The one host synchronisation of the convenience forms: wait for the stream, then read the result.
inline select::threshold read_result(const device_result* d_result, cudaStream_t stream) {
  device_result r{};
  check(cudaMemcpyAsync(&r, d_result, sizeof r, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync(result)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return to_threshold(r);
}

} // namespace commsgd::inline v1::cuda
