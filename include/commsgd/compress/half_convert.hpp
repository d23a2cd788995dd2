// The conversions between float and the two 16-bit wire formats, one value at a time and in bulk.
//
// One value (shared with device code): float -> fp16 (IEEE binary16: 5 exponent bits, 10 fraction bits) and
// float -> bf16 (the float's upper 16 bits: 8 exponent bits, 7 fraction bits), both rounding to nearest, ties
// to even, subnormals of both formats kept (no flush to zero), and back, which is exact. A finite float beyond
// the format's largest finite value plus half an ulp (fp16: |x| >= 65520; bf16: only the top of the float
// range) rounds to inf, as IEEE conversion does; NaN maps to a quiet NaN with the sign kept (fp16: sign|0x7e00,
// the payload dropped; bf16: the upper half with the quiet bit set); decoding keeps a NaN's bits as they are.
//
// In bulk (host only): the same functions over spans, with the same bits for every input. Where the CPU has
// AVX2 and F16C (checked once, at run time) they convert 8 values an instruction: F16C rounds as IEEE does,
// the lanes where it differs from the functions above (a NaN's payload, both ways) are fixed in registers,
// and the tail takes the one-value functions. Elsewhere (another CPU, another compiler, nvcc, or with
// COMMSGD_FORCE_SCALAR_HALF defined at compile time or set to a value other than 0 in the environment) they
// loop over the one-value functions. half_path::scalar asks for that loop explicitly (tests compare both).
// Each takes `saturate`: a result of +-inf (an overflow, or an infinite input) is written as the largest
// finite value of its sign; and returns the index of the first value that became +-inf (before saturating),
// or the length when none did, so a caller can refuse an overflow without a second pass.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include <commsgd/cpu.hpp>
#include <commsgd/prefetch.hpp>

#if !defined(COMMSGD_FORCE_SCALAR_HALF) && COMMSGD_X86_DISPATCH
#define COMMSGD_HALF_X86 1
#include <immintrin.h>
#else
#define COMMSGD_HALF_X86 0
#endif

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

// Which implementation a bulk conversion takes: the fastest this CPU has, or the one-value loop.
enum class half_path : std::uint8_t { best, scalar };

// Whether half_path::best takes the AVX2/F16C path in this process.
inline bool half_vector_path() noexcept {
#if COMMSGD_HALF_X86
  static const bool on = [] {
    if (!cpu().avx2 || !cpu().f16c) return false;
    const char* force = std::getenv("COMMSGD_FORCE_SCALAR_HALF");
    return force == nullptr || force[0] == '\0' || std::string(force) == "0";
  }();
  return on;
#else
  return false;
#endif
}

namespace detail {

inline void check_bulk_sizes(const char* what, std::size_t in, std::size_t out) {
  if (in != out)
    throw size_mismatch(std::string(what) + ": argument 'out' has " + std::to_string(out) +
                        " elements, the input " + std::to_string(in));
}

// The one-value loops: the reference every other path must equal, and every path's tail.
template <std::uint16_t Inf, std::uint16_t MaxFinite>
inline std::uint16_t saturate_bits(std::uint16_t h, bool saturate, std::size_t i,
                                   std::size_t& first_inf) noexcept {
  if ((h & 0x7fffu) == Inf) {
    if (first_inf == static_cast<std::size_t>(-1)) first_inf = i;
    if (saturate) h = static_cast<std::uint16_t>((h & 0x8000u) | MaxFinite);
  }
  return h;
}

inline void fp16_encode_scalar(const float* in, std::uint16_t* out, std::size_t n, bool saturate,
                               std::size_t& first_inf) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = saturate_bits<0x7c00u, 0x7bffu>(float_to_fp16_bits(in[i]), saturate, i, first_inf);
}
inline void fp16_sum_scalar(const std::uint16_t* partial, const float* x, std::uint16_t* out, std::size_t n,
                            bool saturate, std::size_t& first_inf) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = saturate_bits<0x7c00u, 0x7bffu>(float_to_fp16_bits(fp16_bits_to_float(partial[i]) + x[i]),
                                             saturate, i, first_inf);
}
inline void fp16_sum16_scalar(const std::uint16_t* partial, const std::uint16_t* x, std::uint16_t* out,
                              std::size_t n, bool saturate, std::size_t& first_inf) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = saturate_bits<0x7c00u, 0x7bffu>(
        float_to_fp16_bits(fp16_bits_to_float(partial[i]) + fp16_bits_to_float(x[i])), saturate, i,
        first_inf);
}
// a[i] - b[i] (b null: a[i]) encoded by Encode into out; whether every result is finite (so no input was NaN
// or inf and none overflowed), out's values then exactly Encode's. The one-value loop of the encode_finite
// functions below, and their tail.
template <std::uint16_t Inf, class Encode>
inline bool encode_finite_scalar(const float* a, const float* b, std::uint16_t* out, std::size_t n,
                                 Encode encode) noexcept {
  unsigned special = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = encode(b ? a[i] - b[i] : a[i]);
    out[i] = h;
    special |= (h & 0x7fffu) >= Inf ? 1u : 0u;
  }
  return special == 0;
}

inline void fp16_decode_scalar(const std::uint16_t* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = fp16_bits_to_float(in[i]);
}
inline void bf16_encode_scalar(const float* in, std::uint16_t* out, std::size_t n, bool saturate,
                               std::size_t& first_inf) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = saturate_bits<0x7f80u, 0x7f7fu>(float_to_bf16_bits(in[i]), saturate, i, first_inf);
}
inline void bf16_sum_scalar(const std::uint16_t* partial, const float* x, std::uint16_t* out, std::size_t n,
                            bool saturate, std::size_t& first_inf) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = saturate_bits<0x7f80u, 0x7f7fu>(float_to_bf16_bits(bf16_bits_to_float(partial[i]) + x[i]),
                                             saturate, i, first_inf);
}
inline void bf16_sum16_scalar(const std::uint16_t* partial, const std::uint16_t* x, std::uint16_t* out,
                              std::size_t n, bool saturate, std::size_t& first_inf) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = saturate_bits<0x7f80u, 0x7f7fu>(
        float_to_bf16_bits(bf16_bits_to_float(partial[i]) + bf16_bits_to_float(x[i])), saturate, i,
        first_inf);
}
inline void bf16_decode_scalar(const std::uint16_t* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = bf16_bits_to_float(in[i]);
}

#if COMMSGD_HALF_X86
#define COMMSGD_HALF_TARGET __attribute__((target("avx2,f16c")))

// F16C keeps a NaN's payload: NaN lanes become sign|0x7e00, as float_to_fp16_bits makes them.
COMMSGD_HALF_TARGET inline __m128i fp16_fix_nan8(__m128i h) noexcept {
  const __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
  const __m128i nan = _mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7c00));
  return _mm_blendv_epi8(h, _mm_or_si128(_mm_andnot_si128(mag, h), _mm_set1_epi16(0x7e00)), nan);
}

// Whether any of 8 fp16 results is inf or NaN: the one test the common case pays.
COMMSGD_HALF_TARGET inline bool fp16_any_special8(__m128i h) noexcept {
  const __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
  return _mm_movemask_epi8(_mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7bff))) != 0;
}

// +-inf lanes of 8 results: their first index into first_inf (when none is known yet), and with `saturate`
// the largest finite value of their sign instead.
COMMSGD_HALF_TARGET inline __m128i saturate8(__m128i h, std::uint16_t inf, std::uint16_t max_finite,
                                             bool saturate, std::size_t i, std::size_t& first_inf) noexcept {
  const __m128i sign = _mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000)));
  const __m128i is_inf = _mm_cmpeq_epi16(_mm_xor_si128(h, sign), _mm_set1_epi16(static_cast<short>(inf)));
  const int bits = _mm_movemask_epi8(is_inf);
  if (bits == 0) return h;
  if (first_inf == static_cast<std::size_t>(-1))
    first_inf = i + static_cast<std::size_t>(std::countr_zero(static_cast<unsigned>(bits))) / 2;
  if (!saturate) return h;
  return _mm_blendv_epi8(h, _mm_or_si128(sign, _mm_set1_epi16(static_cast<short>(max_finite))), is_inf);
}

// 8 floats to fp16 bits as float_to_fp16_bits makes them, saturated and reported as saturate8 does. F16C rounds
// every non-NaN value as IEEE does (its rounding from the immediate, not MXCSR; a float subnormal, flushed or
// not under DAZ, rounds to a signed zero either way); only a vector holding inf or NaN takes the fix-ups.
COMMSGD_HALF_TARGET inline __m128i fp16_encode8(__m256 v, bool saturate, std::size_t i,
                                                std::size_t& first_inf) noexcept {
  const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  if (!fp16_any_special8(h)) return h;
  return saturate8(fp16_fix_nan8(h), 0x7c00u, 0x7bffu, saturate, i, first_inf);
}

// 8 fp16 values to floats as fp16_bits_to_float makes them: F16C is exact but sets the quiet bit of a
// signalling NaN, which the one-value decoding keeps as it is, so NaN lanes are rebuilt from their bits.
COMMSGD_HALF_TARGET inline __m256 fp16_decode8(__m128i h) noexcept {
  __m256 f = _mm256_cvtph_ps(h);
  const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
  if (_mm_movemask_epi8(nan) != 0) {
    const __m256i w = _mm256_cvtepu16_epi32(h);
    const __m256i bits =
        _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                                        _mm256_set1_epi32(0x7f800000)),
                        _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x3ff)), 13));
    f = _mm256_blendv_ps(f, _mm256_castsi256_ps(bits), _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan)));
  }
  return f;
}

// 8 floats to bf16 bits as float_to_bf16_bits makes them: (x + 0x7fff + lsb) >> 16 rounds the magnitude to
// nearest even and carries into the exponent (up to inf) without reaching the sign; NaN lanes take
// (x >> 16) | 0x40.
COMMSGD_HALF_TARGET inline __m128i bf16_encode8(__m256 v) noexcept {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

COMMSGD_HALF_TARGET inline __m256 bf16_decode8(__m128i h) noexcept {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

COMMSGD_HALF_TARGET inline void fp16_encode_avx2(const float* in, std::uint16_t* out, std::size_t n,
                                                 bool saturate, std::size_t& first_inf) noexcept {
  std::size_t i = 0;
  // 32 values a test: one branch on whether any of them is inf or NaN, the fix-ups only where one is.
  const __m128i abs = _mm_set1_epi16(0x7fff), max_finite = _mm_set1_epi16(0x7bff);
  for (; i + 32 <= n; i += 32) {
    constexpr int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m128i h0 = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), round);
    __m128i h1 = _mm256_cvtps_ph(_mm256_loadu_ps(in + i + 8), round);
    __m128i h2 = _mm256_cvtps_ph(_mm256_loadu_ps(in + i + 16), round);
    __m128i h3 = _mm256_cvtps_ph(_mm256_loadu_ps(in + i + 24), round);
    const __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpgt_epi16(_mm_and_si128(h0, abs), max_finite),
                                                      _mm_cmpgt_epi16(_mm_and_si128(h1, abs), max_finite)),
                                         _mm_or_si128(_mm_cmpgt_epi16(_mm_and_si128(h2, abs), max_finite),
                                                      _mm_cmpgt_epi16(_mm_and_si128(h3, abs), max_finite)));
    if (_mm_movemask_epi8(special) != 0) [[unlikely]] {
      h0 = saturate8(fp16_fix_nan8(h0), 0x7c00u, 0x7bffu, saturate, i, first_inf);
      h1 = saturate8(fp16_fix_nan8(h1), 0x7c00u, 0x7bffu, saturate, i + 8, first_inf);
      h2 = saturate8(fp16_fix_nan8(h2), 0x7c00u, 0x7bffu, saturate, i + 16, first_inf);
      h3 = saturate8(fp16_fix_nan8(h3), 0x7c00u, 0x7bffu, saturate, i + 24, first_inf);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 8), h1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 16), h2);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 24), h3);
  }
  for (; i + 8 <= n; i += 8) {
    const __m128i h = fp16_encode8(_mm256_loadu_ps(in + i), saturate, i, first_inf);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  std::size_t tail_inf = static_cast<std::size_t>(-1);
  fp16_encode_scalar(in + i, out + i, n - i, saturate, tail_inf);
  if (first_inf == static_cast<std::size_t>(-1) && tail_inf != static_cast<std::size_t>(-1))
    first_inf = i + tail_inf;
}

COMMSGD_HALF_TARGET inline void fp16_sum_avx2(const std::uint16_t* partial, const float* x,
                                              std::uint16_t* out, std::size_t n, bool saturate,
                                              std::size_t& first_inf) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 p = fp16_decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(partial + i)));
    const __m128i h = fp16_encode8(_mm256_add_ps(p, _mm256_loadu_ps(x + i)), saturate, i, first_inf);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  std::size_t tail_inf = static_cast<std::size_t>(-1);
  fp16_sum_scalar(partial + i, x + i, out + i, n - i, saturate, tail_inf);
  if (first_inf == static_cast<std::size_t>(-1) && tail_inf != static_cast<std::size_t>(-1))
    first_inf = i + tail_inf;
}

COMMSGD_HALF_TARGET inline void fp16_sum16_avx2(const std::uint16_t* partial, const std::uint16_t* x,
                                                std::uint16_t* out, std::size_t n, bool saturate,
                                                std::size_t& first_inf) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if (i % 32 == 0) { // the partial sum and this rank's message, streamed from memory
      commsgd::detail::prefetch_line(partial + i);
      commsgd::detail::prefetch_line(x + i);
    }
    const __m256 p = fp16_decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(partial + i)));
    const __m256 v = fp16_decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    const __m128i h = fp16_encode8(_mm256_add_ps(p, v), saturate, i, first_inf);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  std::size_t tail_inf = static_cast<std::size_t>(-1);
  fp16_sum16_scalar(partial + i, x + i, out + i, n - i, saturate, tail_inf);
  if (first_inf == static_cast<std::size_t>(-1) && tail_inf != static_cast<std::size_t>(-1))
    first_inf = i + tail_inf;
}

COMMSGD_HALF_TARGET inline void fp16_decode_avx2(const std::uint16_t* in, float* out,
                                                 std::size_t n) noexcept {
  std::size_t i = 0;
  // 32 values a test for NaN; a block holding one takes the per-8 path, which fixes the NaN lanes.
  const __m128i abs = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
  for (; i + 32 <= n; i += 32) {
    commsgd::detail::prefetch_line(in + i);
    const auto* p = reinterpret_cast<const __m128i*>(in + i);
    const __m128i h0 = _mm_loadu_si128(p), h1 = _mm_loadu_si128(p + 1), h2 = _mm_loadu_si128(p + 2),
                  h3 = _mm_loadu_si128(p + 3);
    const __m128i nan = _mm_or_si128(_mm_or_si128(_mm_cmpgt_epi16(_mm_and_si128(h0, abs), inf),
                                                  _mm_cmpgt_epi16(_mm_and_si128(h1, abs), inf)),
                                     _mm_or_si128(_mm_cmpgt_epi16(_mm_and_si128(h2, abs), inf),
                                                  _mm_cmpgt_epi16(_mm_and_si128(h3, abs), inf)));
    if (_mm_movemask_epi8(nan) != 0) [[unlikely]] {
      for (std::size_t k = 0; k < 32; k += 8)
        _mm256_storeu_ps(out + i + k,
                         fp16_decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + k))));
      continue;
    }
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h0));
    _mm256_storeu_ps(out + i + 8, _mm256_cvtph_ps(h1));
    _mm256_storeu_ps(out + i + 16, _mm256_cvtph_ps(h2));
    _mm256_storeu_ps(out + i + 24, _mm256_cvtph_ps(h3));
  }
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, fp16_decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  fp16_decode_scalar(in + i, out + i, n - i);
}

COMMSGD_HALF_TARGET inline void bf16_encode_avx2(const float* in, std::uint16_t* out, std::size_t n,
                                                 bool saturate, std::size_t& first_inf) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        saturate8(bf16_encode8(_mm256_loadu_ps(in + i)), 0x7f80u, 0x7f7fu, saturate, i, first_inf);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  std::size_t tail_inf = static_cast<std::size_t>(-1);
  bf16_encode_scalar(in + i, out + i, n - i, saturate, tail_inf);
  if (first_inf == static_cast<std::size_t>(-1) && tail_inf != static_cast<std::size_t>(-1))
    first_inf = i + tail_inf;
}

COMMSGD_HALF_TARGET inline void bf16_sum_avx2(const std::uint16_t* partial, const float* x,
                                              std::uint16_t* out, std::size_t n, bool saturate,
                                              std::size_t& first_inf) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 p = bf16_decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(partial + i)));
    const __m128i h = saturate8(bf16_encode8(_mm256_add_ps(p, _mm256_loadu_ps(x + i))), 0x7f80u, 0x7f7fu,
                                saturate, i, first_inf);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  std::size_t tail_inf = static_cast<std::size_t>(-1);
  bf16_sum_scalar(partial + i, x + i, out + i, n - i, saturate, tail_inf);
  if (first_inf == static_cast<std::size_t>(-1) && tail_inf != static_cast<std::size_t>(-1))
    first_inf = i + tail_inf;
}

COMMSGD_HALF_TARGET inline void bf16_sum16_avx2(const std::uint16_t* partial, const std::uint16_t* x,
                                                std::uint16_t* out, std::size_t n, bool saturate,
                                                std::size_t& first_inf) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if (i % 32 == 0) { // the partial sum and this rank's message, streamed from memory
      commsgd::detail::prefetch_line(partial + i);
      commsgd::detail::prefetch_line(x + i);
    }
    const __m256 p = bf16_decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(partial + i)));
    const __m256 v = bf16_decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    const __m128i h = saturate8(bf16_encode8(_mm256_add_ps(p, v)), 0x7f80u, 0x7f7fu, saturate, i, first_inf);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  std::size_t tail_inf = static_cast<std::size_t>(-1);
  bf16_sum16_scalar(partial + i, x + i, out + i, n - i, saturate, tail_inf);
  if (first_inf == static_cast<std::size_t>(-1) && tail_inf != static_cast<std::size_t>(-1))
    first_inf = i + tail_inf;
}

COMMSGD_HALF_TARGET inline void bf16_decode_avx2(const std::uint16_t* in, float* out,
                                                 std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    commsgd::detail::prefetch_line(in + i);
    for (std::size_t k = i; k < i + 32; k += 8)
      _mm256_storeu_ps(out + k, bf16_decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + k))));
  }
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, bf16_decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  bf16_decode_scalar(in + i, out + i, n - i);
}

// encode_finite_scalar's results, 64 values a round: the subtraction, F16C's conversion or bf16_encode8, and
// one running test for a result of inf or NaN (a finite float rounds as float_to_fp16_bits does; any other
// lane makes the call answer false, and its caller redoes the values the careful way).
template <bool Bf16, bool Difference>
COMMSGD_HALF_TARGET inline __m128i encode_finite8(const float* a, const float* b, std::uint16_t* out,
                                                  __m128i special) noexcept {
  __m256 v = _mm256_loadu_ps(a);
  if constexpr (Difference) v = _mm256_sub_ps(v, _mm256_loadu_ps(b));
  __m128i h;
  if constexpr (Bf16)
    h = bf16_encode8(v);
  else
    h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), h);
  return _mm_or_si128(special, _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)),
                                               _mm_set1_epi16(Bf16 ? 0x7f7f : 0x7bff)));
}

template <bool Bf16, bool Difference>
COMMSGD_HALF_TARGET inline bool encode_finite_avx2(const float* a, const float* b, std::uint16_t* out,
                                                   std::size_t n) noexcept {
  __m128i special = _mm_setzero_si128();
  const float* const no_b = nullptr;
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    // The operands are a DiLoCo round's two models, streamed from memory (commsgd/prefetch.hpp).
    commsgd::detail::prefetch_group(a + i);
    if constexpr (Difference) commsgd::detail::prefetch_group(b + i);
    {
      const auto o = reinterpret_cast<std::uintptr_t>(out + i + commsgd::detail::prefetch_ahead);
      commsgd::detail::prefetch_address<true>(o);
      commsgd::detail::prefetch_address<true>(o + 64);
    }
    for (std::size_t k = 0; k < 64; k += 8)
      special =
          encode_finite8<Bf16, Difference>(a + i + k, Difference ? b + i + k : no_b, out + i + k, special);
  }
  for (; i + 8 <= n; i += 8)
    special = encode_finite8<Bf16, Difference>(a + i, Difference ? b + i : no_b, out + i, special);
  const bool tail = Bf16 ? encode_finite_scalar<0x7f80u>(a + i, Difference ? b + i : nullptr, out + i, n - i,
                                                         [](float f) { return float_to_bf16_bits(f); })
                         : encode_finite_scalar<0x7c00u>(a + i, Difference ? b + i : nullptr, out + i, n - i,
                                                         [](float f) { return float_to_fp16_bits(f); });
  return tail && _mm_movemask_epi8(special) == 0;
}

#undef COMMSGD_HALF_TARGET
#endif

inline bool take_vector(half_path path) noexcept {
  return path == half_path::best && half_vector_path();
}

} // namespace detail

// Bulk conversions: out[i] = float_to_fp16_bits(in[i]) (saturated as asked) for every i; the sizes must agree.
// Returns the index of the first +-inf result before saturating, or in.size().
inline std::size_t float_to_fp16_bits(std::span<const float> in, std::span<std::uint16_t> out,
                                      bool saturate = false,
                                      [[maybe_unused]] half_path path = half_path::best) {
  detail::check_bulk_sizes("float_to_fp16_bits", in.size(), out.size());
  std::size_t first_inf = static_cast<std::size_t>(-1);
#if COMMSGD_HALF_X86
  if (detail::take_vector(path)) {
    detail::fp16_encode_avx2(in.data(), out.data(), in.size(), saturate, first_inf);
    return first_inf == static_cast<std::size_t>(-1) ? in.size() : first_inf;
  }
#endif
  detail::fp16_encode_scalar(in.data(), out.data(), in.size(), saturate, first_inf);
  return first_inf == static_cast<std::size_t>(-1) ? in.size() : first_inf;
}

inline std::size_t float_to_bf16_bits(std::span<const float> in, std::span<std::uint16_t> out,
                                      bool saturate = false,
                                      [[maybe_unused]] half_path path = half_path::best) {
  detail::check_bulk_sizes("float_to_bf16_bits", in.size(), out.size());
  std::size_t first_inf = static_cast<std::size_t>(-1);
#if COMMSGD_HALF_X86
  if (detail::take_vector(path)) {
    detail::bf16_encode_avx2(in.data(), out.data(), in.size(), saturate, first_inf);
    return first_inf == static_cast<std::size_t>(-1) ? in.size() : first_inf;
  }
#endif
  detail::bf16_encode_scalar(in.data(), out.data(), in.size(), saturate, first_inf);
  return first_inf == static_cast<std::size_t>(-1) ? in.size() : first_inf;
}

// The encoding of a difference, for a code that tests its input and encodes it in one pass:
// out[i] = float_to_fp16_bits(a[i] - b[i]) (b null: of a[i]) for every i, and true, when every result is
// finite; false when some value of a - b is NaN or inf or overflows the format, out then unspecified (the
// caller tests and encodes those values again, with the functions above). a, b and out hold n values each.
inline bool fp16_encode_finite(const float* a, const float* b, std::uint16_t* out, std::size_t n,
                               [[maybe_unused]] half_path path = half_path::best) noexcept {
#if COMMSGD_HALF_X86
  if (detail::take_vector(path))
    return b ? detail::encode_finite_avx2<false, true>(a, b, out, n)
             : detail::encode_finite_avx2<false, false>(a, nullptr, out, n);
#endif
  return detail::encode_finite_scalar<0x7c00u>(a, b, out, n, [](float f) { return float_to_fp16_bits(f); });
}

inline bool bf16_encode_finite(const float* a, const float* b, std::uint16_t* out, std::size_t n,
                               [[maybe_unused]] half_path path = half_path::best) noexcept {
#if COMMSGD_HALF_X86
  if (detail::take_vector(path))
    return b ? detail::encode_finite_avx2<true, true>(a, b, out, n)
             : detail::encode_finite_avx2<true, false>(a, nullptr, out, n);
#endif
  return detail::encode_finite_scalar<0x7f80u>(a, b, out, n, [](float f) { return float_to_bf16_bits(f); });
}

// One hop of a 16-bit ring: out[i] = float_to_fp16_bits(fp16_bits_to_float(partial[i]) + x[i]), saturated as
// asked (the sum in float). out may be partial. A sum that is NaN is a NaN of either sign and payload (which
// operand's NaN an add keeps is the compiler's choice, and differs between builds); the ring refuses it.
inline std::size_t fp16_sum_bits(std::span<const std::uint16_t> partial, std::span<const float> x,
                                 std::span<std::uint16_t> out, bool saturate = false,
                                 [[maybe_unused]] half_path path = half_path::best) {
  detail::check_bulk_sizes("fp16_sum_bits", partial.size(), x.size());
  detail::check_bulk_sizes("fp16_sum_bits", partial.size(), out.size());
  std::size_t first_inf = static_cast<std::size_t>(-1);
#if COMMSGD_HALF_X86
  if (detail::take_vector(path)) {
    detail::fp16_sum_avx2(partial.data(), x.data(), out.data(), x.size(), saturate, first_inf);
    return first_inf == static_cast<std::size_t>(-1) ? x.size() : first_inf;
  }
#endif
  detail::fp16_sum_scalar(partial.data(), x.data(), out.data(), x.size(), saturate, first_inf);
  return first_inf == static_cast<std::size_t>(-1) ? x.size() : first_inf;
}

inline std::size_t bf16_sum_bits(std::span<const std::uint16_t> partial, std::span<const float> x,
                                 std::span<std::uint16_t> out, bool saturate = false,
                                 [[maybe_unused]] half_path path = half_path::best) {
  detail::check_bulk_sizes("bf16_sum_bits", partial.size(), x.size());
  detail::check_bulk_sizes("bf16_sum_bits", partial.size(), out.size());
  std::size_t first_inf = static_cast<std::size_t>(-1);
#if COMMSGD_HALF_X86
  if (detail::take_vector(path)) {
    detail::bf16_sum_avx2(partial.data(), x.data(), out.data(), x.size(), saturate, first_inf);
    return first_inf == static_cast<std::size_t>(-1) ? x.size() : first_inf;
  }
#endif
  detail::bf16_sum_scalar(partial.data(), x.data(), out.data(), x.size(), saturate, first_inf);
  return first_inf == static_cast<std::size_t>(-1) ? x.size() : first_inf;
}

// A hop whose own values are 16-bit too: out[i] = float_to_fp16_bits(fp16_bits_to_float(partial[i]) +
// fp16_bits_to_float(x[i])), saturated as asked; the bits of the float form given x's decoded values (decoding
// is exact). out may be partial or x.
inline std::size_t fp16_sum_bits(std::span<const std::uint16_t> partial, std::span<const std::uint16_t> x,
                                 std::span<std::uint16_t> out, bool saturate = false,
                                 [[maybe_unused]] half_path path = half_path::best) {
  detail::check_bulk_sizes("fp16_sum_bits", partial.size(), x.size());
  detail::check_bulk_sizes("fp16_sum_bits", partial.size(), out.size());
  std::size_t first_inf = static_cast<std::size_t>(-1);
#if COMMSGD_HALF_X86
  if (detail::take_vector(path)) {
    detail::fp16_sum16_avx2(partial.data(), x.data(), out.data(), x.size(), saturate, first_inf);
    return first_inf == static_cast<std::size_t>(-1) ? x.size() : first_inf;
  }
#endif
  detail::fp16_sum16_scalar(partial.data(), x.data(), out.data(), x.size(), saturate, first_inf);
  return first_inf == static_cast<std::size_t>(-1) ? x.size() : first_inf;
}

inline std::size_t bf16_sum_bits(std::span<const std::uint16_t> partial, std::span<const std::uint16_t> x,
                                 std::span<std::uint16_t> out, bool saturate = false,
                                 [[maybe_unused]] half_path path = half_path::best) {
  detail::check_bulk_sizes("bf16_sum_bits", partial.size(), x.size());
  detail::check_bulk_sizes("bf16_sum_bits", partial.size(), out.size());
  std::size_t first_inf = static_cast<std::size_t>(-1);
#if COMMSGD_HALF_X86
  if (detail::take_vector(path)) {
    detail::bf16_sum16_avx2(partial.data(), x.data(), out.data(), x.size(), saturate, first_inf);
    return first_inf == static_cast<std::size_t>(-1) ? x.size() : first_inf;
  }
#endif
  detail::bf16_sum16_scalar(partial.data(), x.data(), out.data(), x.size(), saturate, first_inf);
  return first_inf == static_cast<std::size_t>(-1) ? x.size() : first_inf;
}

inline void fp16_bits_to_float(std::span<const std::uint16_t> in, std::span<float> out,
                               [[maybe_unused]] half_path path = half_path::best) {
  detail::check_bulk_sizes("fp16_bits_to_float", in.size(), out.size());
#if COMMSGD_HALF_X86
  if (detail::take_vector(path)) return detail::fp16_decode_avx2(in.data(), out.data(), in.size());
#endif
  detail::fp16_decode_scalar(in.data(), out.data(), in.size());
}

inline void bf16_bits_to_float(std::span<const std::uint16_t> in, std::span<float> out,
                               [[maybe_unused]] half_path path = half_path::best) {
  detail::check_bulk_sizes("bf16_bits_to_float", in.size(), out.size());
#if COMMSGD_HALF_X86
  if (detail::take_vector(path)) return detail::bf16_decode_avx2(in.data(), out.data(), in.size());
#endif
  detail::bf16_decode_scalar(in.data(), out.data(), in.size());
}

} // namespace commsgd::inline v1::compress
