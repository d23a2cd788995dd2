// The top-k codes' decode of one chunk of a message (compress/top_k_ef.hpp): its packed indices unpacked and
// tested (each below the chunk's length, each above the one before), and its 2-bit codes looked up as values.
// Every rank decodes every rank's message each round, so at 3 % and 4 ranks this is an eighth of the values
// of the model a round, field by field. Where the CPU has AVX2 (commsgd/cpu.hpp, read once) 8 fields go at a
// time; elsewhere, and for the few fields at a chunk's end, the portable loops. Both write the same entries
// and give the same verdict: the indices and values are integers and table lookups, nothing is rounded.
//
// 8 fields of w bits hold 8 w bits, w whole bytes, so in a chunk whose first field starts s bits into a byte
// every group of 8 starts s bits into a byte too. For w <= 25 (chunks of up to 2^25 values) the first four
// fields lie within 16 bytes from the group's first byte and the last four within 16 bytes from field 4's:
// two 16-byte loads, one byte shuffle that puts each field's four bytes in its 32-bit lane, a shift by its
// bit within the first byte and a mask. The shuffles and shifts depend on w and s alone (unpack_tables).
#pragma once

#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/cpu.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if COMMSGD_X86_DISPATCH
#include <immintrin.h>
#endif

namespace commsgd::inline v1::compress::detail {

// Where 8 fields of `width` bits lie, for each bit s (0 to 7) that the group's first field starts at in its
// first byte: `half`, the byte that fields 4 to 7 are loaded from (after the group's first); in each 16-byte
// half, each field's four bytes (`shuffle`, one byte's index a lane byte) and its shift within them.
struct unpack_tables {
  static constexpr unsigned widest = 25; // a field and its shift within 32 bits
  unsigned width = 0;
  std::array<std::uint32_t, 8> half{};
  std::array<std::array<std::uint8_t, 32>, 8> shuffle{};
  std::array<std::array<std::uint32_t, 8>, 8> shift{};

  explicit unpack_tables(unsigned w) : width(w) {
    if (w == 0 || w > widest) return;
    for (unsigned s = 0; s < 8; ++s) {
      half[s] = (s + 4 * w) / 8;
      for (unsigned j = 0; j < 8; ++j) {
        const unsigned bit = s + j * w;
        const unsigned from = j < 4 ? bit / 8 : bit / 8 - half[s];
        for (unsigned b = 0; b < 4; ++b)
          shuffle[s][4 * j + b] = static_cast<std::uint8_t>(from + b);
        shift[s][j] = bit % 8;
      }
    }
  }
  bool vectorised() const noexcept { return width > 0 && width <= widest; }
};

#if COMMSGD_X86_DISPATCH
#define COMMSGD_UNPACK_TARGET __attribute__((target("avx2")))

// Fields q, q + 1, ... of `in` (size bytes) in groups of 8 while a group's two loads stay inside `in`:
// at[i] = first + field, `bad` raised where a field is >= len or not above the one before (`prev`, -1 before
// the chunk's first, carried out). Returns how many fields it took (a multiple of 8, at most kj).
COMMSGD_UNPACK_TARGET inline std::size_t unpack_rising_avx2(const std::byte* in, std::size_t size,
                                                            std::size_t q, std::size_t kj,
                                                            const unpack_tables& t, std::uint32_t first,
                                                            std::uint32_t len, std::uint32_t* at,
                                                            std::int64_t& prev, bool& bad) noexcept {
  const unsigned w = t.width, s = static_cast<unsigned>((q * w) % 8);
  const std::size_t half = t.half[s];
  const __m256i order = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.shuffle[s].data()));
  const __m256i shift = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.shift[s].data()));
  const __m256i mask = _mm256_set1_epi32(static_cast<std::int32_t>((1u << w) - 1u));
  const __m256i base = _mm256_set1_epi32(static_cast<std::int32_t>(first));
  // Fields are below 2^25 and len is at least 1, so signed compares are the unsigned ones.
  const __m256i last_ok = _mm256_set1_epi32(static_cast<std::int32_t>(len - 1u));
  const __m256i back = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6), top = _mm256_set1_epi32(7);
  const __m256i ones = _mm256_set1_epi32(-1);
  __m256i carry = _mm256_set1_epi32(static_cast<std::int32_t>(prev));
  __m256i wrong = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 8 <= kj; i += 8) {
    const std::size_t b = (q + i) * w / 8;
    if (b + half + 16 > size) break;
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + b));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + b + half));
    __m256i v = _mm256_shuffle_epi8(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1), order);
    v = _mm256_and_si256(_mm256_srlv_epi32(v, shift), mask);
    const __m256i before = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(v, back), carry, 1);
    wrong = _mm256_or_si256(wrong, _mm256_cmpgt_epi32(v, last_ok));
    wrong = _mm256_or_si256(wrong, _mm256_xor_si256(_mm256_cmpgt_epi32(v, before), ones));
    carry = _mm256_permutevar8x32_epi32(v, top);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + i), _mm256_add_epi32(v, base));
  }
  if (i > 0) prev = _mm256_cvtsi256_si32(carry);
  bad = bad || !_mm256_testz_si256(wrong, wrong);
  return i;
}

// Values q, q + 1, ... of 2-bit codes (value i at bit 2 i of `codes`, size bytes) in groups of 8 while a
// group's 4-byte load stays inside `codes`: val[i] = t[code]. Returns how many it took (a multiple of 8).
COMMSGD_UNPACK_TARGET inline std::size_t two_bit_avx2(const std::byte* codes, std::size_t size, std::size_t q,
                                                      std::size_t kj, const float* t, float* val) noexcept {
  const __m256 table = _mm256_setr_ps(t[0], t[1], t[2], t[3], t[0], t[1], t[2], t[3]);
  const __m256i shift = _mm256_add_epi32(_mm256_set1_epi32(static_cast<std::int32_t>(2 * (q % 4))),
                                         _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
  const __m256i three = _mm256_set1_epi32(3);
  std::size_t i = 0;
  for (; i + 8 <= kj; i += 8) {
    const std::size_t b = (q + i) / 4;
    if (b + 4 > size) break;
    std::uint32_t word;
    std::memcpy(&word, codes + b, 4);
    const __m256i c =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<std::int32_t>(word)), shift), three);
    _mm256_storeu_ps(val + i, _mm256_permutevar8x32_ps(table, c));
  }
  return i;
}

#undef COMMSGD_UNPACK_TARGET
#endif

// A chunk's kj indices, fields q .. q + kj - 1 of idx (t.width bits each): at[i] = first + field (q + i).
// Returns false where some field is >= len or not above the one before it. `vector`: AVX2 where the CPU has
// it and the width allows (tests turn it off to compare).
inline bool unpack_rising(std::span<const std::byte> idx, std::size_t q, std::size_t kj,
                          const unpack_tables& t, std::uint32_t first, std::uint32_t len, std::uint32_t* at,
                          [[maybe_unused]] bool vector = true) {
  std::int64_t prev = -1;
  bool bad = false;
  std::size_t done = 0;
#if COMMSGD_X86_DISPATCH
  if (vector && t.vectorised() && cpu().avx2)
    done = unpack_rising_avx2(idx.data(), idx.size(), q, kj, t, first, len, at, prev, bad);
#endif
  std::uint32_t wrong = 0;
  unpack_bits(idx, q + done, kj - done, t.width, [&](std::size_t i, std::uint32_t rel) {
    wrong |= (rel >= len ? 1u : 0u) | (static_cast<std::int64_t>(rel) <= prev ? 1u : 0u);
    prev = rel;
    at[i - q] = first + rel;
  });
  return !bad && wrong == 0;
}

// A chunk's kj 2-bit values, codes q .. q + kj - 1 of `codes` (value i's code at bit 2 i): val[i] = t[code
// (q + i)].
inline void two_bit_values(std::span<const std::byte> codes, std::size_t q, std::size_t kj, const float* t,
                           float* val, [[maybe_unused]] bool vector = true) {
  std::size_t i = 0;
#if COMMSGD_X86_DISPATCH
  if (vector && cpu().avx2) i = two_bit_avx2(codes.data(), codes.size(), q, kj, t, val);
#endif
  for (; i < kj; ++i)
    val[i] = t[(std::to_integer<unsigned>(codes[(q + i) / 4]) >> (2 * ((q + i) % 4))) & 3u];
}

} // namespace commsgd::inline v1::compress::detail
