// compress::top_k_ef: the k largest |p_i| of p = g + e sent as (value, index) pairs, the rest kept in the
// residual; for DiLoCo's pseudo-gradients (SparseLoCo): the code "topk-<density>" (cost/diloco.hpp).
//
// Per round, with d values and k = ceil(density d) (at least 1, at most d; cost::top_k_count, which also
// forgives a density d that lands a rounding error above an integer):
//   p = g + e                    as every compressor in compress/ forms it (compress/error_feedback.hpp)
//   selection                    the k largest |p_i| by an exact selector S (select/), ties at the k-th
//                                magnitude to the lowest indices, so the set is a function of p alone
//   values                       the selected p_i as floats, or (two_bit) 2 bits each against one scale
//                                per message: s = mean |p_i| over the selection, rounded once to float;
//                                a value is sign(p_i) (|p_i| >= s ? 1.5 s : 0.5 s). Two levels at a half
//                                and one and a half of the mean are the best pair for magnitudes spread
//                                evenly around it, and the sign bit keeps -0.
// Message, the same size on every rank (the length is agreed): the values (4 k bytes; two_bit: the scale,
// 4 bytes, then ceil(k / 4) bytes of codes), then the indices (4 k bytes, u32, increasing). Every rank's
// message is gathered and summed in float in rank order from +0, so every
// rank holds the same bits. The residual keeps p - sent exactly (a pair of floats; without two_bit the
// subtraction is always exact: p - p or p - 0), so sent + new residual == old residual + g, bit for bit.
// Bytes a rank sends a round: (n - 1) (40 + message_bytes), 40 the verdict of compress/agree.hpp.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/cost/diloco.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/compact.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/selector.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::compress {

struct top_k_ef_options {
  double density = 0.01; // fraction of values sent: (0, 1]
  bool two_bit = false;  // values in 2 bits against one scale per message (SparseLoCo)
};

// k for `density` of d values (cost/diloco.hpp has the rule).
inline std::size_t top_k_ef_count(std::size_t d, double density) {
  return static_cast<std::size_t>(cost::top_k_count(d, density));
}

// The 2-bit code of a sent value: bit 1 its sign, bit 0 whether its magnitude is at or above the scale.
struct two_bit_code {
  static std::uint32_t encode(float v, float s) noexcept {
    return (std::signbit(v) ? 2u : 0u) | (std::fabs(v) >= s ? 1u : 0u);
  }
  // 1.5 s is clamped to the largest float, so that a huge mean still decodes to a finite value of the
  // right sign and p - value cannot overflow.
  static float decode(std::uint32_t code, float s) noexcept {
    const double m = (code & 1u) ? 1.5 * static_cast<double>(s) : 0.5 * static_cast<double>(s);
    const auto mag = static_cast<float>(std::min(m, static_cast<double>(std::numeric_limits<float>::max())));
    return (code & 2u) ? -mag : mag;
  }
};

// S: an exact selector (select/exact.hpp, select/radix.hpp, ...). An approximate one would send a count
// that varies with the data, and every rank's message must have the one size the gather expects.
template <select::selector S = select::exact>
requires(S::is_exact) class top_k_ef : public detail::round_state {
public:
  static constexpr const char* name = "top_k_ef";

  explicit top_k_ef(std::size_t length, top_k_ef_options o = {}, S selector = {})
      : round_state(checked_length(length), true), opt_(o), k_(top_k_ef_count(length, o.density)),
        sel_(std::move(selector)) {
    msg_.resize(message_bytes(k_, opt_.two_bit));
    idx_.resize(k_);
    val_.resize(k_);
  }

  const top_k_ef_options& options() const noexcept { return opt_; }
  std::size_t k() const noexcept { return k_; }

  // A rank's message for k values: the values (floats, or a scale and 2-bit codes), then u32 indices.
  static constexpr std::size_t message_bytes(std::size_t k, bool two_bit) noexcept {
    return static_cast<std::size_t>(cost::top_k_message_bytes(k, two_bit));
  }

  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    const auto v = detail::take_input(g, out.size(), length_, ef_, p_);
    detail::agree(c, what(), length_, config(), v, verdicts_);
    encode();
    std::fill(d_.begin(), d_.end(), 0.0f); // what is not sent decodes to +0: the residual keeps p there
    detail::gather_and_sum(c, msg_, all_, out, d_, [&](auto m, auto&& sink) { decode(m, sink); });
    wire_ = (cost::compress_header_traffic(c.size()) + comm::all_gather_traffic(msg_.size(), c.size()))
                .bytes_sent;
    return detail::finish_round(ef_, p_, d_, steps_, static_cast<std::size_t>(c.size()), k_, false);
  }

  void save(std::ostream& os) const { detail::save_state(os, what(), params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "k", "two_bit (1 on, 0 off)"};
    detail::load_state(is, what(), params(), names, length_, steps_, ef_);
  }

private:
  // Indices travel as u32; checked before the residual is allocated.
  static std::size_t checked_length(std::size_t length) {
    commsgd::check_range("length", length, std::size_t{0},
                         std::size_t{std::numeric_limits<std::uint32_t>::max()}, "[0, 2^32 - 1]");
    return length;
  }
  static const char* what() noexcept { return "compress::top_k_ef"; }
  std::array<std::uint64_t, 3> params() const noexcept { return {length_, k_, opt_.two_bit ? 1u : 0u}; }
  std::uint64_t config() const noexcept { return detail::fingerprint(params()); }

  void encode() {
    const auto t = sel_.select(std::span<const float>(p_), k_);
    select::compact<std::uint32_t>(p_, t, std::span<std::uint32_t>(idx_), std::span<float>(val_));
    std::byte* at = msg_.data();
    if (opt_.two_bit) {
      double sum = 0.0;
      for (float x : val_)
        sum += std::fabs(static_cast<double>(x));
      const float s = k_ == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(k_));
      std::memcpy(at, &s, 4);
      detail::pack_bits(std::span<std::byte>(at + 4, detail::packed_bytes(k_, 2)), k_, 2,
                        [&](std::size_t j) { return two_bit_code::encode(val_[j], s); });
      at += 4 + detail::packed_bytes(k_, 2);
    } else if (k_ != 0) { // an empty message has no storage: memcpy must not see its null pointer
      std::memcpy(at, val_.data(), 4 * k_);
      at += 4 * k_;
    }
    if (k_ != 0) std::memcpy(at, idx_.data(), 4 * k_);
  }

  // Every rank decodes every message, so an index out of range (a corrupt peer) is refused on all of them.
  template <class Sink>
  void decode(std::span<const std::byte> m, Sink&& sink) const {
    const std::size_t values = opt_.two_bit ? 4 + detail::packed_bytes(k_, 2) : 4 * k_;
    const std::byte* idx = m.data() + values;
    auto index = [&](std::size_t j) {
      std::uint32_t i;
      std::memcpy(&i, idx + 4 * j, 4);
      if (i >= length_)
        throw corrupt_data(
            commsgd::concat(what(), ": a message holds index ", i, ", outside [0, length = ", length_, ")"));
      return static_cast<std::size_t>(i);
    };
    if (opt_.two_bit) {
      float s;
      std::memcpy(&s, m.data(), 4);
      detail::unpack_bits(m.subspan(4, values - 4), 0, k_, 2, [&](std::size_t j, std::uint32_t code) {
        sink(index(j), two_bit_code::decode(code, s));
      });
    } else {
      for (std::size_t j = 0; j < k_; ++j) {
        float x;
        std::memcpy(&x, m.data() + 4 * j, 4);
        sink(index(j), x);
      }
    }
  }

  top_k_ef_options opt_;
  std::size_t k_;
  S sel_;
  std::vector<std::uint32_t> idx_;
  std::vector<float> val_;
  std::vector<std::byte> msg_, all_;
};

static_assert(compressor<top_k_ef<>, comm::archetype>);

} // namespace commsgd::inline v1::compress
