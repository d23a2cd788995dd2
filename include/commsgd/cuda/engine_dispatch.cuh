// Host side of the selection engine: workspace layout, grid sizes and the pass sequences.
#pragma once

#include <commsgd/cuda/engine_kernels.cuh>
#include <commsgd/cuda/memory.cuh>
#include <commsgd/select/selector.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace commsgd::inline v1::cuda::detail {

struct engine_workspace {
  engine_state* state;
  u64* hist;
  u64* edge;
  u32* cand0;
  u32* cand1;
  u64 cap;
};

// Candidate buffers hold n / divisor keys (at least 64 Ki, at most n): enough for the bucket chosen by a
// first 11-bit digit on any smooth distribution; heavier ties fall back to reading x again.
inline engine_workspace carve_engine(workspace_carver& carver, std::size_t n, std::size_t divisor,
                                     std::size_t at_least = 0) {
  engine_workspace w{};
  w.cap = std::min<u64>(n, std::max<u64>({n / divisor, u64{1} << 16, at_least}));
  w.state = carver.take<engine_state>(1);
  w.hist = carver.take<u64>(hist_bins);
  w.edge = carver.take<u64>(hist_bins);
  w.cand0 = carver.take<u32>(w.cap);
  w.cand1 = carver.take<u32>(w.cap);
  return w;
}

// A few blocks per SM, each looping over its share: enough loads in flight to saturate HBM, and few enough
// blocks that flushing the shared histograms stays cheap.
inline unsigned grid_for(std::size_t n) {
  const std::size_t tiles = (n + block_threads * 16 - 1) / (block_threads * 16);
  const std::size_t most = static_cast<std::size_t>(multiprocessor_count()) * 4;
  return static_cast<unsigned>(std::clamp<std::size_t>(tiles, 1, most));
}

inline u64 approx_limit(std::size_t k, double tol) {
  commsgd::detail::check_range("tol", tol, 0.0, 1e6, "[0, 1e6]");
  const double limit = std::ceil((1.0 + tol) * static_cast<double>(k));
  return static_cast<u64>(limit);
}

inline void launch_init(const engine_workspace& w, const engine_params& p, cudaStream_t stream) {
  engine_init_kernel<><<<1, 256, 0, stream>>>(w.state, p, w.hist, w.edge);
  check_launch("engine_init_kernel");
}

// `count` digit passes; each returns at once once the state is done, so enqueueing the worst case costs
// only a few microseconds of launches when fewer are needed.
inline void launch_digit_passes(const float* x, std::size_t n, const engine_workspace& w, int count,
                                bool track_first, cudaStream_t stream) {
  const unsigned grid = grid_for(n);
  for (int i = 0; i < count; ++i) {
    digit_pass_kernel<><<<grid, block_threads, 0, stream>>>(x, w.state, w.hist, w.edge, w.cand0, w.cand1,
                                                            track_first && i == 0);
    check_launch("digit_pass_kernel");
  }
}

// Passes needed to resolve all 31 key bits in 11-bit digits.
inline constexpr int full_passes = (key_bits + max_digit_bits - 1) / max_digit_bits;

inline void launch_finalize(const engine_workspace& w, device_result* out, float* previous,
                            device_result* host_out, cudaStream_t stream) {
  engine_finalize_kernel<><<<1, 1, 0, stream>>>(w.state, out, previous);
  check_launch("engine_finalize_kernel");
  if (host_out)
    check(cudaMemcpyAsync(host_out, out, sizeof(device_result), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(host result)");
}

// k == 0 or n == 0: nothing to select, but the input is still checked.
inline bool trivial_selection(const float* x, std::size_t n, std::size_t k, const engine_workspace& w,
                              device_result* out, device_result* host_out, cudaStream_t stream) {
  if (k != 0) return false;
  engine_params p{};
  p.n = n;
  launch_init(w, p, stream);
  if (n > 0) {
    nonfinite_kernel<><<<grid_for(n), block_threads, 0, stream>>>(x, w.state);
    check_launch("nonfinite_kernel");
  }
  launch_finalize(w, out, nullptr, host_out, stream);
  return true;
}

inline void check_select_args(const float* x, std::size_t n, std::size_t k, const device_result* out) {
  select::check_k(k, n);
  if (n > 0 && x == nullptr) throw invalid_argument("argument 'x' is null with n > 0");
  if (out == nullptr) throw invalid_argument("argument 'out' (device result) is null");
}

// The allocating form every method offers: ask for the workspace size, allocate it, run, read the result
// back. The one host synchronisation is in read_result.
template <class Method>
commsgd::select::threshold select_allocating(Method& method, const float* x, std::size_t n, std::size_t k,
                                             cudaStream_t stream) {
  std::size_t bytes = 0;
  method.select(nullptr, bytes, x, n, k, nullptr, stream);
  device_buffer<char> ws(bytes);
  device_buffer<device_result> out(1);
  method.select(ws.data(), bytes, x, n, k, out.data(), stream);
  return read_result(out.data(), stream);
}

} // namespace commsgd::inline v1::cuda::detail
