// radix: exact radix select on magnitude keys with a candidate buffer (AIR top-k's shape).
//
// Passes over memory: digit 1 reads x; digit 2 reads x and keeps the keys of the chosen bucket; digit 3 reads
// only those. So about 2 reads of x, no host synchronisation.
#pragma once

#include <commsgd/cuda/engine/dispatch.cuh>

namespace commsgd::inline v1::cuda {

struct radix {
  static constexpr bool is_exact = true;
  static constexpr const char* name = "radix";

  // Two-phase: with workspace == nullptr only sets workspace_bytes. The threshold lands in *out (device
  // memory) and, when host_out (pinned) is given, is copied there on the same stream.
  void select(void* workspace, std::size_t& workspace_bytes, const float* x, std::size_t n, std::size_t k,
              device_result* out, cudaStream_t stream = nullptr, device_result* host_out = nullptr) const {
    detail::workspace_carver carver(workspace);
    const auto w = detail::carve_engine<detail::radix_state>(carver, n, radix_tuning::candidate_divisor);
    if (detail::select_prologue(w, workspace, workspace_bytes, carver.bytes(), x, n, k, out, host_out,
                                stream))
      return;
    detail::launch_init(w, detail::initial_state<detail::radix_state>(n, k, k, 0, w.cap), stream);
    detail::launch_digit_passes(x, n, w, detail::full_passes, true, stream);
    detail::launch_finalize(w, out, nullptr, host_out, stream);
  }

  // Allocating form; synchronises the stream to return the threshold (and throws on non-finite input).
  commsgd::select::threshold select(const float* x, std::size_t n, std::size_t k,
                                    cudaStream_t stream = nullptr) const {
    return detail::select_allocating(*this, x, n, k, stream);
  }
};

} // namespace commsgd::inline v1::cuda
