// laplace_bisect: a Laplace tail estimate of the threshold, corrected in one counting pass.
//
// Cold: pass 1 sums |x| (b = mean |x|, t0 = b ln(N / k)); pass 2 counts the keys in 4096 buckets of
// relative width ~0.2 % spanning t0 / 16 .. 16 t0, wide enough for gradients whose tails are far heavier than
// Laplace; the bucket where the count crosses k is the answer when it holds few enough keys, otherwise one
// refine pass splits it. Warm: the previous threshold (kept in device memory by this object) centres a
// narrower window, and pass 1 is skipped. An estimate outside the window falls back to a full radix select.
// With `trim` the method is exact (ties to the lowest indices, same result as radix). No host
// synchronisation.
#pragma once

#include <commsgd/cuda/engine_dispatch.cuh>

namespace commsgd::inline v1::cuda {

struct laplace_bisect_options {
  double tol = 0.01;      // approximate: k <= count <= ceil((1 + tol) k)
  bool trim = false;      // exact k, as radix
  bool warm_start = true; // centre the window on the previous call's threshold
};

class laplace_bisect {
public:
  static constexpr bool is_exact = false;
  static constexpr const char* name = "laplace_bisect";

  explicit laplace_bisect(laplace_bisect_options options = {}) : options_(options), previous_(1) {
    commsgd::select::check_tolerance(options_.tol);
    // A defined (if useless) centre should a first call be refused for non-finite input.
    check(cudaMemset(previous_.data(), 0, sizeof(float)), "cudaMemset");
  }

  // Forget the previous threshold (for instance when the model or the density changes).
  void reset() noexcept { has_previous_ = false; }
  bool warm() const noexcept { return options_.warm_start && has_previous_; }
  // Device copy of the last threshold; callers that save state copy it out.
  const float* previous_threshold() const noexcept { return previous_.data(); }
  const laplace_bisect_options& options() const noexcept { return options_; }

  void select(void* workspace, std::size_t& workspace_bytes, const float* x, std::size_t n, std::size_t k,
              device_result* out, cudaStream_t stream = nullptr, device_result* host_out = nullptr) {
    using state_t = detail::laplace_bisect_state;
    detail::workspace_carver carver(workspace);
    const auto w = detail::carve_engine<state_t>(carver, n, laplace_bisect_tuning::candidate_divisor);
    if (detail::select_prologue(w, workspace, workspace_bytes, carver.bytes(), x, n, k, out, host_out,
                                stream))
      return;
    const std::size_t limit = options_.trim ? k : commsgd::select::count_limit(k, options_.tol);
    detail::launch_init(w, detail::initial_state<state_t>(n, k, limit, options_.trim ? 0 : 1, w.cap), stream);
    const unsigned grid = detail::grid_for(n);
    const bool warm_now = warm();
    if (warm_now) {
      // The centre comes from the previous call, stored on the device: copy it into the state without
      // bringing it to the host.
      check(cudaMemcpyAsync(&w.state->center, previous_.data(), sizeof(float), cudaMemcpyDeviceToDevice,
                            stream),
            "cudaMemcpyAsync(previous threshold)");
    } else {
      detail::abs_sum_kernel<><<<grid, detail::block_threads, 0, stream>>>(x, w.state);
      check_launch("abs_sum_kernel");
    }
    const detail::u32 span_log2 =
        warm_now ? laplace_bisect_tuning::warm_span_log2 : laplace_bisect_tuning::cold_span_log2;
    detail::window_pass_kernel<state_t>
        <<<grid, detail::block_threads, 0, stream>>>(x, w.state, w.hist, w.edge, span_log2, warm_now);
    check_launch("window_pass_kernel");
    detail::launch_digit_passes(x, n, w, detail::full_passes, false, stream);
    detail::launch_finalize(w, out, previous_.data(), host_out, stream);
    has_previous_ = true;
  }

  commsgd::select::threshold select(const float* x, std::size_t n, std::size_t k,
                                    cudaStream_t stream = nullptr) {
    return detail::select_allocating(*this, x, n, k, stream);
  }

private:
  laplace_bisect_options options_;
  device_buffer<float> previous_;
  bool has_previous_ = false;
};

} // namespace commsgd::inline v1::cuda
