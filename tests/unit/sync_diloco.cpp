// DiLoCo: local_sgd with an outer optimizer (sync/outer_optimizer.hpp). The sign of the pseudo-gradient,
// Nesterov against a reference written here, plain averaging against today's local_sgd bit for bit,
// H = 1 against synchronous SGD, one rank against Lookahead, refusals on every rank.
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/outer_optimizer.hpp>
#include <commsgd/sync/synchronous.hpp>
#include <support/least_squares.hpp>
#include <support/train_ranks.hpp>

#include <doctest/doctest.h>

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
using sync::correction_mode;

namespace {

using toy::finals_t;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The whole run in one thread: n ranks' local SGD from a common model, and at every H-th step the
// hook `outer(global, locals)` sets the next common model.
template <class Outer>
std::vector<float> reference(const toy::least_squares& prob, int n, int steps, int period, float lr,
                             Outer outer) {
  std::vector<float> global(prob.dim(), 0.0f), g(prob.dim());
  std::vector<std::vector<float>> xs(static_cast<std::size_t>(n), global);
  for (int t = 0; t < steps; ++t) {
    for (int r = 0; r < n; ++r) {
      auto& x = xs[static_cast<std::size_t>(r)];
      prob.gradient(x, prob.batch(r, n, t, 8), g);
      for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = x[i] - lr * g[i];
    }
    if ((t + 1) % period == 0) {
      outer(global, xs);
      for (auto& x : xs)
        x = global;
    }
  }
  return global;
}

} // namespace

TEST_CASE("the pseudo-gradient is old minus new, so an outer step moves the common model toward the ranks") {
  const std::vector<float> global{1.0f, -2.0f, 0.5f}, local_model{0.5f, -1.0f, 0.5f};
  std::vector<float> delta(3);
  sync::pseudo_gradient(global, local_model, delta);
  CHECK(delta == std::vector<float>{0.5f, -1.0f, 0.0f});
  sync::outer_sgd o({.lr = 0.5f, .momentum = 0.0f});
  auto g = global;
  o.step(g, delta);
  CHECK(g == std::vector<float>{0.75f, -1.5f, 0.5f}); // halfway toward the local model
  // Through the strategy: one rank, one local step of lr 1 on gradient 1 from 0 leaves -1; an outer lr
  // of 0.5 puts the common model at -0.5, not +0.5.
  local_group(1).run([](local& c) {
    outer_local_sgd<local> s(c, {.lr = 1.0f, .period = 1, .outer = {.lr = 0.5f, .momentum = 0.0f}});
    std::vector<float> x{0.0f};
    const std::vector<float> grad{1.0f};
    s.start(x);
    s.step(x, grad);
    CHECK(x[0] == -0.5f);
    CHECK(s.global_model()[0] == -0.5f);
  });
}

TEST_CASE("outer_sgd follows PyTorch's Nesterov SGD, against a reference in double, over many rounds") {
  std::mt19937 rng(17);
  for (std::size_t d : {0u, 1u, 2u, 7u, 33u, 130u}) {
    for (int seed = 0; seed < 12; ++seed) {
      CAPTURE(d);
      CAPTURE(seed);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f), lr_u(0.05f, 1.5f), mu_u(0.0f, 0.99f);
      const float eta = lr_u(rng), mu = seed % 3 == 0 ? 0.0f : mu_u(rng);
      sync::outer_sgd o({.lr = eta, .momentum = mu});
      std::vector<float> g(d), delta(d);
      for (auto& v : g)
        v = u(rng);
      std::vector<double> gr(g.begin(), g.end()), vr(d, 0.0);
      for (int round = 0; round < 9; ++round) {
        for (auto& v : delta)
          v = 0.1f * u(rng);
        o.step(g, delta);
        for (std::size_t i = 0; i < d; ++i) {
          vr[i] = mu * vr[i] + delta[i];
          gr[i] = gr[i] - eta * (delta[i] + mu * vr[i]);
        }
      }
      for (std::size_t i = 0; i < d; ++i)
        CHECK(g[i] == doctest::Approx(gr[i]).epsilon(1e-5).scale(1.0));
      CHECK(o.velocity().size() == (mu == 0.0f ? 0u : d));
    }
  }
}

TEST_CASE("local_sgd with an outer step: its rounds match the outer step on the mean pseudo-gradient, 1 to 4 "
          "ranks") {
  const toy::least_squares prob({.samples = 256, .dim = 13, .seed = 4});
  for (int n = 1; n <= 4; ++n)
    for (const sync::outer_sgd_options o : {sync::outer_sgd_options{}, sync::outer_sgd_options{0.4f, 0.5f},
                                            sync::outer_sgd_options{1.3f, 0.0f}}) {
      CAPTURE(n);
      CAPTURE(o.lr);
      // No warm-up: the first sync point is step 0, then every 3 steps; step 15 is the last, so after 16
      // steps every rank holds the common model.
      const int period = 3, steps = 16;
      const float lr = 0.1f;
      const auto got = toy::train_ranks(
          prob, n, steps,
          [&](local& c) { return outer_local_sgd<local>(c, {.lr = lr, .period = period, .outer = o}); },
          false);
      std::vector<double> v(prob.dim(), 0.0), gd(prob.dim(), 0.0);
      std::vector<float> gr(prob.dim());
      std::vector<std::vector<float>> xs(static_cast<std::size_t>(n), std::vector<float>(prob.dim(), 0.0f));
      for (int t = 0; t < steps; ++t) {
        for (int r = 0; r < n; ++r) {
          auto& x = xs[static_cast<std::size_t>(r)];
          prob.gradient(x, prob.batch(r, n, t, 8), gr);
          for (std::size_t i = 0; i < x.size(); ++i)
            x[i] = x[i] - lr * gr[i];
        }
        if (t % period != 0) continue;
        std::vector<float> next(prob.dim());
        for (std::size_t i = 0; i < prob.dim(); ++i) {
          double mean = 0;
          for (int r = 0; r < n; ++r)
            mean += gd[i] - xs[static_cast<std::size_t>(r)][i]; // old minus new
          mean /= n;
          v[i] = o.momentum * v[i] + mean;
          gd[i] = gd[i] - o.lr * (mean + o.momentum * v[i]);
          next[i] = static_cast<float>(gd[i]);
        }
        for (auto& x : xs)
          x = next;
      }
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < prob.dim(); ++i)
          CHECK(got[static_cast<std::size_t>(r)][i] == doctest::Approx(xs[0][i]).epsilon(1e-4).scale(1e-2));
    }
}

TEST_CASE("plain averaging (outer lr 1, momentum 0) is today's local_sgd bit for bit") {
  const toy::least_squares prob({.samples = 256, .dim = 9, .seed = 8});
  for (int n = 1; n <= 4; ++n)
    for (auto corr : {correction_mode::none, correction_mode::at_sync, correction_mode::every_step}) {
      CAPTURE(n);
      CAPTURE(static_cast<int>(corr));
      const sync::local_sgd_options base{
          .lr = 0.15f, .period = 4, .warmup_steps = 2, .correction = corr, .alpha = 0.25f};
      auto plain = base;
      plain.outer = {.lr = 1.0f, .momentum = 0.0f};
      const auto today =
          toy::train_ranks(prob, n, 23, [&](local& c) { return sync::local_sgd<local>(c, base); });
      const auto outer =
          toy::train_ranks(prob, n, 23, [&](local& c) { return outer_local_sgd<local>(c, plain); });
      for (int r = 0; r < n; ++r)
        CHECK(same_bits(outer[static_cast<std::size_t>(r)], today[static_cast<std::size_t>(r)]));
    }
  // And what today's averaging is, written out: comm::local sums in rank order, then the sum is divided by n.
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    const auto got = toy::train_ranks(
        prob, n, 20,
        [&](local& c) {
          return outer_local_sgd<local>(c, {.lr = 0.15f, .period = 4, .outer = sync::plain_average});
        },
        false);
    std::vector<float> g(prob.dim());
    std::vector<std::vector<float>> xs(static_cast<std::size_t>(n), std::vector<float>(prob.dim(), 0.0f));
    for (int t = 0; t < 20; ++t) {
      for (int r = 0; r < n; ++r) {
        auto& x = xs[static_cast<std::size_t>(r)];
        prob.gradient(x, prob.batch(r, n, t, 8), g);
        for (std::size_t i = 0; i < x.size(); ++i)
          x[i] = x[i] - 0.15f * g[i];
      }
      if (t % 4 != 0) continue;
      std::vector<float> avg = xs[0];
      for (int r = 1; r < n; ++r)
        for (std::size_t i = 0; i < avg.size(); ++i)
          avg[i] += xs[static_cast<std::size_t>(r)][i];
      for (auto& a : avg)
        a = a / static_cast<float>(n);
      for (auto& x : xs)
        x = avg;
    }
    for (int r = 0; r < n; ++r)
      CHECK(same_bits(got[static_cast<std::size_t>(r)], xs[static_cast<std::size_t>(r)]));
  }
}

TEST_CASE("H = 1 with outer SGD equals synchronous SGD on the average gradient") {
  const toy::least_squares prob({.samples = 256, .dim = 10, .seed = 5});
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    const auto sync_x =
        toy::train_ranks(prob, n, 40, [](local& c) { return sync::synchronous<local>(c, {.lr = 0.2f}); });
    // lr 1, momentum 0: the models averaged, x - lr g_r summed instead of the g_r (rounding differs by
    // about an ulp of x a step).
    const auto plain = toy::train_ranks(prob, n, 40, [](local& c) {
      return outer_local_sgd<local>(c, {.lr = 0.2f, .period = 1, .outer = sync::plain_average});
    });
    // Through the pseudo-gradient: inner lr 0.4 and outer lr 0.5 give the mean of 0.4 g_r, halved.
    const auto halved = toy::train_ranks(prob, n, 40, [](local& c) {
      return outer_local_sgd<local>(c, {.lr = 0.4f, .period = 1, .outer = {.lr = 0.5f, .momentum = 0.0f}});
    });
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < prob.dim(); ++i) {
        const auto ri = static_cast<std::size_t>(r);
        CHECK(plain[ri][i] == doctest::Approx(sync_x[ri][i]).epsilon(1e-6).scale(1.0));
        CHECK(halved[ri][i] == doctest::Approx(sync_x[ri][i]).epsilon(1e-5).scale(1.0));
      }
  }
}

TEST_CASE("one rank is Lookahead: k = H fast steps, slow += alpha (fast - slow), bit for bit") {
  const toy::least_squares prob({.samples = 128, .dim = 7, .seed = 11});
  for (const float alpha : {0.5f, 0.8f, 0.3f}) {
    CAPTURE(alpha);
    const int k = 5, steps = 1 + 4 * k; // the first sync point is step 0
    const auto got = toy::train_ranks(
        prob, 1, steps,
        [&](local& c) {
          return outer_local_sgd<local>(c,
                                        {.lr = 0.1f, .period = k, .outer = {.lr = alpha, .momentum = 0.0f}});
        },
        false);
    std::vector<float> slow(prob.dim(), 0.0f), fast = slow, g(prob.dim());
    for (int t = 0; t < steps; ++t) {
      prob.gradient(fast, prob.batch(0, 1, t, 8), g);
      for (std::size_t i = 0; i < fast.size(); ++i)
        fast[i] = fast[i] - 0.1f * g[i];
      if (t % k != 0) continue;
      for (std::size_t i = 0; i < slow.size(); ++i)
        slow[i] = slow[i] + alpha * (fast[i] - slow[i]);
      fast = slow;
    }
    CHECK(same_bits(got[0], slow));
  }
}

TEST_CASE("a non-finite pseudo-gradient is refused on every rank, changing nothing, and training goes on") {
  const toy::least_squares prob({.samples = 128, .dim = 6, .seed = 2});
  for (int n = 2; n <= 4; ++n)
    for (int bad = 0; bad < n; bad += n - 1)
      for (const char* kind : {"uncompressed", "fp16", "top_k_ef", "top_k_ef two_bit"}) {
        CAPTURE(n);
        CAPTURE(bad);
        CAPTURE(kind);
        std::mutex mu;
        std::vector<std::string> failures;
        auto run = [&](auto s, local& c) {
          std::vector<float> x(prob.dim(), 0.0f), g(prob.dim());
          const std::vector<float> zero(prob.dim(), 0.0f);
          s.start(x);
          for (int t = 0; t < 5; ++t) { // sync points 0 and 4: the second is refused
            prob.gradient(x, prob.batch(c.rank(), n, t, 8), g);
            if (t < 4) {
              s.step(x, g);
              continue;
            }
            std::ostringstream before;
            s.save(before);
            const auto kept = x;
            if (c.rank() == bad) x[3] = std::numeric_limits<float>::quiet_NaN();
            std::string f;
            try {
              s.step(x, zero); // a zero gradient: the trainer's own optimizer moved x
              f = "the round was not refused";
            } catch (const non_finite& e) {
              const std::string what = e.what();
              if (what.find("pseudo-gradient") == std::string::npos)
                f = "the message does not name the pseudo-gradient: " + what;
            } catch (const std::exception& e) {
              f = std::string("refused with another error: ") + e.what();
            }
            std::ostringstream after;
            s.save(after);
            if (before.str() != after.str()) f += " / the strategy's state changed";
            if (s.steps() != 4) f += " / the step counter moved";
            x = kept;
            s.step(x, zero); // the same round again, finite: goes through on every rank
            if (s.steps() != 5) f += " / the retried round did not count";
            if (!f.empty()) {
              std::lock_guard lock(mu);
              failures.push_back("rank " + std::to_string(c.rank()) + ": " + f);
            }
          }
        };
        local_group(n).run([&](local& c) {
          const sync::local_sgd_options o{.lr = 0.1f, .period = 4, .outer = {}};
          const std::string k = kind;
          if (k == "fp16")
            run(outer_local_sgd<local, compress::fp16>(c, o,
                                                       compress::fp16(prob.dim(), {.error_feedback = true})),
                c);
          else if (k.starts_with("top_k_ef"))
            run(outer_local_sgd<local, compress::top_k_ef<>>(
                    c, o, compress::top_k_ef<>(prob.dim(), {.density = 0.5, .two_bit = k != "top_k_ef"})),
                c);
          else
            run(outer_local_sgd<local>(c, o), c);
        });
        for (const auto& f : failures)
          FAIL_CHECK(f);
      }
}

TEST_CASE("the outer optimizer's bad arguments are refused with name, value and range") {
  local_group(1).run([](local& c) {
    auto refused = [&](sync::outer_sgd_options o, const char* needle) {
      try {
        outer_local_sgd<local> s(c, {.outer = o});
        FAIL_CHECK("accepted");
      } catch (const invalid_argument& e) {
        const std::string what = e.what();
        CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
      }
    };
    refused({.lr = 0.0f}, "'outer.lr' = 0 is outside the allowed range (0, inf)");
    refused({.lr = -1.0f}, "'outer.lr' = -1 is outside");
    refused({.lr = std::numeric_limits<float>::infinity()}, "'outer.lr' = inf");
    refused({.lr = std::numeric_limits<float>::quiet_NaN()}, "'outer.lr' = nan");
    refused({.momentum = 1.0f}, "'outer.momentum' = 1 is outside the allowed range [0, 1)");
    refused({.momentum = -0.1f}, "'outer.momentum' = -0.1");
    refused({.momentum = std::numeric_limits<float>::quiet_NaN()}, "'outer.momentum' = nan");
  });
}
