// sync::synchronous against single-process SGD on the concatenated batch, plus the toy problem's promises.
#include <commsgd/comm/local.hpp>
#include <commsgd/sync/synchronous.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {
constexpr std::size_t batch = 8;
constexpr int steps = 30;
constexpr float lr = 0.2f;

// Single-process reference: the gradient of the concatenated batch of all ranks, as the sum of the ranks'
// batch gradients taken in rank order, then the same update function the strategy applies.
std::vector<float> reference_sgd(const toy::least_squares& prob, int n) {
  std::vector<float> x(prob.dim(), 0.0f), g(prob.dim()), sum(prob.dim());
  for (int t = 0; t < steps; ++t) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int r = 0; r < n; ++r) {
      prob.gradient(x, prob.batch(r, n, t, batch), g);
      for (std::size_t i = 0; i < g.size(); ++i)
        sum[i] = r == 0 ? g[i] : sum[i] + g[i];
    }
    sync::apply_mean_sum(x, sum, n, lr);
  }
  return x;
}

template <class Strategy>
std::vector<std::vector<float>> run_synchronous(const toy::least_squares& prob, int n) {
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(n));
  local_group(n).run([&](local& c) {
    Strategy s(c, {.lr = lr});
    std::vector<float> x(prob.dim(), 0.0f), g(prob.dim());
    s.start(x);
    for (int t = 0; t < steps; ++t) {
      prob.gradient(x, prob.batch(c.rank(), n, t, batch), g);
      s.step(x, g, {});
    }
    s.finish(x);
    finals[static_cast<std::size_t>(c.rank())] = x;
  });
  return finals;
}
} // namespace

TEST_CASE("synchronous equals single-process SGD on the concatenated batch, bit for bit") {
  // Bit for bit because the reduction order is fixed: comm::local's all_reduce_sum and ordered_exchange both
  // add the ranks' gradients in rank order, the reference adds them in the same order, and both apply the
  // same apply_mean_sum. (A transport free to reorder the sum would only agree within rounding.)
  const toy::least_squares prob({.samples = 256, .dim = 12, .seed = 3});
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    const auto expected = reference_sgd(prob, n);
    const auto via_all_reduce = run_synchronous<sync::synchronous<local>>(prob, n);
    const auto via_ordered =
        run_synchronous<sync::synchronous<local, sync::ordered_exchange<local>>>(prob, n);
    for (int r = 0; r < n; ++r) {
      CHECK(std::memcmp(via_all_reduce[r].data(), expected.data(), expected.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(via_ordered[r].data(), expected.data(), expected.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("the rank-ordered batch gradient agrees with the gradient of the whole concatenated batch") {
  // Same rows, different association of the double sums: agreement within float rounding, not bits.
  const toy::least_squares prob({.samples = 256, .dim = 12, .seed = 3});
  const int n = 4;
  std::vector<float> x(prob.dim(), 0.25f), g(prob.dim()), sum(prob.dim(), 0.0f), whole(prob.dim());
  for (int r = 0; r < n; ++r) {
    prob.gradient(x, prob.shard(r, n), g);
    for (std::size_t i = 0; i < g.size(); ++i)
      sum[i] += g[i] / n;
  }
  prob.gradient(x, {0, prob.samples()}, whole);
  for (std::size_t i = 0; i < g.size(); ++i)
    CHECK(sum[i] == doctest::Approx(whole[i]).epsilon(1e-5));
}

TEST_CASE("toy least squares: deterministic, exact optimum, correct gradient") {
  const toy::least_squares a({.samples = 64, .dim = 5, .seed = 11}), b({.samples = 64, .dim = 5, .seed = 11});
  CHECK(std::memcmp(a.row(7).data(), b.row(7).data(), 5 * sizeof(float)) == 0);
  CHECK(a.loss(a.optimum()) < 1e-12);
  std::vector<float> zero(5, 0.0f);
  CHECK(a.loss(zero) > 0.01);
  // Central differences of the loss match the analytic gradient.
  std::vector<float> x = {0.3f, -0.2f, 0.1f, 0.5f, -0.4f}, g(5);
  const toy::rows r = a.batch(1, 2, 3, 8);
  a.gradient(x, r, g);
  for (std::size_t j = 0; j < 5; ++j) {
    auto xp = x, xm = x;
    const float h = 1e-2f;
    xp[j] += h;
    xm[j] -= h;
    CHECK(g[j] == doctest::Approx((a.loss(xp, r) - a.loss(xm, r)) / (2 * h)).epsilon(1e-3));
  }
  // Shards tile the samples; batches stay inside their shard.
  std::size_t covered = 0;
  for (int k = 0; k < 3; ++k) {
    const auto s = a.shard(k, 3);
    CHECK(s.first == covered);
    covered += s.count;
    const auto bt = a.batch(k, 3, 5, 4);
    CHECK(bt.first >= s.first);
    CHECK(bt.first + bt.count <= s.first + s.count);
  }
  CHECK(covered == 64);
  CHECK_THROWS_AS(a.batch(0, 3, 0, 100), commsgd::invalid_argument);
  CHECK_THROWS_AS(toy::least_squares({.samples = 0}), commsgd::invalid_argument);
}

TEST_CASE("synchronous refuses bad arguments with their name, value and range") {
  local_group(1).run([](local& c) {
    CHECK_THROWS_WITH_AS(sync::synchronous<local>(c, {.lr = 0.0f}),
                         doctest::Contains("'lr' = 0 is outside the allowed range (0, inf)"),
                         commsgd::invalid_argument);
    CHECK_THROWS_AS(sync::synchronous<local>(c, {.lr = -1.0f}), commsgd::invalid_argument);
    sync::synchronous<local> s(c, {.lr = 0.1f});
    std::vector<float> x(4), g(3), bad = {1.0f, NAN, 2.0f, INFINITY};
    CHECK_THROWS_AS(s.step(x, g, {}), commsgd::size_mismatch);
    CHECK_THROWS_AS(s.step(x, bad, {}), commsgd::non_finite);
  });
}
