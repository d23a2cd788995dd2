// cuda::top_k<Selector, Index>: the top-k sparsifier with error feedback for gradients in device memory.
//
// The same step as sparsify::top_k, run on the GPU with the state (residual e, and DGC's u under momentum
// correction) kept in device memory:
//   p = g + e                  one fused elementwise kernel, which also counts NaN/inf in g (and overflow
//                              in p) in the same pass
//   s = top_k(p)               the device Selector (laplace_bisect by default, any cuda:: selector fits)
//   pairs of s, index order    cuda::compact: |p_i| > t, plus the first `at` indices with |p_i| == t (the
//                              host tie rule, so an exact selector sends the host top_k<select::exact>'s
//                              set); at density 1 (k == length) the selector is skipped and everything is
//                              sent
//   e <- p, +0 where sent      a scatter over the sent indices; every other position keeps p's exact bits,
//                              so sent + new residual == old residual + gradient, bit for bit
//   pairs -> pinned host       returned as a sparsify::sparse_view<Index>, for sparsify::exchanger::sum
// With momentum m > 0: u' = m u + g, p = e + u' (DGC's v); u' is zeroed where sent under
// sparsify::momentum_masking::dgc (the default), as on the host (sparsify/top_k.hpp).
//
// Host synchronisation: ONE cudaStreamSynchronize per step, at the end of step(), after the pairs, their
// count, the threshold and the non-finite counts have been copied to pinned memory. Only then does the host
// look at anything (to refuse NaN, to learn the count). Everything before it is stream-ordered.
// A second synchronisation happens only when an approximate selector returns more entries than the
// preallocated capacity (then the buffers grow, the compaction runs again and the stream is waited on again);
// capacity is kept, so this happens at most a few times per run. save()/load() synchronise the stream too.
//
// Failure leaves the sparsifier as it was: the next state is built in scratch buffers (p, u') that are
// swapped in only after the host has checked the step, and the message is staged in the other of two
// pinned buffers, so the view returned by the previous step stays valid (a selector's own warm-start memory
// aside, as on the host). The view returned by step() is valid until the next successful step.
//
// A trainer whose gradients stay on the GPU wants cuda::batched_top_k instead (batched_top_k.cuh): many
// tensors per call, 16-bit gradients, the pairs left in device memory, no synchronisation, near one pass.
//
// Not here (see sparsify::top_k for them on the host): per-layer selection, fixed k, density warm-up,
// clipping and the `zero` non-finite policy. Non-finite gradients are always refused.
//
// Checkpoints: save() and load() use the host sparsifier's codec (state/top_k.hpp: "top_k", here with
// one layer and an empty selector state), so a GPU checkpoint loads into a host top_k<S, Index> with one
// layer whose selector keeps no state (select::exact, select::radix) and back.
// A device selector's warm-start memory (laplace_bisect's previous threshold) is not saved: after load() it
// starts cold, so its next threshold may differ (within its tolerance) from an uninterrupted run's. Exact
// selectors (exact, radix) continue bit-identically.
#pragma once

#include <commsgd/cuda/engine/dispatch.cuh>
#include <commsgd/cuda/engine/tuning.cuh>
#include <commsgd/cuda/memory.cuh>
#include <commsgd/cuda/result.cuh>
#include <commsgd/cuda/select/compact.cuh>
#include <commsgd/cuda/select/laplace_bisect.cuh>
#include <commsgd/select/key.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/sparsify/momentum_masking.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>
#include <commsgd/state/top_k.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::cuda {

// What cuda::top_k needs of a selector: the two-phase, stream-ordered form of every cuda:: selector.
template <class S>
concept device_selector = requires(S& s, void* ws, std::size_t& bytes, const float* x, std::size_t n,
                                   device_result* out, cudaStream_t stream) {
  s.select(ws, bytes, x, n, n, out, stream);
  { S::is_exact } -> std::convertible_to<bool>;
  { S::name } -> std::convertible_to<const char*>;
};

struct top_k_options {
  double density = 0.01; // in (0, 1]; k = ceil(density * length), as select::k_for_density
  double momentum = 0.0; // momentum correction when > 0; in [0, 1)
  sparsify::momentum_masking masking = sparsify::momentum_masking::dgc; // as sparsify::top_k_options
};

namespace detail {

// Non-finite values met by the fused update: in the gradient, and (with a finite gradient) in what it
// produced, which can overflow. first_* is no_nonfinite_index when its count is 0.
struct top_k_status {
  u64 grad_count;
  u64 grad_first;
  u64 sum_count;
  u64 sum_first;
};

// Everything the host reads after the step's one synchronisation, in one block so one copy brings it.
struct top_k_scalars {
  top_k_status status;
  device_result result;
  unsigned long long count; // pairs in the selected set (may exceed the capacity; see step())
};

// p = g + e (or u' = m u + g, p = e + u'), counting non-finite values in the same pass. Rounded operations
// (__fadd_rn, __fmul_rn) keep nvcc from contracting m u + g into an FMA, so the result matches the host's
// float arithmetic bit for bit.
template <bool Momentum>
__global__ void __launch_bounds__(block_threads)
    top_k_accumulate_kernel(const float* __restrict__ g, const float* __restrict__ e,
                            const float* __restrict__ u, float m, u64 n, float* __restrict__ p,
                            float* __restrict__ u_next, top_k_status* status) {
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 i = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const float gi = g[i];
    float pi;
    bool sum_bad;
    if constexpr (Momentum) {
      const float ui = __fadd_rn(__fmul_rn(m, u[i]), gi);
      u_next[i] = ui;
      pi = __fadd_rn(e[i], ui);
      sum_bad = select::magnitude_key(pi) >= select::infinite_key ||
                select::magnitude_key(ui) >= select::infinite_key;
    } else {
      pi = __fadd_rn(gi, e[i]);
      sum_bad = select::magnitude_key(pi) >= select::infinite_key;
    }
    p[i] = pi;
    if (select::magnitude_key(gi) >= select::infinite_key) [[unlikely]] {
      atomicAdd(&status->grad_count, 1ull);
      atomicMin(&status->grad_first, i);
    } else if (sum_bad) [[unlikely]] {
      atomicAdd(&status->sum_count, 1ull);
      atomicMin(&status->sum_first, i);
    }
  }
}

// Sets p (and u') to +0 at the sent indices. Does nothing when the selected set overflowed the pair buffers
// (the host then grows them and runs compaction and this kernel again on the untouched p).
template <class Index>
__global__ void __launch_bounds__(block_threads)
    top_k_zero_sent_kernel(const Index* __restrict__ index, const unsigned long long* count, u64 capacity,
                           float* __restrict__ p, float* __restrict__ u_next) {
  const u64 c = *count;
  if (c > capacity) return;
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 j = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; j < c; j += stride) {
    const Index i = index[j];
    p[i] = 0.0f;
    if (u_next) u_next[i] = 0.0f;
  }
}

// The threshold that selects every entry: +0, with all n entries counted as tied at it.
template <class = void>
__global__ void top_k_all_kernel(device_result* out, u64 n) {
  *out = device_result{0.0f, 0u, 0ull, n, 0ull, no_nonfinite_index};
}

// Page-locked host array: the target of the asynchronous copies of the pairs.
template <class T>
using pinned_array = owned_array<T, pinned_memory>;

inline unsigned grid_for_count(std::size_t n) {
  const std::size_t blocks = (n + block_threads - 1) / block_threads;
  const std::size_t most =
      static_cast<std::size_t>(multiprocessor_count()) * top_k_tuning::zero_blocks_per_sm;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, most));
}

} // namespace detail

template <device_selector Selector = laplace_bisect, sparsify::sparse_index Index = std::uint32_t>
class top_k {
public:
  using message_type = sparsify::sparse_view<Index>;
  using selector_type = Selector;
  using index_type = Index;
  using options = top_k_options;
  // The host sparsifier's name: the saved state has the same format.
  static constexpr const char* name = "top_k";

  explicit top_k(std::size_t length, options opt = {}, Selector selector = Selector{})
      : length_(length), opt_(opt), selector_(std::move(selector)) {
    sparsify::check_index_fits<Index>(length_);
    k_ = select::k_for_density(length_, opt_.density); // checks density in (0, 1]
    commsgd::check_range("momentum", opt_.momentum, 0.0, std::nextafter(1.0, 0.0), "[0, 1)");
    residual_ = device_buffer<float>(length_);
    work_ = device_buffer<float>(length_);
    if (has_momentum()) {
      momentum_ = device_buffer<float>(length_);
      work_u_ = device_buffer<float>(length_);
    }
    scalars_ = device_buffer<detail::top_k_scalars>(1);
    host_scalars_ = detail::pinned_array<detail::top_k_scalars>(1);
    zero_state(nullptr);
    check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
    // Exact selectors (trimmed ones too) return k pairs; approximate ones up to about (1 + tol) k: a margin,
    // grown on demand.
    grow_device_pairs(
        select::selects_exactly(selector_)
            ? k_
            : std::min(length_, k_ + k_ / top_k_tuning::margin_divisor + top_k_tuning::margin_extra));
  }

  std::size_t length() const noexcept { return length_; }
  std::size_t k() const noexcept { return k_; }
  std::uint64_t steps() const noexcept { return steps_; }
  const options& config() const noexcept { return opt_; }
  bool has_momentum() const noexcept { return opt_.momentum > 0.0; }
  Selector& selector() noexcept { return selector_; }
  // Pairs the device buffers hold without growing: k for an exact selector, a margin above it otherwise.
  std::size_t pair_capacity() const noexcept { return capacity_; }

  // Device pointers to the state: e (v under momentum correction), and DGC's u (null without momentum).
  const float* residual() const noexcept { return residual_.data(); }
  const float* momentum() const noexcept { return momentum_.data(); }

  // Copies of the state on the host; synchronise `stream`.
  std::vector<float> residual_to_host(cudaStream_t stream = nullptr) const {
    return to_host(residual_.data(), stream);
  }
  std::vector<float> momentum_to_host(cudaStream_t stream = nullptr) const {
    return has_momentum() ? to_host(momentum_.data(), stream) : std::vector<float>{};
  }

  // The last successful step's message (empty before the first).
  sparsify::sparse_view<Index> last() const noexcept {
    const auto& s = stage_[current_];
    return {length_, std::span<const Index>(s.index.data(), sent_),
            std::span<const float>(s.value.data(), sent_)};
  }

  // One step on the gradient d_grad (device memory, length() floats), ordered on `stream`. Returns the pairs
  // in pinned host memory, valid until the next successful step. Synchronises the stream once (see the top).
  // Throws commsgd::non_finite (count, first index) on NaN/inf in the gradient, or on overflow of g + e.
  sparsify::sparse_view<Index> step(const float* d_grad, cudaStream_t stream = nullptr) {
    if (length_ > 0 && d_grad == nullptr) throw invalid_argument("argument 'd_grad' is null with length > 0");
    auto* sc = scalars_.data();
    check(cudaMemsetAsync(&sc->status, 0, sizeof sc->status, stream), "cudaMemsetAsync(status)");
    static_assert(no_nonfinite_index == ~0ull); // what the two memsets of 0xff write
    check(cudaMemsetAsync(&sc->status.grad_first, 0xff, sizeof sc->status.grad_first, stream),
          "cudaMemsetAsync(status)");
    check(cudaMemsetAsync(&sc->status.sum_first, 0xff, sizeof sc->status.sum_first, stream),
          "cudaMemsetAsync(status)");
    if (length_ > 0) {
      const unsigned grid = detail::grid_for(length_);
      if (has_momentum()) {
        detail::top_k_accumulate_kernel<true><<<grid, detail::block_threads, 0, stream>>>(
            d_grad, residual_.data(), momentum_.data(), static_cast<float>(opt_.momentum), length_,
            work_.data(), work_u_.data(), &sc->status);
      } else {
        detail::top_k_accumulate_kernel<false><<<grid, detail::block_threads, 0, stream>>>(
            d_grad, residual_.data(), nullptr, 0.0f, length_, work_.data(), nullptr, &sc->status);
      }
      check_launch("top_k_accumulate_kernel");
    }

    // One workspace for the selector and then the compaction (they run one after the other on the stream,
    // and the threshold lives in scalars_, not in the workspace).
    // Density 1 (k == length) needs no selection: the threshold +0 with every entry "at" it sends all.
    const bool everything = k_ == length_;
    std::size_t select_bytes = 0, compact_bytes = 0;
    if (!everything) selector_.select(nullptr, select_bytes, work_.data(), length_, k_, &sc->result, stream);
    compact<Index>(nullptr, compact_bytes, work_.data(), length_, &sc->result, nullptr, nullptr, 0,
                   &sc->count, stream);
    const std::size_t need = std::max(select_bytes, compact_bytes);
    if (workspace_.size() < need) workspace_ = device_buffer<char>(need);
    std::size_t bytes = workspace_.size();
    if (everything) {
      detail::top_k_all_kernel<><<<1, 1, 0, stream>>>(&sc->result, length_);
      check_launch("top_k_all_kernel");
    } else {
      selector_.select(workspace_.data(), bytes, work_.data(), length_, k_, &sc->result, stream);
    }

    stage& out = stage_[1 - current_];
    compact_and_copy(out, stream);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); // the step's one host synchronisation

    const detail::top_k_scalars& h = *host_scalars_.data();
    if (h.status.grad_count > 0) throw non_finite("gradient", h.status.grad_count, h.status.grad_first);
    if (h.status.sum_count > 0)
      throw non_finite(has_momentum() ? "error-feedback sum v + u (overflow)"
                                      : "error-feedback sum g + e (overflow)",
                       h.status.sum_count, h.status.sum_first);
    const select::threshold t = to_threshold(h.result, "error-feedback sum");
    std::size_t count = static_cast<std::size_t>(h.count);
    if (count > capacity_) {
      // Rare: an approximate selector took more than the margin. p is untouched (the zeroing kernel saw the
      // overflow and did nothing): grow, compact again, wait again.
      grow_device_pairs(count + count / top_k_tuning::margin_divisor);
      compact_and_copy(out, stream);
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      count = static_cast<std::size_t>(host_scalars_.data()->count);
    }
    if (count != t.count())
      throw error(commsgd::concat("selector '", Selector::name, "' broke its contract: it reported ",
                                  t.count(), " entries (", t.above, " above ", t.value, ", ", t.at,
                                  " at it) but compaction found ", count));

    std::swap(residual_, work_);
    if (has_momentum()) std::swap(momentum_, work_u_);
    current_ = 1 - current_;
    sent_ = count;
    ++steps_;
    return last();
  }

  // Forgets everything held back, as at construction. Synchronises `stream`.
  void reset(cudaStream_t stream = nullptr) {
    zero_state(stream);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    steps_ = 0;
    sent_ = 0;
    if constexpr (requires { selector_.reset(); }) selector_.reset();
  }

  // The host sparsifier's format (sparsify::top_k::save with one layer). Synchronises `stream`.
  void save(std::vector<std::byte>& out, cudaStream_t stream = nullptr) const {
    // Device selectors' warm-start memory is not saved.
    out =
        state::write_top_k_state(name, layout(), steps_, residual_to_host(stream), momentum_to_host(stream));
  }
  void save(std::ostream& os, cudaStream_t stream = nullptr) const { state::write_saved(os, *this, stream); }

  // Everything is parsed and checked before anything is replaced, so a bad blob changes nothing.
  // Synchronises `stream`. The selector restarts cold (see the top).
  void load(std::span<const std::byte> blob, cudaStream_t stream = nullptr) {
    // A host selector's state (if any) means nothing to a device selector.
    const state::top_k_contents c = state::read_top_k_state(blob, name, layout());
    // Into the scratch buffers first, so a failing copy leaves the state as it was.
    if (length_ > 0) {
      check(cudaMemcpyAsync(work_.data(), c.residual.data(), length_ * sizeof(float), cudaMemcpyHostToDevice,
                            stream),
            "cudaMemcpyAsync(residual)");
      if (has_momentum())
        check(cudaMemcpyAsync(work_u_.data(), c.momentum.data(), length_ * sizeof(float),
                              cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync(momentum)");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    std::swap(residual_, work_);
    if (has_momentum()) std::swap(momentum_, work_u_);
    steps_ = c.steps;
    sent_ = 0;
    if constexpr (requires { selector_.reset(); }) selector_.reset();
  }
  void load(std::istream& is, cudaStream_t stream = nullptr) { load(state::read_frame(is), stream); }

private:
  // A message staged in pinned memory.
  struct stage {
    detail::pinned_array<Index> index;
    detail::pinned_array<float> value;
  };

  // What the saved state must agree on: the host top_k's layout with one layer and one selector.
  state::top_k_layout layout() const noexcept { return {length_, sizeof(Index), has_momentum(), 1, 1}; }

  std::vector<float> to_host(const float* d, cudaStream_t stream) const {
    std::vector<float> h(length_);
    if (length_ > 0)
      check(cudaMemcpyAsync(h.data(), d, length_ * sizeof(float), cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync(state)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return h;
  }

  void zero_state(cudaStream_t stream) {
    if (length_ == 0) return;
    check(cudaMemsetAsync(residual_.data(), 0, length_ * sizeof(float), stream), "cudaMemsetAsync(residual)");
    if (has_momentum())
      check(cudaMemsetAsync(momentum_.data(), 0, length_ * sizeof(float), stream),
            "cudaMemsetAsync(momentum)");
  }

  void grow_device_pairs(std::size_t capacity) {
    capacity = std::min(std::max(capacity, k_), length_);
    if (pairs_allocated_ && capacity <= capacity_) return;
    d_index_ = device_buffer<Index>(capacity);
    d_value_ = device_buffer<float>(capacity);
    capacity_ = capacity;
    pairs_allocated_ = true;
  }

  // Compaction of p into the device pairs, zeroing of the sent positions in p and u' (skipped on the device
  // when the set overflowed), and the copies of the scalars and the pairs into the pinned stage. No sync.
  void compact_and_copy(stage& out, cudaStream_t stream) {
    auto* sc = scalars_.data();
    std::size_t bytes = workspace_.size();
    compact<Index>(workspace_.data(), bytes, work_.data(), length_, &sc->result, d_index_.data(),
                   d_value_.data(), capacity_, &sc->count, stream);
    if (capacity_ > 0) {
      detail::top_k_zero_sent_kernel<Index>
          <<<detail::grid_for_count(capacity_), detail::block_threads, 0, stream>>>(
              d_index_.data(), &sc->count, capacity_, work_.data(),
              has_momentum() && opt_.masking == sparsify::momentum_masking::dgc ? work_u_.data() : nullptr);
      check_launch("top_k_zero_sent_kernel");
    }
    if (out.index.size() < capacity_) {
      out.index = detail::pinned_array<Index>(capacity_);
      out.value = detail::pinned_array<float>(capacity_);
    }
    // The whole capacity is copied: the count is not known on the host before the synchronisation, and
    // the margin over k is small.
    if (capacity_ > 0) {
      check(cudaMemcpyAsync(out.index.data(), d_index_.data(), capacity_ * sizeof(Index),
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync(indices)");
      check(cudaMemcpyAsync(out.value.data(), d_value_.data(), capacity_ * sizeof(float),
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync(values)");
    }
    check(cudaMemcpyAsync(host_scalars_.data(), sc, sizeof(detail::top_k_scalars), cudaMemcpyDeviceToHost,
                          stream),
          "cudaMemcpyAsync(scalars)");
  }

  std::size_t length_;
  options opt_;
  Selector selector_;
  std::size_t k_ = 0;
  device_buffer<float> residual_, momentum_; // the state
  device_buffer<float> work_, work_u_;       // p and u': the next state, built during a step
  device_buffer<char> workspace_;
  device_buffer<detail::top_k_scalars> scalars_;
  detail::pinned_array<detail::top_k_scalars> host_scalars_;
  device_buffer<Index> d_index_;
  device_buffer<float> d_value_;
  std::size_t capacity_ = 0; // of d_index_ and d_value_
  bool pairs_allocated_ = false;
  stage stage_[2];
  int current_ = 0;      // stage_[current_] holds the last message
  std::size_t sent_ = 0; // its size
  std::uint64_t steps_ = 0;
};

} // namespace commsgd::inline v1::cuda
