// compress::half_reduce_scatter (fp16 and bf16): each rank's part of the sum against a reference that rounds
// every rank's values to the format one at a time (the one-value conversions) and sums them in rank order
// from +0 (random inputs, many seeds, n = 1..5, parts of 0, 1, odd and large sizes, zeros and -0, values
// that round to subnormals and ties), conservation with the residual over rounds, the bytes the meter counts
// against a formula written out here, checkpoints, and the refusals (NaN, inf, overflow, sizes, ranks built
// differently), raised on every rank; clamp sends the largest finite value instead.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/half_reduce_scatter.hpp>

#include "compress_harness.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

float round_trip(float x, bool fp16) {
  return fp16 ? compress::fp16_bits_to_float(compress::float_to_fp16_bits(x))
              : compress::bf16_bits_to_float(compress::float_to_bf16_bits(x));
}

// A gradient as the harness makes it, with values that land on the formats' subnormals and on ties.
std::vector<float> input(std::size_t d, std::uint64_t seed) {
  auto g = harness::gradient(d, seed);
  for (std::size_t i = 5; i < d; i += 11)
    g[i] = std::ldexp(static_cast<float>(i % 7) + 0.5f, -20 - static_cast<int>(i % 9)); // fp16 subnormals
  for (std::size_t i = 7; i < d; i += 13)
    g[i] = 1.0f + std::ldexp(1.0f, -11) * static_cast<float>(1 + 2 * (i % 3)); // fp16 ties at 1.0
  return g;
}

template <class X>
std::string matches_reference(int n, std::size_t part, std::uint64_t seed, bool ef) {
  constexpr bool fp16 = X::name[0] == 'f';
  const std::size_t length = part * static_cast<std::size_t>(n);
  const int rounds = 3;
  std::vector<std::vector<std::vector<float>>> g(static_cast<std::size_t>(rounds));
  for (int t = 0; t < rounds; ++t)
    for (int r = 0; r < n; ++r)
      g[static_cast<std::size_t>(t)].push_back(input(length, seed * 1000 + 10 * t + r));
  std::vector<std::vector<std::vector<float>>> outs(static_cast<std::size_t>(n));
  std::vector<std::vector<comm::traffic>> sent(static_cast<std::size_t>(n));
  std::vector<std::vector<std::uint64_t>> wire(static_cast<std::size_t>(n));
  local_group(n).run([&](local& raw) {
    comm::metered<local> c(raw);
    X x(length, {.error_feedback = ef});
    const auto me = static_cast<std::size_t>(c.rank());
    for (int t = 0; t < rounds; ++t) {
      std::vector<float> out(part, 12345.0f);
      c.reset();
      x.reduce_scatter(c, g[static_cast<std::size_t>(t)][me], out);
      auto tr = c.counters().total();
      tr.calls = 0;
      outs[me].push_back(out);
      sent[me].push_back(tr);
      wire[me].push_back(x.wire_bytes());
    }
  });
  // Without error feedback every round's p is its gradient; with it, the first round's is.
  for (int t = 0; t < (ef ? 1 : rounds); ++t)
    for (int j = 0; j < n; ++j) {
      std::vector<float> want(part, 0.0f);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < part; ++i)
          want[i] += round_trip(g[static_cast<std::size_t>(t)][static_cast<std::size_t>(r)]
                                 [static_cast<std::size_t>(j) * part + i],
                                fp16);
      if (!harness::same_bits(outs[static_cast<std::size_t>(j)][static_cast<std::size_t>(t)], want))
        return "round " + std::to_string(t) + ": rank " + std::to_string(j) +
               "'s part differs from the reference";
    }
  const std::uint64_t peers = static_cast<std::uint64_t>(n - 1);
  const std::uint64_t each = peers * (40 + 2 * part);
  for (int r = 0; r < n; ++r)
    for (int t = 0; t < rounds; ++t) {
      const auto& tr = sent[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
      if (tr.bytes_sent != each || tr.bytes_received != each || tr.messages_sent != 2 * peers)
        return "rank " + std::to_string(r) + " round " + std::to_string(t) + ": the meter counted " +
               std::to_string(tr.bytes_sent) + " bytes in " + std::to_string(tr.messages_sent) +
               " messages, expected " + std::to_string(each) + " in " + std::to_string(2 * peers);
      if (wire[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)] != each)
        return "rank " + std::to_string(r) + ": wire_bytes() != " + std::to_string(each);
    }
  return {};
}

} // namespace

TEST_CASE("each rank's part is every rank's values rounded to 16 bits, summed in rank order from +0") {
  for (int n = 1; n <= 5; ++n)
    for (std::size_t part : {0u, 1u, 3u, 64u, 1001u})
      for (std::uint64_t seed = 1; seed <= 3; ++seed)
        for (bool ef : {true, false}) {
          CAPTURE(n);
          CAPTURE(part);
          CAPTURE(seed);
          CAPTURE(ef);
          const auto a = matches_reference<compress::fp16_reduce_scatter>(n, part, seed, ef);
          CHECK_MESSAGE(a.empty(), "fp16: " << a);
          const auto b = matches_reference<compress::bf16_reduce_scatter>(n, part, seed, ef);
          CHECK_MESSAGE(b.empty(), "bf16: " << b);
        }
}

TEST_CASE("with error feedback, sent + new residual == residual + input, exactly, every rank and round") {
  for (int n : {1, 3, 4}) {
    CAPTURE(n);
    const std::size_t part = 41, length = part * static_cast<std::size_t>(n);
    std::vector<std::string> bad(static_cast<std::size_t>(n));
    local_group(n).run([&](local& c) {
      compress::bf16_reduce_scatter x(length, {.error_feedback = true});
      const auto me = static_cast<std::size_t>(c.rank());
      for (int t = 0; t < 6; ++t) {
        const auto g = input(length, 77 + 10 * static_cast<std::uint64_t>(t) + me);
        std::vector<float> p(length), out(part);
        for (std::size_t i = 0; i < length; ++i) { // as error_feedback adds: (g + e) + r
          const float s = g[i] + x.residual()[i];
          p[i] = x.residual_low()[i] == 0.0f ? s : s + x.residual_low()[i];
        }
        x.reduce_scatter(c, g, out);
        for (std::size_t i = 0; i < length; ++i) {
          const double total =
              static_cast<double>(round_trip(p[i], false)) +
              (static_cast<double>(x.residual()[i]) + static_cast<double>(x.residual_low()[i]));
          if (total != static_cast<double>(p[i]) && bad[me].empty())
            bad[me] = "round " + std::to_string(t) + " index " + std::to_string(i) + ": sent + residual " +
                      std::to_string(total) + " != " + std::to_string(p[i]);
        }
      }
      if (x.steps() != 6) bad[me] += " / steps " + std::to_string(x.steps());
    });
    for (const auto& s : bad)
      CHECK_MESSAGE(s.empty(), s);
  }
}

TEST_CASE("a checkpoint round-trips the residual: a resumed reduce-scatter goes on bit for bit") {
  const int n = 2;
  const std::size_t length = 2 * 30;
  std::vector<std::string> bad(n);
  local_group(n).run([&](local& c) {
    const auto me = static_cast<std::size_t>(c.rank());
    compress::fp16_reduce_scatter x(length, {.error_feedback = true});
    std::vector<float> out(30), again(30);
    for (int t = 0; t < 2; ++t)
      x.reduce_scatter(c, input(length, 5 + t * 10 + me), out);
    std::stringstream saved;
    x.save(saved);
    compress::fp16_reduce_scatter y(length, {.error_feedback = true});
    y.load(saved);
    for (int t = 2; t < 4; ++t) {
      const auto g = input(length, 5 + t * 10 + me);
      x.reduce_scatter(c, g, out);
      y.reduce_scatter(c, g, again);
      if (!harness::same_bits(out, again))
        bad[me] += " / the resumed round " + std::to_string(t) + " differs";
    }
    std::stringstream other;
    x.save(other);
    compress::fp16_reduce_scatter z(length,
                                    {.error_feedback = true, .overflow = compress::half_overflow::clamp});
    try {
      z.load(other);
      bad[me] += " / a state of another overflow policy was taken";
    } catch (const corrupt_data&) {
    }
  });
  for (const auto& s : bad)
    CHECK_MESSAGE(s.empty(), s);
}

TEST_CASE("NaN, inf, an overflow, wrong sizes and ranks built differently raise on every rank") {
  using X = compress::fp16_reduce_scatter;
  const int n = 3;
  harness::every_names(harness::raised(
                           n, [](int) { return X(9); },
                           [](X& x, local& c) {
                             std::vector<float> g(9, 1.0f), out(3);
                             if (c.rank() == 1) g[4] = std::numeric_limits<float>::quiet_NaN();
                             x.reduce_scatter(c, g, out);
                           }),
                       "NaN");
  harness::every_names(harness::raised(
                           n, [](int) { return X(9); },
                           [](X& x, local& c) {
                             std::vector<float> g(9, 1.0f), out(3);
                             if (c.rank() == 2) g[0] = -std::numeric_limits<float>::infinity();
                             x.reduce_scatter(c, g, out);
                           }),
                       "inf");
  harness::every_names(harness::raised(
                           n, [](int) { return X(9); },
                           [](X& x, local& c) {
                             std::vector<float> g(9, 1.0f), out(3);
                             if (c.rank() == 0) g[7] = 70000.0f;
                             x.reduce_scatter(c, g, out);
                           }),
                       "[-65504, 65504] (fp16)");
  harness::every_names(harness::raised(
                           n, [](int) { return X(9); },
                           [](X& x, local& c) {
                             std::vector<float> g(9, 1.0f), out(c.rank() == 2 ? 4 : 3);
                             x.reduce_scatter(c, g, out);
                           }),
                       "argument 'out' has 4 elements, the allowed size is the length over the ranks, 3");
  harness::every_names(harness::raised(
                           n, [](int r) { return X(9, {.error_feedback = r == 1}); },
                           [](X& x, local& c) {
                             std::vector<float> g(9, 1.0f), out(3);
                             x.reduce_scatter(c, g, out);
                           }),
                       "ranks disagree on the compressor's parameters");
  harness::every_names(harness::raised(
                           n, [](int) { return X(10); },
                           [](X& x, local& c) {
                             std::vector<float> g(10, 1.0f), out(3);
                             x.reduce_scatter(c, g, out);
                           }),
                       "does not divide into the 3 ranks");
}

TEST_CASE("clamp sends the largest finite value of the sign; error feedback keeps the excess") {
  local_group(2).run([](local& c) {
    compress::fp16_reduce_scatter x(4, {.error_feedback = true, .overflow = compress::half_overflow::clamp});
    std::vector<float> g{70000.0f, -1e9f, 1.0f, 0.5f}, out(2);
    x.reduce_scatter(c, g, out);
    if (c.rank() == 0) {
      CHECK(out[0] == 2 * 65504.0f);
      CHECK(out[1] == -2 * 65504.0f);
    } else {
      CHECK(out[0] == 2.0f);
      CHECK(out[1] == 1.0f);
    }
    CHECK(x.residual()[0] + x.residual_low()[0] == 70000.0f - 65504.0f);
  });
}

namespace {

using harness::same_bits;

// Rounds of an fp16 or bf16 compressor (the ring's, or the reduce-scatter's) with error feedback against the
// passes its round fused, written out: p = g + e (+ r), d = p rounded to the format (saturated under clamp),
// then error_feedback::commit(p, d). Values far beyond fp16's range make clamp's p - d inexact, so the low
// word is exercised; a refused round (a NaN late in p) changes nothing; a checkpoint in between resumes on the
// same bits. Returns how many low words were not zero.
template <class X, class Format>
std::size_t same_residual_as_the_passes(std::size_t d, std::uint64_t seed, bool clamp) {
  std::size_t lows = 0;
  std::vector<std::string> bad(2);
  local_group(2).run([&](local& c) {
    const auto me = static_cast<std::size_t>(c.rank());
    const compress::half_options o{.error_feedback = true,
                                   .overflow = clamp ? compress::half_overflow::clamp
                                                     : compress::half_overflow::refuse};
    X x(d, o);
    compress::error_feedback ref(d, true);
    std::vector<float> out(d), p(d), dec(d);
    const auto call = [&](X& y, std::span<const float> g) {
      if constexpr (requires { y.reduce_scatter(c, g, std::span<float>(out).first(d / 2)); })
        y.reduce_scatter(c, g, std::span<float>(out).first(d / 2));
      else
        y.reduce(c, g, out);
    };
    for (int round = 0; round < 6; ++round) {
      auto g = input(d, seed + 97 * static_cast<std::uint64_t>(round) + me);
      if (clamp)
        for (std::size_t i = 3; i < d; i += 17)
          g[i] = (i % 2 ? 1.0f : -1.0f) *
                 std::ldexp(1.0f + static_cast<float>(i % 5) / 8.0f, 20 + static_cast<int>(i % 13));
      if (round == 2 && d > 0) {
        auto nan = g;
        nan[d - 1 - (seed % ((d + 1) / 2))] = std::numeric_limits<float>::quiet_NaN();
        try {
          call(x, nan);
          bad[me] = "a NaN was not refused";
        } catch (const non_finite&) {
        }
        if (!same_bits(x.residual(), ref.residual()) || !same_bits(x.residual_low(), ref.residual_low()))
          bad[me] = "a refused round moved the residual";
      }
      if (round == 4) {
        std::stringstream ss;
        x.save(ss);
        X y(d, o);
        y.load(ss);
        x = std::move(y);
      }
      ref.accumulate(g, p);
      for (std::size_t i = 0; i < d; ++i) {
        const float v = clamp ? std::clamp(p[i], -Format::max_finite, Format::max_finite) : p[i];
        dec[i] = Format::decode(Format::encode(v));
      }
      ref.commit(p, dec);
      call(x, g);
      if (!same_bits(x.residual(), ref.residual()) || !same_bits(x.residual_low(), ref.residual_low()))
        if (bad[me].empty()) bad[me] = "round " + std::to_string(round) + ": the residual differs";
      if (me == 0)
        for (float r : ref.residual_low())
          lows += r != 0.0f ? 1u : 0u;
    }
  });
  for (const auto& s : bad)
    CHECK_MESSAGE(s.empty(), s);
  return lows;
}

} // namespace

TEST_CASE("with error feedback, the one-pass round keeps the residual of the passes it fused, bit for bit") {
  // Lengths across the 4,096-value stretches, even (the reduce-scatter's 2 parts).
  std::size_t lows = 0;
  for (std::size_t d : {std::size_t{0}, std::size_t{2}, std::size_t{64}, std::size_t{130}, std::size_t{4096},
                        std::size_t{4098}, std::size_t{12290}})
    for (std::uint64_t seed : {1u, 2u, 3u})
      for (bool clamp : {false, true}) {
        CAPTURE(d);
        CAPTURE(seed);
        CAPTURE(clamp);
        lows +=
            same_residual_as_the_passes<compress::fp16_reduce_scatter, compress::fp16_format>(d, seed, clamp);
        lows +=
            same_residual_as_the_passes<compress::bf16_reduce_scatter, compress::bf16_format>(d, seed, clamp);
        lows += same_residual_as_the_passes<compress::fp16, compress::fp16_format>(d, seed, clamp);
        lows += same_residual_as_the_passes<compress::bf16, compress::bf16_format>(d, seed, clamp);
      }
  CHECK(lows > 0); // clamped values left low words, so their path was taken
}
