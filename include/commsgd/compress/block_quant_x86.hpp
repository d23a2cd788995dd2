// The int8 and e3m0 passes 8 values an instruction where the CPU has AVX2 (checked once, at run time, with
// the 16-bit conversions' switch: compress::half_vector_path, COMMSGD_FORCE_SCALAR_HALF). The baseline
// x86-64 build's loops in block_quant.hpp take two doubles or four floats an instruction, and GCC's own AVX2
// code for them (target attributes) was slower for int8; these are what a DiLoCo round's code and decode
// are bound by, not memory (issue 60). Same bits as the portable loops: the same IEEE operations on the same
// operands (no contraction: the library builds with -ffp-contract=off), or for int8's split decode other
// operations proved to round the same way and tested against them.
//   scan    a block's largest |p_i| (NaN passed over) and its count of NaN and inf.
//   int8    codes: p times 127 / s, rounded by adding and taking away 1.5 2^23, the quotients near a half
//           flagged for the exact path; decode: (c - 127) times v = s / 127 in double, rounded to float, or
//           (where the CPU has FMA and 2^-60 <= |s| <= 2^120) the same product from v split into two floats.
//   e3m0    codes: |p|'s bits against the block's seven thresholds; decode: mag[k], its sign flipped by the
//           code's sign bit, mag[k] the block's eight values made once by the portable formula (one permute
//           a group of 8 for eight multiplies and the shuffles that interleave a byte's two codes).
// Each kernel does the whole groups of its count (8 or 32 values) and returns how many it did; the caller's
// portable loop does the rest.
#pragma once

#include <commsgd/compress/half_convert.hpp>
#include <commsgd/prefetch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace commsgd::inline v1::compress::detail {

// How a decoded value x lands in out[i]: out[i] = x, out[i] = 0.0f + x (the first term of a sum from +0,
// +0 for a zero) or out[i] += x.
enum class put_mode { assign, first, add };

// Whether the block decoders take the AVX2 kernels below: `path` is best and the CPU has them.
inline bool block_vector_path(half_path path) noexcept {
  return take_vector(path);
}

#if COMMSGD_HALF_X86
#define COMMSGD_BLOCK_TARGET __attribute__((target("avx2")))

template <put_mode Mode>
COMMSGD_BLOCK_TARGET inline void put8(float* o, __m256 x) noexcept {
  if constexpr (Mode == put_mode::assign)
    _mm256_storeu_ps(o, x);
  else if constexpr (Mode == put_mode::first)
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_setzero_ps(), x));
  else
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), x));
}

template <put_mode Mode>
COMMSGD_BLOCK_TARGET inline std::size_t int8_put_avx2(const std::byte* codes, std::size_t count, double v,
                                                      float* out) noexcept {
  const __m256d vv = _mm256_set1_pd(v);
  const __m256i bias = _mm256_set1_epi32(127);
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
    const __m256i c = _mm256_sub_epi32(_mm256_cvtepu8_epi32(c8), bias);
    const __m256d lo = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(c)), vv);
    const __m256d hi = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(c, 1)), vv);
    put8<Mode>(out + i, _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo)));
  }
  return i;
}

// int8's decode without doubles, for a block whose scale allows it (int8_split_fits): the same bits as
// int8_put_avx2. v = s / 127 in double is split into floats h + l (h = v rounded, l = v - h rounded), both
// taken positive and the sign of s put back at the end (so a zero code keeps the double path's -0). With
// k = c - 127 (exact in float): hi = k h rounded, e = k h - hi (exact, one FMA), t = k l + e (one rounding),
// x = hi + t (one rounding). hi + t is within 2^-46 of itself of k v, and k v lies at least 2^-40 of itself
// from every float midpoint (decode_block), so x rounds as k v does. One conversion and five FMA-port
// operations a group of 8 where the double path spends six conversions and shuffles on one port; the
// decode-and-sum of the gathered messages is bound by those, not memory.
inline bool int8_split_fits(float s) noexcept {
  // No step underflows or overflows, and l keeps its bits under flush-to-zero, in this range.
  const float a = std::fabs(s);
  return a >= 0x1p-60f && a <= 0x1p120f;
}

#define COMMSGD_BLOCK_FMA_TARGET __attribute__((target("avx2,fma")))
template <put_mode Mode>
COMMSGD_BLOCK_FMA_TARGET inline std::size_t int8_put_split_avx2(const std::byte* codes, std::size_t count,
                                                                float s, float* out) noexcept {
  const double v = static_cast<double>(std::fabs(s)) / 127.0;
  const float h = static_cast<float>(v), l = static_cast<float>(v - static_cast<double>(h));
  const __m256 vh = _mm256_set1_ps(h), vl = _mm256_set1_ps(l);
  const __m256 sign =
      _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(std::bit_cast<std::uint32_t>(s) & 0x80000000u)));
  const __m256i bias = _mm256_set1_epi32(127);
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
    const __m256 k = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(c8), bias));
    const __m256 hi = _mm256_mul_ps(k, vh);
    const __m256 t = _mm256_fmadd_ps(k, vl, _mm256_fmsub_ps(k, vh, hi));
    put8<Mode>(out + i, _mm256_xor_ps(_mm256_add_ps(hi, t), sign));
  }
  return i;
}
#undef COMMSGD_BLOCK_FMA_TARGET

// Eight codes, one a byte of `eight`'s low half, as mag[k] with its sign bit flipped by the code's (bit 3).
// The permute reads each lane's low three bits, the exponent k.
template <put_mode Mode>
COMMSGD_BLOCK_TARGET inline void e3m0_put8(__m128i eight, __m256 mag, float* o) noexcept {
  const __m256i c = _mm256_cvtepu8_epi32(eight);
  const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(c, 3), 31);
  put8<Mode>(o, _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, c), _mm256_castsi256_ps(sign)));
}

// `codes` starts at a byte's low half; mag[k] is the value of code k (k < 8) in this block.
template <put_mode Mode>
COMMSGD_BLOCK_TARGET inline std::size_t e3m0_put_avx2(const std::byte* codes, std::size_t count,
                                                      const float* mag, float* out) noexcept {
  const __m256 table = _mm256_loadu_ps(mag);
  const __m128i nibble = _mm_set1_epi8(15);
  std::size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i / 2));
    const __m128i lo = _mm_and_si128(b, nibble), hi = _mm_and_si128(_mm_srli_epi16(b, 4), nibble);
    const __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi);
    e3m0_put8<Mode>(first, table, out + i);
    e3m0_put8<Mode>(_mm_srli_si128(first, 8), table, out + i + 8);
    e3m0_put8<Mode>(second, table, out + i + 16);
    e3m0_put8<Mode>(_mm_srli_si128(second, 8), table, out + i + 24);
  }
  return i;
}

// One group of 8 magnitudes x into a scan's running maximum m (returned) and NaN/inf count n. A NaN is passed
// over: max(x, m) keeps m where x is NaN, as m < a ? a : m does; NaN and inf lanes compare true (-1), finite
// ones false (0), so taking the masks away counts them.
COMMSGD_BLOCK_TARGET inline __m256 scan8(__m256 x, __m256 m, __m256i& n) noexcept {
  n = _mm256_sub_epi32(n, _mm256_castps_si256(_mm256_cmp_ps(
                              x, _mm256_set1_ps(std::numeric_limits<float>::max()), _CMP_NLE_UQ)));
  return _mm256_max_ps(x, m);
}
// A scan's 8 lanes folded into scale and bad.
COMMSGD_BLOCK_TARGET inline void fold_scan(__m256 m, __m256i n, float& scale, std::size_t& bad) noexcept {
  alignas(32) float ms[8];
  alignas(32) std::int32_t ns[8];
  _mm256_store_ps(ms, m);
  _mm256_store_si256(reinterpret_cast<__m256i*>(ns), n);
  for (int j = 0; j < 8; ++j) {
    scale = scale < ms[j] ? ms[j] : scale;
    bad += static_cast<std::size_t>(ns[j]);
  }
}

// The largest |p_i| of p's whole groups of 8 and how many are NaN or inf, as scan_block finds them. Returns
// the values done.
COMMSGD_BLOCK_TARGET inline std::size_t scan_avx2(const float* p, std::size_t count, float& scale,
                                                  std::size_t& bad) noexcept {
  const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  __m256i n = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8)
    m = scan8(_mm256_and_ps(_mm256_loadu_ps(p + i), abs), m, n);
  fold_scan(m, n, scale, bad);
  return i;
}

// scan_avx2 on the values a[i] - b[i], each also written to out[i]: a stretch of p formed from the two models
// it is the difference of and scanned in the one pass that reads them from memory (they are asked for a few
// KiB ahead, commsgd/prefetch.hpp). Returns the values done.
COMMSGD_BLOCK_TARGET inline __m256 form_scan8(const float* a, const float* b, float* out, __m256 m,
                                              __m256i& n) noexcept {
  const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b));
  _mm256_storeu_ps(out, v);
  return scan8(_mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))), m, n);
}
COMMSGD_BLOCK_TARGET inline std::size_t form_scan_avx2(const float* a, const float* b, float* out,
                                                       std::size_t count, float& scale,
                                                       std::size_t& bad) noexcept {
  __m256 m = _mm256_setzero_ps();
  __m256i n = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 64 <= count; i += 64) {
    commsgd::detail::prefetch_group(a + i);
    commsgd::detail::prefetch_group(b + i);
    for (std::size_t k = 0; k < 64; k += 8)
      m = form_scan8(a + i + k, b + i + k, out + i + k, m, n);
  }
  for (; i + 8 <= count; i += 8)
    m = form_scan8(a + i, b + i, out + i, m, n);
  fold_scan(m, n, scale, bad);
  return i;
}

// int8_codes' float shortcut for 8 values at q (see there): their codes as 32-bit lanes, and the mask of the
// lanes whose quotient lies within 2^-14 of a half.
COMMSGD_BLOCK_TARGET inline __m256i int8_code8(const float* q, __m256 inv, int& near) noexcept {
  const __m256 shift = _mm256_set1_ps(0x1.8p23f), near_half = _mm256_set1_ps(0.5f - 0x1p-14f),
               abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(q), inv);
  const __m256 r = _mm256_sub_ps(_mm256_add_ps(y, shift), shift);
  near = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(y, r), abs), near_half, _CMP_GT_OQ));
  return _mm256_add_epi32(_mm256_cvttps_epi32(r), _mm256_set1_epi32(127));
}

// int8_codes over whole groups of 32 (inv = 127 / s): the float shortcut, and the values whose quotient lies
// within 2^-14 of a half coded again by exact(p_i) (int8_code::encode) there and then. Returns the values
// done.
template <class Exact>
COMMSGD_BLOCK_TARGET inline std::size_t int8_codes_avx2(const float* p, std::size_t count, float inv,
                                                        std::uint8_t* out, Exact&& exact) noexcept {
  const __m256 by = _mm256_set1_ps(inv);
  std::size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    int na, nb, nc, nd;
    const __m256i a = int8_code8(p + i, by, na), b = int8_code8(p + i + 8, by, nb),
                  c = int8_code8(p + i + 16, by, nc), d = int8_code8(p + i + 24, by, nd);
    // Codes lie in [0, 254]: the saturating packs keep them. The packs work within 128-bit lanes, so the
    // result holds the four codes of a0-3, b0-3, c0-3, d0-3, a4-7, ... in that order: a permute of the
    // 32-bit groups puts them back.
    const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    for (auto near = static_cast<std::uint32_t>(na | nb << 8 | nc << 16 | nd << 24); near != 0;
         near &= near - 1) {
      const auto j = static_cast<std::size_t>(std::countr_zero(near));
      out[i + j] = static_cast<std::uint8_t>(exact(p[i + j]));
    }
  }
  return i;
}

// e3m0_codes' comparisons for 8 values at q (see there): t holds the bits of the thresholds b0 .. b5 and z,
// compared as signed integers with |v|'s bits. Codes as 32-bit lanes.
COMMSGD_BLOCK_TARGET inline __m256i e3m0_code8(const float* q, const __m256i (&t)[7]) noexcept {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i a = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  // k = 1 + the thresholds |v| exceeds (each comparison -1 or 0, taken away), 0 below z.
  __m256i k = _mm256_sub_epi32(_mm256_set1_epi32(1), _mm256_cmpgt_epi32(a, t[0]));
  for (int j = 1; j < 6; ++j)
    k = _mm256_sub_epi32(k, _mm256_cmpgt_epi32(a, t[j]));
  k = _mm256_andnot_si256(_mm256_cmpgt_epi32(t[6], a), k);
  return _mm256_or_si256(k, _mm256_and_si256(_mm256_srli_epi32(bits, 28), _mm256_set1_epi32(8)));
}

// e3m0_codes over whole groups of 32, one code a byte. Returns the values done.
COMMSGD_BLOCK_TARGET inline std::size_t e3m0_codes_avx2(const float* p, std::size_t count,
                                                        const std::int32_t (&thresholds)[7],
                                                        std::uint8_t* out) noexcept {
  __m256i t[7];
  for (int j = 0; j < 7; ++j)
    t[j] = _mm256_set1_epi32(thresholds[j]);
  std::size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m256i a = e3m0_code8(p + i, t), b = e3m0_code8(p + i + 8, t), c = e3m0_code8(p + i + 16, t),
                  d = e3m0_code8(p + i + 24, t);
    const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  return i;
}

#undef COMMSGD_BLOCK_TARGET
#endif

} // namespace commsgd::inline v1::compress::detail
