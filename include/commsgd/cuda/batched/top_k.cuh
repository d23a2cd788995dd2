// cuda::batched_top_k<Grad>: top-k with error feedback over many tensors (a model's layers, a DDP bucket's
// parameters) in one step of a few launches, for float, fp16 or bf16 gradients, with no host
// synchronisation, so a step can be captured in a CUDA graph.
//
// Per tensor t (k_t = ceil(density * length_t), or given), the same step as sparsify::top_k<select::exact>
// with one layer per tensor:
//   p = g + e                  (with momentum m > 0: u' = m u + g, p = e + u', DGC's masking by default)
//   the k_t largest |p|, ties to the lowest indices (the host's rule), sent as (flat index, value) pairs
//   e <- p with +0 where sent  so sent + new residual == old residual + gradient, bit for bit
// The message has a fixed layout: tensor t's k_t pairs start at message_offset(t), in no particular order
// within the tensor, with indices into the flat gradient. A fixed size is what lets a caller exchange it
// (an all-gather of total_k() pairs) without asking the device how many there are.
//
// How it stays near one pass over memory (kernels.cuh): last step's threshold, less a margin, is the floor
// above which the pass that forms p also keeps (index, value) candidates; the exact selection and the pairs
// then come from the candidates alone. A tensor whose candidates missed (threshold fell below the floor) or
// overflowed reads its p again for that step, with the same exact result; its margin adapts. report() counts
// both kinds of step per tensor.
//
// Non-finite values: a gradient (or an overflowed sum) holding NaN/inf refuses the whole step on the device:
// the state stays as before it, and every value in its message is NaN, so that an average over ranks is
// non-finite too (an AMP GradScaler then skips the step and lowers its scale). The host learns of it a step
// late: the next step() throws commsgd::non_finite when the refused step has finished by then, and
// check_refused() waits for the stream and throws.
//
// Checkpoints: the host top_k's format with one layer per tensor (state/top_k.hpp, empty selector
// states); the warm-start memory is not saved, so after load() the first step reads every tensor twice, with
// the same (exact) result.
#pragma once

#include <commsgd/cuda/batched/kernels.cuh>
#include <commsgd/cuda/error.cuh>
#include <commsgd/cuda/memory.cuh>
#include <commsgd/sparsify/momentum_masking.hpp>
#include <commsgd/state/top_k.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <vector>

namespace commsgd::inline v1::cuda {

struct batched_top_k_options {
  double density = 0.01;      // in (0, 1]; k_t = ceil(density * length_t)
  std::vector<std::size_t> k; // one k per tensor, in [0, length_t]; overrides density when given
  double momentum = 0.0;      // momentum correction when > 0; in [0, 1)
  sparsify::momentum_masking masking = sparsify::momentum_masking::dgc;
};

// What report() returns: per tensor, the last committed threshold and how its steps were searched.
struct batched_top_k_report {
  std::uint64_t committed = 0; // steps
  std::uint64_t refused = 0;
  std::vector<float> threshold;
  std::vector<std::uint64_t> fast_steps; // read the candidates only
  std::vector<std::uint64_t> full_steps; // read the tensor again
};

template <gradient_type Grad = float>
class batched_top_k {
public:
  using index_type = std::uint32_t;
  using gradient_type = Grad;
  using options = batched_top_k_options;
  static constexpr const char* name = "top_k"; // the host sparsifier's: the same saved format

  explicit batched_top_k(std::span<const std::size_t> lengths, options opt = {}) : opt_(std::move(opt)) {
    commsgd::check_range("momentum", opt_.momentum, 0.0, std::nextafter(1.0, 0.0), "[0, 1)");
    layout_ = detail::batched::make_layout(lengths, opt_.density, opt_.k);
    const std::size_t n = layout_.length;
    for (int b = 0; b < 2; ++b) {
      e_[b] = device_buffer<float>(n);
      if (has_momentum()) u_[b] = device_buffer<float>(n);
    }
    segs_ = upload(std::span<const detail::batched::segment>(layout_.segments));
    tiles_ = upload(std::span<const detail::batched::tile>(layout_.tiles));
    warm_ = device_buffer<detail::batched::warm_state>(tensors());
    search_ = device_buffer<detail::batched::search_state>(tensors());
    hist_ = device_buffer<std::uint32_t>(tensors() * batched_tuning::digit_bins);
    cand_index_ = device_buffer<std::uint32_t>(layout_.candidates);
    cand_value_ = device_buffer<float>(layout_.candidates);
    index_ = device_buffer<std::uint32_t>(layout_.total_k);
    value_ = device_buffer<float>(layout_.total_k);
    ctl_ = device_buffer<detail::batched::control>(1);
    host_ctl_ = detail::owned_array<detail::batched::control, detail::pinned_memory>(1);
    check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    grid_ = static_cast<unsigned>(std::clamp<std::uint64_t>(
        layout_.tiles.size(), 1,
        static_cast<std::uint64_t>(detail::multiprocessor_count()) * batched_tuning::blocks_per_sm));
    check(cudaMemset(hist_.data(), 0, hist_.size() * sizeof(std::uint32_t)), "cudaMemset(histograms)");
    reset(nullptr);
  }
  batched_top_k(const batched_top_k&) = delete;
  batched_top_k& operator=(const batched_top_k&) = delete;
  ~batched_top_k() {
    if (done_) cudaEventDestroy(done_);
  }

  std::size_t tensors() const noexcept { return layout_.segments.size(); }
  std::size_t length() const noexcept { return layout_.length; }
  std::size_t length(std::size_t t) const { return segment(t).length; }
  std::size_t offset(std::size_t t) const { return segment(t).begin; }
  std::size_t k(std::size_t t) const { return segment(t).k; }
  std::size_t total_k() const noexcept { return layout_.total_k; }
  std::size_t message_offset(std::size_t t) const { return segment(t).message_begin; }
  bool has_momentum() const noexcept { return opt_.momentum > 0.0; }
  const options& config() const noexcept { return opt_; }

  // The message of the last step enqueued: total_k() pairs in device memory, valid until the next step.
  const std::uint32_t* index() const noexcept { return index_.data(); }
  const float* value() const noexcept { return value_.data(); }

  // Enqueues one step on the flat gradient (length() values of Grad, the tensors back to back, in device
  // memory) on `stream`; the pairs go to index() / value(). Never waits for the device.
  void step(const Grad* grad, cudaStream_t stream = nullptr) {
    step(grad, index_.data(), value_.data(), stream);
  }

  // The same, with the pairs written to the caller's device arrays of total_k() entries each.
  void step(const Grad* grad, std::uint32_t* out_index, float* out_value, cudaStream_t stream = nullptr) {
    if (length() > 0 && grad == nullptr) throw invalid_argument("argument 'grad' is null with length > 0");
    if (total_k() > 0 && (out_index == nullptr || out_value == nullptr))
      throw invalid_argument("argument 'out_index' or 'out_value' is null with total_k > 0");
    // While a graph is captured nothing may ask the device anything: the late report waits for a step run
    // outside one.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    const bool capturing = capture != cudaStreamCaptureStatusNone;
    if (!capturing) report_late_refusal();
    namespace b = detail::batched;
    using T = batched_tuning;
    const auto count = static_cast<std::uint32_t>(tensors());
    const unsigned per_tensor = (count + T::block_threads - 1) / T::block_threads;
    const b::state_buffers buf = buffers();
    auto* ctl = ctl_.data();
    b::begin_kernel<><<<per_tensor, T::block_threads, 0, stream>>>(segs_.data(), count, search_.data(), ctl);
    check_launch("batched begin_kernel");
    if (layout_.value_tiles > 0) {
      if (has_momentum())
        b::fused_kernel<Grad, true><<<grid_, T::block_threads, 0, stream>>>(
            tiles_.data(), layout_.value_tiles, segs_.data(), warm_.data(), search_.data(), grad, buf,
            static_cast<float>(opt_.momentum), cand_index_.data(), cand_value_.data(), ctl);
      else
        b::fused_kernel<Grad, false><<<grid_, T::block_threads, 0, stream>>>(
            tiles_.data(), layout_.value_tiles, segs_.data(), warm_.data(), search_.data(), grad, buf, 0.0f,
            cand_index_.data(), cand_value_.data(), ctl);
      check_launch("batched fused_kernel");
    }
    b::decide_kernel<><<<per_tensor, T::block_threads, 0, stream>>>(segs_.data(), count, search_.data(), ctl);
    check_launch("batched decide_kernel");
    const std::uint64_t tile_count = layout_.tiles.size();
    for (int pass = 0; pass < T::passes; ++pass) {
      b::digit_kernel<><<<grid_, T::block_threads, 0, stream>>>(
          pass, tiles_.data(), tile_count, layout_.value_tiles, segs_.data(), search_.data(), buf,
          cand_index_.data(), cand_value_.data(), hist_.data(), ctl);
      check_launch("batched digit_kernel");
      b::settle_kernel<><<<count, T::block_threads, 0, stream>>>(pass, search_.data(), hist_.data(), ctl);
      check_launch("batched settle_kernel");
    }
    const bool mask = has_momentum() && opt_.masking == sparsify::momentum_masking::dgc;
    b::emit_kernel<><<<grid_, T::block_threads, 0, stream>>>(
        tiles_.data(), tile_count, layout_.value_tiles, segs_.data(), search_.data(), buf, mask,
        cand_index_.data(), cand_value_.data(), out_index, out_value, ctl);
    check_launch("batched emit_kernel");
    b::finalize_kernel<>
        <<<1, T::block_threads, 0, stream>>>(segs_.data(), count, search_.data(), warm_.data(), ctl);
    check_launch("batched finalize_kernel");
    check(cudaMemcpyAsync(host_ctl_.data(), ctl, sizeof(b::control), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(control)");
    if (!capturing) {
      check(cudaEventRecord(done_, stream), "cudaEventRecord");
      recorded_ = true;
    }
  }

  // Waits for `stream`; throws commsgd::non_finite if a step was refused since the last report of one, and
  // commsgd::internal_error if a step's counts disagreed (a fault of the step itself).
  void check_refused(cudaStream_t stream = nullptr) {
    check_stream(stream);
    throw_if_refused();
  }

  // Waits for `stream` and returns the figures of every committed step so far.
  batched_top_k_report report(cudaStream_t stream = nullptr) const {
    check_stream(stream);
    std::vector<detail::batched::warm_state> w(tensors());
    check(cudaMemcpy(w.data(), warm_.data(), w.size() * sizeof w[0], cudaMemcpyDeviceToHost),
          "cudaMemcpy(warm)");
    batched_top_k_report r;
    r.committed = host_ctl_.data()->committed;
    r.refused = host_ctl_.data()->refused;
    for (const auto& x : w) {
      float t;
      std::memcpy(&t, &x.threshold_key, sizeof t);
      r.threshold.push_back(x.has_threshold ? t : std::nanf(""));
      r.fast_steps.push_back(x.fast_steps);
      r.full_steps.push_back(x.full_steps);
    }
    return r;
  }

  std::uint64_t steps(cudaStream_t stream = nullptr) const {
    check_stream(stream);
    return host_ctl_.data()->committed;
  }

  // Copies of the state (e, or DGC's v under momentum; and u) on the host; wait for `stream`.
  std::vector<float> residual_to_host(cudaStream_t stream = nullptr) const {
    return state_to_host(e_, stream);
  }
  std::vector<float> momentum_to_host(cudaStream_t stream = nullptr) const {
    return has_momentum() ? state_to_host(u_, stream) : std::vector<float>{};
  }

  // The same state into the caller's device arrays of length() floats (device-to-device); wait for `stream`.
  // momentum_into writes nothing without momentum.
  void residual_into(float* out, cudaStream_t stream = nullptr) const { state_into(e_, out, stream); }
  void momentum_into(float* out, cudaStream_t stream = nullptr) const {
    if (has_momentum()) state_into(u_, out, stream);
  }

  // Sets the state from the caller's device arrays (length() floats each; a null momentum leaves u at zero)
  // and the step count, as load() does from a checkpoint: how a caller hands a tensor's residual to another
  // batch (DDP's bucket rebuild) without a trip through the host. Waits for `stream`; the warm start begins
  // again.
  void assign(const float* residual, const float* momentum, std::uint64_t steps,
              cudaStream_t stream = nullptr) {
    if (length() > 0 && residual == nullptr)
      throw invalid_argument("argument 'residual' is null with length > 0");
    reset(stream);
    copy_in(e_[0], residual, stream);
    if (has_momentum() && momentum != nullptr) copy_in(u_[0], momentum, stream);
    host_ctl_.data()->committed = steps;
    check(cudaMemcpyAsync(ctl_.data(), host_ctl_.data(), sizeof(detail::batched::control),
                          cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync(control)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

  // check_refused() that waits for the last step enqueued only, not for the stream: at a caller's next step
  // that wait is almost always over already, so a refusal is reported then without stalling the host on the
  // work queued since.
  void check_last_step() {
    if (recorded_) check(cudaEventSynchronize(done_), "cudaEventSynchronize");
    throw_if_refused();
  }

  // Forgets everything held back and the warm start, as at construction. Waits for `stream`.
  void reset(cudaStream_t stream = nullptr) {
    zero(e_[0], stream);
    if (has_momentum()) zero(u_[0], stream);
    std::vector<detail::batched::warm_state> w(
        tensors(),
        detail::batched::warm_state{detail::batched::no_floor, 0, batched_tuning::first_margin, 0, 0, 0});
    check(cudaMemcpyAsync(warm_.data(), w.data(), w.size() * sizeof w[0], cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync(warm)");
    *host_ctl_.data() = detail::batched::control{};
    check(cudaMemcpyAsync(ctl_.data(), host_ctl_.data(), sizeof(detail::batched::control),
                          cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync(control)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    reported_refusals_ = 0;
    recorded_ = false;
  }

  // The host top_k's format, one layer per tensor. Waits for `stream`.
  void save(std::vector<std::byte>& out, cudaStream_t stream = nullptr) const {
    out = state::write_top_k_state(name, saved_layout(), host_ctl_.data()->committed,
                                   residual_to_host(stream), momentum_to_host(stream));
  }
  void save(std::ostream& os, cudaStream_t stream = nullptr) const { state::write_saved(os, *this, stream); }
  // Everything is parsed and checked before anything changes, so a bad blob changes nothing. Waits for
  // `stream`; the warm start begins again.
  void load(std::span<const std::byte> blob, cudaStream_t stream = nullptr) {
    const state::top_k_contents c = state::read_top_k_state(blob, name, saved_layout());
    reset(stream);
    copy_in(e_[0], c.residual, stream);
    if (has_momentum()) copy_in(u_[0], c.momentum, stream);
    host_ctl_.data()->committed = c.steps;
    check(cudaMemcpyAsync(ctl_.data(), host_ctl_.data(), sizeof(detail::batched::control),
                          cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync(control)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  void load(std::istream& is, cudaStream_t stream = nullptr) { load(state::read_frame(is), stream); }

private:
  const detail::batched::segment& segment(std::size_t t) const {
    if (t >= tensors())
      throw invalid_argument(
          commsgd::concat("argument 't' = ", t, " is outside the allowed range [0, ", tensors(), ")"));
    return layout_.segments[t];
  }

  state::top_k_layout saved_layout() const noexcept {
    return {layout_.length, sizeof(std::uint32_t), has_momentum(), tensors(), tensors()};
  }

  detail::batched::state_buffers buffers() const noexcept {
    return {{e_[0].data(), e_[1].data()}, {u_[0].data(), u_[1].data()}};
  }

  template <class V>
  static device_buffer<V> upload(std::span<const V> host) {
    device_buffer<V> d(host.size());
    if (!host.empty())
      check(cudaMemcpy(d.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice),
            "cudaMemcpy(layout)");
    return d;
  }

  void zero(device_buffer<float>& d, cudaStream_t stream) {
    if (d.size() > 0)
      check(cudaMemsetAsync(d.data(), 0, d.size() * sizeof(float), stream), "cudaMemsetAsync(state)");
  }
  void copy_in(device_buffer<float>& d, const float* from, cudaStream_t stream) {
    if (d.size() > 0)
      check(cudaMemcpyAsync(d.data(), from, d.size() * sizeof(float), cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync(state)");
  }
  void copy_in(device_buffer<float>& d, const std::vector<float>& h, cudaStream_t stream) {
    if (!h.empty())
      check(cudaMemcpyAsync(d.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync(state)");
  }

  // The control block as of the stream's end.
  void check_stream(cudaStream_t stream) const {
    check(cudaMemcpyAsync(host_ctl_.data(), ctl_.data(), sizeof(detail::batched::control),
                          cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(control)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

  std::vector<float> state_to_host(const device_buffer<float> (&pair)[2], cudaStream_t stream) const {
    check_stream(stream);
    std::vector<float> h(length());
    const auto& d = pair[host_ctl_.data()->phase];
    if (!h.empty())
      check(cudaMemcpy(h.data(), d.data(), h.size() * sizeof(float), cudaMemcpyDeviceToHost),
            "cudaMemcpy(state)");
    return h;
  }

  void state_into(const device_buffer<float> (&pair)[2], float* out, cudaStream_t stream) const {
    if (length() > 0 && out == nullptr) throw invalid_argument("argument 'out' is null with length > 0");
    check_stream(stream);
    const auto& d = pair[host_ctl_.data()->phase];
    if (length() > 0)
      check(cudaMemcpyAsync(out, d.data(), length() * sizeof(float), cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync(state)");
  }

  // A step already finished that was refused: reported at the next step, without waiting for anything.
  void report_late_refusal() {
    if (!recorded_) return;
    const cudaError_t s = cudaEventQuery(done_);
    if (s == cudaErrorNotReady) {
      (void)cudaGetLastError(); // not an error: the step is still running
      return;
    }
    check(s, "cudaEventQuery");
    throw_if_refused();
  }

  void throw_if_refused() {
    const detail::batched::control& c = *host_ctl_.data();
    if (c.broken)
      throw internal_error(
          commsgd::concat("the batched top-k step's counts disagreed with its search (code ", c.broken, ")"));
    if (c.refused > reported_refusals_) {
      reported_refusals_ = c.refused;
      const auto& s = c.first_refusal;
      if (s.grad_count > 0)
        throw non_finite(
            commsgd::concat("gradient (step ", c.first_refused_step, ", refused: the state is unchanged)"),
            s.grad_count, s.grad_first);
      throw non_finite(
          commsgd::concat(has_momentum() ? "error-feedback sum v + u" : "error-feedback sum g + e",
                          " (overflow; step ", c.first_refused_step, ", refused: the state is unchanged)"),
          s.sum_count, s.sum_first);
    }
  }

  options opt_;
  detail::batched::layout layout_;
  device_buffer<float> e_[2], u_[2];
  device_buffer<detail::batched::segment> segs_;
  device_buffer<detail::batched::tile> tiles_;
  device_buffer<detail::batched::warm_state> warm_;
  device_buffer<detail::batched::search_state> search_;
  device_buffer<std::uint32_t> hist_;
  device_buffer<std::uint32_t> cand_index_;
  device_buffer<float> cand_value_;
  device_buffer<std::uint32_t> index_;
  device_buffer<float> value_;
  device_buffer<detail::batched::control> ctl_;
  detail::owned_array<detail::batched::control, detail::pinned_memory> host_ctl_;
  cudaEvent_t done_ = nullptr;
  bool recorded_ = false;
  std::uint64_t reported_refusals_ = 0;
  unsigned grid_ = 1;
};

} // namespace commsgd::inline v1::cuda
