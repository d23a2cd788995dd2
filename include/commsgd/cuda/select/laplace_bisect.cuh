// laplace_bisect: a Laplace tail estimate of the threshold, corrected in one counting pass.
//
// Cold: pass 1 sums |x| (b = mean |x|, t0 = b ln(N / k)); pass 2 counts the keys in 4096 buckets of
// relative width ~0.2 % spanning t0 / 16 .. 16 t0, wide enough for gradients whose tails are far heavier than
// Laplace; the bucket where the count crosses k is the answer when it holds few enough keys, otherwise one
// refine pass splits it. An estimate outside the window falls back to a full radix select.
//
// Warm (the previous threshold and a record of how it moved, kept in device memory by this object): the
// host's warm rule (select/laplace_bisect.hpp): the next threshold is predicted from the last moves, and one
// window pass counts 4096 buckets of ~0.07 % from a floor a margin below the prediction while it keeps every
// key above the floor, so that finishing in the bucket reads those keys and not x; a miss below widens the
// window geometrically around the prediction (laplace_kernels.cuh). No sum pass.
//
// With `trim` the method is exact (ties to the lowest indices, same result as radix). No host
// synchronisation.
#pragma once

#include <commsgd/cuda/engine/dispatch.cuh>
#include <commsgd/cuda/select/laplace_kernels.cuh>
#include <commsgd/error.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/laplace_math.hpp>

namespace commsgd::inline v1::cuda {

struct laplace_bisect_options {
  double tol = 0.01;      // approximate: k <= count <= ceil((1 + tol) k)
  bool trim = false;      // exact k, as radix
  bool warm_start = true; // start from the previous call's threshold and how it moved
};

class laplace_bisect {
public:
  static constexpr bool is_exact = false; // not for every options: see exact()
  static constexpr const char* name = "laplace_bisect";

  // With trim every call selects exactly k (select::selects_exactly asks this).
  bool exact() const noexcept { return options_.trim; }

  explicit laplace_bisect(laplace_bisect_options options = {})
      : options_(options), previous_(1), tracker_(1) {
    commsgd::select::check_tolerance(options_.tol);
    // A defined (if useless) previous threshold should a first call be refused for non-finite input.
    check(cudaMemset(previous_.data(), 0, sizeof(float)), "cudaMemset");
    clear_tracker();
  }

  // Forget the previous threshold (for instance when the model or the density changes).
  void reset() noexcept { has_previous_ = false; }
  // Start the next call warm from `threshold` (a saved previous_threshold()), with no record of how it
  // moved: the host's restore. 0 makes the next call cold. It copies synchronously on the default stream:
  // a caller selecting on a non-blocking stream synchronises that stream first.
  void restore(float threshold) {
    if (!(threshold >= 0.0f) || commsgd::select::magnitude_key(threshold) >= commsgd::select::infinite_key)
      throw invalid_argument(commsgd::concat("laplace_bisect state threshold = ", threshold,
                                             " is outside the allowed range [0, +inf)"));
    check(cudaMemcpy(previous_.data(), &threshold, sizeof(float), cudaMemcpyHostToDevice),
          "cudaMemcpy(restored threshold)");
    clear_tracker();
    has_previous_ = threshold > 0.0f;
  }
  bool warm() const noexcept { return options_.warm_start && has_previous_; }
  // Device copy of the last threshold; callers that save state copy it out. A call refused for non-finite
  // input or for ties beyond the tolerance writes neither it nor the record of how it moved: the next call
  // starts from the last accepted threshold. Cold calls sum |x| with double atomics, so an approximate
  // threshold may differ in its last bits from run to run (select/selector.hpp, Determinism).
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
      // Window levels that a hit leaves unneeded return at once: enqueueing all three costs launches only.
      detail::warm_plan_kernel<><<<1, 1, 0, stream>>>(w.state, previous_.data(), tracker_.data());
      check_launch("warm_plan_kernel");
      for (detail::u32 level = 0; level < detail::warm_levels; ++level) {
        detail::warm_window_kernel<>
            <<<grid, detail::block_threads, 0, stream>>>(x, w.state, w.hist, w.edge, w.cand0, level);
        check_launch("warm_window_kernel");
      }
    } else {
      detail::abs_sum_kernel<><<<grid, detail::block_threads, 0, stream>>>(x, w.state);
      check_launch("abs_sum_kernel");
      detail::window_pass_kernel<state_t><<<grid, detail::block_threads, 0, stream>>>(
          x, w.state, w.hist, w.edge, laplace_bisect_tuning::cold_span_log2, false);
      check_launch("window_pass_kernel");
    }
    detail::launch_digit_passes(x, n, w, detail::full_passes, false, stream);
    if (options_.warm_start) {
      detail::warm_record_kernel<><<<1, 1, 0, stream>>>(w.state, previous_.data(), tracker_.data(), warm_now);
      check_launch("warm_record_kernel");
    }
    detail::launch_finalize(w, out, previous_.data(), host_out, stream);
    has_previous_ = true;
  }

  commsgd::select::threshold select(const float* x, std::size_t n, std::size_t k,
                                    cudaStream_t stream = nullptr) {
    return detail::select_allocating(*this, x, n, k, stream);
  }

private:
  void clear_tracker() {
    const commsgd::select::warm_tracker fresh{};
    check(cudaMemcpy(tracker_.data(), &fresh, sizeof(fresh), cudaMemcpyHostToDevice), "cudaMemcpy(tracker)");
  }

  laplace_bisect_options options_;
  device_buffer<float> previous_;
  device_buffer<commsgd::select::warm_tracker> tracker_;
  bool has_previous_ = false;
};

} // namespace commsgd::inline v1::cuda
