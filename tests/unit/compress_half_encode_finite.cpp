// The one-pass encoding of a difference (compress/half_convert.hpp's fp16_encode_finite and
// bf16_encode_finite) and the stretches of compress/half.hpp that use it: against the one-value functions and
// the test-then-encode formulas, bit for bit, on random inputs with ties, +-0, subnormals, values at the
// overflow boundary, NaN and inf, a difference and a plain span alike, both paths.
#include <commsgd/compress/half.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace commsgd;
using compress::half_path;

namespace {

constexpr half_path paths[] = {half_path::best, half_path::scalar};
constexpr std::size_t sizes[] = {0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 127, 200, 4096, 4099};

// A float drawn to exercise 16-bit rounding: gradient-like values at several scales, exact ties of both
// formats' rounding (the dropped bits exactly half an ulp), +-0, float and fp16 subnormals, values around
// fp16's and bf16's overflow boundaries (only when `wild`), and (with probability `special`) NaN or inf.
float draw(std::mt19937& rng, double special, bool wild) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float sign = u(rng) < 0.5 ? -1.0f : 1.0f;
  if (u(rng) < special)
    return u(rng) < 0.5 ? std::numeric_limits<float>::quiet_NaN()
                        : sign * std::numeric_limits<float>::infinity();
  const auto kind = rng() % 9;
  switch (wild || (kind != 4 && kind != 5) ? kind : 8) {
  case 0:
    return sign * 0.0f;
  case 1: // a float subnormal
    return std::bit_cast<float>(
        static_cast<std::uint32_t>((rng() & 0x7fffffu) | (sign < 0 ? 0x80000000u : 0u)));
  case 2: // around fp16's subnormals and smallest normals
    return sign * std::ldexp(1.0f + static_cast<float>(u(rng)), -static_cast<int>(12 + rng() % 16));
  case 3: { // a tie of fp16's rounding (13 dropped bits 0x1000) or of bf16's (16 dropped bits 0x8000)
    const auto hi =
        static_cast<std::uint32_t>((0x38800000u + (rng() % (wild ? 0x0f000000u : 0x0e800000u))) & ~0x1fffu);
    return std::bit_cast<float>(hi | (rng() % 2 ? 0x1000u : 0x8000u) | (sign < 0 ? 0x80000000u : 0u));
  }
  case 4: // around fp16's largest finite value and its overflow (65520)
    return sign * (65504.0f + static_cast<float>(u(rng) * 32.0));
  case 5: // near the top of the float range: bf16 rounds some of them to inf
    return sign * std::bit_cast<float>(static_cast<std::uint32_t>(0x7f7f0000u | (rng() & 0xffffu)));
  default:
    return normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
  }
}

struct format_case {
  const char* name;
  std::uint16_t inf;
  std::uint16_t (*one)(float);
  bool (*bulk)(const float*, const float*, std::uint16_t*, std::size_t, half_path);
};

const format_case formats[] = {
    {"fp16", 0x7c00, [](float f) { return compress::float_to_fp16_bits(f); },
     [](const float* a, const float* b, std::uint16_t* o, std::size_t n, half_path p) {
       return compress::fp16_encode_finite(a, b, o, n, p);
     }},
    {"bf16", 0x7f80, [](float f) { return compress::float_to_bf16_bits(f); },
     [](const float* a, const float* b, std::uint16_t* o, std::size_t n, half_path p) {
       return compress::bf16_encode_finite(a, b, o, n, p);
     }},
};

} // namespace

TEST_CASE("encode_finite: the one-value encoding of a - b where every result is finite, false otherwise") {
  std::mt19937 rng(2026);
  std::uint64_t checked = 0, finite_calls = 0, refused_calls = 0;
  for (const auto& f : formats)
    for (std::size_t n : sizes)
      for (double special : {0.0, 0.002, 0.05})
        for (int seed = 0; seed < 12; ++seed)
          for (bool with_b : {false, true}) {
            // Offsets 0 and 1 into the buffers, so that the vector path also meets unaligned operands.
            const std::size_t off = static_cast<std::size_t>(seed % 2);
            std::vector<float> a(n + off), b(n + off);
            for (std::size_t i = 0; i < n; ++i) {
              a[off + i] = draw(rng, special, seed % 2 == 1);
              // b: a second draw, or +-0, or a value a differs from by one of its ulps
              const auto pick = rng() % 4;
              b[off + i] = pick == 0   ? draw(rng, special, seed % 2 == 1)
                           : pick == 1 ? (rng() % 2 ? 0.0f : -0.0f)
                                       : std::nextafter(a[off + i], 0.0f) * (pick == 2 ? 1.0f : -1.0f);
            }
            // Sometimes one overflow alone, at a random place (the vector body or the tail).
            if (n > 0 && special == 0.0 && seed % 3 == 0) {
              const std::size_t at = rng() % n;
              a[off + at] = f.inf == 0x7c00 ? 60000.0f : 3.0e38f;
              b[off + at] = -a[off + at];
            }
            std::vector<std::uint16_t> want(n);
            bool all_finite = true;
            for (std::size_t i = 0; i < n; ++i) {
              const float p = with_b ? a[off + i] - b[off + i] : a[off + i];
              want[i] = f.one(p);
              all_finite = all_finite && (want[i] & 0x7fffu) < f.inf;
            }
            for (half_path path : paths) {
              CAPTURE(std::string(f.name));
              CAPTURE(n);
              CAPTURE(with_b);
              CAPTURE(special);
              CAPTURE(seed);
              CAPTURE(path == half_path::best ? "best" : "scalar");
              std::vector<std::uint16_t> got(n + off, 0x5555);
              const bool finite =
                  f.bulk(a.data() + off, with_b ? b.data() + off : nullptr, got.data() + off, n, path);
              REQUIRE(finite == all_finite);
              if (finite) {
                std::size_t wrong = 0, first = n;
                for (std::size_t i = 0; i < n; ++i)
                  if (got[off + i] != want[i] && wrong++ == 0) first = i;
                CAPTURE(first);
                CHECK(wrong == 0);
                ++finite_calls;
              } else {
                ++refused_calls;
              }
              if (off) CHECK(got[0] == 0x5555); // nothing written before out
              checked += n;
            }
          }
  MESSAGE(checked << " values checked; " << finite_calls << " calls all finite, " << refused_calls
                  << " refused");
  CHECK(finite_calls > 0);
  CHECK(refused_calls > 0);
}

namespace {

// The stretches' verdict and message by the formulas they replace: p formed whole, tested for NaN and inf
// (all of them counted, the first named), else encoded with the first overflow named (none with clamp).
template <class Format>
compress::detail::input_verdict reference(const std::vector<float>& p, bool clamp,
                                          std::vector<std::uint16_t>& msg) {
  std::size_t bad = 0, first_bad = 0;
  for (std::size_t i = 0; i < p.size(); ++i)
    if (!std::isfinite(p[i]) && bad++ == 0) first_bad = i;
  if (bad > 0) return {compress::detail::input_problem::non_finite, bad, first_bad, 0};
  msg.resize(p.size());
  const std::size_t over = Format::encode_n(p, msg, clamp);
  if (!clamp && over < p.size()) return {compress::detail::input_problem::overflow, 1, over, p[over]};
  return {};
}

template <class Format>
void check_stretches(const char* name, float big) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  int cases = 0, refused = 0;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4096},
                        std::size_t{4097}, std::size_t{3 * 4096 + 5}})
    for (int plan = 0; plan < 7; ++plan)
      for (bool clamp : {false, true}) {
        std::vector<float> a(n), b(n), p(n);
        for (std::size_t i = 0; i < n; ++i) {
          a[i] = u(rng);
          b[i] = u(rng);
        }
        // plan 0: clean; 1: one NaN; 2: inf and NaN in different stretches; 3: an overflow; 4: an overflow,
        // then a NaN in a later stretch (the NaN outranks it); 5: overflows in two stretches; 6: a NaN in
        // the last value.
        auto at = [&](std::size_t k) { return n == 0 ? 0 : (k * 4096 + rng() % 4096) % n; };
        const float nan = std::numeric_limits<float>::quiet_NaN(),
                    inf = std::numeric_limits<float>::infinity();
        if (n > 0) {
          if (plan == 1) a[at(1)] = nan;
          if (plan == 2) {
            b[at(0)] = inf;
            a[at(2)] = nan;
          }
          if (plan == 3 || plan == 4 || plan == 5) {
            const std::size_t k = at(0);
            a[k] = big;
            b[k] = -big;
          }
          if (plan == 4) b[at(2)] = nan;
          if (plan == 5) {
            const std::size_t k = at(2);
            a[k] = -big;
            b[k] = big;
          }
          if (plan == 6) a[n - 1] = -nan;
        }
        for (std::size_t i = 0; i < n; ++i)
          p[i] = a[i] - b[i];
        std::vector<std::uint16_t> want_msg;
        const auto want = reference<Format>(p, clamp, want_msg);
        for (bool as_difference : {true, false}) {
          CAPTURE(name);
          CAPTURE(n);
          CAPTURE(plan);
          CAPTURE(clamp);
          CAPTURE(as_difference);
          std::vector<std::uint16_t> msg(n);
          const auto got = compress::detail::encode_stretches<Format>(
              n, clamp, msg,
              [&](std::size_t i, std::size_t m) {
                return as_difference
                           ? compress::difference(std::span<const float>(a).subspan(i, m), b.data() + i)
                           : compress::difference(std::span<const float>(p).subspan(i, m));
              },
              [](std::size_t, std::size_t) {});
          CHECK(got.problem == want.problem);
          CHECK(got.count == want.count);
          CHECK(got.where == want.where);
          CHECK(std::bit_cast<std::uint64_t>(got.value) == std::bit_cast<std::uint64_t>(want.value));
          if (want.problem == compress::detail::input_problem::none) CHECK(msg == want_msg);
          ++cases;
          refused += want.problem != compress::detail::input_problem::none;
        }
      }
  CHECK(cases > 0);
  CHECK(refused > 0);
}

} // namespace

TEST_CASE(
    "encode_stretches: a difference and its formed span give the test-then-encode verdict and message") {
  check_stretches<compress::fp16_format>("fp16", 40000.0f);
  check_stretches<compress::bf16_format>("bf16", 3.0e38f);
}
