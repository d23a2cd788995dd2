// outer_sgd::step_and_merge, the engine's outer step and merge in vectorised groups, against step_on_sum
// with math::merge as its callback (the per-value form it replaced): the same global model, velocity and
// local model bit for bit, with and without momentum, alpha = 0 and not, over lengths around its group of 64,
// runs that start inside the model, and values of every size, zeros of both signs and subnormals; the same
// for step_and_carry against math::carry (keep_delay_steps' merge).
#include <commsgd/sync/diloco_math.hpp>
#include <commsgd/sync/outer_optimizer.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

using namespace commsgd;

namespace {

bool same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  return true;
}

std::vector<float> values(std::mt19937& rng, std::size_t d) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(d);
  for (auto& v : x) {
    switch (rng() % 6) {
    case 0:
      v = rng() % 2 ? 0.0f : -0.0f;
      break;
    case 1:
      v = normal(rng) * std::numeric_limits<float>::min();
      break;
    case 2:
      v = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
      break;
    default:
      v = normal(rng);
    }
  }
  return x;
}

} // namespace

TEST_CASE("the outer step and merge in groups give step_on_sum's bits with math::merge") {
  for (const sync::outer_sgd_options o : {sync::outer_sgd_options{}, sync::outer_sgd_options{1.3f, 0.0f}})
    for (const float alpha : {0.0f, 0.5f, 1.0f})
      for (const float n : {1.0f, 3.0f, 4.0f})
        for (std::size_t d : {0, 1, 63, 64, 65, 127, 200, 1000}) {
          CAPTURE(o.momentum);
          CAPTURE(alpha);
          CAPTURE(n);
          CAPTURE(d);
          std::mt19937 rng(static_cast<unsigned>(d * 7 + static_cast<std::size_t>(n)));
          sync::outer_sgd a(o), b(o);
          auto ga = values(rng, d), gb = ga;
          auto xa = values(rng, d), xb = xa;
          // Three rounds, the velocity carried; each round in two runs, the second starting inside the model.
          for (int round = 0; round < 3; ++round) {
            const auto sum = values(rng, d);
            const std::size_t cut = d / 3;
            for (const auto [first, count] : {std::pair{std::size_t{0}, cut}, std::pair{cut, d - cut}}) {
              float* x = xa.data() + first;
              a.step_on_sum(ga, sum, n, first, count, [&](std::size_t i, float gi) {
                x[i - first] = sync::math::merge(gi, x[i - first], alpha);
              });
              b.step_and_merge(gb, sum, n, first, count, xb.data() + first, alpha);
            }
            REQUIRE(same_bits(ga, gb));
            REQUIRE(same_bits(xa, xb));
            REQUIRE(same_bits(a.velocity(), b.velocity()));
          }
        }
}

TEST_CASE("the outer step and carry in groups give step_on_sum's bits with math::carry") {
  for (const sync::outer_sgd_options o : {sync::outer_sgd_options{}, sync::outer_sgd_options{1.3f, 0.0f}})
    for (const float n : {1.0f, 3.0f})
      for (std::size_t d : {0, 1, 63, 64, 65, 127, 200, 1000}) {
        CAPTURE(o.momentum);
        CAPTURE(n);
        CAPTURE(d);
        std::mt19937 rng(static_cast<unsigned>(d * 11 + static_cast<std::size_t>(n)));
        sync::outer_sgd a(o), b(o);
        auto ga = values(rng, d), gb = ga;
        auto xa = values(rng, d), xb = xa;
        for (int round = 0; round < 3; ++round) {
          const auto sum = values(rng, d);
          // Where the local value has not moved since the start (half of them here) the merge gives the
          // common value's bits, -0 included.
          auto start = values(rng, d);
          for (std::size_t i = 0; i < d; i += 2)
            start[i] = xa[i];
          const std::size_t cut = d / 3;
          for (const auto [first, count] : {std::pair{std::size_t{0}, cut}, std::pair{cut, d - cut}}) {
            float* x = xa.data() + first;
            a.step_on_sum(ga, sum, n, first, count, [&](std::size_t i, float gi) {
              x[i - first] = sync::math::carry(gi, x[i - first], start[i]);
            });
            b.step_and_carry(gb, sum, n, first, count, xb.data() + first, start.data() + first);
          }
          REQUIRE(same_bits(ga, gb));
          REQUIRE(same_bits(xa, xb));
          REQUIRE(same_bits(a.velocity(), b.velocity()));
          for (std::size_t i = 0; i < d; i += 2)
            REQUIRE(std::bit_cast<std::uint32_t>(xa[i]) == std::bit_cast<std::uint32_t>(ga[i]));
        }
      }
}
