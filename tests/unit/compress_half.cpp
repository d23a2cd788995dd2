// fp16 / bf16: the conversions against an independent reference (scaling by powers of two and rounding in
// double, ties to even) over every exponent of both signs with every low-bit pattern that decides the
// rounding, every 16-bit pattern back and forth, and the compressors' contract.
#include "compress_harness.hpp"
#include "support/narrow_ring_cases.hpp"

#include <commsgd/compress/half.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace commsgd;

namespace {

// Rounds |x| to a float format with `frac` fraction bits, smallest normal exponent `emin`, largest `emax`,
// in double (exact: scaling by powers of two, then one rint to nearest even), and encodes the result.
std::uint16_t reference(float x, int frac, int emin, int emax, int bias) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const std::uint16_t inf = static_cast<std::uint16_t>((2 * bias + 1) << frac);
  if (std::isnan(x)) return 0;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return sign | inf;
  const int e = a == 0 ? emin : std::max(emin, std::ilogb(a));
  const double q = std::ldexp(1.0, e - frac);
  const double r = std::rint(a / q) * q;
  if (r >= std::ldexp(1.0, emax + 1)) return sign | inf;
  if (r < std::ldexp(1.0, emin))
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(r / std::ldexp(1.0, emin - frac)));
  const int er = std::ilogb(r);
  const auto m = static_cast<std::uint32_t>(r / std::ldexp(1.0, er - frac)) - (1u << frac);
  return static_cast<std::uint16_t>(sign | ((er + bias) << frac) | m);
}
std::uint16_t ref_fp16(float x) {
  return reference(x, 10, -14, 15, 15);
}
std::uint16_t ref_bf16(float x) {
  return reference(x, 7, -126, 127, 127);
}

// Calls f on both signs of every exponent, under a few choices of the bits above the low `low` bits (zero,
// all ones, random: both parities of the last kept bit), with the low patterns that decide the rounding
// (zero, just below, at and above the tie, all ones) and random ones, then on random patterns.
template <class F>
void for_float_sample(unsigned low, F&& f) {
  std::mt19937 rng(12345);
  const std::uint32_t low_mask = (1u << low) - 1;
  const std::uint32_t high_mask = 0x7fffffu & ~low_mask;
  const std::uint32_t tie = 1u << (low - 1);
  auto pick = [&](std::uint32_t mask) { return static_cast<std::uint32_t>(rng()) & mask; };
  for (std::uint32_t s = 0; s < 2; ++s)
    for (std::uint32_t e = 0; e < 256; ++e)
      for (const std::uint32_t h : {std::uint32_t{0}, high_mask, pick(high_mask), pick(high_mask)}) {
        for (const std::uint32_t l :
             {0u, 1u, 2u, tie - 2, tie - 1, tie, tie + 1, tie + 2, low_mask - 1, low_mask})
          f(std::bit_cast<float>((s << 31) | (e << 23) | h | l));
        for (int i = 0; i < 24; ++i)
          f(std::bit_cast<float>((s << 31) | (e << 23) | h | pick(low_mask)));
      }
  for (int i = 0; i < (1 << 18); ++i)
    f(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
}

} // namespace

TEST_CASE("fp16 rounding equals the reference for every finite float class") {
  REQUIRE(std::fegetround() == FE_TONEAREST);
  std::size_t checked = 0, mismatched = 0;
  for_float_sample(13, [&](float x) {
    const auto got = compress::float_to_fp16_bits(x);
    if (std::isnan(x)) {
      mismatched += !((got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0 && (got >> 15) == std::signbit(x));
      return;
    }
    ++checked;
    if (got != ref_fp16(x) && mismatched++ < 5)
      FAIL_CHECK("x = " << x << " got " << got << " ref " << ref_fp16(x));
#ifdef __FLT16_MAX__
    // The compiler's own conversion, a second independent reference.
    const _Float16 h = static_cast<_Float16>(x);
    if (got != std::bit_cast<std::uint16_t>(h) && mismatched++ < 5)
      FAIL_CHECK("_Float16 differs at x = " << x);
#endif
  });
  CHECK(mismatched == 0);
  CHECK(checked > 300'000);
  // The classes by name: the overflow boundary, the smallest subnormal and its tie, the normal boundary.
  CHECK(compress::float_to_fp16_bits(65504.0f) == 0x7bff);
  CHECK(compress::float_to_fp16_bits(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  CHECK(compress::float_to_fp16_bits(65520.0f) == 0x7c00);
  CHECK(compress::float_to_fp16_bits(-65520.0f) == 0xfc00);
  CHECK(compress::float_to_fp16_bits(0x1p-24f) == 0x0001);
  CHECK(compress::float_to_fp16_bits(0x1p-25f) == 0x0000);
  CHECK(compress::float_to_fp16_bits(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(compress::float_to_fp16_bits(0x1.8p-24f) == 0x0002);
  CHECK(compress::float_to_fp16_bits(0x1p-14f) == 0x0400);
  CHECK(compress::float_to_fp16_bits(-0.0f) == 0x8000);
  CHECK(compress::float_to_fp16_bits(std::numeric_limits<float>::denorm_min()) == 0);
}

TEST_CASE("bf16 rounding equals the reference for every finite float class") {
  std::size_t mismatched = 0;
  for_float_sample(16, [&](float x) {
    const auto got = compress::float_to_bf16_bits(x);
    if (std::isnan(x)) {
      mismatched += !((got & 0x7f80) == 0x7f80 && (got & 0x7f) != 0 && (got >> 15) == std::signbit(x));
      return;
    }
    if (got != ref_bf16(x) && mismatched++ < 5)
      FAIL_CHECK("x = " << x << " got " << got << " ref " << ref_bf16(x));
  });
  CHECK(mismatched == 0);
  CHECK(compress::float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(compress::float_to_bf16_bits(0x1.fep127f) == 0x7f7f);
  CHECK(compress::float_to_bf16_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(compress::float_to_bf16_bits(0x1p-133f) == 0x0001);
  CHECK(compress::float_to_bf16_bits(0x1p-134f) == 0x0000);
  CHECK(compress::float_to_bf16_bits(0x1.8p-134f) == 0x0001);
}

TEST_CASE("every 16-bit pattern decodes exactly and encodes back to itself") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float f = compress::fp16_bits_to_float(b);
    const float g = compress::bf16_bits_to_float(b);
    const bool f_nan = (b & 0x7c00) == 0x7c00 && (b & 0x3ff) != 0;
    const bool g_nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    CHECK(std::isnan(f) == f_nan);
    CHECK(std::isnan(g) == g_nan);
    if (!f_nan) {
      CHECK(compress::float_to_fp16_bits(f) == b);
      // The value, computed another way: (-1)^s 2^(e - 15) (1 + m / 1024), or m 2^-24 for e = 0.
      const int e = (b >> 10) & 0x1f, m = b & 0x3ff;
      const double v = e == 31  ? INFINITY
                       : e == 0 ? std::ldexp(m, -24)
                                : std::ldexp(1.0 + m / 1024.0, e - 15);
      CHECK(static_cast<double>(std::fabs(f)) == v);
      CHECK(std::signbit(f) == ((b >> 15) != 0));
    }
    if (!g_nan) CHECK(compress::float_to_bf16_bits(g) == b);
  }
}

namespace {

template <class X>
void check_half_round(int n, std::size_t d, bool ef) {
  CAPTURE(n);
  CAPTURE(d);
  CAPTURE(ef);
  auto grad = [&](int r, int t) {
    return harness::gradient(d, static_cast<std::uint64_t>(r * 1000 + t + 1));
  };
  auto logs = harness::run(
      n, 3, [&](int) { return X(d, {.error_feedback = ef}); }, grad, d);
  // Reference without error feedback: each rank's rounded values summed in ring order (comm/narrow_ring.hpp).
  for (int t = 0; t < 3; ++t) {
    std::vector<std::vector<float>> rounded;
    for (int r = 0; r < n; ++r) {
      auto g = grad(r, t);
      for (auto& x : g)
        x = X::format::decode(X::format::encode(x));
      rounded.push_back(std::move(g));
    }
    const auto want = ef ? std::vector<float>{} : narrow_ring_cases::reference<typename X::format>(rounded);
    for (int r = 0; r < n; ++r) {
      const auto& log = logs[static_cast<std::size_t>(r)];
      CHECK(harness::same_bits(log.outs[static_cast<std::size_t>(t)],
                               logs[0].outs[static_cast<std::size_t>(t)]));
      if (!ef) CHECK(harness::same_bits(log.outs[static_cast<std::size_t>(t)], want));
      const auto model = cost::half_traffic(d, n, r, t == 0);
      CHECK(log.sent[static_cast<std::size_t>(t)] == model);
      CHECK(log.wire[static_cast<std::size_t>(t)] == model.bytes_sent);
    }
  }
}

} // namespace

TEST_CASE("fp16 and bf16 sum the rounded values of every rank, same bits everywhere, bytes as modelled") {
  for (int n = 1; n <= 4; ++n)
    for (std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{77}, std::size_t{4096}})
      for (bool ef : {false, true}) {
        check_half_round<compress::fp16>(n, d, ef);
        check_half_round<compress::bf16>(n, d, ef);
      }
}

TEST_CASE("fp16 error feedback: decoded + residual reproduces p exactly") {
  const std::size_t d = 5000;
  comm::local_group(1).run([&](comm::local& c) {
    compress::fp16 x(d, {.error_feedback = true});
    std::vector<float> out(d), e_before(d, 0.0f);
    for (int t = 0; t < 4; ++t) {
      auto g = harness::gradient(d, static_cast<std::uint64_t>(t + 7));
      g[0] = 1e-30f; // below fp16's smallest subnormal: all of it stays in the residual
      g[1] = 1234.567f;
      x.reduce(c, g, out);
      const auto e = x.residual();
      for (std::size_t i = 0; i < d; ++i) {
        const float p = g[i] + e_before[i];
        const float decoded = compress::fp16_bits_to_float(compress::float_to_fp16_bits(p));
        CHECK(decoded == out[i]); // one rank: the sum is its own decoded value
        CHECK(static_cast<double>(decoded) + static_cast<double>(e[i]) == static_cast<double>(p));
        CHECK(std::bit_cast<std::uint32_t>(e[i]) == std::bit_cast<std::uint32_t>(p - decoded));
      }
      e_before.assign(e.begin(), e.end());
    }
  });
}

TEST_CASE("fp16 refuses overflow on every rank by default, or clamps it as asked") {
  const std::size_t d = 10;
  for (int n : {1, 3}) {
    auto msgs = harness::errors_on_every_rank<invalid_argument>(
        n, [&](int) { return compress::fp16(d); },
        [&](int r, std::vector<float>& g, std::vector<float>& out) {
          g.assign(d, 1.0f);
          out.assign(d, 0.0f);
          if (r == n - 1) g[4] = 70000.0f;
        });
    for (const auto& m : msgs) {
      CHECK(m.find("70000") != std::string::npos);
      CHECK(m.find("index 4") != std::string::npos);
      CHECK(m.find("65504") != std::string::npos);
    }
  }
  comm::local_group(1).run([&](comm::local& c) {
    compress::fp16 x(3, {.error_feedback = true, .overflow = compress::half_overflow::clamp});
    const std::vector<float> g{70000.0f, -1e20f, 1.0f};
    std::vector<float> out(3);
    x.reduce(c, g, out);
    CHECK(out[0] == 65504.0f);
    CHECK(out[1] == -65504.0f);
    CHECK(x.residual()[0] == 70000.0f - 65504.0f);
  });
}

TEST_CASE("fp16 and bf16 refuse NaN, inf and wrong sizes on every rank") {
  const std::size_t d = 9;
  for (int n : {1, 2, 4}) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      auto msgs = harness::errors_on_every_rank<non_finite>(
          n, [&](int) { return compress::bf16(d); },
          [&](int r, std::vector<float>& g, std::vector<float>& out) {
            g.assign(d, 1.0f);
            out.assign(d, 0.0f);
            if (r == 0) g[2] = bad;
          });
      for (const auto& m : msgs)
        CHECK(m.find("index 2") != std::string::npos);
    }
    auto msgs = harness::errors_on_every_rank<size_mismatch>(
        n, [&](int) { return compress::fp16(d); },
        [&](int r, std::vector<float>& g, std::vector<float>& out) {
          g.assign(r == n - 1 ? d + 1 : d, 1.0f);
          out.assign(d, 0.0f);
        });
    for (const auto& m : msgs)
      CHECK(m.find("'gradient' has 10 elements") != std::string::npos);
  }
}

TEST_CASE("fp16 and bf16 state continues bit-identically after save and load") {
  const std::size_t d = 300;
  auto grad = [&](int, int t) { return harness::gradient(d, static_cast<std::uint64_t>(t + 40)); };
  const std::string foreign = harness::saved(compress::bf16(d, {.error_feedback = true}));
  harness::check_save_load([&](int) { return compress::fp16(d, {.error_feedback = true}); }, grad, d,
                           foreign);
  harness::check_save_load([&](int) { return compress::bf16(d, {.error_feedback = true}); }, grad, d,
                           harness::saved(compress::fp16(d, {.error_feedback = true})));
  // A state without a residual does not load into one that keeps one.
  harness::check_save_load([&](int) { return compress::bf16(d, {.error_feedback = true}); }, grad, d,
                           harness::saved(compress::bf16(d)));
}

TEST_CASE("fp16 and bf16 find a bad value anywhere: in the blocks of 64 the scans take and in their tail") {
  // The input scan and the ring's count of the sum go 64 values at a time, then the rest: every place a block
  // can hold the bad value, with and without error feedback (two different input paths), in place (out = g)
  // too.
  for (std::size_t d : {std::size_t{63}, std::size_t{64}, std::size_t{65}, std::size_t{130}, std::size_t{1000}})
    for (std::size_t at : {std::size_t{0}, std::size_t{63}, std::size_t{64}, d - 1}) {
      if (at >= d) continue;
      for (float bad : {NAN, INFINITY, -INFINITY})
        for (bool ef : {false, true}) {
          CAPTURE(d);
          CAPTURE(at);
          CAPTURE(bad);
          CAPTURE(ef);
          auto input = [&](int r, std::vector<float>& g, std::vector<float>& out) {
            g.assign(d, 0.5f);
            out.assign(d, 0.0f);
            if (r == 1) g[at] = bad;
          };
          const auto index = "index " + std::to_string(at);
          auto fp = harness::errors_on_every_rank<non_finite>(
              3, [&](int) { return compress::fp16(d, {.error_feedback = ef}); }, input);
          auto bf = harness::errors_on_every_rank<non_finite>(
              3, [&](int) { return compress::bf16(d, {.error_feedback = ef}); }, input);
          for (const auto* msgs : {&fp, &bf}) {
            CHECK((*msgs)[1].find(index) != std::string::npos); // the rank that holds it says where
            CHECK((*msgs)[0].find("non-finite") != std::string::npos);
            CHECK((*msgs)[2].find("non-finite") != std::string::npos);
          }
        }
      // A sum that overflows where no input does (the ranks' 40000 make 80000 or more > 65504): every rank
      // refuses it, found by the ring's count on the rank that finishes that chunk and told to the others,
      // with the same count and index everywhere.
      for (int n : {2, 3}) {
        CAPTURE(n);
        auto msgs = harness::errors_on_every_rank<non_finite>(
            n, [&](int) { return compress::fp16(d); },
            [&](int, std::vector<float>& g, std::vector<float>& out) {
              g.assign(d, 0.25f);
              g[at] = 40000.0f;
              out = g;
            });
        for (const auto& m : msgs) {
          CHECK(m.find("the 16-bit sum") != std::string::npos);
          CHECK(m.find("index " + std::to_string(at)) != std::string::npos);
          CHECK(m == msgs[0]);
        }
      }
    }
}
