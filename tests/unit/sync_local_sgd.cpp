// sync::local_sgd: H = 1 equals synchronous, the warm-up/period schedule, the ADACOMM interval rule on a
// scripted loss sequence, and the elastic correction.
#include <commsgd/comm/local.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/synchronous.hpp>
#include <support/least_squares.hpp>
#include <support/train_ranks.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;
using sync::correction_mode;

namespace {
using toy::finals_t;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
} // namespace

TEST_CASE("local_sgd with H = 1 equals synchronous within 1e-6 relative") {
  // Not bit for bit: averaging models x - lr g_r rounds differently from x - lr * mean(g) (float addition is
  // not associative), by about an ulp of x per step; over 40 steps that stays far below 1e-6 relative.
  const toy::least_squares prob({.samples = 256, .dim = 10, .seed = 5});
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    const auto sync_x =
        toy::train_ranks(prob, n, 40, [](local& c) { return sync::synchronous<local>(c, {.lr = 0.2f}); });
    const auto local_x = toy::train_ranks(prob, n, 40, [](local& c) {
      return sync::local_sgd<local>(c, {.lr = 0.2f, .period = 1, .average_on_finish = false});
    });
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < prob.dim(); ++i)
        CHECK(local_x[r][i] == doctest::Approx(sync_x[r][i]).epsilon(1e-6).scale(1.0));
    // A warm-up covering every step is synchronous itself, so that one is bit for bit.
    const auto warm_x = toy::train_ranks(prob, n, 40, [](local& c) {
      return sync::local_sgd<local>(c, {.lr = 0.2f, .period = 5, .warmup_steps = 40});
    });
    for (int r = 0; r < n; ++r)
      CHECK(same_bits(warm_x[r], sync_x[r]));
  }
}

TEST_CASE("averaging happens exactly at the scheduled steps: warm-up, then every H") {
  const toy::least_squares prob({.samples = 256, .dim = 6, .seed = 2});
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    std::mutex mu;
    std::vector<std::vector<int>> averaged(static_cast<std::size_t>(n)),
        exchanged(static_cast<std::size_t>(n));
    std::vector<int> identical_after_average;
    local_group(n).run([&](local& c) {
      sync::local_sgd<local> s(c, {.lr = 0.1f, .period = 4, .warmup_steps = 3});
      std::vector<float> x(prob.dim(), 0.0f), g(prob.dim()), all(prob.dim() * static_cast<std::size_t>(n));
      s.start(x);
      for (int t = 0; t < 20; ++t) {
        prob.gradient(x, prob.batch(c.rank(), n, t, 8), g);
        const auto res = s.step(x, g, {});
        if (res.averaged) averaged[static_cast<std::size_t>(c.rank())].push_back(t);
        if (res.exchanged) exchanged[static_cast<std::size_t>(c.rank())].push_back(t);
        if (res.exchanged) {
          // Replicas agree bit for bit right after any exchange.
          c.all_gather(std::span<const float>(x), std::span<float>(all));
          bool same = true;
          for (int r = 1; r < n; ++r)
            same =
                same && std::memcmp(all.data(), all.data() + r * prob.dim(), prob.dim() * sizeof(float)) == 0;
          std::lock_guard lock(mu);
          identical_after_average.push_back(same ? 1 : 0);
        }
      }
    });
    for (int r = 0; r < n; ++r) {
      CHECK(averaged[r] == std::vector<int>{3, 7, 11, 15, 19});
      CHECK(exchanged[r] == std::vector<int>{0, 1, 2, 3, 7, 11, 15, 19});
    }
    for (int v : identical_after_average)
      CHECK(v == 1);
  }
}

TEST_CASE("the adaptive interval follows ADACOMM's rule on a scripted loss sequence") {
  // tau_0 = 8. Losses are powers of two spread over ranks by offsets that cancel exactly, so the mean over
  // ranks is exact and the intervals can be worked out by hand:
  //   t = 0:  F_0 = 4                                   -> tau = 8      (first sync point)
  //   t = 8:  F = 1,     sqrt(1/4) * 8 = 4              -> next at 12
  //   t = 12: F = 1/4,   sqrt(1/16) * 8 = 2             -> next at 14
  //   t = 14: F = 1/16,  sqrt(1/64) * 8 = 1             -> next at 15
  //   lr drops from 0.1 to 0.025 before step 15:
  //   t = 15: F = 1/16,  sqrt(0.1 * (1/16) / (0.025 * 4)) * 8 = 2   -> next at 17, then 19, 21
  // and with a loss that grows, the interval is clamped to max_period = 10.
  const std::vector<std::vector<double>> offsets = {
      {0.0}, {-0.5, 0.5}, {-0.5, 0.0, 0.5}, {-0.75, -0.25, 0.25, 0.75}};
  auto loss_at = [](int t) { return t < 8 ? 4.0 : t < 12 ? 1.0 : t < 14 ? 0.25 : t < 22 ? 0.0625 : 64.0; };
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    std::vector<std::vector<int>> syncs(static_cast<std::size_t>(n));
    std::vector<int> last_period(static_cast<std::size_t>(n));
    local_group(n).run([&](local& c) {
      sync::local_sgd<local> s(c, {.lr = 0.1f, .period = 8, .adaptive = true, .max_period = 10});
      std::vector<float> x(3, 0.0f), g(3, 0.0f);
      s.start(x);
      for (int t = 0; t < 30; ++t) {
        if (t == 15) s.set_learning_rate(0.025f);
        const double f = loss_at(t) * (1.0 + offsets[n - 1][static_cast<std::size_t>(c.rank())]);
        if (s.step(x, g, {.loss = f}).averaged) syncs[static_cast<std::size_t>(c.rank())].push_back(t);
      }
      last_period[static_cast<std::size_t>(c.rank())] = s.current_period();
    });
    for (int r = 0; r < n; ++r) {
      // At t = 23 F = 64: sqrt(0.1 * 64 / (0.025 * 4)) * 8 = 64 -> clamped to 10.
      CHECK(syncs[r] == std::vector<int>{0, 8, 12, 14, 15, 17, 19, 21, 23});
      CHECK(last_period[r] == 10);
    }
  }
}

TEST_CASE("correction at sync points moves each model toward the average by exactly alpha") {
  // lr = 1, rank r's gradient is r + 1 everywhere, so after the first local step x_r = -(r + 1) and the
  // average is -1.5; alpha = 0.25 gives x_r - 0.25 (x_r + 1.5): -1.125 and -1.875, exact in float.
  std::vector<std::vector<float>> after(2);
  local_group(2).run([&](local& c) {
    sync::local_sgd<local> s(c, {.lr = 1.0f,
                                 .period = 4,
                                 .correction = correction_mode::at_sync,
                                 .alpha = 0.25f,
                                 .average_on_finish = false});
    std::vector<float> x(5, 0.0f), g(5, static_cast<float>(c.rank() + 1));
    s.start(x);
    CHECK(s.step(x, g, {}).averaged);
    after[static_cast<std::size_t>(c.rank())] = x;
  });
  for (float v : after[0])
    CHECK(v == -1.125f);
  for (float v : after[1])
    CHECK(v == -1.875f);
}

TEST_CASE("correction every step pulls the local model toward the last global model by exactly alpha") {
  // Sync at t = 0 makes both models -1.5 (the global one). At t = 1 the local step gives -2.5 and -3.5, and
  // the pull with alpha = 0.5 halves the distance to -1.5: -2.0 and -2.5.
  for (float alpha : {0.0f, 0.5f, 1.0f}) {
    CAPTURE(alpha);
    std::vector<std::vector<float>> after(2);
    local_group(2).run([&](local& c) {
      sync::local_sgd<local> s(c, {.lr = 1.0f,
                                   .period = 3,
                                   .correction = correction_mode::every_step,
                                   .alpha = alpha,
                                   .average_on_finish = false});
      std::vector<float> x(4, 0.0f), g(4, static_cast<float>(c.rank() + 1));
      s.start(x);
      s.step(x, g, {});
      CHECK(x[0] == -1.5f);
      CHECK_FALSE(s.step(x, g, {}).exchanged);
      after[static_cast<std::size_t>(c.rank())] = x;
    });
    for (int r = 0; r < 2; ++r) {
      const float local_x = -1.5f - static_cast<float>(r + 1);
      const float expected = local_x - alpha * (local_x - -1.5f);
      for (float v : after[r]) {
        CHECK(v == expected);
        CHECK(v - -1.5f == doctest::Approx((1.0f - alpha) * (local_x - -1.5f)));
      }
    }
  }
}

TEST_CASE("finish averages the local steps since the last sync point") {
  local_group(3).run([](local& c) {
    sync::local_sgd<local> s(c, {.lr = 0.5f, .period = 10});
    std::vector<float> x(2, 0.0f), g(2, static_cast<float>(c.rank()));
    s.start(x);
    for (int t = 0; t < 4; ++t)
      s.step(x, g, {});
    s.finish(x);
    std::vector<float> all(6);
    c.all_gather(std::span<const float>(x), std::span<float>(all));
    CHECK(all[0] == all[2]);
    CHECK(all[0] == all[4]);
    // Four steps of -0.5 * rank, averaged: -0.5 * 4 * mean(0, 1, 2).
    CHECK(all[0] == doctest::Approx(-2.0));
  });
}

TEST_CASE("local_sgd refuses bad arguments with their name, value and range") {
  local_group(1).run([](local& c) {
    using ls = sync::local_sgd<local>;
    CHECK_THROWS_WITH_AS(ls(c, {.period = 0}), doctest::Contains("'period' = 0"), commsgd::invalid_argument);
    CHECK_THROWS_WITH_AS(ls(c, {.alpha = 1.5f}),
                         doctest::Contains("'alpha' = 1.5 is outside the allowed range [0, 1]"),
                         commsgd::invalid_argument);
    CHECK_THROWS_AS(ls(c, {.alpha = -0.1f}), commsgd::invalid_argument);
    CHECK_THROWS_AS(ls(c, {.lr = 0.0f}), commsgd::invalid_argument);
    CHECK_THROWS_AS(ls(c, {.warmup_steps = -1}), commsgd::invalid_argument);
    CHECK_THROWS_WITH_AS(ls(c, {.period = 20, .adaptive = true, .max_period = 10}),
                         doctest::Contains("[1, max_period = 10]"), commsgd::invalid_argument);
    ls s(c, {.period = 2, .adaptive = true});
    std::vector<float> x(2), g(2);
    CHECK_THROWS_WITH_AS(s.step(x, g, {}), doctest::Contains("loss"), commsgd::invalid_argument);
  });
}
