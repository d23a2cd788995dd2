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
// in the residual, exactly (compress/error_feedback.hpp), when error feedback is on (the default); then p,
// the message and the new residual are made in one pass, a stretch of blocks at a time from cache
// (detail::encode_and_split): g and e read once, the codes and e' written once.
// Bytes a rank sends a round: the 40-byte verdict and its message to each of the n - 1 others.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/block_quant_x86.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/compress/difference.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/validate.hpp>

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

// The host's passes over a message, each a loop over a block held in cache. The inner loops run over a
// fixed group of values (a constant trip count, with no byte pointer in them that could alias the floats),
// which is what GCC's -O2 cost model needs to turn them into SIMD; a block's last values go one by one.
// Every pass gives the bits of the per-value formulas above (tests/unit/compress_block_quant_passes.cpp
// compares them with those formulas, kept there as they were).
inline constexpr std::size_t group = 16;

// The largest |p_i| of a block and how many of its values are NaN or inf. A NaN is passed over as
// std::max(s, NaN) passes over it; a block that holds one is refused anyway.
struct block_scan {
  float scale = 0.0f;
  std::size_t bad = 0;
};
// What the encode works in, kept from round to round: a stretch's 4-bit codes before they are packed, and a
// stretch formed from a difference with its blocks' scans (encode_blocks_from).
struct encode_scratch {
  std::vector<std::uint8_t> codes;
  std::vector<float> formed;
  std::vector<block_scan> scans;
};

// A scan's group lanes folded into r: the maximum of the same values in another order is the same float, as
// no NaN takes part.
inline void fold_groups(const float (&m)[group], const std::uint32_t (&bad)[group], block_scan& r) noexcept {
  for (std::size_t j = 0; j < group; ++j) {
    r.scale = r.scale < m[j] ? m[j] : r.scale;
    r.bad += bad[j];
  }
}

// With `vector`, the whole groups of 8 by the AVX2 kernel (block_quant_x86.hpp).
inline block_scan scan_block(const float* p, std::size_t count,
                             [[maybe_unused]] bool vector = false) noexcept {
  float m[group] = {};
  std::uint32_t bad[group] = {};
  std::size_t i = 0;
  block_scan r;
#if COMMSGD_HALF_X86
  if (vector) i = scan_avx2(p, count, r.scale, r.bad);
#endif
  for (; i + group <= count; i += group)
    for (std::size_t j = 0; j < group; ++j) {
      const float a = std::fabs(p[i + j]);
      m[j] = m[j] < a ? a : m[j];
      bad[j] += a <= std::numeric_limits<float>::max() ? 0u : 1u;
    }
  for (; i < count; ++i) {
    const float a = std::fabs(p[i]);
    r.scale = r.scale < a ? a : r.scale;
    r.bad += a <= std::numeric_limits<float>::max() ? 0u : 1u;
  }
  fold_groups(m, bad, r);
  return r;
}

// scan_block of the values a[i] - b[i] (math::delta's bits), each also written to out[i]: p formed and
// scanned in one pass (the pass that reads the two models from memory) instead of formed, then read again.
inline block_scan form_scan_block(const float* __restrict a, const float* __restrict b, float* __restrict out,
                                  std::size_t count, [[maybe_unused]] bool vector = false) noexcept {
  float m[group] = {};
  std::uint32_t bad[group] = {};
  std::size_t i = 0;
  block_scan r;
#if COMMSGD_HALF_X86
  if (vector) i = form_scan_avx2(a, b, out, count, r.scale, r.bad);
#endif
  for (; i + group <= count; i += group)
    for (std::size_t j = 0; j < group; ++j) {
      const float v = commsgd::detail::sub_rn(a[i + j], b[i + j]);
      out[i + j] = v;
      const float x = std::fabs(v);
      m[j] = m[j] < x ? x : m[j];
      bad[j] += x <= std::numeric_limits<float>::max() ? 0u : 1u;
    }
  for (; i < count; ++i) {
    const float v = commsgd::detail::sub_rn(a[i], b[i]);
    out[i] = v;
    const float x = std::fabs(v);
    r.scale = r.scale < x ? x : r.scale;
    r.bad += x <= std::numeric_limits<float>::max() ? 0u : 1u;
  }
  fold_groups(m, bad, r);
  return r;
}

// int8 codes of a block of scale s > 0, one byte each. 127 p / s is formed in float, p times 127 / s, within
// 2^-16 of the exact quotient (two roundings of at most 2^-24, times at most 127), and rounded to the nearest
// integer, ties to even, by adding and taking away 1.5 2^23. That integer is the exact quotient's nearest,
// as int8_code::encode finds it in double, unless the float quotient lies within 2^-14 of a half: those few
// values (ties among them) are coded again by int8_code::encode. A tiny s, whose 127 / s is near overflow,
// takes int8_code::encode throughout.
// With `vector`, the whole groups of 32 by the AVX2 kernel (block_quant_x86.hpp), the same shortcut.
inline void int8_codes(const float* p, std::size_t count, float s, std::uint8_t* out,
                       [[maybe_unused]] bool vector = false) noexcept {
  if (!(s >= 0x1p-100f)) {
    for (std::size_t i = 0; i < count; ++i)
      out[i] = static_cast<std::uint8_t>(int8_code::encode(p[i], s));
    return;
  }
  const float inv = 127.0f / s, shift = 0x1.8p23f, near_half = 0.5f - 0x1p-14f;
  std::uint32_t near[group] = {};
  std::size_t i = 0;
#if COMMSGD_HALF_X86
  if (vector) i = int8_codes_avx2(p, count, inv, out, [s](float v) { return int8_code::encode(v, s); });
#endif
  for (; i + group <= count; i += group) {
    std::uint8_t c[group];
    for (std::size_t j = 0; j < group; ++j) {
      const float y = p[i + j] * inv;
      const float r = (y + shift) - shift;
      near[j] |= std::fabs(y - r) > near_half ? 1u : 0u;
      c[j] = static_cast<std::uint8_t>(static_cast<std::int32_t>(r) + 127);
    }
    std::memcpy(out + i, c, group);
  }
  std::uint32_t any = 0;
  for (std::size_t j = 0; j < group; ++j)
    any |= near[j];
  for (; i < count; ++i) {
    const float y = p[i] * inv;
    const float r = (y + shift) - shift;
    any |= std::fabs(y - r) > near_half ? 1u : 0u;
    out[i] = static_cast<std::uint8_t>(static_cast<std::int32_t>(r) + 127);
  }
  if (any == 0) return;
  for (i = 0; i < count; ++i) {
    const float y = p[i] * inv;
    if (std::fabs(y - ((y + shift) - shift)) > near_half)
      out[i] = static_cast<std::uint8_t>(int8_code::encode(p[i], s));
  }
}

// The largest float <= t and the smallest float >= t, for t >= 0 exact in double (a step of one in the bits
// of a float >= 0 is a step to its neighbour; no library call, as these run once a block).
inline float float_below(double t) noexcept {
  const float f = static_cast<float>(t);
  return static_cast<double>(f) > t ? std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) - 1u) : f;
}
inline float float_above(double t) noexcept {
  const float f = static_cast<float>(t);
  return static_cast<double>(f) < t ? std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) + 1u) : f;
}

// e3m0 codes of a block of scale s > 0, one a byte. e3m0_code::encode compares x = |p| / s, rounded in
// double, with 2^-7 and 1.5 2^i; the quotient lies too far from those thresholds for its rounding to cross
// one, so each comparison is |p| against the exact product t s, and a float |p| exceeds a real t s exactly
// when it exceeds the largest float <= t s (and is below it exactly when below the smallest float >= t s).
// So the per-value work is seven comparisons against thresholds made once per block.
// With `vector`, the whole groups of 32 by the AVX2 kernel (block_quant_x86.hpp), the same comparisons.
inline void e3m0_codes(const float* p, std::size_t count, float s, std::uint8_t* out,
                       [[maybe_unused]] bool vector = false) noexcept {
  // t s exactly in double: s times a power of two and 1.5 stays within double's range and precision.
  const double sd = static_cast<double>(s), h = 1.5 * sd;
  const float zero_below = float_above(sd * 0x1p-7);
  const float t0 = float_below(h * 0x1p-6), t1 = float_below(h * 0x1p-5), t2 = float_below(h * 0x1p-4),
              t3 = float_below(h * 0x1p-3), t4 = float_below(h * 0x1p-2), t5 = float_below(h * 0x1p-1);
  // Compared as the bits of |v| and of the thresholds, signed 32-bit integers that order as the floats do
  // (v is finite); each comparison's mask, -1 or 0, taken away; the codes narrowed to bytes in a loop of their
  // own: the form GCC vectorises best. No branch: the block is finite, so no NaN makes a < z and !(a >= z)
  // differ.
  const auto bits_of = [](float f) { return std::bit_cast<std::int32_t>(f); };
  const std::int32_t z = bits_of(zero_below), b0 = bits_of(t0), b1 = bits_of(t1), b2 = bits_of(t2),
                     b3 = bits_of(t3), b4 = bits_of(t4), b5 = bits_of(t5);
  const auto code = [=](float v) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
    const auto a = static_cast<std::int32_t>(bits & 0x7fffffffu);
    std::int32_t k = 1 - -static_cast<std::int32_t>(a > b0) - -static_cast<std::int32_t>(a > b1) -
                     -static_cast<std::int32_t>(a > b2) - -static_cast<std::int32_t>(a > b3) -
                     -static_cast<std::int32_t>(a > b4) - -static_cast<std::int32_t>(a > b5);
    k &= -static_cast<std::int32_t>(a >= z);
    return ((bits >> 28) & 8u) | static_cast<std::uint32_t>(k);
  };
  std::size_t i = 0;
#if COMMSGD_HALF_X86
  if (vector) i = e3m0_codes_avx2(p, count, {b0, b1, b2, b3, b4, b5, z}, out);
#endif
  for (; i + group <= count; i += group) {
    std::uint32_t wide[group];
    for (std::size_t j = 0; j < group; ++j)
      wide[j] = code(p[i + j]);
    std::uint8_t c[group];
    for (std::size_t j = 0; j < group; ++j)
      c[j] = static_cast<std::uint8_t>(wide[j]);
    std::memcpy(out + i, c, group);
  }
  for (; i < count; ++i)
    out[i] = static_cast<std::uint8_t>(code(p[i]));
}

// The codes of a block of scale s (a block of zeros, s = 0, codes every value as block_code does).
template <class Code>
void block_codes(const float* p, std::size_t count, float s, std::uint8_t* out,
                 bool vector = false) noexcept {
  if (s == 0.0f) {
    for (std::size_t i = 0; i < count; ++i)
      out[i] = static_cast<std::uint8_t>(block_code<Code>(p[i], s));
  } else if constexpr (Code::bits == 8) {
    int8_codes(p, count, s, out, vector);
  } else {
    e3m0_codes(p, count, s, out, vector);
  }
}

// Blocks are coded a stretch of whole blocks at a time, about 4,096 values: int8 codes are the message's
// bytes, written in place; 4-bit codes go into a buffer, then are packed. A stretch starts at an even value
// (an odd block size takes its blocks in pairs), so its codes pack into whole bytes of their own.
inline std::size_t stretch_blocks(std::size_t b) noexcept {
  constexpr std::size_t values = 4096;
  if (b >= values) return b % 2 == 0 ? 1 : 2;
  return std::max<std::size_t>(2, values / b) & ~std::size_t{1};
}

// Blocks [k0, k1) of the message of d values p (see encode_blocks): their scales and codes, each block's
// scale and finiteness taken first and its codes while it is in cache. `here` points at p's value k0 b (the
// stretch's first). `c` holds the 4-bit codes of the stretch before they are packed. Returns how many of the
// stretch's values are NaN or inf (blocks that hold one are not coded). `path` scalar keeps to the portable
// loops (tests compare both). `scanned`, where the caller has them: the blocks' scans, scan_block's answers
// (made as the stretch was formed, form_scan_block), so the stretch is not scanned again.
template <class Code>
std::size_t encode_stretch(const float* here, std::size_t d, std::size_t b, std::size_t k0, std::size_t k1,
                           std::vector<float>& scales, std::span<std::byte> msg, std::vector<std::uint8_t>& c,
                           half_path path = half_path::best, const block_scan* scanned = nullptr) {
  static_assert(Code::bits == 8 || Code::bits == 4);
  const bool vector = block_vector_path(path);
  const std::size_t blocks = (d + b - 1) / b;
  std::byte* const codes = msg.data() + 4 * blocks;
  const std::size_t first = k0 * b, last = std::min(d, k1 * b);
  if (Code::bits != 8 && c.size() < last - first) c.resize(last - first);
  std::size_t bad = 0;
  for (std::size_t k = k0; k < k1; ++k) {
    const std::size_t at = k * b, count = std::min(d, at + b) - at;
    std::uint8_t* const to =
        Code::bits == 8 ? reinterpret_cast<std::uint8_t*>(codes) + at : c.data() + (at - first);
    const auto scan = scanned ? scanned[k - k0] : scan_block(here + (at - first), count, vector);
    scales[k] = scan.scale;
    std::memcpy(msg.data() + 4 * k, &scan.scale, 4);
    bad += scan.bad;
    if (scan.bad == 0)
      block_codes<Code>(here + (at - first), count, scan.scale, to, vector);
    else
      std::fill_n(to, count, std::uint8_t{0});
  }
  const std::size_t m = last - first;
  if constexpr (Code::bits == 4) {
    std::byte* const o = codes + first / 2;
    std::size_t j = 0;
    for (; j + 2 * group <= m; j += 2 * group) {
      std::uint8_t two[2 * group], packed[group];
      std::memcpy(two, c.data() + j, 2 * group);
      for (std::size_t q = 0; q < group; ++q)
        packed[q] = static_cast<std::uint8_t>(two[2 * q] | (two[2 * q + 1] << 4));
      std::memcpy(o + j / 2, packed, group);
    }
    for (; j + 1 < m; j += 2)
      o[j / 2] = static_cast<std::byte>(c[j] | (c[j + 1] << 4));
    if (m % 2) o[m / 2] = static_cast<std::byte>(c[m - 1]);
  }
  return bad;
}

inline select::non_finite_scan first_non_finite(std::span<const float> p, std::size_t bad) noexcept {
  if (bad == 0) return {0, p.size()};
  std::size_t at = 0;
  while (std::fabs(p[at]) <= std::numeric_limits<float>::max())
    ++at;
  return {bad, at};
}

// The message of p's values, a scale per block of b values (the last block may be shorter): the scales (4
// bytes each), then the codes packed (compress/bit_pack.hpp's layout); `scales` receives the scales. The
// message is cost::block_quant_message_bytes(p.size(), b, Code::bits) bytes. One pass over p, a stretch of
// blocks at a time. Returns the NaN and infinities of p, as select::find_non_finite counts them; where there
// is any, the message is not to be sent (its blocks that hold one are not coded).
//
// encode_blocks_from takes p a stretch at a time: in(first, m) returns p's values [first, first + m) (formed
// then, or read where they lie), called for adjacent stretches in rising order; an input that gives them as
// a difference (compress/difference.hpp) has each stretch formed into s.formed and scanned in one pass.
// s.codes holds 4-bit codes before they are packed.
template <class Code, class In>
select::non_finite_scan encode_blocks_from(std::size_t d, std::size_t b, std::vector<float>& scales,
                                           std::span<std::byte> msg, encode_scratch& s, In&& in,
                                           half_path path = half_path::best) {
  const std::size_t blocks = (d + b - 1) / b, per = stretch_blocks(b);
  const bool vector = block_vector_path(path);
  scales.resize(blocks);
  std::size_t bad = 0, bad_at = d;
  for (std::size_t k0 = 0; k0 < blocks; k0 += per) {
    const std::size_t k1 = std::min(blocks, k0 + per), first = k0 * b, m = std::min(d, k1 * b) - first;
    const difference q = stretch_of(in, first, m);
    std::span<const float> p = q.a;
    const block_scan* scanned = nullptr;
    if (q.b) {
      if (s.formed.size() < m) s.formed.resize(m);
      if (s.scans.size() < k1 - k0) s.scans.resize(k1 - k0);
      for (std::size_t k = k0; k < k1; ++k) {
        const std::size_t at = k * b - first, count = std::min(m, at + b) - at;
        s.scans[k - k0] = form_scan_block(q.a.data() + at, q.b + at, s.formed.data() + at, count, vector);
      }
      p = std::span<const float>(s.formed.data(), m);
      scanned = s.scans.data();
    }
    const std::size_t here =
        encode_stretch<Code>(p.data(), d, b, k0, k1, scales, msg, s.codes, path, scanned);
    if (here != 0 && bad == 0) bad_at = first + first_non_finite(p, here).first;
    bad += here;
  }
  return {bad, bad == 0 ? d : bad_at};
}
template <class Code>
select::non_finite_scan encode_blocks(std::span<const float> p, std::size_t b, std::vector<float>& scales,
                                      std::span<std::byte> msg, half_path path = half_path::best) {
  encode_scratch s;
  return encode_blocks_from<Code>(
      p.size(), b, scales, msg, s, [&](std::size_t first, std::size_t m) { return p.subspan(first, m); },
      path);
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

// The e3m0 value of code c (its low 4 bits) in a block of scale s, branch-free, as e3m0_code::decode makes
// it for every s: s times a power of two built from the exponent's bits, rounded once (only where it falls
// below the normal floats) as ldexp rounds it, negated (its sign bit flipped, as for a scale below zero,
// which only a foreign message carries) where the code's sign bit is set.
inline float e3m0_value(std::uint32_t c, float s) noexcept {
  const std::uint32_t k = c & 7u, sign = (c & 8u) << 28;
  const float mag = s * std::bit_cast<float>((k + 120u) << 23);
  const std::uint32_t keep = 0u - static_cast<std::uint32_t>(k != 0);
  return std::bit_cast<float>((std::bit_cast<std::uint32_t>(mag) & keep) ^ sign);
}

// Puts the values x of one block of scale s whose codes start at byte `codes` (int8: one a byte; e3m0: two a
// byte, the block starting at a byte's low half).
//   int8  x = code s / 127 in double, rounded to float. The exact quotient is never a float's midpoint and
//         lies at least 2^-40 of itself away from every one (c s and 127 m are multiples of one grid), so
//         rounding it to double first moves no float rounding, and neither does c times s / 127 rounded to
//         double (within 2^-52): x is c times s / 127 in double, rounded to float, a multiply a value.
//   e3m0  +-2^(k-7) s: e3m0_value.
// With `vector` (block_vector_path), the whole groups go through the AVX2 kernels (block_quant_x86.hpp).
template <class Code, put_mode Mode>
void decode_block(const std::byte* codes, std::size_t count, float s, float* out,
                  [[maybe_unused]] bool vector) noexcept {
  const auto put = [](float& o, float x) {
    if constexpr (Mode == put_mode::assign)
      o = x;
    else if constexpr (Mode == put_mode::first)
      o = 0.0f + x;
    else
      o = o + x;
  };
  std::size_t i = 0;
  if constexpr (Code::bits == 8) {
    const double v = static_cast<double>(s) / 127.0;
#if COMMSGD_HALF_X86
    if (vector)
      i = cpu().fma && int8_split_fits(s) ? int8_put_split_avx2<Mode>(codes, count, s, out)
                                          : int8_put_avx2<Mode>(codes, count, v, out);
#endif
    for (; i + group <= count; i += group) {
      std::uint8_t c[group];
      std::memcpy(c, codes + i, group);
      for (std::size_t j = 0; j < group; ++j)
        put(out[i + j], static_cast<float>(static_cast<double>(static_cast<std::int32_t>(c[j]) - 127) * v));
    }
    for (; i < count; ++i)
      put(out[i],
          static_cast<float>(
              static_cast<double>(static_cast<std::int32_t>(std::to_integer<std::uint8_t>(codes[i])) - 127) *
              v));
  } else {
    const auto code_at = [&](std::size_t j) {
      return (std::to_integer<std::uint32_t>(codes[j / 2]) >> (4 * (j % 2))) & 15u;
    };
    const auto value = [s](std::uint32_t c) { return e3m0_value(c, s); };
#if COMMSGD_HALF_X86
    if (vector && count >= 32) {
      float mag[8];
      for (std::uint32_t k = 0; k < 8; ++k)
        mag[k] = value(k);
      i = e3m0_put_avx2<Mode>(codes, count, mag, out);
    }
#endif
    // A byte's two values side by side: GCC vectorises the low and the high halves and interleaves them.
    for (; i + 2 * group <= count; i += 2 * group) {
      std::uint8_t c[group];
      std::memcpy(c, codes + i / 2, group);
      for (std::size_t j = 0; j < group; ++j) {
        put(out[i + 2 * j], value(c[j] & 15u));
        put(out[i + 2 * j + 1], value(c[j] >> 4));
      }
    }
    for (; i < count; ++i)
      put(out[i], value(code_at(i)));
  }
}

// The sums of blocks [k0, k1) of the n messages at all[r * bytes ...], each value summed in rank order from
// +0 (0.0f + x_0, then + x_1, ...), written to at[0 ...] (at[0] the sum at value k0 b): a block of every
// message at a time, so each block of the sum is written from cache. The messages code d values in blocks of
// b. With Count, returns how many of the sums are NaN or inf, counted from cache as each block is written.
// `path` scalar keeps to the portable loops (tests compare both).
template <class Code, bool Count>
std::size_t sum_stretch(std::span<const std::byte> all, std::size_t bytes, std::size_t n, std::size_t d,
                        std::size_t b, std::size_t k0, std::size_t k1, float* at,
                        half_path path = half_path::best) {
  const std::size_t blocks = (d + b - 1) / b;
  const bool vector = block_vector_path(path);
  const std::size_t lo = std::min(d, k0 * b), hi = std::min(d, k1 * b);
  if (Code::bits == 4 && b % 2 != 0) {
    // Blocks that start inside a byte: value by value.
    for (std::size_t r = 0; r < n; ++r)
      decode_blocks<Code>(all.subspan(r * bytes, bytes), d, b, k0, k1, [&](std::size_t i, float x) {
        float& o = at[i - lo];
        o = r == 0 ? 0.0f + x : o + x;
      });
    return Count ? select::count_non_finite(std::span<const float>(at, hi - lo)) : 0;
  }
  std::size_t bad = 0;
  for (std::size_t k = k0; k < k1; ++k) {
    const std::size_t first = k * b, count = std::min(d, first + b) - first;
    float* const o = at + (first - lo);
    for (std::size_t r = 0; r < n; ++r) {
      const std::byte* m = all.data() + r * bytes;
      float s;
      std::memcpy(&s, m + 4 * k, 4);
      const std::byte* codes = m + 4 * blocks + first * Code::bits / 8;
      if (r == 0)
        decode_block<Code, put_mode::first>(codes, count, s, o, vector);
      else
        decode_block<Code, put_mode::add>(codes, count, s, o, vector);
    }
    if constexpr (Count) bad += select::count_non_finite(std::span<const float>(o, count));
  }
  return bad;
}

// out <- the sum of the n messages over blocks [k0, k1) (sum_stretch), out indexed from the first value.
// Returns the NaN and infinities of out over those blocks (a sum of finite values can overflow), as
// select::find_non_finite counts them, the first index counted from out's start.
template <class Code>
select::non_finite_scan sum_blocks(std::span<const std::byte> all, std::size_t bytes, std::size_t n,
                                   std::size_t d, std::size_t b, std::size_t k0, std::size_t k1,
                                   std::span<float> out, half_path path = half_path::best) {
  const std::size_t lo = std::min(d, k0 * b), hi = std::min(d, k1 * b);
  const std::size_t bad = sum_stretch<Code, true>(all, bytes, n, d, b, k0, k1, out.data() + lo, path);
  if (bad == 0) return {0, hi};
  return {bad, lo + select::find_non_finite(std::span<const float>(out).subspan(lo, hi - lo)).first};
}

// Whether every sum of the n messages is surely finite, known from their scales alone (a value decodes to at
// most its block's |scale|: int8 |c| s / 127 with |c| <= 127, e3m0 s 2^(k - 7) with k <= 7). False says only
// that the sums must be tested.
inline bool sums_bounded(std::span<const std::byte> all, std::size_t bytes, std::size_t n,
                         std::size_t blocks) {
  sum_bound bound;
  for (std::size_t r = 0; r < n; ++r)
    bound.add(all.data() + r * bytes, blocks);
  return bound.holds(n);
}

// out <- what message m decodes to (d values in blocks of b), bit for bit as decode_blocks.
template <class Code>
void decode_message(std::span<const std::byte> m, std::size_t d, std::size_t b, std::span<float> out,
                    half_path path = half_path::best) {
  if (Code::bits == 4 && b % 2 != 0) {
    decode_blocks<Code>(m, d, b, 0, (d + b - 1) / b, [&](std::size_t i, float x) { out[i] = x; });
    return;
  }
  const std::size_t blocks = (d + b - 1) / b;
  for (std::size_t k = 0; k < blocks; ++k) {
    const std::size_t first = k * b, count = std::min(d, first + b) - first;
    float s;
    std::memcpy(&s, m.data() + 4 * k, 4);
    decode_block<Code, put_mode::assign>(m.data() + 4 * blocks + first * Code::bits / 8, count, s,
                                         out.data() + first, block_vector_path(path));
  }
}

// What encode_and_split works in, kept from round to round: encode_scratch, and the split's buffers
// (error_feedback.hpp).
struct split_scratch : residual_split, encode_scratch {};

// With error feedback, the round's own passes in one, a stretch of blocks at a time from cache: p = g + e
// (+ r where it holds something: error_feedback::accumulate_part), the stretch's scales and codes
// (encode_stretch), this rank's decode of them (decode_message's arithmetic) and the new residual p - decode
// split exactly (split_difference). p's buffer ends holding the new residual's leading part e', and
// s.low_at / s.low_val its nonzero low words, for error_feedback::commit_split once the round has succeeded.
// The bits of accumulate, encode_blocks, decode_message and commit in turn. Returns the NaN and infinities
// of p as encode_blocks does (then p holds e' before the first stretch that has one, and is not to be
// committed).
//
// g, p and the message may be one part of a longer input, starting at value `offset` of the residual: parts
// taken in rising order share one `cursor` (0 at the first part) and append their low words to s, which the
// caller empties (s.clear_low()) when the round starts.
//
// The input g of d values may also come a stretch at a time, from in(first, m) as encode_blocks_from takes it.
template <class Code, class In>
select::non_finite_scan encode_and_split(std::size_t d, In&& in, const error_feedback& ef, std::size_t offset,
                                         std::size_t& cursor, std::size_t b, std::vector<float>& scales,
                                         std::span<std::byte> msg, std::span<float> p, split_scratch& s) {
  const std::size_t blocks = (d + b - 1) / b, per = stretch_blocks(b);
  const std::byte* const codes = msg.data() + 4 * blocks;
  const bool vector = block_vector_path(half_path::best);
  scales.resize(blocks);
  std::size_t bad = 0, bad_from = 0;
  for (std::size_t k0 = 0; k0 < blocks; k0 += per) {
    const std::size_t k1 = std::min(blocks, k0 + per), first = k0 * b, m = std::min(d, k1 * b) - first;
    ef.accumulate_part(stretch_of(in, first, m), p.subspan(first, m), offset + first, cursor);
    const std::size_t here = encode_stretch<Code>(p.data() + first, d, b, k0, k1, scales, msg, s.codes);
    if (here != 0 && bad == 0) bad_from = first;
    bad += here;
    if (bad != 0) continue; // the round is refused: nothing to split, only the bad values to count
    float* const dec = s.stretch(m);
    if (Code::bits == 4 && b % 2 != 0) {
      decode_blocks<Code>(msg, d, b, k0, k1, [&](std::size_t i, float x) { dec[i - first] = x; });
    } else {
      for (std::size_t k = k0; k < k1; ++k) {
        const std::size_t at = k * b;
        decode_block<Code, put_mode::assign>(codes + at * Code::bits / 8, std::min(d, at + b) - at, scales[k],
                                             dec + (at - first), vector);
      }
    }
    s.split(p.data() + first, m, offset + first);
  }
  if (bad == 0) return {0, d};
  const auto rest = first_non_finite(std::span<const float>(p).subspan(bad_from), bad);
  return {bad, bad_from + rest.first};
}
template <class Code>
select::non_finite_scan encode_and_split(std::span<const float> g, const error_feedback& ef,
                                         std::size_t offset, std::size_t& cursor, std::size_t b,
                                         std::vector<float>& scales, std::span<std::byte> msg,
                                         std::span<float> p, split_scratch& s) {
  return encode_and_split<Code>(
      g.size(), [&](std::size_t first, std::size_t m) { return g.subspan(first, m); }, ef, offset, cursor, b,
      scales, msg, p, s);
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
    verdict_ = detail::check_sizes(g.size(), out.size(), length_);
    if (verdict_.problem == detail::input_problem::none) code(read_from(g));
    return round(c, [&] { sum_scan_ = sum_to(out); });
  }

  // reduce() in two halves, its sum not written (compress::summed_in_parts). code(in) codes this rank's
  // input of length() values, which in(first, m) gives a stretch at a time (a span of the values [first,
  // first + m), formed then or read where they lie; called for adjacent stretches in rising order), and keeps
  // the verdict; no communication, so a caller may take the input from memory that changes once code()
  // returns. reduce_coded(c) is the collective rest; for_each_sum_part() then reads the sum a part at a time
  // (until the next round), for a caller that uses each part once while it is in cache (sync::diloco).
  template <class In>
  void code(In&& in) {
    // The pass that codes is the finiteness test. Without error feedback p is the input itself; with it, p,
    // the message and the new residual are made in one pass (detail::encode_and_split), the residual
    // committed only once the round has succeeded.
    std::size_t cursor = 0;
    split_.clear_low();
    const auto bad =
        ef_.on() ? detail::encode_and_split<Code>(length_, in, ef_, 0, cursor, opt_.block_size, scales_, msg_,
                                                  p_, split_)
                 : detail::encode_blocks_from<Code>(length_, opt_.block_size, scales_, msg_, split_, in);
    verdict_ = {};
    if (bad.count > 0) verdict_ = {detail::input_problem::non_finite, bad.count, bad.first, 0};
  }
  template <comm::communicator C>
  comm::exchange_report reduce_coded(C& c) {
    return round(c, [&] {
      bounded_ = detail::sums_bounded(all_, msg_.size(), ranks_, blocks());
      sum_scan_ = {0, length_};
    });
  }
  // After reduce_coded: whether every value of the sum is surely finite (sums_bounded). False only near
  // the largest float: a caller that must refuse a sum with NaN or inf then writes it whole and tests it.
  bool sum_surely_finite() const noexcept { return bounded_; }
  // After reduce_coded: calls f(first, part) for parts of the sum that cover [0, length()) in rising
  // order, part[j] the sum at first + j (reduce()'s bits), each made in `scratch` from the gathered messages.
  // Parts of whole blocks, about part_values values: the part and what the caller reads beside it stay in
  // the core's cache.
  static constexpr std::size_t part_values = 8192;
  template <class F>
  void for_each_sum_part(std::vector<float>& scratch, F&& f) const {
    const std::size_t b = opt_.block_size, blocks = this->blocks(),
                      per = std::max<std::size_t>(1, part_values / b);
    for (std::size_t k0 = 0; k0 < blocks; k0 += per) {
      const std::size_t k1 = std::min(blocks, k0 + per), lo = k0 * b, hi = std::min(length_, k1 * b);
      scratch.resize(std::max(scratch.size(), hi - lo));
      detail::sum_stretch<Code, false>(all_, msg_.size(), ranks_, length_, b, k0, k1, scratch.data());
      f(lo, std::span<const float>(scratch.data(), hi - lo));
    }
  }

  // The NaN and infinities of the sum the last successful reduce wrote into out (a sum of finite values can
  // overflow), counted as it was written: a caller that must refuse such a sum need not read it again.
  select::non_finite_scan sum_non_finite() const noexcept { return sum_scan_; }

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

  static auto read_from(std::span<const float> g) {
    return [g](std::size_t first, std::size_t m) { return g.subspan(first, m); };
  }

  // The round once coded: the verdicts agreed on, every rank's message gathered, `sum` run on them, the
  // residual committed.
  template <comm::communicator C, class Sum>
  comm::exchange_report round(C& c, Sum&& sum) {
    detail::agree(c, what(), length_, config(), verdict_, verdicts_);
    ranks_ = static_cast<std::size_t>(c.size());
    all_.resize(ranks_ * msg_.size());
    c.all_gather(std::span<const std::byte>(msg_), std::span<std::byte>(all_));
    sum();
    wire_ = (cost::compress_header_traffic(c.size()) + comm::all_gather_traffic(msg_.size(), c.size()))
                .bytes_sent;
    return detail::finish_split_round(ef_, p_, split_, steps_, ranks_, length_, false);
  }

  // Every rank's gathered message summed in rank order from +0, as compress/compressor_round.hpp's
  // gather_and_sum, but a block at a time across the ranks, so that each block of `out` is written once from
  // cache rather than read and written again for every rank.
  select::non_finite_scan sum_to(std::span<float> out) const {
    return detail::sum_blocks<Code>(all_, msg_.size(), ranks_, length_, opt_.block_size, 0, blocks(), out);
  }

  block_quant_options opt_;
  std::vector<float> scales_;
  std::vector<std::byte> msg_, all_;
  detail::split_scratch split_;
  select::non_finite_scan sum_scan_;
  detail::input_verdict verdict_; // code()'s
  std::size_t ranks_ = 0;         // of the last round
  bool bounded_ = false;          // reduce_coded: the gathered sums are surely finite
};

using int8 = block_quantizer<int8_code>;
using e3m0 = block_quantizer<e3m0_code>;

static_assert(compressor<int8, comm::archetype>);
static_assert(summed_in_parts<int8, comm::archetype>);
static_assert(compressor<e3m0, comm::archetype>);
static_assert(summed_in_parts<e3m0, comm::archetype>);

} // namespace commsgd::inline v1::compress
