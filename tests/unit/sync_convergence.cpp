// Every strategy drives the toy least-squares loss from its start to below 1e-3 of it, with 1 to 4 ranks
// (async_ps needs a server besides its workers: 2 to 4 ranks).
#include <commsgd/comm/local.hpp>
#include <commsgd/sync/async_ps.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/partitioned.hpp>
#include <commsgd/sync/synchronous.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <mutex>
#include <type_traits>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {
const toy::least_squares problem({.samples = 480, .dim = 16, .seed = 21});
constexpr int steps = 300;
constexpr double target = 1e-3;

// Runs the life cycle every strategy shares and returns the full loss of rank 0's final model.
template <class Make>
double train(int n, Make make) {
  double final_loss = -1.0;
  std::mutex mu;
  local_group(n).run([&](local& c) {
    auto s = make(c);
    std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
    s.start(x);
    if (s.computes_gradients())
      for (int t = 0; t < steps; ++t) {
        // A parameter server (rank 0) computes nothing: shard over the workers so every row is used.
        constexpr bool served = std::is_same_v<std::remove_cvref_t<decltype(s)>, sync::async_ps<local>>;
        const int workers = served ? n - 1 : n;
        const int me = served ? c.rank() - 1 : c.rank();
        const auto rows = problem.batch(me, workers, t, 8);
        problem.gradient(x, rows, g);
        s.step(x, g, {.loss = problem.loss(x, rows)});
      }
    s.finish(x);
    std::lock_guard lock(mu);
    if (c.rank() == 0) final_loss = problem.loss(x);
  });
  return final_loss;
}
} // namespace

TEST_CASE("every strategy converges on the toy problem") {
  std::vector<float> zero(problem.dim(), 0.0f);
  const double initial = problem.loss(zero);
  REQUIRE(initial > 0.1);
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    CHECK(train(n, [](local& c) { return sync::synchronous<local>(c, {.lr = 0.3f}); }) < target * initial);
    CHECK(train(n, [](local& c) {
            return sync::local_sgd<local>(c, {.lr = 0.3f, .period = 4, .warmup_steps = 10});
          }) < target * initial);
    CHECK(train(n, [](local& c) {
            return sync::local_sgd<local>(c, {.lr = 0.3f,
                                              .period = 8,
                                              .adaptive = true,
                                              .max_period = 16,
                                              .correction = sync::correction_mode::every_step,
                                              .alpha = 0.1f});
          }) < target * initial);
    CHECK(train(n, [](local& c) {
            return sync::partitioned<local>(c, {5, 7, 4},
                                            {.lr = 0.3f, .partition_elements = 3, .credit_bytes = 24});
          }) < target * initial);
    if (n >= 2) {
      CHECK(train(n, [](local& c) { return sync::async_ps<local>(c, {.lr = 0.2f}); }) < target * initial);
      CHECK(train(n, [n](local& c) {
              return sync::async_ps<local>(
                  c, {.lr = 0.3f, .apply_after = n - 1, .staleness_scaling = true, .staleness_bound = 2});
            }) < target * initial);
    }
  }
}
