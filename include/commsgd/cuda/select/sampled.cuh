// sampled: DGC's estimate from a strided sample, corrected by the same one-pass window count as
// laplace_bisect (instead of DGC's fixed 0.8 / 1.3 steps, which need a pass per step).
//
// Passes: the exact threshold of the sample (about n / stride keys, read 3 times: cheap), one window pass
// over x centred on it, and a refine pass when the chosen bucket holds too many keys. No host
// synchronisation.
#pragma once

#include <commsgd/cuda/engine/dispatch.cuh>

namespace commsgd::inline v1::cuda {

struct sampled_options {
  double tol = 0.01;
  double sample_fraction = 0.01;
  bool trim = false;
};

class sampled {
public:
  static constexpr bool is_exact = false; // not for every options: see exact()
  static constexpr const char* name = "sampled";

  // With trim every call selects exactly k (select::selects_exactly asks this).
  bool exact() const noexcept { return options_.trim; }

  explicit sampled(sampled_options options = {}) : options_(options) {
    commsgd::select::check_tolerance(options_.tol);
    commsgd::check_range("sample_fraction", options_.sample_fraction, 1e-9, 1.0, "[1e-9, 1]");
  }

  void select(void* workspace, std::size_t& workspace_bytes, const float* x, std::size_t n, std::size_t k,
              device_result* out, cudaStream_t stream = nullptr, device_result* host_out = nullptr) const {
    const std::size_t stride =
        std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(1.0 / options_.sample_fraction)));
    const std::size_t m = n == 0 ? 0 : (n - 1) / stride + 1;
    using state_t = detail::sampled_state;
    detail::workspace_carver carver(workspace);
    const auto w = detail::carve_engine<state_t>(carver, n, sampled_tuning::candidate_divisor, m);
    if (detail::select_prologue(w, workspace, workspace_bytes, carver.bytes(), x, n, k, out, host_out,
                                stream))
      return;
    // The sample's share of k, at least 1 so that the sample always yields a threshold.
    const auto k_sample = std::clamp<std::size_t>(
        static_cast<std::size_t>(std::llround(static_cast<double>(k) * static_cast<double>(m) / n)), 1, m);
    // First the exact threshold of the sample, which cand[0] holds; then the main search over x.
    state_t init = detail::initial_state<state_t>(n, k_sample, k_sample, 0, w.cap);
    init.stage = static_cast<detail::u32>(detail::on_done::sample);
    init.main = {k, options_.trim ? k : commsgd::select::count_limit(k, options_.tol),
                 options_.trim ? 0u : 1u};
    init.source = 1;
    init.cur = 0;
    init.cand_count[0] = m;
    detail::launch_init(w, init, stream);
    detail::sample_kernel<><<<detail::grid_for(m), detail::block_threads, 0, stream>>>(x, stride, m, w.cand0);
    check_launch("sample_kernel");
    detail::launch_digit_passes(x, m, w, detail::full_passes, false, stream);
    const unsigned grid = detail::grid_for(n);
    detail::window_pass_kernel<state_t><<<grid, detail::block_threads, 0, stream>>>(
        x, w.state, w.hist, w.edge, sampled_tuning::span_log2, true);
    check_launch("window_pass_kernel");
    detail::launch_digit_passes(x, n, w, detail::full_passes, false, stream);
    detail::launch_finalize(w, out, nullptr, host_out, stream);
  }

  commsgd::select::threshold select(const float* x, std::size_t n, std::size_t k,
                                    cudaStream_t stream = nullptr) const {
    return detail::select_allocating(*this, x, n, k, stream);
  }

private:
  sampled_options options_;
};

} // namespace commsgd::inline v1::cuda
