// compress::int8 and compress::e3m0: each value in a few bits, relative to a scale per block of
// values, for pseudo-gradients (DiLoCo: INTELLECT-1 sends int8, Streaming DiLoCo 4-bit floats).
//
// Per block of `block_size` values of p = g + e (the last block may be shorter), s = max |p_i| (a float,
// sent as it is), and each value a code:
//   int8   code = round(127 p_i / s) in [-127, 127] (to nearest, ties to even); decodes to code s / 127,
//          computed in double and rounded once to float. 8 bits a value.
//   e3m0   a sign bit and a 3-bit exponent k: k = 0 is zero (its sign kept), k in 1..7 is +-2^(k-7) s, the
//          power of two nearest |p_i| / s (2^-6 .. 1; below 2^-7 s is zero). 4 bits a value.
// A block of zeros (s = 0) decodes to zeros. Message: the block scales (4 bytes each), then the codes
// packed (compress/bit_pack.hpp); every rank's message is gathered, decoded and summed in float, in rank
// order from +0, so every rank holds the same bits (compress/compressor_round.hpp). What a code does not carry stays
// in the residual, exactly (compress/error_feedback.hpp), when error feedback is on (the default).
// Bytes a rank sends a round: the 40-byte verdict and its message to each of the n - 1 others.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/cost/diloco.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <array>
#include <bit>
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

// The codes' per-value maths is host and device code alike (the device round, cuda/diloco/, encodes and
// decodes with these very functions). Double operations are a multiply then a divide, which no compiler
// fuses, so both sides round the same way.
struct int8_code {
  static constexpr const char* name = "int8";
  static constexpr unsigned bits = 8;
  // x = p / s in [-1, 1].
  COMMSGD_HOST_DEVICE static std::uint32_t encode(float p, float s) noexcept {
#if defined(__CUDA_ARCH__)
    const double q = rint(127.0 * static_cast<double>(p) / static_cast<double>(s)); // ties to even
#else
    const double q = std::nearbyint(127.0 * static_cast<double>(p) / static_cast<double>(s));
#endif
    return static_cast<std::uint32_t>(static_cast<std::int32_t>(q) + 127);
  }
  COMMSGD_HOST_DEVICE static float decode(std::uint32_t code, float s) noexcept {
    const auto c = static_cast<std::int32_t>(code) - 127;
    return static_cast<float>(static_cast<double>(c) * static_cast<double>(s) / 127.0);
  }
};

struct e3m0_code {
  static constexpr const char* name = "e3m0";
  static constexpr unsigned bits = 4;
  // The nearest power of two 2^j to x = |p| / s, j in [-6, 0]: between 2^(j-1) and 2^j the midpoint is
  // 0.75 2^j = 1.5 2^(j-1), a tie going to the smaller power, so k = j + 7 = 1 + #{i in [-6, -1] : x > 1.5 2^i}
  // (comparisons that the compiler vectorises; the thresholds are exact in double, so the decision is the
  // same as rounding x's mantissa at 0.75).
  COMMSGD_HOST_DEVICE static std::uint32_t encode(float p, float s) noexcept {
    const std::uint32_t sign = std::signbit(p) ? 8u : 0u;
    const double x = std::fabs(static_cast<double>(p)) / static_cast<double>(s);
    if (x < 0x1p-7) return sign; // nearer zero than 2^-6
    std::uint32_t k = 1;
    k += x > 0x1.8p-6 ? 1u : 0u;
    k += x > 0x1.8p-5 ? 1u : 0u;
    k += x > 0x1.8p-4 ? 1u : 0u;
    k += x > 0x1.8p-3 ? 1u : 0u;
    k += x > 0x1.8p-2 ? 1u : 0u;
    k += x > 0x1.8p-1 ? 1u : 0u;
    return sign | k;
  }
  COMMSGD_HOST_DEVICE static float decode(std::uint32_t code, float s) noexcept {
    const int k = static_cast<int>(code & 7u);
    const float mag = k == 0 ? 0.0f : std::ldexp(s, k - 7);
    return (code & 8u) ? -mag : mag;
  }
  // The 16 values a block of scale s decodes to, by code: decode() once each, so a message decodes by lookup.
  static std::array<float, 16> table(float s) noexcept {
    std::array<float, 16> t{};
    for (std::uint32_t c = 0; c < 16; ++c)
      t[c] = decode(c, s);
    return t;
  }
};

// The code of value p in a block of scale s: in a block of zeros (s = 0), the code of +-0 (int8: 127; e3m0:
// the sign alone).
template <class Code>
COMMSGD_HOST_DEVICE std::uint32_t block_code(float p, float s) noexcept {
  if (s == 0.0f) return Code::bits == 8 ? 127u : (std::signbit(p) ? 8u : 0u);
  return Code::encode(p, s);
}

namespace detail {

// The message of p's values, a scale per block of b values (the last block may be shorter): the scales (4
// bytes each), then the codes packed; `scales` receives the scales. The message is
// cost::block_quant_message_bytes(p.size(), b, Code::bits) bytes.
template <class Code>
void encode_blocks(std::span<const float> p, std::size_t b, std::vector<float>& scales, std::span<std::byte> msg) {
  const std::size_t d = p.size(), blocks = (d + b - 1) / b;
  scales.assign(blocks, 0.0f);
  for (std::size_t k = 0; k < blocks; ++k) {
    float s = 0.0f;
    for (std::size_t i = k * b; i < std::min(d, (k + 1) * b); ++i)
      s = std::max(s, std::fabs(p[i]));
    scales[k] = s;
    std::memcpy(msg.data() + 4 * k, &s, 4);
  }
  pack_bits(msg.subspan(4 * blocks), d, Code::bits, [&](std::size_t i) { return block_code<Code>(p[i], scales[i / b]); });
}

// Calls sink(i, x) for the values of blocks [k0, k1) of message m, which codes d values in blocks of b.
template <class Code, class Sink>
void decode_blocks(std::span<const std::byte> m, std::size_t d, std::size_t b, std::size_t k0, std::size_t k1,
                   Sink&& sink) {
  const std::size_t blocks = (d + b - 1) / b;
  for (std::size_t k = k0; k < k1; ++k) {
    float s;
    std::memcpy(&s, m.data() + 4 * k, 4);
    const std::size_t first = k * b, count = std::min(d, first + b) - first;
    if constexpr (Code::bits == 4) {
      const auto t = Code::table(s);
      unpack_bits(m.subspan(4 * blocks), first, count, Code::bits,
                  [&](std::size_t i, std::uint32_t code) { sink(i, t[code]); });
    } else {
      unpack_bits(m.subspan(4 * blocks), first, count, Code::bits,
                  [&](std::size_t i, std::uint32_t code) { sink(i, Code::decode(code, s)); });
    }
  }
}

} // namespace detail

struct block_quant_options {
  std::size_t block_size = 256; // values per scale: [1, inf)
  bool error_feedback = true;
};

template <class Code>
class block_quantizer : public detail::round_state {
public:
  static constexpr const char* name = Code::name;

  explicit block_quantizer(std::size_t length, block_quant_options o = {})
      : round_state(length, o.error_feedback), opt_(o) {
    commsgd::check_range("block_size", opt_.block_size, std::size_t{1},
                         std::numeric_limits<std::size_t>::max(), "[1, inf)");
    msg_.resize(message_bytes(length, opt_.block_size));
  }

  std::size_t blocks() const noexcept { return (length_ + opt_.block_size - 1) / opt_.block_size; }
  const block_quant_options& options() const noexcept { return opt_; }

  // A rank's message: the scales, then the codes.
  static constexpr std::size_t message_bytes(std::size_t d, std::size_t block_size) noexcept {
    return static_cast<std::size_t>(cost::block_quant_message_bytes(d, block_size, Code::bits));
  }

  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    const auto v = detail::take_input(g, out.size(), length_, ef_, p_);
    detail::agree(c, what(), length_, config(), v, verdicts_);
    encode();
    sum_gathered(c, out);
    wire_ = (cost::compress_header_traffic(c.size()) + comm::all_gather_traffic(msg_.size(), c.size()))
                .bytes_sent;
    return detail::finish_round(ef_, p_, d_, steps_, static_cast<std::size_t>(c.size()), length_, false);
  }

  void save(std::ostream& os) const { detail::save_state(os, what(), params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "block size"};
    detail::load_state(is, what(), params(), names, length_, steps_, ef_);
  }

private:
  static const char* what() noexcept { return Code::bits == 8 ? "compress::int8" : "compress::e3m0"; }
  std::array<std::uint64_t, 2> params() const noexcept { return {length_, opt_.block_size}; }
  std::uint64_t config() const noexcept {
    const std::array<std::uint64_t, 4> p{length_, opt_.block_size, ef_.on() ? 1u : 0u, Code::bits};
    return detail::fingerprint(p);
  }

  void encode() { detail::encode_blocks<Code>(p_, opt_.block_size, scales_, msg_); }

  // Every rank's message gathered and summed in rank order from +0, as compress/compressor_round.hpp's gather_and_sum,
  // but a chunk of blocks at a time across the ranks, so that each chunk of `out` is written once from
  // cache rather than read and written again for every rank; this rank's own decoded message only when error
  // feedback keeps the rest of it.
  template <comm::communicator C>
  void sum_gathered(C& c, std::span<float> out) {
    const auto n = static_cast<std::size_t>(c.size());
    const std::size_t bytes = msg_.size();
    all_.resize(n * bytes);
    c.all_gather(std::span<const std::byte>(msg_), std::span<std::byte>(all_));
    const std::size_t chunk = std::max<std::size_t>(1, 16384 / opt_.block_size);
    const std::span<const std::byte> all(all_);
    for (std::size_t k0 = 0; k0 < blocks(); k0 += chunk) {
      const std::size_t k1 = std::min(blocks(), k0 + chunk);
      decode(all.first(bytes), k0, k1, [&](std::size_t i, float x) { out[i] = 0.0f + x; });
      for (std::size_t r = 1; r < n; ++r)
        decode(all.subspan(r * bytes, bytes), k0, k1, [&](std::size_t i, float x) { out[i] += x; });
    }
    if (ef_.on())
      decode(std::span<const std::byte>(msg_), 0, blocks(), [&](std::size_t i, float x) { d_[i] = x; });
  }

  template <class Sink>
  void decode(std::span<const std::byte> m, std::size_t k0, std::size_t k1, Sink&& sink) const {
    detail::decode_blocks<Code>(m, length_, opt_.block_size, k0, k1, std::forward<Sink>(sink));
  }

  block_quant_options opt_;
  std::vector<float> scales_;
  std::vector<std::byte> msg_, all_;
};

using int8 = block_quantizer<int8_code>;
using e3m0 = block_quantizer<e3m0_code>;

static_assert(compressor<int8, comm::archetype>);
static_assert(compressor<e3m0, comm::archetype>);

} // namespace commsgd::inline v1::compress
