// Host side of the selection engine (the dispatch layer): workspace layout, grid sizes and the pass
// sequences every method strings together.
#pragma once

#include <commsgd/cuda/engine/kernels.cuh>
#include <commsgd/cuda/engine/state.cuh>
#include <commsgd/cuda/engine/tuning.cuh>
#include <commsgd/cuda/memory.cuh>
#include <commsgd/select/selector.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace commsgd::inline v1::cuda::detail {

// The engine's piece of a workspace: the method's state, the global histograms and two candidate buffers.
template <class State>
struct engine_workspace {
  State* state;
  u64* hist;
  u64* edge;
  u32* cand0;
  u32* cand1;
  u64 cap;
};

// Candidate buffers hold n / divisor keys (engine_tuning::min_candidates at least, n at most); `at_least`
// raises the floor for a method that fills cand0 itself (sampled's sample).
template <class State>
engine_workspace<State> carve_engine(workspace_carver& carver, std::size_t n, std::size_t divisor,
                                     std::size_t at_least = 0) {
  engine_workspace<State> w{};
  w.cap = std::min<u64>(n, std::max<u64>({n / divisor, engine_tuning::min_candidates, at_least}));
  w.state = carver.take<State>(1);
  w.hist = carver.take<u64>(hist_bins);
  w.edge = carver.take<u64>(hist_bins);
  w.cand0 = carver.take<u32>(w.cap);
  w.cand1 = carver.take<u32>(w.cap);
  return w;
}

// Grid of a pass over n entries (see engine_tuning).
inline unsigned grid_for(std::size_t n) {
  constexpr std::size_t tile = static_cast<std::size_t>(block_threads) * engine_tuning::tile_items;
  const std::size_t tiles = (n + tile - 1) / tile;
  const std::size_t most = static_cast<std::size_t>(multiprocessor_count()) * engine_tuning::blocks_per_sm;
  return static_cast<unsigned>(std::clamp<std::size_t>(tiles, 1, most));
}

template <class State>
void launch_init(const engine_workspace<State>& w, const State& init, cudaStream_t stream) {
  engine_init_kernel<State><<<1, block_threads, 0, stream>>>(w.state, init, w.hist, w.edge);
  check_launch("engine_init_kernel");
}

// `count` digit passes; each returns at once once the state is done, so enqueueing the worst case costs
// only a few microseconds of launches when fewer are needed.
template <class State>
void launch_digit_passes(const float* x, std::size_t n, const engine_workspace<State>& w, int count,
                         bool track_first, cudaStream_t stream) {
  const unsigned grid = grid_for(n);
  for (int i = 0; i < count; ++i) {
    digit_pass_kernel<State><<<grid, block_threads, 0, stream>>>(x, w.state, w.hist, w.edge, w.cand0, w.cand1,
                                                                 track_first && i == 0);
    check_launch("digit_pass_kernel");
  }
}

// Passes needed to resolve all 31 key bits in digits of max_digit_bits.
inline constexpr int full_passes = (key_bits + max_digit_bits - 1) / max_digit_bits;

template <class State>
void launch_finalize(const engine_workspace<State>& w, device_result* out, float* previous,
                     device_result* host_out, cudaStream_t stream) {
  engine_finalize_kernel<><<<1, 1, 0, stream>>>(w.state, out, previous);
  check_launch("engine_finalize_kernel");
  if (host_out)
    check(cudaMemcpyAsync(host_out, out, sizeof(device_result), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(host result)");
}

inline void check_select_args(const float* x, std::size_t n, std::size_t k, const device_result* out) {
  select::check_k(k, n);
  if (n > 0 && x == nullptr) throw invalid_argument("argument 'x' is null with n > 0");
  if (out == nullptr) throw invalid_argument("argument 'out' (device result) is null");
}

// The k == 0 prologue of every method (n == 0 implies k == 0): nothing to select, but the input is still
// checked. Returns whether it handled the call.
template <class State>
bool trivial_selection(const float* x, std::size_t n, std::size_t k, const engine_workspace<State>& w,
                       device_result* out, device_result* host_out, cudaStream_t stream) {
  if (k != 0) return false;
  launch_init(w, initial_state<State>(n, 0), stream);
  if (n > 0) {
    nonfinite_kernel<><<<grid_for(n), block_threads, 0, stream>>>(x, w.state);
    check_launch("nonfinite_kernel");
  }
  launch_finalize(w, out, nullptr, host_out, stream);
  return true;
}

// The opening of every method's two-phase select, once `needed` bytes of workspace are laid out: answers a
// size query, checks the arguments, and takes k == 0. True when that finished the call.
template <class State>
bool select_prologue(const engine_workspace<State>& w, void* workspace, std::size_t& workspace_bytes,
                     std::size_t needed, const float* x, std::size_t n, std::size_t k, device_result* out,
                     device_result* host_out, cudaStream_t stream) {
  if (size_query(workspace, workspace_bytes, needed)) return true;
  check_select_args(x, n, k, out);
  return trivial_selection(x, n, k, w, out, host_out, stream);
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
