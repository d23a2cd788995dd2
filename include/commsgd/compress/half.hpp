// fp16 and bf16 on the wire: the conversions, and compress::fp16 / compress::bf16, the compressors that send
// every value in 16 bits.
//
// Conversions (shared with device code): float -> fp16 (IEEE binary16: 5 exponent bits, 10 fraction bits)
// and float -> bf16 (the float's upper 16 bits: 8 exponent bits, 7 fraction bits), both rounding to nearest,
// ties to even, subnormals of both formats kept (no flush to zero), and back, which is exact. A finite float
// beyond the format's largest finite value plus half an ulp (fp16: |x| >= 65520; bf16: only the top of the
// float range) rounds to inf, as IEEE conversion does; NaN maps to a quiet NaN with the sign kept.
//
// The compressors refuse NaN and inf in p = g + e, and what would overflow: by default with
// commsgd::invalid_argument naming the value, its index and the finite range; with
// half_overflow::clamp, it is sent as the largest finite value of its sign (and, with error feedback, the
// excess stays in the residual).
//
// Exchange: a ring all-reduce with the 16-bit values on the wire and float sums (comm/narrow_ring.hpp): each
// rank's contribution is its values rounded to 16 bits (what error feedback keeps the rest of), the partial
// sums are rounded to 16 bits at every hop, and every rank ends with the same bits on every transport. A
// rank sends and receives half the bytes of a float ring all-reduce, as PyTorch's fp16 hook does. The first
// round also gathers every rank's verdict and parameters (compress/agree.hpp), so ranks built differently
// are refused before any payload moves; later rounds carry a refusal in the payload itself: a rank whose
// input is bad contributes NaN, which reaches every value of every rank's sum, and every rank raises (this
// rank with its own precise error). A partial sum beyond the format's range raises on every rank the same
// way, or with half_overflow::clamp saturates. cost/compress.hpp charges both kinds of round.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/narrow_ring.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/compressed_reducer.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/round.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <type_traits>
#include <vector>

namespace commsgd::inline v1::compress {

namespace detail {

// v >> s (1 <= s <= 31) rounded to nearest, ties to even.
COMMSGD_HOST_DEVICE constexpr std::uint32_t shift_round_even(std::uint32_t v, unsigned s) noexcept {
  const std::uint32_t q = v >> s;
  const std::uint32_t rem = v & ((std::uint32_t{1} << s) - 1);
  const std::uint32_t half = std::uint32_t{1} << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

} // namespace detail

COMMSGD_HOST_DEVICE constexpr std::uint16_t float_to_fp16_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u); // >= 65520: inf (and inf)
  if (a >= 0x38800000u)                                                    // >= 2^-14: normal
    return static_cast<std::uint16_t>(sign | detail::shift_round_even(a - (112u << 23), 13));
  if (a <= 0x33000000u) return sign; // <= 2^-25: rounds to zero (2^-25 itself is a tie, to even 0)
  // A half subnormal: m 2^(e - 150) in units of 2^-24 is m >> (126 - e), and 126 - e is in [14, 24].
  const std::uint32_t e = a >> 23;
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
  return static_cast<std::uint16_t>(sign | detail::shift_round_even(m, 126u - e));
}

COMMSGD_HOST_DEVICE constexpr float fp16_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t m = h & 0x3ffu;
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  if (e != 0) return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return std::bit_cast<float>(sign);
  // Subnormal: m 2^-24, normalised into a float.
  const unsigned shift = static_cast<unsigned>(std::countl_zero(m)) - 21u; // brings bit 10 to the top
  return std::bit_cast<float>(sign | ((113u - shift) << 23) | (((m << shift) & 0x3ffu) << 13));
}

COMMSGD_HOST_DEVICE constexpr std::uint16_t float_to_bf16_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = x & 0x80000000u;
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>((sign | a) >> 16 | 0x40u); // quiet NaN
  // Rounding the magnitude carries into the exponent where it must, up to inf at the top.
  return static_cast<std::uint16_t>((sign >> 16) | detail::shift_round_even(a, 16));
}

COMMSGD_HOST_DEVICE constexpr float bf16_bits_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

struct fp16_format {
  static constexpr const char* name = "fp16";
  static constexpr float max_finite = 65504.0f;
  static constexpr std::uint16_t max_finite_bits = 0x7bffu;
  static constexpr std::uint16_t inf_bits = 0x7c00u;
  COMMSGD_HOST_DEVICE static constexpr std::uint16_t encode(float f) noexcept {
    return float_to_fp16_bits(f);
  }
  COMMSGD_HOST_DEVICE static constexpr float decode(std::uint16_t h) noexcept {
    return fp16_bits_to_float(h);
  }
};

struct bf16_format {
  static constexpr const char* name = "bf16";
  static constexpr float max_finite = 0x1.fep127f;
  static constexpr std::uint16_t max_finite_bits = 0x7f7fu;
  static constexpr std::uint16_t inf_bits = 0x7f80u;
  COMMSGD_HOST_DEVICE static constexpr std::uint16_t encode(float f) noexcept {
    return float_to_bf16_bits(f);
  }
  COMMSGD_HOST_DEVICE static constexpr float decode(std::uint16_t h) noexcept {
    return bf16_bits_to_float(h);
  }
};

static_assert(fp16_format::decode(fp16_format::max_finite_bits) == fp16_format::max_finite);
static_assert(bf16_format::decode(bf16_format::max_finite_bits) == bf16_format::max_finite);

enum class half_overflow : std::uint8_t {
  refuse, // commsgd::invalid_argument on every rank (the default: nothing is changed silently)
  clamp,  // send the largest finite value of the value's sign
};

struct half_options {
  bool error_feedback = false;
  half_overflow overflow = half_overflow::refuse;
  // The first round gathers every rank's sizes and parameters and refuses a mismatch. A host that knows the
  // ranks agree (DDP rebuilding a bucket the same way on every rank) may skip it, so that every round moves
  // exactly the ring's bytes.
  bool verify_first_round = true;
};

template <class Format>
class half_compressor : public detail::round_state {
public:
  static constexpr const char* name = Format::name;
  using format = Format;

  explicit half_compressor(std::size_t length, half_options o = {})
      : round_state(length, o.error_feedback), opt_(o), msg_(length), agreed_(!o.verify_first_round) {}

  const half_options& options() const noexcept { return opt_; }

  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    auto v = detail::take_input(g, out.size(), length_, ef_, p_);
    if (v.problem == detail::input_problem::none) v = encode();
    const bool first = !agreed_;
    if (first) {
      detail::agree(c, what(), length_, detail::fingerprint(config()), v, verdicts_, range());
      agreed_ = true;
    }
    // This rank's contribution: what its message decodes to, or NaN to make every rank refuse the round.
    sum_.resize(length_);
    if (v.problem == detail::input_problem::none)
      for (std::size_t i = 0; i < length_; ++i)
        sum_[i] = d_[i] = decode(msg_[i]);
    else
      std::fill(sum_.begin(), sum_.end(), std::numeric_limits<float>::quiet_NaN());
    comm::narrow_ring_sum<Format>(c, std::span<float>(sum_), opt_.overflow == half_overflow::clamp, ring_);
    if (v.problem != detail::input_problem::none) {
      const auto mine = detail::verdict_fields(length_, v, 0);
      detail::throw_verdict(what(), "this rank's", mine.data(), range());
    }
    if (const auto bad = detail::check_finite(sum_); bad.problem != detail::input_problem::none)
      throw non_finite(commsgd::detail::concat(what(),
                                               ": the 16-bit sum (another rank refused its input, or "
                                               "a partial sum left the range ",
                                               range(), "; overflow clamp saturates instead)"),
                       bad.count, bad.where);
    std::copy(sum_.begin(), sum_.end(), out.begin());
    wire_ = cost::half_traffic(length_, c.size(), c.rank(), first).sent;
    return detail::finish_round(ef_, p_, d_, steps_, static_cast<std::size_t>(c.size()), length_, true);
  }

  void save(std::ostream& os) const { detail::save_state(os, kind(), params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "overflow policy (0 refuse, 1 clamp)"};
    detail::load_state(is, kind(), params(), names, length_, steps_, ef_);
  }

private:
  static const char* what() noexcept { return Format::name[0] == 'f' ? "compress::fp16" : "compress::bf16"; }
  static const char* kind() noexcept { return what(); }
  static const char* range() noexcept {
    return Format::name[0] == 'f' ? "[-65504, 65504] (fp16)" : "[-3.3895314e38, 3.3895314e38] (bf16)";
  }
  std::array<std::uint64_t, 2> params() const noexcept {
    return {length_, static_cast<std::uint64_t>(opt_.overflow)};
  }
  std::array<std::uint64_t, 3> config() const noexcept {
    return {length_, static_cast<std::uint64_t>(opt_.overflow), ef_.on() ? 1u : 0u};
  }

  // fp16 decodes through a table of all 65536 values (built once from fp16_bits_to_float, so the same
  // bits), which spares the subnormal branch on every value n times a round; bf16 is a shift already.
  static float decode(std::uint16_t h) noexcept {
    if constexpr (std::is_same_v<Format, fp16_format>) {
      static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (std::uint32_t b = 0; b < 65536; ++b)
          t[b] = fp16_bits_to_float(static_cast<std::uint16_t>(b));
        return t;
      }();
      return table[h];
    } else {
      return Format::decode(h);
    }
  }

  // The message of p (finite), or the verdict on a value beyond the format's range; changes no state.
  detail::input_verdict encode() {
    for (std::size_t i = 0; i < length_; ++i) {
      std::uint16_t h = Format::encode(p_[i]);
      if ((h & 0x7fffu) == Format::inf_bits) {
        if (opt_.overflow == half_overflow::refuse)
          return {detail::input_problem::overflow, 1, i, static_cast<double>(p_[i])};
        h = static_cast<std::uint16_t>((h & 0x8000u) | Format::max_finite_bits);
      }
      msg_[i] = h;
    }
    return {};
  }

  half_options opt_;
  std::vector<std::uint16_t> msg_;
  std::vector<float> sum_;
  comm::narrow_ring_buffers ring_;
  bool agreed_ = false; // the first round's verdict (sizes and parameters alike on every rank) is behind us
};

using fp16 = half_compressor<fp16_format>;
using bf16 = half_compressor<bf16_format>;

} // namespace commsgd::inline v1::compress

namespace commsgd::inline v1::compress {
static_assert(compressor<fp16, comm::archetype>);
static_assert(compressor<bf16, comm::archetype>);
} // namespace commsgd::inline v1::compress
