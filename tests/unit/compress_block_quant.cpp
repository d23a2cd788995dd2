// compress::int8 and compress::e3m0: the codes on known values, conservation with the residual
// over rounds (sent + new residual == old residual + input, exactly), the same sum on every rank, the bytes
// the meter counts, checkpoints, and DiLoCo with 4-bit pseudo-gradients.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/block_quant.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <support/compressor_ranks.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

// local_sgd with an outer optimizer: local SGD's sync points (PeriodicModelAverager's schedule) with the
// outer step of sync/outer_optimizer.hpp. sync::diloco is DiLoCo's own engine.
template <class C, class X = commsgd::sync::uncompressed>
using outer_local_sgd = commsgd::sync::local_sgd<C, commsgd::sync::all_reduce_exchange<C>, X>;

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

using toy::decoded;

// Conservation, exactly: with p what the compressor added (g + e + r, as error_feedback forms it), the
// decoded message d and the new residual (e', r') hold d + e' + r' == p as real numbers. Double holds e' + r'
// exactly (r' is below half an ulp of e'), and the sum with d is p, a float, so no rounding can hide a loss.
template <class X>
std::string conserves(int seed, std::size_t d, std::size_t block) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  X x(d, {.block_size = block});
  for (int round = 0; round < 6; ++round) {
    std::vector<float> g(d), p(d);
    for (auto& v : g)
      v = (round % 2 ? 0.01f : 1.0f) * u(rng) * u(rng);
    if (d > 2) g[1] = 0.0f, g[2] = -0.0f;
    const auto e = std::vector<float>(x.residual().begin(), x.residual().end());
    const auto r = std::vector<float>(x.residual_low().begin(), x.residual_low().end());
    for (std::size_t i = 0; i < d; ++i) {
      const float s = g[i] + e[i];
      p[i] = r[i] == 0.0f ? s : s + r[i];
    }
    const auto out = decoded(x, g);
    for (std::size_t i = 0; i < d; ++i) {
      const double total = static_cast<double>(out[i]) +
                           (static_cast<double>(x.residual()[i]) + static_cast<double>(x.residual_low()[i]));
      if (total != static_cast<double>(p[i]))
        return "round " + std::to_string(round) + " index " + std::to_string(i) + ": sent + residual " +
               std::to_string(total) + " != " + std::to_string(p[i]);
    }
  }
  return {};
}

} // namespace

TEST_CASE("e3m0 sends the nearest power of two of the block's scale, zero below 2^-7, signs kept") {
  compress::e3m0 x(9, {.block_size = 16, .error_feedback = false});
  const std::vector<float> g{1.0f, 0.5f, 0.3f, -0.1f, 0.0f, -0.0f, 0.004f, -0.74f, 0.76f};
  const auto out = decoded(x, g);
  const std::vector<float> want{1.0f, 0.5f, 0.25f, -0.125f, 0.0f, 0.0f, 0.0f, -0.5f, 1.0f};
  for (std::size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(out[i] == want[i]);
  }
  CHECK(compress::e3m0_code::decode(compress::e3m0_code::encode(-0.0f, 1.0f), 1.0f) == 0.0f);
  CHECK(std::signbit(compress::e3m0_code::decode(compress::e3m0_code::encode(-0.0f, 1.0f), 1.0f)));
  // Each block has its own scale: a block of small values keeps its resolution.
  compress::e3m0 y(4, {.block_size = 2, .error_feedback = false});
  const auto o2 = decoded(y, {8.0f, 2.0f, 0.001f, -0.0005f});
  CHECK(o2 == std::vector<float>{8.0f, 2.0f, 0.001f, -0.0005f});
  CHECK(x.wire_bytes() == 0); // alone in the group: nothing goes out
  CHECK(compress::e3m0::message_bytes(9, 16) == 4 + 5);
}

// e3m0's code written from its definition, by the mantissa: x = m 2^j with m in [0.5, 1); the nearer of
// 2^(j-1) and 2^j (a tie, m = 0.75, to the smaller), clamped to [2^-6, 1], zero below 2^-7.
std::uint32_t e3m0_by_mantissa(float p, float s) {
  const std::uint32_t sign = std::signbit(p) ? 8u : 0u;
  const double x = std::fabs(static_cast<double>(p)) / static_cast<double>(s);
  if (x < 0x1p-7) return sign;
  int j = 0;
  const double m = std::frexp(x, &j);
  if (m > 0.75) ++j;
  --j;
  j = std::clamp(j, -6, 0);
  return sign | static_cast<std::uint32_t>(j + 7);
}

TEST_CASE("e3m0's threshold encoding and table decoding equal the definition, ties and edges included") {
  std::mt19937 rng(27);
  std::vector<float> xs;
  for (int j = -9; j <= 0; ++j)
    for (double m : {0.5, 0.75, 1.0, 1.5})
      for (int ulps : {-2, -1, 0, 1, 2}) {
        float v = static_cast<float>(std::ldexp(m, j));
        for (int u = 0; u < std::abs(ulps); ++u)
          v = std::nextafter(v, ulps < 0 ? 0.0f : 2.0f);
        xs.push_back(v);
        xs.push_back(-v);
      }
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int i = 0; i < 200000; ++i)
    xs.push_back(u(rng) * std::ldexp(1.0f, -static_cast<int>(rng() % 10)));
  xs.push_back(0.0f);
  xs.push_back(-0.0f);
  xs.push_back(std::numeric_limits<float>::denorm_min());
  for (float s : {1.0f, 3.0f, 0.37f, 1e-30f, 1e30f})
    for (float x : xs) {
      const float p = std::clamp(x * s, -s, s);
      const auto code = compress::e3m0_code::encode(p, s);
      REQUIRE(code == e3m0_by_mantissa(p, s));
      const auto t = compress::e3m0_code::table(s);
      const float a = t[code], b = compress::e3m0_code::decode(code, s);
      REQUIRE(std::memcmp(&a, &b, sizeof a) == 0);
    }
}

TEST_CASE("int8 rounds 127 p / s to nearest, ties to even, per block") {
  compress::int8 x(5, {.block_size = 5, .error_feedback = false});
  const std::vector<float> g{1.27f, 0.635f, -1.27f, 0.0f, 0.004f};
  const auto out = decoded(x, g);
  // s = 1.27: codes 127, 63.5 -> 64 (even), -127, 0, 0.4 -> 0.
  CHECK(out[0] == static_cast<float>(127.0 * 1.27f / 127.0));
  CHECK(out[1] == static_cast<float>(64.0 * static_cast<double>(1.27f) / 127.0));
  CHECK(out[2] == -out[0]);
  CHECK(out[3] == 0.0f);
  CHECK(out[4] == 0.0f);
  CHECK(compress::int8::message_bytes(1000, 256) == 16 + 1000);
}

TEST_CASE("int8 and e3m0 conserve every value with their residual, round after round") {
  for (std::size_t d : {0u, 1u, 2u, 7u, 257u})
    for (std::size_t block : {1u, 3u, 256u})
      for (int seed = 0; seed < 5; ++seed) {
        CAPTURE(d);
        CAPTURE(block);
        CAPTURE(seed);
        const auto a = conserves<compress::int8>(seed, d, block);
        CHECK_MESSAGE(a.empty(), "int8: " << a);
        const auto b = conserves<compress::e3m0>(seed, d, block);
        CHECK_MESSAGE(b.empty(), "e3m0: " << b);
      }
}

TEST_CASE("every rank holds the same sum in float; the meter counts the verdict and the messages") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    const std::size_t d = 300, block = 64;
    auto [sums, mine, sent, wire] =
        toy::reduce_on_ranks(n, d, [&] { return compress::e3m0(d, {.block_size = block}); });
    std::vector<float> want(d, 0.0f);
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < d; ++i)
        want[i] += mine[static_cast<std::size_t>(r)][i];
    const auto per_peer = 40 + compress::e3m0::message_bytes(d, block); // 5 blocks of scales, 150 code bytes
    for (int r = 0; r < n; ++r) {
      const auto ri = static_cast<std::size_t>(r);
      CHECK(std::memcmp(sums[ri].data(), want.data(), d * sizeof(float)) == 0);
      CHECK(sent[ri] == per_peer * static_cast<std::uint64_t>(n - 1));
      CHECK(wire[ri] == sent[ri]);
    }
  }
}

TEST_CASE("int8 and e3m0 checkpoints round-trip the residual; other block sizes are refused") {
  compress::e3m0 x(37, {.block_size = 8});
  std::vector<float> g(37);
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = 0.1f * static_cast<float>(i % 5) - 0.17f;
  decoded(x, g);
  std::stringstream s;
  x.save(s);
  compress::e3m0 y(37, {.block_size = 8});
  y.load(s);
  CHECK(std::memcmp(x.residual().data(), y.residual().data(), 37 * sizeof(float)) == 0);
  CHECK(y.steps() == 1);
  CHECK(decoded(x, g) == decoded(y, g));
  std::stringstream again;
  x.save(again);
  compress::e3m0 z(37, {.block_size = 9});
  CHECK_THROWS_AS(z.load(again), corrupt_data);
  CHECK_THROWS_WITH_AS(compress::int8(4, {.block_size = 0}),
                       doctest::Contains("'block_size' = 0 is outside the allowed range [1, inf)"),
                       invalid_argument);
}

TEST_CASE("DiLoCo with 4-bit and int8 pseudo-gradients trains, and the meter counts their messages") {
  const toy::least_squares prob({.samples = 512, .dim = 64, .seed = 9});
  auto run = [&](auto make) {
    double loss = 0;
    std::uint64_t bytes = 0;
    local_group(4).run([&](local& base) {
      comm::metered c(base);
      auto s = make(c);
      std::vector<float> x(prob.dim(), 0.0f), g(prob.dim());
      s.start(x);
      const auto after_start = c.counters().total().bytes_sent;
      for (int t = 0; t < 200; ++t) {
        const auto rows = prob.batch(c.rank(), 4, t, 8);
        prob.gradient(x, rows, g);
        s.step(x, g);
      }
      if (c.rank() == 0) {
        loss = prob.loss(x);
        bytes = c.counters().total().bytes_sent - after_start;
      }
    });
    return std::pair{loss, bytes};
  };
  using M = comm::metered<local>;
  const sync::local_sgd_options o{.lr = 0.1f, .period = 10, .outer = {.lr = 0.7f, .momentum = 0.5f}};
  const auto [l32, b32] = run([&](M& c) { return outer_local_sgd<M>(c, o); });
  const auto [l4, b4] = run([&](M& c) {
    return outer_local_sgd<M, compress::e3m0>(c, o, compress::e3m0(prob.dim(), {.block_size = 64}));
  });
  const auto [l8, b8] = run([&](M& c) {
    return outer_local_sgd<M, compress::int8>(c, o, compress::int8(prob.dim(), {.block_size = 64}));
  });
  const double start = prob.loss(std::vector<float>(prob.dim(), 0.0f));
  CAPTURE(start);
  CAPTURE(l32);
  CAPTURE(l4);
  CAPTURE(l8);
  CHECK(l32 < 0.05 * start);
  CHECK(l4 < 0.1 * start);
  CHECK(l8 < 0.1 * start);
  // 20 rounds of 64 values: a float all-reduce against gathers of 4-bit and 8-bit messages.
  CHECK(b4 == 20u * 3u * (40u + compress::e3m0::message_bytes(64, 64)));
  CHECK(b8 == 20u * 3u * (40u + compress::int8::message_bytes(64, 64)));
  CHECK(b4 < b32);
}
