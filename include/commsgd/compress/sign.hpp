// compress::sign: EF-SignSGD, the scaled sign with error feedback.
//
// Per layer of p = g + e: scale = ||p||_1 / size (mean |p|, summed in double, rounded once to float), and
// value i is sent as one bit, p_i's sign bit (so -0 goes as negative), decoding to -scale or +scale.
// Message: L float scales, then the bits packed one per value (compress/bit_pack.hpp), all gathered; each
// rank decodes every rank's message and sums them in rank order from +0, so every rank has the same bits.
// The residual keeps p - decoded exactly, as a pair of floats (compress/error_feedback.hpp).
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/compressed_reducer.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/layers.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <span>
#include <vector>

namespace commsgd::inline v1::compress {

struct sign_options {
  std::vector<std::size_t> layer_offsets; // one scale per layer; empty: one for the whole vector
  bool error_feedback = true;
};

class sign : public detail::round_state {
public:
  static constexpr const char* name = "sign";

  explicit sign(std::size_t length, sign_options o = {})
      : round_state(length, o.error_feedback), bounds_(detail::layer_bounds(length, o.layer_offsets)),
        opt_(std::move(o)), msg_(cost::sign_message_bytes(length, layers())) {}

  std::size_t layers() const noexcept { return bounds_.size() - 1; }

  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    const auto v = detail::take_input(g, out.size(), length_, ef_, p_);
    detail::agree(c, "compress::sign", length_, config(), v, verdicts_);
    encode();
    detail::gather_and_sum(c, msg_, all_, out, d_, [&](auto m, auto&& sink) { decode(m, sink); });
    wire_ = cost::sign_traffic(length_, layers(), c.size()).bytes_sent;
    return detail::finish_round(ef_, p_, d_, steps_, static_cast<std::size_t>(c.size()), length_, false);
  }

  void save(std::ostream& os) const { detail::save_state(os, kind, params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "layer count"};
    detail::load_state(is, kind, params(), names, length_, steps_, ef_);
  }

private:
  static constexpr const char* kind = "compress::sign";
  std::array<std::uint64_t, 2> params() const noexcept { return {length_, layers()}; }
  // The layer boundaries themselves, not only their count, must agree.
  std::uint64_t config() const noexcept {
    const std::array<std::uint64_t, 4> p{length_, layers(), ef_.on() ? 1u : 0u, detail::fingerprint(bounds_)};
    return detail::fingerprint(p);
  }

  void encode() {
    for (std::size_t l = 0; l < layers(); ++l) {
      double sum = 0;
      for (std::size_t i = bounds_[l]; i < bounds_[l + 1]; ++i)
        sum += std::fabs(static_cast<double>(p_[i]));
      const std::size_t size = bounds_[l + 1] - bounds_[l];
      const float scale = size ? static_cast<float>(sum / static_cast<double>(size)) : 0.0f;
      std::memcpy(msg_.data() + 4 * l, &scale, 4);
    }
    detail::pack_bits(std::span<std::byte>(msg_).subspan(4 * layers()), length_, 1,
                      [&](std::size_t i) { return std::signbit(p_[i]) ? 1u : 0u; });
  }

  template <class Sink>
  void decode(std::span<const std::byte> m, Sink&& sink) const {
    const auto bits = m.subspan(4 * layers());
    for (std::size_t l = 0; l < layers(); ++l) {
      float scale;
      std::memcpy(&scale, m.data() + 4 * l, 4);
      const std::uint32_t plus = std::bit_cast<std::uint32_t>(scale);
      // The sign bit flips the scale's: -scale exactly, with no branch.
      detail::unpack_bits(
          bits, bounds_[l], bounds_[l + 1] - bounds_[l], 1,
          [&](std::size_t i, std::uint32_t b) { sink(i, std::bit_cast<float>(plus ^ (b << 31))); });
    }
  }

  std::vector<std::size_t> bounds_;
  sign_options opt_;
  std::vector<std::byte> msg_, all_;
};

static_assert(compressor<sign, comm::archetype>);

} // namespace commsgd::inline v1::compress
