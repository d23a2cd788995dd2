// sign (EF-SignSGD) and qsgd: what every rank decodes, the error-feedback identity bit for bit, QSGD's
// unbiasedness within a stated bound, bytes equal cost/compress.hpp, bad arguments refused on every rank,
// state round-trips.
#include "compress_harness.hpp"

#include <commsgd/compress/qsgd.hpp>
#include <commsgd/compress/sign.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

using namespace commsgd;

namespace {

// The sign message, decoded the long way: per layer the mean |p| in double, rounded once; the sign bit.
std::vector<float> sign_reference(std::span<const float> p, const std::vector<std::size_t>& bounds) {
  std::vector<float> d(p.size());
  for (std::size_t l = 0; l + 1 < bounds.size(); ++l) {
    double sum = 0;
    for (std::size_t i = bounds[l]; i < bounds[l + 1]; ++i)
      sum += std::fabs(static_cast<double>(p[i]));
    const std::size_t size = bounds[l + 1] - bounds[l];
    const float scale = size ? static_cast<float>(sum / static_cast<double>(size)) : 0.0f;
    for (std::size_t i = bounds[l]; i < bounds[l + 1]; ++i)
      d[i] = std::signbit(p[i]) ? -scale : scale;
  }
  return d;
}

// The error-feedback identity on one rank: e' == fl(p - d) bit for bit with d what the round summed, and
// d + e' + r' == p exactly (r' the residual's low part), checked in 113-bit arithmetic, where the sum of
// these four floats is exact whenever their exponents lie within 113 bits of each other (true of every
// value here; the test asserts it). `rounded` counts the values where e' alone would have lost something.
void check_identity(std::span<const float> p, std::span<const float> d, std::span<const float> e,
                    std::span<const float> r, std::size_t& exact, std::size_t& rounded) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    CHECK(std::bit_cast<std::uint32_t>(e[i]) == std::bit_cast<std::uint32_t>(p[i] - d[i]));
    const auto wide = [](float x) { return static_cast<__float128>(x); };
    int lo = 0, hi = 0;
    bool any = false;
    for (float v : {p[i], d[i], e[i], r[i]})
      if (v != 0.0f) {
        int ex = 0;
        std::frexp(v, &ex);
        lo = any ? std::min(lo, ex - 24) : ex - 24;
        hi = any ? std::max(hi, ex) : ex;
        any = true;
      }
    CHECK(hi - lo <= 112);
    CHECK(wide(d[i]) + wide(e[i]) + wide(r[i]) == wide(p[i]));
    // The low part lies below half an ulp of the leading part: the pair is normalised.
    CHECK(std::fabs(static_cast<double>(r[i])) <=
          0.5 * static_cast<double>(std::nextafter(std::fabs(e[i]), INFINITY) - std::fabs(e[i])));
    ++(r[i] == 0 ? exact : rounded);
  }
}

} // namespace

TEST_CASE("sign: every rank sums every rank's scaled signs in rank order; bytes as modelled") {
  for (int n = 1; n <= 4; ++n)
    for (std::size_t d : {std::size_t{1}, std::size_t{9}, std::size_t{1000}}) {
      CAPTURE(n);
      CAPTURE(d);
      const std::vector<std::size_t> offsets =
          d > 3 ? std::vector<std::size_t>{0, 2, 2, d} : std::vector<std::size_t>{};
      const std::vector<std::size_t> bounds = offsets.empty() ? std::vector<std::size_t>{0, d} : offsets;
      auto grad = [&](int r, int t) { return harness::gradient(d, static_cast<std::uint64_t>(10 * r + t)); };
      auto logs = harness::run(
          n, 2, [&](int) { return compress::sign(d, {.layer_offsets = offsets, .error_feedback = false}); },
          grad, d);
      for (int t = 0; t < 2; ++t) {
        std::vector<float> want(d, 0.0f);
        for (int r = 0; r < n; ++r) {
          const auto m = sign_reference(grad(r, t), bounds);
          for (std::size_t i = 0; i < d; ++i)
            want[i] += m[i];
        }
        for (const auto& log : logs) {
          CHECK(harness::same_bits(log.outs[static_cast<std::size_t>(t)], want));
          const auto model = cost::sign_traffic(d, bounds.size() - 1, n);
          CHECK(log.sent[static_cast<std::size_t>(t)] == model);
          CHECK(log.wire[static_cast<std::size_t>(t)] == model.bytes_sent);
        }
      }
    }
}

TEST_CASE("sign and qsgd with error feedback conserve bit for bit: d + e' + r' == p exactly") {
  const std::size_t d = 3000;
  comm::local_group(1).run([&](comm::local& c) {
    compress::sign s(d, {.layer_offsets = {0, 1000, d}});
    compress::qsgd q(d, {.levels = 4, .layer_offsets = {0, 1000, d}, .seed = 3, .error_feedback = true});
    std::vector<float> es(d, 0.0f), eq(d, 0.0f), rs(d, 0.0f), rq(d, 0.0f), out(d);
    std::size_t exact = 0, rounded = 0;
    for (int t = 0; t < 6; ++t) {
      const auto g = harness::gradient(d, static_cast<std::uint64_t>(t + 50));
      std::vector<float> p(d);
      // p = g + e (+ r where r is not zero), as the compressor forms it.
      auto accumulate = [&](const std::vector<float>& e, const std::vector<float>& r) {
        for (std::size_t i = 0; i < d; ++i)
          p[i] = r[i] == 0.0f ? g[i] + e[i] : (g[i] + e[i]) + r[i];
      };
      accumulate(es, rs);
      s.reduce(c, g, out);
      // One rank: the sum from +0 is its own decoded message, up to the sign of a zero.
      CHECK(harness::same_bits(out, sign_reference(p, {0, 1000, d})));
      check_identity(p, out, s.residual(), s.residual_low(), exact, rounded);
      es.assign(s.residual().begin(), s.residual().end());
      rs.assign(s.residual_low().begin(), s.residual_low().end());

      accumulate(eq, rq);
      q.reduce(c, g, out);
      // A level-0 value decodes to +-0; the sum from +0 turns -0 into +0, which p - d does not notice
      // unless p is -0 too, so compare zeros by value.
      for (std::size_t i = 0; i < d; ++i)
        if (out[i] == 0) out[i] = std::signbit(p[i]) ? -0.0f : 0.0f;
      check_identity(p, out, q.residual(), q.residual_low(), exact, rounded);
      eq.assign(q.residual().begin(), q.residual().end());
      rq.assign(q.residual_low().begin(), q.residual_low().end());
    }
    MESSAGE("subtraction exact " << exact << ", carried by the low part " << rounded);
    // Both kinds occur, so the low part is exercised, not vacuous.
    CHECK(exact > 0);
    CHECK(rounded > 0);
  });
}

TEST_CASE("qsgd is unbiased: the mean over 4000 rounds lies within 6 standard errors of p") {
  // Each decoded value is norm / s times a level that is floor(x) or floor(x) + 1, so its variance is at
  // most (norm / s)^2 / 4, and the mean over M independent rounds has standard error at most
  // norm / (2 s sqrt(M)). Every coordinate must land within 6 of those (plus float rounding): a floor
  // instead of the stochastic rounding misses by up to norm / s.
  const std::size_t d = 64;
  const int rounds = 4000;
  for (std::uint32_t s : {1u, 3u, 16u}) {
    CAPTURE(s);
    const auto g = harness::gradient(d, 999);
    double norm = 0;
    for (float x : g)
      norm += static_cast<double>(x) * x;
    norm = std::sqrt(norm);
    std::vector<double> mean(d, 0.0);
    comm::local_group(1).run([&](comm::local& c) {
      compress::qsgd q(d, {.levels = s, .seed = 11});
      std::vector<float> out(d);
      for (int t = 0; t < rounds; ++t) {
        q.reduce(c, g, out);
        for (std::size_t i = 0; i < d; ++i)
          mean[i] += out[i];
      }
    });
    const double bound = 6 * norm / (2 * s * std::sqrt(static_cast<double>(rounds))) + 1e-6 * norm;
    double worst = 0;
    for (std::size_t i = 0; i < d; ++i) {
      mean[i] /= rounds;
      worst = std::max(worst, std::fabs(mean[i] - g[i]) / bound);
      CHECK(std::fabs(mean[i] - g[i]) <= bound);
    }
    MESSAGE("s = " << s << ": worst deviation " << worst << " of the bound");
  }
}

TEST_CASE("qsgd: levels within [0, s], the same decode on every rank, bytes as modelled") {
  for (int n = 1; n <= 4; ++n)
    for (std::uint32_t s : {1u, 2u, 7u, 255u, 65535u})
      for (std::size_t d : {std::size_t{1}, std::size_t{13}, std::size_t{2000}}) {
        CAPTURE(n);
        CAPTURE(s);
        CAPTURE(d);
        auto grad = [&](int r, int t) { return harness::gradient(d, static_cast<std::uint64_t>(7 * r + t)); };
        auto logs = harness::run(
            n, 2, [&](int) { return compress::qsgd(d, {.levels = s, .seed = 1}); }, grad, d);
        for (int t = 0; t < 2; ++t) {
          // |sum| <= sum of norms: each decoded value is at most its layer's norm.
          double bound = 0;
          for (int r = 0; r < n; ++r) {
            double sq = 0;
            for (float x : grad(r, t))
              sq += static_cast<double>(x) * x;
            bound += std::sqrt(sq) * (1 + 1e-6);
          }
          for (const auto& log : logs) {
            const auto& out = log.outs[static_cast<std::size_t>(t)];
            CHECK(harness::same_bits(out, logs[0].outs[static_cast<std::size_t>(t)]));
            for (float x : out)
              CHECK(std::fabs(static_cast<double>(x)) <= bound);
            const auto model = cost::qsgd_traffic(d, 1, s, n);
            CHECK(log.sent[static_cast<std::size_t>(t)] == model);
            CHECK(log.wire[static_cast<std::size_t>(t)] == model.bytes_sent);
          }
        }
      }
  // One level per value, s = 1: the decoded magnitudes are 0 or the norm.
  comm::local_group(1).run([&](comm::local& c) {
    compress::qsgd q(4, {.levels = 1});
    const std::vector<float> g{3.0f, -4.0f, 0.0f, 0.0f};
    std::vector<float> out(4);
    q.reduce(c, g, out);
    for (float x : out)
      CHECK((x == 0 || std::fabs(x) == 5.0f));
    CHECK(out[2] == 0);
    CHECK(out[1] <= 0);
  });
}

TEST_CASE("sign and qsgd refuse s = 0, bad layers, non-finite input and wrong sizes, on every rank") {
  CHECK_THROWS_WITH_AS(compress::qsgd(10, {.levels = 0}), doctest::Contains("'levels' = 0"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(compress::qsgd(10, {.levels = 70000}), doctest::Contains("[1, 65535]"),
                       invalid_argument);
  CHECK_THROWS_AS(compress::sign(10, {.layer_offsets = {0, 5}}), invalid_argument);
  CHECK_THROWS_AS(compress::sign(10, {.layer_offsets = {0, 6, 5, 10}}), invalid_argument);
  const std::size_t d = 30;
  for (int n : {1, 2, 4}) {
    auto a = harness::errors_on_every_rank<non_finite>(
        n, [&](int) { return compress::qsgd(d); },
        [&](int r, std::vector<float>& g, std::vector<float>& out) {
          g.assign(d, 0.5f);
          out.assign(d, 0.0f);
          if (r == 1 % n) {
            g[7] = -INFINITY;
            g[9] = NAN;
          }
        });
    for (const auto& m : a) {
      CHECK(m.find("2 non-finite") != std::string::npos);
      CHECK(m.find("index 7") != std::string::npos);
    }
    auto b = harness::errors_on_every_rank<size_mismatch>(
        n, [&](int) { return compress::sign(d); },
        [&](int r, std::vector<float>& g, std::vector<float>& out) {
          g.assign(r == 0 ? 3 : d, 0.5f);
          out.assign(d, 0.0f);
        });
    for (const auto& m : b)
      CHECK(m.find("'gradient' has 3 elements, the compressor's length is 30") != std::string::npos);
    // A norm beyond float's range.
    auto o = harness::errors_on_every_rank<invalid_argument>(
        n, [&](int) { return compress::qsgd(d); },
        [&](int, std::vector<float>& g, std::vector<float>& out) {
          g.assign(d, 3e38f);
          out.assign(d, 0.0f);
        });
    for (const auto& m : o)
      CHECK(m.find("L2 norm") != std::string::npos);
  }
}

TEST_CASE("sign and qsgd state continues bit-identically after save and load") {
  const std::size_t d = 400;
  auto grad = [&](int, int t) { return harness::gradient(d, static_cast<std::uint64_t>(t + 60)); };
  harness::check_save_load([&](int) { return compress::sign(d); }, grad, d,
                           harness::saved(compress::qsgd(d, {.error_feedback = true})));
  harness::check_save_load(
      [&](int) { return compress::qsgd(d, {.levels = 5, .seed = 2, .error_feedback = true}); }, grad, d,
      harness::saved(compress::qsgd(d, {.levels = 5, .seed = 3, .error_feedback = true})));
  harness::check_save_load([&](int) { return compress::qsgd(d, {.levels = 5}); }, grad, d,
                           harness::saved(compress::sign(d)));
}

namespace {

// QSGD as its header states it, computed the long way for one rank's message.
std::vector<float> qsgd_reference(std::span<const float> p, const std::vector<std::size_t>& bounds,
                                  std::uint32_t s, std::uint64_t seed, std::uint64_t step, int rank) {
  const std::uint64_t key = compress::detail::stream_key(seed, step, static_cast<std::uint64_t>(rank) + 1);
  std::vector<float> d(p.size());
  for (std::size_t l = 0; l + 1 < bounds.size(); ++l) {
    double sq = 0;
    for (std::size_t i = bounds[l]; i < bounds[l + 1]; ++i)
      sq += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    const double norm = static_cast<float>(std::sqrt(sq));
    for (std::size_t i = bounds[l]; i < bounds[l + 1]; ++i) {
      std::uint32_t level = 0;
      if (norm > 0) {
        const double x = std::fabs(static_cast<double>(p[i])) * (s / norm);
        const double lo = std::floor(x);
        level = static_cast<std::uint32_t>(lo) +
                (compress::detail::unit_double(compress::detail::draw(key, i)) < x - lo ? 1u : 0u);
        level = std::min(level, s);
      }
      const auto mag = static_cast<float>(norm * level / s);
      d[i] = std::signbit(p[i]) ? -mag : mag;
    }
  }
  return d;
}

} // namespace

TEST_CASE("qsgd equals its stated formula on every rank, layers at any bit offset") {
  const std::size_t d = 101;
  const std::vector<std::size_t> offsets{0, 5, 5, 17, d};
  for (std::uint32_t s : {1u, 3u, 6u, 300u})
    for (int n : {1, 3}) {
      CAPTURE(s);
      CAPTURE(n);
      auto grad = [&](int r, int t) { return harness::gradient(d, static_cast<std::uint64_t>(31 * r + t)); };
      auto logs = harness::run(
          n, 3, [&](int) { return compress::qsgd(d, {.levels = s, .layer_offsets = offsets, .seed = 8}); },
          grad, d);
      for (int t = 0; t < 3; ++t) {
        std::vector<float> want(d, 0.0f);
        for (int r = 0; r < n; ++r) {
          const auto m = qsgd_reference(grad(r, t), offsets, s, 8, static_cast<std::uint64_t>(t), r);
          for (std::size_t i = 0; i < d; ++i)
            want[i] += m[i];
        }
        for (const auto& log : logs)
          CHECK(harness::same_bits(log.outs[static_cast<std::size_t>(t)], want));
        CHECK(logs[0].sent[static_cast<std::size_t>(t)] == cost::qsgd_traffic(d, 4, s, n));
      }
    }
}

TEST_CASE("ranks built with different levels or layers are refused on every rank, not summed") {
  const std::size_t d = 40;
  auto input = [&](int, std::vector<float>& g, std::vector<float>& out) {
    g.assign(d, 1.0f);
    out.assign(d, 0.0f);
  };
  for (int n : {2, 4}) {
    for (const auto& m : harness::errors_on_every_rank<invalid_argument>(
             n, [&](int r) { return compress::qsgd(d, {.levels = r == 1 ? 5u : 4u}); }, input))
      CHECK(m.find("ranks disagree on the compressor's parameters") != std::string::npos);
    // Same layer count, different boundaries.
    for (
        const auto& m : harness::errors_on_every_rank<invalid_argument>(
            n,
            [&](int r) {
              return compress::sign(d, {.layer_offsets = {0, r == 0 ? std::size_t{10} : std::size_t{11}, d}});
            },
            input))
      CHECK(m.find("disagree") != std::string::npos);
  }
}
