// select::chunked's per-candidate passes 8 values an instruction where the CPU has AVX2 (checked once, at run
// time; commsgd/cpu.hpp). The portable loops write a candidate a set bit behind a branch, mispredicted about
// once a group of 64 at the few hits a warm floor leaves, and find the k-th through a histogram whose
// increments wait on each other; those were half of a chunk's time at 3 %.
//   collect     the (key, index) of every value whose key reaches a floor, in index order: a compare of 8 keys,
//               their mask's 8 bits looked up as the permutation that moves the hits to the front (a table
//               of 256 words of 8 byte-sized lanes), and both rows stored whole at the count, which then moves
//               by the mask's population. Branch-free; the stores past the count are overwritten or never read.
//   count_from  how many held keys reach a value: the probe of chunked's bisection for the k-th.
//   keep_from   the held indices whose key reaches the k-th (every tie taken), in place, as collect does.
// collect and keep_from give what the portable loops give: the same entries in the same order.
#pragma once

#include <commsgd/cpu.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#if COMMSGD_X86_DISPATCH
#include <immintrin.h>
#endif

namespace commsgd::inline v1::select::detail {

#if COMMSGD_X86_DISPATCH
#define COMMSGD_SELECT_TARGET __attribute__((target("avx2,popcnt")))

// Lane j of entry m: the position of m's (j + 1)-th set bit (0 past its population), a byte each.
inline constexpr std::array<std::uint64_t, 256> compress_table = [] {
  std::array<std::uint64_t, 256> t{};
  for (unsigned m = 0; m < 256; ++m) {
    unsigned lane = 0;
    for (unsigned b = 0; b < 8; ++b)
      if ((m >> b) & 1u) t[m] |= static_cast<std::uint64_t>(b) << (8 * lane++);
  }
  return t;
}();

COMMSGD_SELECT_TARGET inline __m256i compress_order(unsigned mask) noexcept {
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(compress_table[mask])));
}

// The keys and indices of x[0, n) (n a multiple of 8) whose key is >= lo, in index order, into kq and iq
// (each with room for n + 8); returns their count, and raises top to the largest of their keys.
COMMSGD_SELECT_TARGET inline std::size_t collect_avx2(const float* x, std::size_t n, std::uint32_t lo,
                                                      std::uint32_t* kq, std::uint32_t* iq,
                                                      std::uint32_t& top) noexcept {
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  // Keys are below 2^31, so a signed compare with lo - 1 (-1 when lo is 0) is key >= lo.
  const __m256i below = _mm256_set1_epi32(static_cast<std::int32_t>(lo - 1u));
  const __m256i eight = _mm256_set1_epi32(8);
  __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i high = _mm256_setzero_si256();
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; i += 8) {
    const __m256i key =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), magnitude);
    const __m256i hit = _mm256_cmpgt_epi32(key, below);
    const auto mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(hit)));
    const __m256i order = compress_order(mask);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(kq + c), _mm256_permutevar8x32_epi32(key, order));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(iq + c), _mm256_permutevar8x32_epi32(at, order));
    high = _mm256_max_epu32(high, _mm256_and_si256(key, hit));
    c += static_cast<std::size_t>(std::popcount(mask));
    at = _mm256_add_epi32(at, eight);
  }
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
  const auto hm = static_cast<std::uint32_t>(_mm_cvtsi128_si32(h));
  top = hm > top ? hm : top;
  return c;
}

// at[i] for every i < held (a multiple of 8 or not) whose key[i] >= tk, moved to the front in order; at
// needs room for held rounded up to 8 (the lanes past held are read, never kept). Returns their count.
COMMSGD_SELECT_TARGET inline std::size_t keep_from_avx2(const std::uint32_t* key, std::uint32_t* at,
                                                        std::size_t held, std::uint32_t tk) noexcept {
  const __m256i below = _mm256_set1_epi32(static_cast<std::int32_t>(tk - 1u));
  std::size_t out = 0;
  for (std::size_t i = 0; i < held; i += 8) {
    const __m256i hit =
        _mm256_cmpgt_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + i)), below);
    auto mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(hit)));
    if (held - i < 8) mask &= (1u << (held - i)) - 1u;
    // Loaded before the store: out <= i, so the store covers only lanes this or an earlier step read.
    const __m256i row = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + out),
                        _mm256_permutevar8x32_epi32(row, compress_order(mask)));
    out += static_cast<std::size_t>(std::popcount(mask));
  }
  return out;
}

// How many of key[0, held) are >= t (t > 0); key needs zeros from held to held + 16.
COMMSGD_SELECT_TARGET inline std::size_t count_from_avx2(const std::uint32_t* key, std::size_t held,
                                                         std::uint32_t t) noexcept {
  const __m256i below = _mm256_set1_epi32(static_cast<std::int32_t>(t - 1u));
  __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
  for (std::size_t i = 0; i < held; i += 16) { // two rows a step, two sums: no compare waits on another
    a = _mm256_sub_epi32(
        a, _mm256_cmpgt_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + i)), below));
    b = _mm256_sub_epi32(
        b, _mm256_cmpgt_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + i + 8)), below));
  }
  a = _mm256_add_epi32(a, b);
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  return static_cast<std::uint32_t>(_mm_cvtsi128_si32(h));
}

#undef COMMSGD_SELECT_TARGET
#endif

} // namespace commsgd::inline v1::select::detail
