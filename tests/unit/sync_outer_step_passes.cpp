// The outer step against its definition written out here in float, each operation rounded on its own:
// outer_sgd's step, step_on_sum and grouped step_and_merge, and the engine's rounds (sync::diloco) on random
// models, over lengths 0, 1, odd and past the group of 64, Nesterov and plain averaging. Then
// outer_sgd::step_and_merge, the engine's outer step and merge in vectorised groups, against step_on_sum
// with math::merge as its callback (the per-value form it replaced): the same global model, velocity and
// local model bit for bit, with and without momentum, alpha = 0 and not, over lengths around its group of 64,
// runs that start inside the model, and values of every size, zeros of both signs and subnormals; the same
// for step_and_carry against math::carry (keep_delay_steps' merge).
#include <commsgd/comm/local.hpp>
#include <commsgd/sync/diloco.hpp>
#include <commsgd/sync/diloco_math.hpp>
#include <commsgd/sync/outer_optimizer.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <random>
#include <span>
#include <string>
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

// PyTorch's SGD(nesterov=True) on one value from the sum over n ranks, from its definition: mean = sum / n,
// v <- mu v + mean, g <- g - lr (mean + mu v); without momentum no velocity, g <- g - lr mean. One float
// operation a statement (the test compiles with -ffp-contract=off, so none is fused into another).
float reference_step(float g, float sum, float n, float lr, float mu, float& v) {
  const float mean = sum / n;
  if (mu == 0.0f) {
    const float move = lr * mean;
    return g - move;
  }
  const float kept = mu * v;
  v = kept + mean;
  const float ahead = mu * v;
  const float direction = mean + ahead;
  const float move = lr * direction;
  return g - move;
}

// The merge from its definition: g + alpha (x - g), or the common value itself when alpha = 0.
float reference_merge(float g, float x, float alpha) {
  if (alpha == 0.0f) return g;
  const float apart = x - g;
  const float kept = alpha * apart;
  return g + kept;
}

// Outer settings drawn at random: plain averaging (lr 1, no momentum), momentum 0 with another lr, Nesterov.
sync::outer_sgd_options random_outer(std::mt19937& rng, int kind) {
  std::uniform_real_distribution<float> lr(0.05f, 1.5f), mu(0.05f, 0.99f);
  if (kind == 0) return sync::plain_average;
  if (kind == 1) return {lr(rng), 0.0f};
  return {lr(rng), mu(rng)};
}

} // namespace

TEST_CASE("outer_sgd's step, step_on_sum and step_and_merge are the outer step's definition, bit for bit" *
          doctest::test_suite("single_thread")) {
  for (std::size_t d : {0, 1, 7, 63, 64, 65, 129, 201})
    for (int seed = 0; seed < 6; ++seed)
      for (int kind = 0; kind < 3; ++kind) {
        CAPTURE(d);
        CAPTURE(seed);
        CAPTURE(kind);
        std::mt19937 rng(static_cast<unsigned>(seed * 1000 + static_cast<int>(d) * 3 + kind));
        const auto o = random_outer(rng, kind);
        const float n = static_cast<float>(1 + rng() % 4);
        const float alpha = seed % 2 ? 0.0f : std::uniform_real_distribution<float>(0.05f, 1.0f)(rng);
        CAPTURE(o.lr);
        CAPTURE(o.momentum);
        CAPTURE(n);
        CAPTURE(alpha);
        sync::outer_sgd a(o), b(o), c(o);
        auto ga = values(rng, d), gb = ga, gc = ga, want = ga;
        auto x = values(rng, d), want_x = x;
        std::vector<float> v(d, 0.0f);
        for (int round = 0; round < 4; ++round) {
          const auto sum = values(rng, d);
          // step() is handed the mean, sum / n, and divides no further.
          std::vector<float> mean(d);
          for (std::size_t i = 0; i < d; ++i) {
            mean[i] = sum[i] / n;
            want[i] = reference_step(want[i], sum[i], n, o.lr, o.momentum, v[i]);
            want_x[i] = reference_merge(want[i], want_x[i], alpha);
          }
          a.step(ga, mean);
          b.step_on_sum(gb, sum, n, 0, d, [](std::size_t, float) {});
          c.step_and_merge(gc, sum, n, 0, d, x.data(), alpha);
          REQUIRE(same_bits(ga, want));
          REQUIRE(same_bits(gb, want));
          REQUIRE(same_bits(gc, want));
          REQUIRE(same_bits(x, want_x));
          for (const auto* s : {&a, &b, &c})
            REQUIRE(same_bits(s->velocity(), o.momentum == 0.0f ? std::vector<float>{} : v));
        }
      }
}

TEST_CASE("the engine's rounds are the outer step's definition on random models; plain averaging gives "
          "their mean") {
  // Layers of 0, 1, odd and past the group of 64 values, a fragment each; H = 1 and no delay: every step is a
  // round, its pseudo-gradients summed in rank order as comm::local sums them.
  const std::vector<std::vector<std::size_t>> shapes = {{0}, {1}, {7}, {65, 0, 3}, {1, 129}};
  for (const auto& sizes : shapes)
    for (int n = 1; n <= 3; ++n)
      for (int seed = 0; seed < 3; ++seed)
        for (int kind = 0; kind < 3; ++kind) {
          std::mt19937 rng(static_cast<unsigned>(7919 * seed + 31 * n + kind + 101 * sizes.back()));
          const auto outer = random_outer(rng, kind);
          const float alpha = seed == 1 ? std::uniform_real_distribution<float>(0.05f, 1.0f)(rng) : 0.0f;
          CAPTURE(sizes.size());
          CAPTURE(sizes.back());
          CAPTURE(n);
          CAPTURE(seed);
          CAPTURE(outer.lr);
          CAPTURE(outer.momentum);
          CAPTURE(alpha);
          const sync::diloco_options o{
              .sync_every = 1, .fragments = static_cast<int>(sizes.size()), .alpha = alpha, .outer = outer};
          std::size_t dim = 0;
          for (auto l : sizes)
            dim += l;
          const int rounds = 4;
          const auto start = values(rng, dim);
          // moves[t][r]: what rank r's inner steps add to its model before round t.
          std::vector<std::vector<std::vector<float>>> moves(rounds);
          for (auto& t : moves)
            for (int r = 0; r < n; ++r)
              t.push_back(values(rng, dim));

          // The rounds from the definitions, one rank after another.
          std::vector<std::vector<float>> want_g, xs(static_cast<std::size_t>(n), start);
          std::vector<std::vector<std::vector<float>>> want_x;
          std::vector<float> g = start, v(dim, 0.0f);
          for (int t = 0; t < rounds; ++t) {
            for (std::size_t i = 0; i < dim; ++i) {
              float sum = 0.0f;
              double models = 0.0, scale = std::fabs(g[i]);
              for (std::size_t r = 0; r < xs.size(); ++r) {
                xs[r][i] = xs[r][i] + moves[static_cast<std::size_t>(t)][r][i];
                const float delta = g[i] - xs[r][i]; // old minus new
                sum = r == 0 ? delta : sum + delta;
                models += xs[r][i];
                scale = std::max(scale, static_cast<double>(std::fabs(xs[r][i])));
              }
              g[i] = reference_step(g[i], sum, static_cast<float>(n), outer.lr, outer.momentum, v[i]);
              for (auto& x : xs)
                x[i] = reference_merge(g[i], x[i], alpha);
              // Plain averaging is the mean of the ranks' models, but for the roundings on the way.
              if (kind == 0)
                REQUIRE(std::fabs(g[i] - models / n) <= 16 * std::numeric_limits<float>::epsilon() * scale +
                                                            4 * std::numeric_limits<float>::denorm_min());
            }
            want_g.push_back(g);
            want_x.push_back(xs);
          }

          std::mutex mu;
          std::vector<std::string> failures;
          comm::local_group(n).run([&](comm::local& c) {
            const auto r = static_cast<std::size_t>(c.rank());
            // Only rank 0's model counts: start() broadcasts it.
            std::vector<float> x = r == 0 ? start : std::vector<float>(dim, 1.0f);
            sync::diloco<comm::local> s(c, sizes, o);
            s.start(x);
            for (int t = 0; t < rounds; ++t) {
              const auto ti = static_cast<std::size_t>(t);
              for (std::size_t i = 0; i < dim; ++i)
                x[i] = x[i] + moves[ti][r][i];
              s.advance(x);
              std::vector<float> got;
              for (std::size_t p = 0; p < s.num_fragments(); ++p) {
                const auto gp = s.global_model(p);
                got.insert(got.end(), gp.begin(), gp.end());
              }
              std::string f;
              if (!same_bits(got, want_g[ti])) f += " the common model";
              if (!same_bits(x, want_x[ti][r])) f += " the local model";
              if (!f.empty()) {
                std::lock_guard lock(mu);
                failures.push_back("rank " + std::to_string(r) + " round " + std::to_string(t) + ":" + f);
              }
            }
          });
          for (const auto& f : failures)
            FAIL_CHECK(f);
        }
}

TEST_CASE("the outer step and merge in groups give step_on_sum's bits with math::merge and math::carry" *
          doctest::test_suite("single_thread")) {
  const float alphas[] = {0.0f, 0.5f, 1.0f};
  for (const sync::outer_sgd_options o : {sync::outer_sgd_options{}, sync::outer_sgd_options{1.3f, 0.0f}})
    for (int merge = 0; merge < 4; ++merge) // alpha 0, 0.5, 1, then keep_delay_steps' carry
      for (const float n : {1.0f, 3.0f, 4.0f})
        for (std::size_t d : {0, 1, 63, 64, 65, 127, 200, 1000}) {
          const bool carry = merge == 3;
          const float alpha = carry ? 0.0f : alphas[merge];
          CAPTURE(o.momentum);
          CAPTURE(merge);
          CAPTURE(n);
          CAPTURE(d);
          std::mt19937 rng(static_cast<unsigned>(d * 7 + static_cast<std::size_t>(n)));
          sync::outer_sgd a(o), b(o);
          auto ga = values(rng, d), gb = ga;
          auto xa = values(rng, d), xb = xa;
          // Three rounds, the velocity carried; each round in two runs, the second starting inside the model.
          for (int round = 0; round < 3; ++round) {
            const auto sum = values(rng, d);
            // The carry's start: where the local value has not moved since (every other value here) the
            // merge gives the common value's bits, -0 included.
            auto start = values(rng, d);
            for (std::size_t i = 0; i < d; i += 2)
              start[i] = xa[i];
            const std::size_t cut = d / 3;
            for (const auto [first, count] : {std::pair{std::size_t{0}, cut}, std::pair{cut, d - cut}}) {
              float* x = xa.data() + first;
              a.step_on_sum(ga, sum, n, first, count, [&](std::size_t i, float gi) {
                x[i - first] = carry ? sync::math::carry(gi, x[i - first], start[i])
                                     : sync::math::merge(gi, x[i - first], alpha);
              });
              if (carry)
                b.step_and_carry(gb, sum, n, first, count, xb.data() + first, start.data() + first);
              else
                b.step_and_merge(gb, sum, n, first, count, xb.data() + first, alpha);
            }
            REQUIRE(same_bits(ga, gb));
            REQUIRE(same_bits(xa, xb));
            REQUIRE(same_bits(a.velocity(), b.velocity()));
            if (carry)
              for (std::size_t i = 0; i < d; i += 2)
                REQUIRE(std::bit_cast<std::uint32_t>(xa[i]) == std::bit_cast<std::uint32_t>(ga[i]));
          }
        }
}

// From outer_sgd::streamed_length on, alpha = 0 writes the local model by streaming stores: the same bits
// as the per-value form, wherever the local model starts against a 16-byte boundary and wherever a run
// starts, and the values beside the run untouched.
TEST_CASE("the outer step and merge on a model past streamed_length give step_on_sum's bits" *
          doctest::test_suite("single_thread")) {
  const std::size_t d = sync::outer_sgd::streamed_length + 333;
  for (const sync::outer_sgd_options o : {sync::outer_sgd_options{}, sync::outer_sgd_options{1.0f, 0.0f}})
    for (std::size_t shift : {0, 1, 2, 3}) {
      CAPTURE(o.momentum);
      CAPTURE(shift);
      std::mt19937 rng(static_cast<unsigned>(shift + 11));
      sync::outer_sgd a(o), b(o);
      auto ga = values(rng, d), gb = ga;
      // x at `shift` floats past the vector's start, a guard value on each side.
      std::vector<float> xa(d + shift + 1), xb;
      const auto x0 = values(rng, d);
      std::copy(x0.begin(), x0.end(), xa.begin() + static_cast<std::ptrdiff_t>(shift));
      xb = xa;
      for (int round = 0; round < 2; ++round) {
        const auto sum = values(rng, d);
        const std::size_t cut = round == 0 ? 4097 : 0;
        for (const auto [first, count] : {std::pair{std::size_t{0}, cut}, std::pair{cut, d - cut}}) {
          float* x = xa.data() + shift + first;
          a.step_on_sum(ga, sum, 3.0f, first, count, [&](std::size_t i, float gi) {
            x[i - first] = sync::math::merge(gi, x[i - first], 0.0f);
          });
          b.step_and_merge(gb, sum, 3.0f, first, count, xb.data() + shift + first, 0.0f);
        }
        REQUIRE(same_bits(ga, gb));
        REQUIRE(same_bits(xa, xb));
        REQUIRE(same_bits(a.velocity(), b.velocity()));
      }
    }
}
