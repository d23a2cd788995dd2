// The bulk conversions of compress/half_convert.hpp: the vectorised path (AVX2/F16C, where this CPU has it) and
// the one-value loop, both against the one-value functions, bit for bit: every float pattern to fp16 and bf16
// (in a sanitized build: every pattern of the exponents where rounding changes form, and the low 16 bits of
// the others sampled; COMMSGD_EXHAUSTIVE_HALF=1 asks for all 2^32 there too), every 16-bit pattern back, the
// ring's fused hop, sizes around the vector width, unaligned spans, saturation and the overflow index.
#include <commsgd/compress/half_convert.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace commsgd;
using compress::half_path;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#else
constexpr bool sanitized = false;
#endif

bool exhaustive() {
  const char* e = std::getenv("COMMSGD_EXHAUSTIVE_HALF");
  return !sanitized || (e != nullptr && std::string(e) == "1");
}

constexpr half_path paths[] = {half_path::best, half_path::scalar};

// 16-bit results a and b are the same, or both NaN (inf: the format's infinity bits). Which operand's NaN
// a sum keeps, and its sign, are the compiler's choice (it may swap the operands of an add, and does so
// differently at -O0 and -O2), so a NaN result is held only to be NaN.
bool same_or_both_nan(std::uint16_t a, std::uint16_t b, std::uint16_t inf) {
  const bool a_nan = (a & 0x7fffu) > inf, b_nan = (b & 0x7fffu) > inf;
  return a_nan || b_nan ? a_nan == b_nan : a == b;
}

// Whether a and b hold the same_or_both_nan values.
bool same_or_both_nan(std::span<const std::uint16_t> a, std::span<const std::uint16_t> b, std::uint16_t inf) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same_or_both_nan(a[i], b[i], inf)) return false;
  return true;
}

const char* path_name(half_path p) {
  return p == half_path::scalar ? "scalar"
                                : (compress::half_vector_path() ? "avx2+f16c" : "best (scalar here)");
}

// Encodes a batch of float bit patterns through both paths, saturated and not, and compares every result
// with the one-value function; returns the number of patterns that differ (the first one is reported).
struct encode_sweep {
  std::vector<float> in;
  std::vector<std::uint16_t> want, got;
  std::uint64_t checked = 0, wrong = 0;

  // `every_variant`: both paths, saturated and not; else the vector path, unsaturated, only.
  template <class One, class Bulk>
  void run(std::size_t n, One one, Bulk bulk, std::uint16_t inf, std::uint16_t max_finite,
           bool every_variant) {
    want.resize(n);
    got.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      want[i] = one(in[i]);
    for (bool saturate : {false, true})
      for (half_path p : paths) {
        if (!every_variant && (saturate || p == half_path::scalar)) continue;
        // Sanitized, the one-value path's bulk loop is left to the sizes-and-saturation case below: its
        // sweep would only repeat the one-value function it calls.
        if (sanitized && !exhaustive() && p == half_path::scalar) continue;
        const std::size_t first =
            bulk(std::span<const float>(in.data(), n), std::span<std::uint16_t>(got.data(), n), saturate, p);
        std::size_t want_first = n;
        for (std::size_t i = 0; i < n; ++i) {
          std::uint16_t w = want[i];
          if ((w & 0x7fffu) == inf) {
            if (want_first == n) want_first = i;
            if (saturate) w = static_cast<std::uint16_t>((w & 0x8000u) | max_finite);
          }
          if (got[i] != w && wrong++ == 0)
            FAIL_CHECK("pattern 0x" << std::hex << std::bit_cast<std::uint32_t>(in[i]) << ": " << path_name(p)
                                    << " gives 0x" << got[i] << ", the one-value function 0x" << w
                                    << (saturate ? " (saturated)" : ""));
        }
        CHECK(first == want_first);
        checked += n;
      }
  }
};

template <class One, class Bulk>
void sweep_all_floats(One one, Bulk bulk, std::uint16_t inf, std::uint16_t max_finite) {
  encode_sweep s;
  constexpr std::size_t batch = std::size_t{1} << 16;
  s.in.resize(batch);
  std::mt19937 rng(7);
  auto run_hi = [&](std::uint32_t hi, bool every_low, bool every_variant) {
    // Patterns hi << 16 | lo: all 2^16 of lo, or (sanitized) one in 8 of lo's high bytes, at a random offset,
    // with its low 8 bits sampled from the values that decide a rounding (0 exact or a tie, 0x80 / 0x7f /
    // 0xff around a half of the next bit) and one random byte.
    std::size_t n = 0;
    if (every_low) {
      for (std::uint32_t lo = 0; lo < 0x10000; ++lo)
        s.in[n++] = std::bit_cast<float>(hi << 16 | lo);
    } else {
      const std::uint32_t r = rng() & 0xff;
      for (std::uint32_t mid = rng() & 7; mid < 0x100; mid += 8)
        for (std::uint32_t low : {0x00u, 0x7fu, 0x80u, 0xffu, r})
          s.in[n++] = std::bit_cast<float>(hi << 16 | mid << 8 | low);
    }
    s.run(n, one, bulk, inf, max_finite, every_variant);
  };
  const bool all = exhaustive();
  for (std::uint32_t hi = 0; hi < 0x10000; ++hi) {
    // Exponents where fp16's rounding changes form, done exhaustively everywhere, on both paths, saturated
    // and not: float subnormals (0), the ends of fp16's subnormal range (102, 103: the tie at 2^-25 and the
    // smallest subnormal; 112, 113: the largest and the smallest normal), the overflow boundary (142, 143),
    // inf and NaN (255). Every other pattern (exhaustive) checks the vector path, the one that could differ.
    const std::uint32_t e = (hi >> 7) & 0xff;
    const bool boundary =
        e == 0 || e == 102 || e == 103 || e == 112 || e == 113 || e == 142 || e == 143 || e == 255;
    run_hi(hi, all || boundary, boundary || !all);
    if (s.wrong > 0) break;
  }
  MESSAGE(s.checked << " conversions checked (" << std::string(all ? "all 2^32 patterns" : "sampled") << ")");
  CHECK(s.wrong == 0);
}

} // namespace

TEST_CASE("bulk float -> fp16 equals float_to_fp16_bits on every float pattern, both paths") {
  MESSAGE("best path here: " << std::string(path_name(half_path::best)));
  sweep_all_floats([](float f) { return compress::float_to_fp16_bits(f); },
                   [](std::span<const float> in, std::span<std::uint16_t> out, bool sat, half_path p) {
                     return compress::float_to_fp16_bits(in, out, sat, p);
                   },
                   0x7c00, 0x7bff);
}

TEST_CASE("bulk float -> bf16 equals float_to_bf16_bits on every float pattern, both paths") {
  sweep_all_floats([](float f) { return compress::float_to_bf16_bits(f); },
                   [](std::span<const float> in, std::span<std::uint16_t> out, bool sat, half_path p) {
                     return compress::float_to_bf16_bits(in, out, sat, p);
                   },
                   0x7f80, 0x7f7f);
}

TEST_CASE("bulk fp16 and bf16 -> float equal the one-value functions on every 16-bit pattern") {
  std::vector<std::uint16_t> in(0x10000);
  for (std::uint32_t h = 0; h < 0x10000; ++h)
    in[h] = static_cast<std::uint16_t>(h);
  std::vector<float> out(in.size());
  for (half_path p : paths) {
    CAPTURE(std::string(path_name(p)));
    compress::fp16_bits_to_float(in, out, p);
    std::size_t wrong = 0;
    for (std::uint32_t h = 0; h < 0x10000; ++h)
      wrong += std::bit_cast<std::uint32_t>(out[h]) !=
               std::bit_cast<std::uint32_t>(compress::fp16_bits_to_float(static_cast<std::uint16_t>(h)));
    CHECK(wrong == 0);
    compress::bf16_bits_to_float(in, out, p);
    wrong = 0;
    for (std::uint32_t h = 0; h < 0x10000; ++h)
      wrong += std::bit_cast<std::uint32_t>(out[h]) !=
               std::bit_cast<std::uint32_t>(compress::bf16_bits_to_float(static_cast<std::uint16_t>(h)));
    CHECK(wrong == 0);
  }
}

TEST_CASE("the fused ring hop equals encode(decode(partial) + x), both formats, both paths") {
  // Every 16-bit partial sum against x drawn from gradient-like values, special values and exact halves
  // (ties), so sums round, tie, overflow, meet inf and NaN.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            65504.0f,
                            -65504.0f,
                            65519.996f,
                            65520.0f,
                            16.0f,
                            0x1p-24f,
                            0x1p-25f,
                            -0x1p-14f,
                            INFINITY,
                            -INFINITY,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::max()};
  std::vector<std::uint16_t> partial;
  std::vector<float> x;
  for (std::uint32_t h = 0; h < 0x10000; ++h)
    for (int k = 0; k < 6; ++k) {
      partial.push_back(static_cast<std::uint16_t>(h));
      const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 24);
      x.push_back(k < 4 ? normal(rng) * scale : specials[rng() % std::size(specials)]);
    }
  std::vector<std::uint16_t> out(x.size());
  for (bool saturate : {false, true})
    for (half_path p : paths) {
      CAPTURE(saturate);
      CAPTURE(std::string(path_name(p)));
      std::size_t wrong = 0;
      compress::fp16_sum_bits(partial, x, out, saturate, p);
      for (std::size_t i = 0; i < x.size(); ++i) {
        std::uint16_t w = compress::float_to_fp16_bits(compress::fp16_bits_to_float(partial[i]) + x[i]);
        if (saturate && (w & 0x7fffu) == 0x7c00u) w = static_cast<std::uint16_t>((w & 0x8000u) | 0x7bffu);
        wrong += same_or_both_nan(out[i], w, 0x7c00u) ? 0 : 1;
      }
      CHECK(wrong == 0);
      wrong = 0;
      compress::bf16_sum_bits(partial, x, out, saturate, p);
      for (std::size_t i = 0; i < x.size(); ++i) {
        std::uint16_t w = compress::float_to_bf16_bits(compress::bf16_bits_to_float(partial[i]) + x[i]);
        if (saturate && (w & 0x7fffu) == 0x7f80u) w = static_cast<std::uint16_t>((w & 0x8000u) | 0x7f7fu);
        wrong += same_or_both_nan(out[i], w, 0x7f80u) ? 0 : 1;
      }
      CHECK(wrong == 0);
      // In place, as the ring may use it.
      std::vector<std::uint16_t> inplace = partial;
      compress::fp16_sum_bits(inplace, x, inplace, saturate, p);
      compress::fp16_sum_bits(partial, x, out, saturate, p);
      CHECK(inplace == out);
    }
}

TEST_CASE("the ring hop on two 16-bit inputs equals encode(decode(partial) + decode(x)), both formats, both "
          "paths") {
  // Every 16-bit partial sum against x of random bits (every class: subnormals, +-0, inf, NaN, the top of the
  // range), so sums round, tie, overflow, meet inf and NaN; a NaN result need only be NaN (same_or_both_nan).
  std::mt19937 rng(12);
  std::vector<std::uint16_t> partial, x;
  for (std::uint32_t h = 0; h < 0x10000; ++h)
    for (int k = 0; k < 4; ++k) {
      partial.push_back(static_cast<std::uint16_t>(h));
      x.push_back(static_cast<std::uint16_t>(rng()));
    }
  std::vector<std::uint16_t> out(x.size());
  for (bool saturate : {false, true})
    for (half_path p : paths) {
      CAPTURE(saturate);
      CAPTURE(std::string(path_name(p)));
      std::size_t wrong = 0;
      compress::fp16_sum_bits(std::span<const std::uint16_t>(partial), std::span<const std::uint16_t>(x), out,
                              saturate, p);
      for (std::size_t i = 0; i < x.size(); ++i) {
        std::uint16_t w = compress::float_to_fp16_bits(compress::fp16_bits_to_float(partial[i]) +
                                                       compress::fp16_bits_to_float(x[i]));
        if (saturate && (w & 0x7fffu) == 0x7c00u) w = static_cast<std::uint16_t>((w & 0x8000u) | 0x7bffu);
        wrong += same_or_both_nan(out[i], w, 0x7c00u) ? 0 : 1;
      }
      CHECK(wrong == 0);
      wrong = 0;
      compress::bf16_sum_bits(std::span<const std::uint16_t>(partial), std::span<const std::uint16_t>(x), out,
                              saturate, p);
      for (std::size_t i = 0; i < x.size(); ++i) {
        std::uint16_t w = compress::float_to_bf16_bits(compress::bf16_bits_to_float(partial[i]) +
                                                       compress::bf16_bits_to_float(x[i]));
        if (saturate && (w & 0x7fffu) == 0x7f80u) w = static_cast<std::uint16_t>((w & 0x8000u) | 0x7f7fu);
        wrong += same_or_both_nan(out[i], w, 0x7f80u) ? 0 : 1;
      }
      CHECK(wrong == 0);
      // The two paths agree (bit for bit but for which NaN a NaN sum is), and in place (as the ring may call
      // it) bit for bit.
      std::vector<std::uint16_t> scalar(x.size()), inplace = partial;
      compress::fp16_sum_bits(std::span<const std::uint16_t>(partial), std::span<const std::uint16_t>(x), out,
                              saturate, p);
      compress::fp16_sum_bits(std::span<const std::uint16_t>(partial), std::span<const std::uint16_t>(x),
                              scalar, saturate, half_path::scalar);
      CHECK(same_or_both_nan(out, scalar, 0x7c00u));
      compress::fp16_sum_bits(std::span<const std::uint16_t>(inplace), std::span<const std::uint16_t>(x),
                              inplace, saturate, p);
      CHECK(inplace == out);
    }
}

TEST_CASE("bulk conversions: sizes around the vector width, unaligned spans, named values") {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  const float named[] = {-0.0f,
                         0.0f,
                         INFINITY,
                         -INFINITY,
                         std::bit_cast<float>(0x7fc00001u), // quiet NaN with a payload
                         std::bit_cast<float>(0xff800001u), // negative signalling NaN
                         std::bit_cast<float>(0x7fbfe000u), // signalling NaN whose payload fits fp16
                         65519.996f,                        // the largest float that stays finite in fp16
                         65520.0f,                          // the smallest that rounds to inf
                         -65520.0f,
                         65504.0f,
                         0x1p-24f, // the smallest fp16 subnormal
                         0x1p-25f, // a tie: to zero
                         0x1.000002p-25f,
                         0x1.8p-24f,
                         0x1.ffcp-15f, // the largest fp16 subnormal
                         0x1p-14f,
                         std::numeric_limits<float>::denorm_min(),
                         -std::numeric_limits<float>::min(),
                         std::numeric_limits<float>::max()};
  for (std::size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1001, 1 << 20})
    for (std::size_t offset : {0, 1, 3}) {
      CAPTURE(n);
      CAPTURE(offset);
      std::vector<float> store(n + offset);
      for (std::size_t i = 0; i < store.size(); ++i)
        store[i] = i % 5 == 4 ? named[rng() % std::size(named)] : normal(rng);
      const std::span<const float> in(store.data() + offset, n);
      std::vector<std::uint16_t> want16(n), wantb(n), got_store(n + offset);
      const std::span<std::uint16_t> got(got_store.data() + offset, n);
      for (std::size_t i = 0; i < n; ++i) {
        want16[i] = compress::float_to_fp16_bits(in[i]);
        wantb[i] = compress::float_to_bf16_bits(in[i]);
      }
      std::vector<float> back_store(n + offset);
      const std::span<float> back(back_store.data() + offset, n);
      for (half_path p : paths) {
        CAPTURE(std::string(path_name(p)));
        compress::float_to_fp16_bits(in, got, false, p);
        CHECK(std::equal(got.begin(), got.end(), want16.begin()));
        compress::fp16_bits_to_float(got, back, p);
        bool same = true;
        for (std::size_t i = 0; i < n; ++i)
          same = same && std::bit_cast<std::uint32_t>(back[i]) ==
                             std::bit_cast<std::uint32_t>(compress::fp16_bits_to_float(want16[i]));
        CHECK(same);
        compress::float_to_bf16_bits(in, got, false, p);
        CHECK(std::equal(got.begin(), got.end(), wantb.begin()));
        compress::bf16_bits_to_float(got, back, p);
        same = true;
        for (std::size_t i = 0; i < n; ++i)
          same = same && std::bit_cast<std::uint32_t>(back[i]) == std::uint32_t{wantb[i]} << 16;
        CHECK(same);
      }
    }
  // Named values one by one (every lane position of a vector), against the bits they must give.
  for (half_path p : paths)
    for (std::size_t lane = 0; lane < 9; ++lane) {
      CAPTURE(lane);
      std::vector<float> v(17, 1.0f);
      std::vector<std::uint16_t> h(17);
      auto one = [&](float f) {
        v[lane] = f;
        compress::float_to_fp16_bits(v, h, false, p);
        return h[lane];
      };
      CHECK(one(std::bit_cast<float>(0x7fc00001u)) == 0x7e00);
      CHECK(one(std::bit_cast<float>(0xff800001u)) == 0xfe00);
      CHECK(one(std::bit_cast<float>(0x7fbfe000u)) == 0x7e00);
      CHECK(one(65519.996f) == 0x7bff);
      CHECK(one(65520.0f) == 0x7c00);
      CHECK(one(-0.0f) == 0x8000);
      CHECK(one(0x1p-25f) == 0x0000);
      CHECK(one(0x1.000002p-25f) == 0x0001);
      CHECK(one(0x1.8p-24f) == 0x0002);
    }
}

TEST_CASE("bulk encoding reports the first overflow and saturates as asked") {
  for (half_path p : paths) {
    CAPTURE(std::string(path_name(p)));
    std::vector<float> v(40, 1.0f);
    std::vector<std::uint16_t> h(40);
    CHECK(compress::float_to_fp16_bits(v, h, false, p) == 40);
    v[37] = 70000.0f;
    CHECK(compress::float_to_fp16_bits(v, h, false, p) == 37); // in the tail
    v[12] = -65520.0f;
    CHECK(compress::float_to_fp16_bits(v, h, false, p) == 12);
    CHECK(h[12] == 0xfc00);
    CHECK(compress::float_to_fp16_bits(v, h, true, p) == 12);
    CHECK(h[12] == 0xfbff);
    CHECK(h[37] == 0x7bff);
    v[3] = -INFINITY;
    CHECK(compress::float_to_bf16_bits(v, h, true, p) == 3);
    CHECK(h[3] == 0xff7f);
    CHECK(h[12] == 0xc780); // -65520 is finite in bf16
  }
  std::vector<float> v(8);
  std::vector<std::uint16_t> h(7);
  CHECK_THROWS_AS(compress::float_to_fp16_bits(v, h), size_mismatch);
  CHECK_THROWS_AS(compress::fp16_sum_bits(h, v, h), size_mismatch);
}
