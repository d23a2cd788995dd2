// random_k: the positions are a uniform k-subset that every rank draws alike and nobody sends, the values
// sum exactly as a dense all-reduce of the chosen positions would, error feedback keeps the rest exactly,
// bytes equal cost/compress.hpp, bad k and bad input are refused.
#include "compress_harness.hpp"

#include <commsgd/compress/random_k.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

using namespace commsgd;

TEST_CASE("random_k positions: k distinct rising indices, uniform, a function of (seed, step) only") {
  std::vector<std::size_t> idx, again;
  std::vector<std::uint64_t> marks;
  for (std::size_t d :
       {std::size_t{1}, std::size_t{2}, std::size_t{63}, std::size_t{64}, std::size_t{65}, std::size_t{1000}})
    for (std::size_t k : {std::size_t{1}, d / 2, d}) {
      if (k == 0) continue;
      for (std::uint64_t step = 0; step < 5; ++step) {
        compress::random_k_indices(9, step, d, k, idx, marks);
        REQUIRE(idx.size() == k);
        CHECK(std::adjacent_find(idx.begin(), idx.end(), std::greater_equal<>()) == idx.end());
        CHECK(idx.back() < d);
        compress::random_k_indices(9, step, d, k, again, marks);
        CHECK(idx == again);
      }
    }
  // Uniform: over many steps each position of 40 is picked about k / d of the time.
  const std::size_t d = 40, k = 10, steps = 20000;
  std::vector<std::size_t> hits(d);
  for (std::uint64_t step = 0; step < steps; ++step) {
    compress::random_k_indices(3, step, d, k, idx, marks);
    for (auto i : idx)
      ++hits[i];
  }
  // Each count is Binomial(steps, 1/4): mean 5000, sd 61; 6 sd either side.
  for (auto h : hits) {
    CHECK(h > 5000 - 370);
    CHECK(h < 5000 + 370);
  }
  // Different seeds and steps give different subsets.
  compress::random_k_indices(1, 0, 1000, 10, idx, marks);
  compress::random_k_indices(2, 0, 1000, 10, again, marks);
  CHECK(idx != again);
  compress::random_k_indices(1, 1, 1000, 10, again, marks);
  CHECK(idx != again);
}

TEST_CASE(
    "random_k: identical positions on every rank, exact sums, residual keeps the rest, bytes modelled") {
  for (int n = 1; n <= 4; ++n)
    for (std::size_t d : {std::size_t{1}, std::size_t{5}, std::size_t{1001}}) {
      CAPTURE(n);
      CAPTURE(d);
      const std::size_t k = (d + 2) / 3;
      const int rounds = 4;
      auto grad = [&](int r, int t) { return harness::gradient(d, static_cast<std::uint64_t>(100 * r + t)); };
      std::vector<std::vector<std::vector<std::size_t>>> idx(static_cast<std::size_t>(n));
      std::vector<std::vector<std::vector<float>>> outs(static_cast<std::size_t>(n));
      std::vector<std::vector<float>> residual(static_cast<std::size_t>(n));
      comm::local_group(n).run([&](comm::local& raw) {
        comm::metered<comm::local> c(raw);
        const auto me = static_cast<std::size_t>(c.rank());
        compress::random_k x(d, {.k = k, .seed = 77});
        std::vector<float> out(d), e(d, 0.0f);
        for (int t = 0; t < rounds; ++t) {
          const auto g = grad(c.rank(), t);
          c.reset();
          const auto rep = x.reduce(c, g, out);
          CHECK(rep.dense);
          CHECK(rep.total == k * static_cast<std::uint64_t>(n));
          const auto tot = c.counters().total();
          const auto model = cost::random_k_traffic(k, n, c.rank());
          CHECK(tot.bytes_sent == model.bytes_sent);
          CHECK(tot.bytes_received == model.bytes_received);
          CHECK(x.wire_bytes() == model.bytes_sent);
          idx[me].emplace_back(x.indices().begin(), x.indices().end());
          outs[me].push_back(out);
          // Conservation, exact: sent positions leave +0 in the residual, the others keep p's bits.
          std::vector<bool> sent(d);
          for (auto i : x.indices())
            sent[i] = true;
          for (std::size_t i = 0; i < d; ++i) {
            const float p = g[i] + e[i];
            const float want = sent[i] ? 0.0f : p;
            CHECK(std::bit_cast<std::uint32_t>(x.residual()[i]) == std::bit_cast<std::uint32_t>(want));
            if (!sent[i]) CHECK(std::bit_cast<std::uint32_t>(out[i]) == 0u);
          }
          e.assign(x.residual().begin(), x.residual().end());
        }
        residual[me] = e;
      });
      // Every rank drew the same positions, and the sums equal a dense all-reduce of each rank's p there.
      std::vector<std::vector<float>> e(static_cast<std::size_t>(n), std::vector<float>(d, 0.0f));
      for (int t = 0; t < rounds; ++t) {
        const auto& I = idx[0][static_cast<std::size_t>(t)];
        std::vector<float> want(d, 0.0f);
        for (int r = 0; r < n; ++r) {
          CHECK(idx[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)] == I);
          CHECK(harness::same_bits(outs[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)],
                                   outs[0][static_cast<std::size_t>(t)]));
          const auto g = grad(r, t);
          auto& er = e[static_cast<std::size_t>(r)];
          std::vector<float> p(d);
          for (std::size_t i = 0; i < d; ++i)
            p[i] = g[i] + er[i];
          for (auto i : I) {
            want[i] += p[i];
            p[i] = 0.0f;
          }
          er = p;
        }
        CHECK(harness::same_bits(outs[0][static_cast<std::size_t>(t)], want));
      }
    }
}

TEST_CASE("random_k refuses k = 0, k > length and densities outside (0, 1]") {
  auto what = [](auto f) {
    try {
      f();
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(what([] { compress::random_k(10, {.k = 0}); }).find("'k' = 0") != std::string::npos);
  CHECK(what([] { compress::random_k(10, {.k = 11}); }).find("[1, length = 10]") != std::string::npos);
  CHECK(what([] { compress::random_k(10, {.density = 0.0}); }).find("'density' = 0") != std::string::npos);
  CHECK(what([] { compress::random_k(10, {.density = 1.5}); }).find("(0, 1]") != std::string::npos);
  CHECK(what([] { compress::random_k(10, {.density = NAN}); }).find("'density'") != std::string::npos);
  CHECK(compress::random_k(0, {.k = 0}).k() == 0);
  CHECK(compress::random_k(1000, {.density = 0.001}).k() == 1);
}

TEST_CASE("random_k refuses non-finite input and wrong sizes on every rank, state untouched") {
  const std::size_t d = 20;
  for (int n : {1, 3}) {
    auto msgs = harness::errors_on_every_rank<non_finite>(
        n, [&](int) { return compress::random_k(d, {.k = 3}); },
        [&](int r, std::vector<float>& g, std::vector<float>& out) {
          g.assign(d, 1.0f);
          out.assign(d, 0.0f);
          if (r == n - 1) g[11] = NAN;
        });
    for (const auto& m : msgs)
      CHECK(m.find("first at index 11") != std::string::npos);
    auto sizes = harness::errors_on_every_rank<size_mismatch>(
        n, [&](int) { return compress::random_k(d, {.k = 3}); },
        [&](int r, std::vector<float>& g, std::vector<float>& out) {
          g.assign(d, 1.0f);
          out.assign(r == 0 ? d - 1 : d, 0.0f);
        });
    for (const auto& m : sizes)
      CHECK(m.find("'out' has 19 elements") != std::string::npos);
  }
  comm::local_group(1).run([&](comm::local& c) {
    compress::random_k x(d, {.k = 3});
    std::vector<float> g(d, 1.0f), out(d);
    x.reduce(c, g, out);
    const auto before = harness::saved(x);
    g[0] = INFINITY;
    CHECK_THROWS_AS(x.reduce(c, g, out), non_finite);
    CHECK(harness::saved(x) == before);
  });
}

TEST_CASE("random_k state continues bit-identically after save and load") {
  const std::size_t d = 500;
  auto grad = [&](int, int t) { return harness::gradient(d, static_cast<std::uint64_t>(t + 3)); };
  harness::check_save_load([&](int) { return compress::random_k(d, {.k = 17, .seed = 5}); }, grad, d,
                           harness::saved(compress::random_k(d, {.k = 17, .seed = 6})));
}

TEST_CASE("ranks built with different k or seeds are refused on every rank, not summed") {
  const std::size_t d = 40;
  for (int n : {2, 3}) {
    auto msgs = harness::errors_on_every_rank<invalid_argument>(
        n, [&](int r) { return compress::random_k(d, {.k = r == n - 1 ? std::size_t{4} : std::size_t{3}}); },
        [&](int, std::vector<float>& g, std::vector<float>& out) {
          g.assign(d, 1.0f);
          out.assign(d, 0.0f);
        });
    for (const auto& m : msgs)
      CHECK(m.find("ranks disagree on the compressor's parameters") != std::string::npos);
    auto seeds = harness::errors_on_every_rank<invalid_argument>(
        n, [&](int r) { return compress::random_k(d, {.k = 3, .seed = static_cast<std::uint64_t>(r)}); },
        [&](int, std::vector<float>& g, std::vector<float>& out) {
          g.assign(d, 1.0f);
          out.assign(d, 0.0f);
        });
    for (const auto& m : seeds)
      CHECK(m.find("disagree") != std::string::npos);
  }
}
