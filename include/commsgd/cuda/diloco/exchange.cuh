// cuda::diloco_exchange: a device fragment's round over a host communicator (comm::local, comm::mpi, a
// process group). The round's work on the model runs on the device; only the message travels through the
// host: for int8 a quarter of the fragment's bytes, for e3m0 an eighth, for top-k its pairs (dense: the
// floats, all-reduced).
// The device's fragment is the host engine's bit for bit, refusals included: a rank whose pseudo-gradient
// is not finite refuses the round on every rank, and a sum that is not finite is refused before it changes
// anything; both throw commsgd::non_finite with the fragment's state as it was.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/cuda/diloco/fragment.cuh>
#include <commsgd/cuda/error.cuh>
#include <commsgd/cuda/memory.cuh>
#include <commsgd/error.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace commsgd::inline v1::cuda {

// The dense exchange's sum: all_reduce_sum of the floats.
struct all_reduce_floats {};

// The staging buffers of one fragment's exchanges (page-locked host memory and the gathered messages on the
// device), kept from round to round. Reducer, for the dense fragment only: all_reduce_floats, or a host
// compressor that sums the pseudo-gradients its own way: compress::fp16 and compress::bf16 (without error
// feedback, as sync::coded_diloco makes them), whose ring rounds its partial sums to 16 bits at every hop on
// the host, so that the device does the pseudo-gradient and the step and the host the code.
template <class Code, class Reducer = all_reduce_floats>
class diloco_exchange {
  static_assert(
      std::is_same_v<Reducer, all_reduce_floats> || std::is_same_v<Code, dense_code>,
      "cuda::diloco_exchange: a host Reducer goes with the dense fragment (its message is the floats)");

public:
  explicit diloco_exchange(const diloco_fragment<Code>& f, Reducer reducer = {})
      : bytes_(f.message_bytes()), reducer_(std::move(reducer)) {}

  // One round: encode, exchange, apply. Throws commsgd::non_finite on every rank when a rank's
  // pseudo-gradient or the sum is not finite (nothing of f or params changed); comm errors as the
  // communicator throws them. Returns the bytes this rank sent, by comm/traffic.hpp's rules.
  template <comm::communicator C>
  std::uint64_t run(C& c, diloco_fragment<Code>& f, float* params, float weight, cudaStream_t stream) {
    const auto n = static_cast<std::size_t>(c.size());
    if (f.message_bytes() != bytes_)
      throw invalid_argument(commsgd::concat(
          "argument 'f' has messages of ", f.message_bytes(),
          " bytes; the allowed fragment is the one this exchange was made for (", bytes_, " bytes)"));
    commsgd::check_range("weight", weight, 0.0f, static_cast<float>(c.size()), "[0, the number of ranks]");
    f.encode(params, weight, stream);
    grow(send_, bytes_);
    check(cudaMemcpyAsync(send_.data(), f.message(), bytes_, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    const diloco_verdict own = f.verdict(stream); // synchronises: the message is on the host
    std::uint64_t wire = 0;
    const std::byte* in = nullptr;
    if constexpr (diloco_fragment<Code>::dense) {
      // The host engine's uncompressed exchange: the raw floats summed, non-finite ones too, and the sum
      // judged.
      (void)own;
      const std::span<float> mine(reinterpret_cast<float*>(send_.data()), f.length());
      if constexpr (std::is_same_v<Reducer, all_reduce_floats>) {
        c.all_reduce_sum(mine);
        wire = comm::ring_all_reduce_traffic(f.length(), sizeof(float), c.size(), c.rank()).bytes_sent;
        in = upload(send_.data(), bytes_, stream);
      } else {
        sum_.resize(f.length());
        reducer_.reduce(c, std::span<const float>(mine), std::span<float>(sum_)); // refusals throw here
        wire = reducer_.wire_bytes();
        in = upload(reinterpret_cast<const std::byte*>(sum_.data()), bytes_, stream);
      }
    } else {
      // Every rank's count first, so that every rank refuses together (compress/agree.hpp's rule).
      const std::uint64_t mine[2] = {own.own, own.own_first};
      std::vector<std::uint64_t> counts(2 * n);
      c.all_gather(std::as_bytes(std::span<const std::uint64_t>(mine)),
                   std::as_writable_bytes(std::span<std::uint64_t>(counts)));
      for (std::size_t r = 0; r < n; ++r)
        if (counts[2 * r] != 0)
          throw non_finite(
              commsgd::concat("cuda::diloco_exchange: rank ", r, "'s pseudo-gradient (", Code::name, ")"),
              counts[2 * r], counts[2 * r + 1]);
      grow(all_, n * bytes_);
      c.all_gather(std::span<const std::byte>(send_.data(), bytes_),
                   std::span<std::byte>(all_.data(), n * bytes_));
      wire = comm::all_gather_traffic(sizeof mine, c.size()).bytes_sent +
             comm::all_gather_traffic(bytes_, c.size()).bytes_sent;
      in = upload(all_.data(), n * bytes_, stream);
    }
    f.apply(in, static_cast<int>(n), params, stream);
    const diloco_verdict v = f.verdict(stream);
    if (v.corrupt != 0)
      throw corrupt_data(commsgd::concat("cuda::diloco_exchange: ", v.corrupt,
                                         " gathered index(es) outside their chunk (", Code::name, ")"));
    if (v.sum != 0)
      throw non_finite(
          commsgd::concat("cuda::diloco_exchange: the sum of the ranks' pseudo-gradients (", Code::name, ")"),
          v.sum, v.sum_first);
    f.commit();
    return wire;
  }

private:
  template <class T>
  static void grow(T& buf, std::size_t bytes) {
    if (buf.size() < bytes) buf = T(bytes);
  }
  const std::byte* upload(const std::byte* host, std::size_t bytes, cudaStream_t stream) {
    grow(device_, bytes + 8); // the bit readers never pass a field's last byte; the slack is for safety
    check(cudaMemcpyAsync(device_.data(), host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    return device_.data();
  }

  std::size_t bytes_;
  Reducer reducer_;
  std::vector<float> sum_; // a host Reducer's sum
  detail::owned_array<std::byte, detail::pinned_memory> send_, all_;
  device_buffer<std::byte> device_;
};

} // namespace commsgd::inline v1::cuda
