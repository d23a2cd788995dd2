// hierarchical: per-segment candidates, then an exact radix select among them.
//
// Each segment of 4096 keys keeps the keys of its top-digit buckets down to the one holding its
// ceil(k S / N) + slack largest. The select among candidates is exact when no segment left out a key at or
// above the threshold found; the kernels check that on the device and otherwise select again over x, so the
// method is always exact (same threshold as radix). Passes: one read of x, then reads of the candidates.
#pragma once

#include <commsgd/cuda/engine/dispatch.cuh>

namespace commsgd::inline v1::cuda {

struct hierarchical {
  static constexpr bool is_exact = true;
  static constexpr const char* name = "hierarchical";

  // The slack makes a segment holding more than its share of the top k (Poisson-likely at small k S / N)
  // rare, so the fallback pass stays rare.
  static std::size_t segment_k(std::size_t n, std::size_t k) {
    const double share = static_cast<double>(k) * detail::segment_size / static_cast<double>(n);
    const double with_slack = std::ceil(share) + hierarchical_tuning::slack_fixed +
                              hierarchical_tuning::slack_sigmas * std::sqrt(share);
    return static_cast<std::size_t>(std::min<double>(with_slack, detail::segment_size));
  }

  void select(void* workspace, std::size_t& workspace_bytes, const float* x, std::size_t n, std::size_t k,
              device_result* out, cudaStream_t stream = nullptr, device_result* host_out = nullptr) const {
    using state_t = detail::hierarchical_state;
    detail::workspace_carver carver(workspace);
    const auto w = detail::carve_engine<state_t>(carver, n, hierarchical_tuning::candidate_divisor);
    if (detail::select_prologue(w, workspace, workspace_bytes, carver.bytes(), x, n, k, out, host_out,
                                stream))
      return;
    // First the threshold among the segments' candidates, checked; then, only if the check fails, over x.
    state_t init = detail::initial_state<state_t>(n, k, k, 0, w.cap);
    init.stage = static_cast<detail::u32>(detail::on_done::verify);
    init.main = {k, k, 0u};
    detail::launch_init(w, init, stream);
    const std::size_t segments = (n + detail::segment_size - 1) / detail::segment_size;
    const unsigned grid = static_cast<unsigned>(std::min<std::size_t>(
        segments, static_cast<std::size_t>(detail::multiprocessor_count()) * engine_tuning::blocks_per_sm));
    detail::segment_candidates_kernel<><<<grid, detail::block_threads, 0, stream>>>(
        x, w.state, static_cast<detail::u32>(segment_k(n, k)), w.cand0);
    check_launch("segment_candidates_kernel");
    // Among the candidates, then (only if the check fails) over x again.
    detail::launch_digit_passes(x, n, w, 2 * detail::full_passes, false, stream);
    detail::launch_finalize(w, out, nullptr, host_out, stream);
  }

  commsgd::select::threshold select(const float* x, std::size_t n, std::size_t k,
                                    cudaStream_t stream = nullptr) const {
    return detail::select_allocating(*this, x, n, k, stream);
  }
};

} // namespace commsgd::inline v1::cuda
