// cuda::diloco_fragment: one DiLoCo fragment's round on device parameters, the host engine's (sync/diloco.hpp)
// bit for bit: this rank's pseudo-gradient encoded into a message, then, once the messages of every rank
// are here, their sum decoded, the outer Nesterov step and the merge into the parameters, each a pass over
// the fragment at memory speed. The common model and the outer momentum live on the device, in fragment
// order; the parameters are the trainer's flat model, the fragment's values at its runs.
//
//   cuda::diloco_fragment<compress::int8_code> f(runs, {.lr = 0.7f, .momentum = 0.9f});
//   f.start(params, stream);                       // the common model <- the fragment's parameters
//   f.encode(params, weight, stream);              // f.message(): message_bytes() on the device
//   ... every rank's message gathered, in rank order, n * message_bytes() on the device ...
//   f.apply(gathered, n, params, stream);          // skipped when the sum is not finite
//   if (auto v = f.verdict(stream); v.count) ...   // reads what encode and apply counted (synchronises)
//
// Codes: cuda::dense_code (the message is the float pseudo-gradient; apply takes the sum of the n messages,
// an all-reduce's result, not the messages), compress::int8_code and compress::e3m0_code (blocks of
// block_size values, a multiple of 32 and at most 1024; apply takes the n messages and sums them in rank
// order). cuda/diloco/exchange.cuh runs the round over a host communicator. Top-k and the 16-bit codes have
// no device round yet; their engines run on a host copy.
#pragma once

#include <commsgd/compress/block_quant.hpp>
#include <commsgd/cost/diloco.hpp>
#include <commsgd/cuda/diloco/kernels.cuh>
#include <commsgd/cuda/error.cuh>
#include <commsgd/cuda/memory.cuh>
#include <commsgd/error.hpp>
#include <commsgd/sync/outer_optimizer.hpp>

#include <cuda_runtime.h>

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

template <class Code>
inline constexpr bool is_diloco_device_code =
    std::is_same_v<Code, dense_code> || std::is_same_v<Code, compress::int8_code> ||
    std::is_same_v<Code, compress::e3m0_code>;

struct diloco_fragment_options {
  float lr = 0.7f;                                  // the outer step's: (0, inf)
  float momentum = 0.9f;                            // [0, 1)
  float alpha = 0.0f;                               // the local model's weight in the merge: [0, 1]
  std::size_t block_size = cost::diloco_block_size; // int8, e3m0: a multiple of 32 in [32, 1024]
};

// What a round counted: the non-finite values of this rank's pseudo-gradient (encode) and of the sum
// (apply), with the lowest index of each.
struct diloco_verdict {
  std::uint64_t own = 0, own_first = 0;
  std::uint64_t sum = 0, sum_first = 0;
};

template <class Code>
class diloco_fragment {
  static_assert(
      is_diloco_device_code<Code>,
      "cuda::diloco_fragment runs cuda::dense_code, compress::int8_code and compress::e3m0_code; the "
      "other DiLoCo codes run on a host copy (sync::coded_diloco)");

public:
  using options = diloco_fragment_options;
  static constexpr bool dense = std::is_same_v<Code, dense_code>;

  // runs: the fragment's (offset, length) runs in the flat model, in fragment order (the host engine's
  // fragment_runs(p)).
  diloco_fragment(std::span<const std::pair<std::size_t, std::size_t>> runs, options o) : opt_(o) {
    sync::outer_sgd::check({.lr = o.lr, .momentum = o.momentum});
    commsgd::check_range("alpha", o.alpha, 0.0f, 1.0f, "[0, 1]");
    if constexpr (!dense)
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
    runs_ = device_buffer<std::uint64_t>(begin.size() + offset.size());
    check(cudaMemcpy(runs_.data(), begin.data(), begin.size() * 8, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(runs_.data() + begin.size(), offset.data(), offset.size() * 8, cudaMemcpyHostToDevice),
          "cudaMemcpy");
    table_ = {runs_.data(), runs_.data() + begin.size(), static_cast<int>(offset.size())};
    global_ = device_buffer<float>(length_);
    if (o.momentum != 0.0f) {
      velocity_ = device_buffer<float>(length_);
      check(cudaMemset(velocity_.data(), 0, length_ * 4), "cudaMemset");
    }
    message_ = device_buffer<std::byte>(message_bytes());
    verdict_ = device_buffer<diloco_detail::device_verdict>(3);
    host_verdict_ = detail::owned_array<diloco_detail::device_verdict, detail::pinned_memory>(2);
    const diloco_detail::device_verdict fresh[3] = {{0, none_}, {0, none_}, {0, none_}};
    check(cudaMemcpy(verdict_.data(), fresh, sizeof fresh, cudaMemcpyHostToDevice), "cudaMemcpy");
  }

  std::size_t length() const noexcept { return length_; }
  const options& opts() const noexcept { return opt_; }
  std::size_t blocks() const noexcept {
    return dense ? 0 : (length_ + opt_.block_size - 1) / opt_.block_size;
  }
  // Bytes of one rank's message (dense: the float pseudo-gradient).
  std::size_t message_bytes() const noexcept {
    if constexpr (dense)
      return 4 * length_;
    else
      return compress::block_quantizer<Code>::message_bytes(length_, opt_.block_size);
  }
  const std::byte* message() const noexcept { return message_.data(); }
  std::byte* message() noexcept { return message_.data(); }
  const float* global() const noexcept { return global_.data(); }
  const float* velocity() const noexcept { return velocity_.data(); } // null without momentum

  // The common model <- the fragment's values of params (the flat model).
  void start(const float* params, cudaStream_t stream) {
    diloco_detail::gather_kernel<><<<grid(256), 256, 0, stream>>>(table_, length_, params, global_.data());
    check_launch("cuda::diloco_fragment::start");
  }

  // This rank's message of weight (common - local), weight in [0, n] (1: the plain mean). Counts the
  // pseudo-gradient's non-finite values into verdict().own. Stream-ordered, no synchronisation.
  void encode(const float* params, float weight, cudaStream_t stream) {
    reset(0, stream);
    if constexpr (dense) {
      diloco_detail::dense_encode_kernel<>
          <<<grid(256), 256, 0, stream>>>(table_, length_, global_.data(), params, weight,
                                          reinterpret_cast<float*>(message_.data()), verdict_.data());
    } else {
      diloco_detail::block_encode_kernel<Code>
          <<<static_cast<unsigned>(blocks()), static_cast<unsigned>(opt_.block_size), 0, stream>>>(
              table_, length_, global_.data(), params, weight, blocks(), message_.data(), verdict_.data());
    }
    check_launch("cuda::diloco_fragment::encode");
  }

  // The outer step on the sum over n ranks and the merge into params. Dense: `in` is the sum of the n
  // messages (4 length bytes); the codes: the n messages, n message_bytes() in rank order. When the sum holds
  // a value that is not finite nothing changes and verdict().sum counts them. Stream-ordered.
  void apply(const std::byte* in, int n, float* params, cudaStream_t stream) {
    commsgd::check_range("n", n, 1, std::numeric_limits<int>::max(), "[1, inf)");
    reset(1, stream);
    diloco_detail::step_args a{
        table_,     length_,        static_cast<float>(n), opt_.lr, opt_.momentum,
        opt_.alpha, global_.data(), velocity_.data(),      params,  verdict_.data() + 1};
    if constexpr (dense) {
      const auto* sum = reinterpret_cast<const float*>(in);
      diloco_detail::dense_check_kernel<><<<grid(256), 256, 0, stream>>>(length_, sum, verdict_.data() + 1);
      check_launch("cuda::diloco_fragment::apply (check)");
      diloco_detail::dense_step_kernel<><<<grid(256), 256, 0, stream>>>(a, sum);
    } else {
      diloco_detail::block_check_kernel<Code><<<static_cast<unsigned>(blocks()), 256, 0, stream>>>(
          length_, opt_.block_size, blocks(), in, message_bytes(), n, verdict_.data() + 1);
      check_launch("cuda::diloco_fragment::apply (check)");
      diloco_detail::block_step_kernel<Code>
          <<<grid(256), 256, 0, stream>>>(a, opt_.block_size, blocks(), in, message_bytes(), n);
    }
    check_launch("cuda::diloco_fragment::apply");
  }

  // What the last encode and apply counted; synchronises the stream.
  diloco_verdict verdict(cudaStream_t stream) const {
    check(cudaMemcpyAsync(host_verdict_.data(), verdict_.data(), 2 * sizeof(diloco_detail::device_verdict),
                          cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto& e = host_verdict_.data()[0];
    const auto& s = host_verdict_.data()[1];
    return {e.count, e.count ? e.first : 0, s.count, s.count ? s.first : 0};
  }

  // The common model and the momentum from the host (fragment order): for a trainer that resumes, or a test.
  void load(std::span<const float> global, std::span<const float> velocity) {
    if (global.size() != length_)
      throw invalid_argument(commsgd::concat("argument 'global' holds ", global.size(),
                                             " values; the allowed size is the fragment's ", length_));
    check(cudaMemcpy(global_.data(), global.data(), length_ * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    if (opt_.momentum == 0.0f) return;
    if (!velocity.empty() && velocity.size() != length_)
      throw invalid_argument(commsgd::concat("argument 'velocity' holds ", velocity.size(),
                                             " values; the allowed sizes are 0 and the fragment's ",
                                             length_));
    if (velocity.empty())
      check(cudaMemset(velocity_.data(), 0, length_ * 4), "cudaMemset");
    else
      check(cudaMemcpy(velocity_.data(), velocity.data(), length_ * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  }

private:
  unsigned grid(unsigned block) const noexcept {
    return static_cast<unsigned>(std::max<std::uint64_t>(1, (length_ + block - 1) / block));
  }
  // Verdict slot `which` (0: encode's, 1: apply's) <- slot 2, a fresh one, on the stream.
  void reset(int which, cudaStream_t stream) {
    check(cudaMemcpyAsync(verdict_.data() + which, verdict_.data() + 2, sizeof(diloco_detail::device_verdict),
                          cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
  }

  static constexpr unsigned long long none_ = std::numeric_limits<unsigned long long>::max();
  options opt_;
  std::uint64_t length_ = 0;
  device_buffer<std::uint64_t> runs_;
  diloco_detail::run_table table_;
  device_buffer<float> global_, velocity_;
  device_buffer<std::byte> message_;
  device_buffer<diloco_detail::device_verdict> verdict_;
  detail::owned_array<diloco_detail::device_verdict, detail::pinned_memory> host_verdict_;
};

} // namespace commsgd::inline v1::cuda
