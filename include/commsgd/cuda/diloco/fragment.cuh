// cuda::diloco_fragment: one DiLoCo fragment's round on device parameters, the host engine's (sync/diloco.hpp)
// bit for bit: this rank's pseudo-gradient encoded into a message, then, once the messages of every rank
// are here, their sum decoded, the outer Nesterov step and the merge into the parameters, each a pass over
// the fragment at memory speed. The common model, the outer momentum and (top-k) the residual live on the
// device, in fragment order; the parameters are the trainer's flat model, the fragment's values at its runs.
//
//   cuda::diloco_fragment<compress::int8_code> f(runs, {.lr = 0.7f, .momentum = 0.9f});
//   f.start(params, stream);                       // the common model <- the fragment's parameters
//   f.encode(params, weight, stream);              // f.message(): message_bytes() on the device
//   ... every rank's message gathered, in rank order, n * message_bytes() on the device ...
//   ... every rank's verdict().own gathered too: any non-zero refuses the round on every rank ...
//   f.apply(gathered, n, params, stream);          // skipped when the sum is not finite
//   if (f.verdict(stream).clean()) f.commit();     // reads what encode and apply counted (synchronises)
//
// A rank whose own values are not finite must not apply on any rank: its message is not a code of them (an
// int8 block's scale skips a NaN), so the sum need not show it. cuda::diloco_exchange gathers the counts
// first; a caller of the raw calls must too. apply() never steps on the rank that counted them.
//
// Codes (sync::coded_diloco's, with the same settings):
//   cuda::dense_code      the message is the float pseudo-gradient; apply takes the sum of the n messages (an
//                         all-reduce's result), not the messages
//   compress::int8_code,  blocks of block_size values (a multiple of 32 in [32, 1024]) with a float scale
//   compress::e3m0_code   each; apply takes the n messages and sums them in rank order
//   cuda::top_k_code      options.top_k: chunks of at most 4096 values (top_k_max_chunk), each chunk's k
//                         largest |p| of p = g + decay e, 2-bit values optionally, the mean over the senders
//                         optionally; the residual carried from round to round on the device
// cuda/diloco/exchange.cuh runs the round over a host communicator. The 16-bit codes are the dense fragment
// with their host compressor as the exchange's reducer: their sum is a ring that rounds its partial sums to
// 16 bits at every hop, which is the host's part; the device's is the pseudo-gradient and the step.
#pragma once

#include <commsgd/compress/block_quant.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/cost/top_k_plan.hpp>
#include <commsgd/cuda/diloco/kernels.cuh>
#include <commsgd/cuda/diloco/top_k_kernels.cuh>
#include <commsgd/cuda/error.cuh>
#include <commsgd/cuda/memory.cuh>
#include <commsgd/error.hpp>
#include <commsgd/sync/outer_optimizer.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace commsgd::inline v1::cuda {

// The uncompressed code: 32-bit floats summed by an all-reduce.
struct dense_code {
  static constexpr const char* name = "dense";
};
// The top-k codes ("topk-<density>[-c<chunk>][-2bit][-b<decay>][-senders]"), their options in
// diloco_fragment_options::top_k.
struct top_k_code {
  static constexpr const char* name = "topk";
};

template <class Code>
inline constexpr bool is_diloco_device_code =
    std::is_same_v<Code, dense_code> || std::is_same_v<Code, compress::int8_code> ||
    std::is_same_v<Code, compress::e3m0_code> || std::is_same_v<Code, top_k_code>;

struct diloco_fragment_options {
  float lr = 0.7f;                                  // the outer step's: (0, inf)
  float momentum = 0.9f;                            // [0, 1)
  float alpha = 0.0f;                               // the local model's weight in the merge: [0, 1]
  std::size_t block_size = cost::diloco_block_size; // int8, e3m0: a multiple of 32 in [32, 1024]
  compress::top_k_ef_options top_k = {};            // top_k_code: as compress::top_k_ef's
};

// What a round counted: the non-finite values of this rank's pseudo-gradient (encode) and of the sum
// (apply), with the lowest index of each, and (top-k) the gathered indices outside their chunk.
struct diloco_verdict {
  std::uint64_t own = 0, own_first = 0;
  std::uint64_t sum = 0, sum_first = 0;
  std::uint64_t corrupt = 0;
  bool clean() const noexcept { return own == 0 && sum == 0 && corrupt == 0; }
};

template <class Code>
class diloco_fragment {
  static_assert(is_diloco_device_code<Code>,
                "cuda::diloco_fragment runs cuda::dense_code, compress::int8_code, compress::e3m0_code and "
                "cuda::top_k_code (the 16-bit codes: dense_code with their compressor as the exchange's "
                "reducer)");

public:
  using options = diloco_fragment_options;
  static constexpr bool dense = std::is_same_v<Code, dense_code>;
  static constexpr bool top_k = std::is_same_v<Code, top_k_code>;
  static constexpr bool block = !dense && !top_k;

  // runs: the fragment's (offset, length) runs in the flat model, in fragment order (the host engine's
  // fragment_runs(p)).
  diloco_fragment(std::span<const std::pair<std::size_t, std::size_t>> runs, options o) : opt_(o) {
    sync::outer_sgd::check({.lr = o.lr, .momentum = o.momentum});
    commsgd::check_range("alpha", o.alpha, 0.0f, 1.0f, "[0, 1]");
    if constexpr (block)
      if (o.block_size < 32 || o.block_size > 1024 || o.block_size % 32 != 0)
        throw invalid_argument(
            commsgd::concat("argument 'block_size' = ", o.block_size,
                            " is outside the allowed range: a multiple of 32 in [32, 1024]"));
    if (runs.empty())
      throw invalid_argument("argument 'runs' is empty; the allowed range is at least one run");
    std::vector<std::uint64_t> begin{0}, offset;
    for (const auto& [off, len] : runs) {
      if (len == 0)
        throw invalid_argument("argument 'runs' holds a run of length 0; the allowed range is [1, inf)");
      offset.push_back(off);
      begin.push_back(begin.back() + len);
    }
    length_ = begin.back();
    if ((length_ + 255) / 256 > max_grid || (block && (length_ + o.block_size - 1) / o.block_size > max_grid))
      throw invalid_argument(
          commsgd::concat("argument 'runs' holds ", length_,
                          " values; the allowed range for one fragment is [1, 2^31 x 32)"));
    if constexpr (top_k) layout_ = checked_layout(length_, o.top_k);
    runs_ = device_buffer<std::uint64_t>(begin.size() + offset.size());
    check(cudaMemcpy(runs_.data(), begin.data(), begin.size() * 8, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(runs_.data() + begin.size(), offset.data(), offset.size() * 8, cudaMemcpyHostToDevice),
          "cudaMemcpy");
    table_ = {runs_.data(), runs_.data() + begin.size(), static_cast<int>(offset.size())};
    global_ = device_buffer<float>(length_);
    if (o.momentum != 0.0f) velocity_ = zeros<float>(length_);
    // Whole words and one more: the top-k encoder ORs 32-bit words into it.
    message_ = device_buffer<std::byte>((message_bytes() + 3) / 4 * 4 + 4);
    if constexpr (top_k) {
      e_ = zeros<float>(length_);
      r_ = zeros<float>(length_);
      e_next_ = device_buffer<float>(length_);
      r_next_ = device_buffer<float>(length_);
      sel_index_ = device_buffer<std::uint32_t>(layout_.k());
      sel_value_ = device_buffer<float>(layout_.k());
    }
    verdict_ = device_buffer<detail::diloco::device_verdict>(slots);
    host_verdict_ = detail::owned_array<detail::diloco::device_verdict, detail::pinned_memory>(slots);
    detail::diloco::device_verdict fresh[slots];
    for (auto& v : fresh)
      v = {0, none_};
    check(cudaMemcpy(verdict_.data(), fresh, sizeof fresh, cudaMemcpyHostToDevice), "cudaMemcpy");
  }

  std::size_t length() const noexcept { return length_; }
  const options& opts() const noexcept { return opt_; }
  std::size_t blocks() const noexcept {
    return block ? (length_ + opt_.block_size - 1) / opt_.block_size : 0;
  }
  // Bytes of one rank's message (dense: the float pseudo-gradient).
  std::size_t message_bytes() const noexcept {
    if constexpr (dense)
      return 4 * length_;
    else if constexpr (top_k)
      return static_cast<std::size_t>(layout_.bytes);
    else
      return compress::block_quantizer<Code>::message_bytes(length_, opt_.block_size);
  }
  const std::byte* message() const noexcept { return message_.data(); }
  std::byte* message() noexcept { return message_.data(); }
  const float* global() const noexcept { return global_.data(); }
  const float* velocity() const noexcept { return velocity_.data(); } // null without momentum
  // top-k: the residual (what has not been sent, e + r exactly); null for the other codes.
  const float* residual() const noexcept { return e_.data(); }
  const float* residual_low() const noexcept { return r_.data(); }

  // The common model <- the fragment's values of params (the flat model).
  void start(const float* params, cudaStream_t stream) {
    detail::diloco::gather_kernel<><<<grid(256), 256, 0, stream>>>(table_, length_, params, global_.data());
    check_launch("cuda::diloco_fragment::start");
  }

  // This rank's message of weight (common - local), weight in [0, n] (1: the plain mean). Counts the
  // values that are not finite (top-k: of p = g + decay e) into verdict().own. Stream-ordered.
  void encode(const float* params, float weight, cudaStream_t stream) {
    reset(own_slot, stream);
    if constexpr (dense) {
      detail::diloco::dense_encode_kernel<>
          <<<grid(256), 256, 0, stream>>>(table_, length_, global_.data(), params, weight,
                                          reinterpret_cast<float*>(message_.data()), verdict_.data());
    } else if constexpr (top_k) {
      pending_ = true;
      check(cudaMemsetAsync(message_.data(), 0, message_.size(), stream), "cudaMemsetAsync");
      if (layout_.count == 0) return;
      detail::diloco::top_k_encode_args a{table_,
                                          layout_,
                                          global_.data(),
                                          params,
                                          weight,
                                          opt_.top_k.decay,
                                          e_.data(),
                                          r_.data(),
                                          e_next_.data(),
                                          r_next_.data(),
                                          sel_index_.data(),
                                          sel_value_.data(),
                                          message_.data(),
                                          verdict_.data() + own_slot};
      detail::diloco::top_k_encode_kernel<>
          <<<static_cast<unsigned>(layout_.count), detail::diloco::top_k_threads, 0, stream>>>(a);
    } else {
      detail::diloco::block_encode_kernel<Code>
          <<<static_cast<unsigned>(blocks()), static_cast<unsigned>(opt_.block_size), 0, stream>>>(
              table_, length_, global_.data(), params, weight, blocks(), message_.data(), verdict_.data());
    }
    check_launch("cuda::diloco_fragment::encode");
  }

  // The outer step on the sum over n ranks and the merge into params. Dense: `in` is the sum of the n
  // messages (4 length bytes); the codes: the n messages, n message_bytes() in rank order. When the sum holds
  // a value that is not finite (or, top-k, a message an index outside its chunk) nothing changes and
  // verdict() counts them. Stream-ordered.
  void apply(const std::byte* in, int n, float* params, cudaStream_t stream) {
    commsgd::check_range("n", n, 1, top_k ? 65535 : std::numeric_limits<int>::max(),
                         top_k ? "[1, 65535]" : "[1, inf)");
    reset(sum_slot, stream);
    detail::diloco::step_args a{table_,
                                length_,
                                static_cast<float>(n),
                                opt_.lr,
                                opt_.momentum,
                                opt_.alpha,
                                global_.data(),
                                velocity_.data(),
                                params,
                                verdict_.data() + sum_slot,
                                verdict_.data() + own_slot};
    if constexpr (dense) {
      const auto* sum = reinterpret_cast<const float*>(in);
      detail::diloco::dense_check_kernel<><<<grid(256), 256, 0, stream>>>(length_, sum, a.verdict);
      check_launch("cuda::diloco_fragment::apply (check)");
      detail::diloco::dense_step_kernel<><<<grid(256), 256, 0, stream>>>(a, sum);
    } else if constexpr (top_k) {
      reset(corrupt_slot, stream);
      if (layout_.count != 0) {
        const auto blocks = static_cast<unsigned>(layout_.count);
        const bool mean = opt_.top_k.sender_mean;
        detail::diloco::top_k_check_kernel<><<<blocks, detail::diloco::top_k_threads, 0, stream>>>(
            layout_, in, message_bytes(), n, mean, a.verdict, verdict_.data() + corrupt_slot);
        check_launch("cuda::diloco_fragment::apply (check)");
        detail::diloco::top_k_step_kernel<><<<blocks, detail::diloco::top_k_threads, 0, stream>>>(
            a, layout_, in, message_bytes(), n, mean, verdict_.data() + corrupt_slot);
      }
    } else {
      detail::diloco::block_check_kernel<Code>
          <<<static_cast<unsigned>((blocks() + 255) / 256), 256, 0, stream>>>(
              length_, opt_.block_size, blocks(), in, message_bytes(), n, a.verdict);
      check_launch("cuda::diloco_fragment::apply (check)");
      detail::diloco::block_step_kernel<Code>
          <<<grid(256), 256, 0, stream>>>(a, opt_.block_size, blocks(), in, message_bytes(), n);
    }
    check_launch("cuda::diloco_fragment::apply");
  }

  // After an apply whose verdict is clean: the round's residual becomes the residual (top-k; nothing for the
  // other codes). A refused round is not committed, so the residual stays as it was, as on the host.
  void commit() noexcept {
    if constexpr (top_k)
      if (std::exchange(pending_, false)) { // once per encode: a second call must not bring the old one back
        std::swap(e_, e_next_);
        std::swap(r_, r_next_);
      }
  }

  // What the last encode and apply counted; synchronises the stream.
  diloco_verdict verdict(cudaStream_t stream) const {
    check(cudaMemcpyAsync(host_verdict_.data(), verdict_.data(),
                          slots * sizeof(detail::diloco::device_verdict), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto* h = host_verdict_.data();
    const auto& e = h[own_slot];
    const auto& s = h[sum_slot];
    return {e.count, e.count ? e.first : 0, s.count, s.count ? s.first : 0,
            top_k ? h[corrupt_slot].count : 0};
  }

  // The common model, the momentum and (top-k) the residual from the host, in fragment order: for a trainer
  // that resumes, or a test. An empty velocity or residual is zeros.
  void load(std::span<const float> global, std::span<const float> velocity,
            std::span<const float> residual = {}, std::span<const float> residual_low = {}) {
    if (global.size() != length_)
      throw invalid_argument(commsgd::concat("argument 'global' holds ", global.size(),
                                             " values; the allowed size is the fragment's ", length_));
    for (auto [name, s] : {std::pair{"velocity", velocity}, std::pair{"residual", residual},
                           std::pair{"residual_low", residual_low}})
      if (!s.empty() && s.size() != length_)
        throw invalid_argument(commsgd::concat("argument '", name, "' holds ", s.size(),
                                               " values; the allowed sizes are 0 and the fragment's ",
                                               length_));
    if (opt_.momentum == 0.0f && !velocity.empty())
      throw invalid_argument(commsgd::concat("argument 'velocity' holds ", velocity.size(),
                                             " values; without momentum the allowed size is 0"));
    put(global_, global);
    if (opt_.momentum != 0.0f) put(velocity_, velocity);
    if constexpr (top_k) {
      put(e_, residual);
      put(r_, residual_low);
    }
  }

  // The same from device memory (the fragment's values each, in fragment order), stream-ordered: a device
  // trainer's checkpoint never passes through the host twice. A null velocity or residual is zeros.
  void load_device(const float* global, const float* velocity, const float* residual,
                   const float* residual_low, cudaStream_t stream) {
    if (global == nullptr)
      throw invalid_argument("argument 'global' is null; the allowed value is the fragment's common model");
    if (opt_.momentum == 0.0f && velocity != nullptr)
      throw invalid_argument("argument 'velocity' is given; without momentum the allowed value is none");
    put_device(global_, global, stream);
    if (opt_.momentum != 0.0f) put_device(velocity_, velocity, stream);
    if constexpr (top_k) {
      put_device(e_, residual, stream);
      put_device(r_, residual_low, stream);
    }
  }

private:
  static constexpr int own_slot = 0, sum_slot = 1, fresh_slot = 2, corrupt_slot = 3, slots = 4;
  static constexpr std::uint64_t max_grid = 0x7fffffffu; // CUDA's limit on blocks in x

  static cost::top_k_plan checked_layout(std::uint64_t length, const compress::top_k_ef_options& o) {
    commsgd::check_range("top_k.decay", o.decay, 0.0f, 1.0f, "[0, 1]");
    commsgd::check_range("length", length, std::uint64_t{1},
                         std::uint64_t{std::numeric_limits<std::uint32_t>::max()}, "[1, 2^32 - 1]");
    const auto c = cost::top_k_plan::of(length, o.chunk, o.density, o.two_bit); // checks the density
    if (c.count > max_grid)
      throw invalid_argument(commsgd::concat("argument 'top_k.chunk' = ", o.chunk, " makes ", c.count,
                                             " chunks; the device round allows at most ", max_grid));
    if (c.size > detail::diloco::top_k_max_chunk)
      throw invalid_argument(commsgd::concat("argument 'top_k.chunk' = ", o.chunk, " makes chunks of ",
                                             c.size, " values; the device round allows [1, ",
                                             detail::diloco::top_k_max_chunk,
                                             "] (0 only for a fragment of at most that many values)"));
    return c;
  }

  template <class T>
  static device_buffer<T> zeros(std::size_t n) {
    device_buffer<T> b(n);
    if (n) check(cudaMemset(b.data(), 0, n * sizeof(T)), "cudaMemset");
    return b;
  }
  void put(device_buffer<float>& d, std::span<const float> h) {
    if (h.empty())
      check(cudaMemset(d.data(), 0, length_ * 4), "cudaMemset");
    else
      check(cudaMemcpy(d.data(), h.data(), length_ * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  }

  void put_device(device_buffer<float>& d, const float* from, cudaStream_t stream) {
    if (from == nullptr)
      check(cudaMemsetAsync(d.data(), 0, length_ * 4, stream), "cudaMemsetAsync");
    else
      check(cudaMemcpyAsync(d.data(), from, length_ * 4, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync");
  }

  unsigned grid(unsigned block) const noexcept {
    return static_cast<unsigned>(std::max<std::uint64_t>(1, (length_ + block - 1) / block));
  }
  // Verdict slot `which` <- a fresh one, on the stream.
  void reset(int which, cudaStream_t stream) {
    check(cudaMemcpyAsync(verdict_.data() + which, verdict_.data() + fresh_slot,
                          sizeof(detail::diloco::device_verdict), cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
  }

  static constexpr unsigned long long none_ = std::numeric_limits<unsigned long long>::max();
  options opt_;
  std::uint64_t length_ = 0;
  cost::top_k_plan layout_;
  device_buffer<std::uint64_t> runs_;
  detail::diloco::run_table table_;
  device_buffer<float> global_, velocity_;
  device_buffer<float> e_, r_, e_next_, r_next_, sel_value_; // top-k
  device_buffer<std::uint32_t> sel_index_;
  device_buffer<std::byte> message_;
  device_buffer<detail::diloco::device_verdict> verdict_;
  detail::owned_array<detail::diloco::device_verdict, detail::pinned_memory> host_verdict_;
  bool pending_ = false; // top-k: an encoded round whose residual commit() may take
};

} // namespace commsgd::inline v1::cuda
