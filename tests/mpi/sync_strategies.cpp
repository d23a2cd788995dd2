// The sync strategies over comm::mpi: the same promises as the comm::local tests, with real processes.
#include "mpi/support.hpp"

#include <commsgd/comm/local.hpp>
#include <commsgd/comm/mpi.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/sync/async_ps.hpp>
#include <commsgd/sync/diloco.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/partitioned.hpp>
#include <commsgd/sync/synchronous.hpp>
#include <support/least_squares.hpp>

#include <algorithm>
#include <boost/mpi/environment.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace commsgd;
using comm::mpi;

namespace {
const std::vector<std::size_t> layers = {5, 17, 3, 9};
const toy::least_squares problem({.samples = 480, .dim = 34, .seed = 13});

template <class Strategy>
std::vector<float> run_sync(mpi& c, Strategy& s, int steps) {
  std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
  s.start(x);
  for (int t = 0; t < steps; ++t) {
    const auto rows = problem.batch(c.rank(), c.size(), t, 8);
    problem.gradient(x, rows, g);
    s.step(x, g, {.loss = problem.loss(x, rows)});
  }
  s.finish(x);
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
} // namespace

TEST_CASE(
    "synchronous: bit for bit with a rank-ordered reference over ordered_exchange, close over MPI_SUM") {
  auto c = mpi::world();
  const int n = c.size(), steps = 20;
  // Reference computed by every rank alone: ranks' batch gradients summed in rank order.
  std::vector<float> ref(problem.dim(), 0.0f), g(problem.dim()), sum(problem.dim());
  for (int t = 0; t < steps; ++t) {
    for (int r = 0; r < n; ++r) {
      problem.gradient(ref, problem.batch(r, n, t, 8), g);
      for (std::size_t i = 0; i < g.size(); ++i)
        sum[i] = r == 0 ? g[i] : sum[i] + g[i];
    }
    sync::apply_mean_sum(ref, sum, n, 0.2f);
  }
  sync::synchronous<mpi, sync::ordered_exchange<mpi>> ordered(c, {.lr = 0.2f});
  CHECK(same_bits(run_sync(c, ordered, steps), ref));
  // MPI_SUM may associate differently: equal within rounding only.
  sync::synchronous<mpi> plain(c, {.lr = 0.2f});
  const auto x = run_sync(c, plain, steps);
  for (std::size_t i = 0; i < x.size(); ++i)
    CHECK(x[i] == doctest::Approx(ref[i]).epsilon(1e-5));
}

TEST_CASE("partitioned equals synchronous over ordered_exchange bit for bit, layers ready in any order") {
  auto c = mpi::world();
  sync::synchronous<mpi, sync::ordered_exchange<mpi>> s(c, {.lr = 0.2f});
  const auto want = run_sync(c, s, 15);
  sync::partitioned<mpi> p(c, layers, {.lr = 0.2f, .partition_elements = 4, .credit_bytes = 32});
  std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
  p.start(x);
  std::mt19937 rng(static_cast<unsigned>(c.rank() + 1));
  for (int t = 0; t < 15; ++t) {
    problem.gradient(x, problem.batch(c.rank(), c.size(), t, 8), g);
    std::vector<std::size_t> order(layers.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), rng); // a different order on every rank and step
    p.begin_step(g);
    for (std::size_t l : order)
      p.gradient_ready(l);
    p.finish_step(x);
  }
  p.finish(x);
  CHECK(same_bits(x, want));
}

TEST_CASE("local_sgd: the schedule holds and the model converges") {
  auto c = mpi::world();
  sync::local_sgd<mpi> s(c, {.lr = 0.3f, .period = 4, .warmup_steps = 3});
  std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
  const double initial = problem.loss(x);
  s.start(x);
  std::vector<int> averaged;
  for (int t = 0; t < 300; ++t) {
    const auto rows = problem.batch(c.rank(), c.size(), t, 8);
    problem.gradient(x, rows, g);
    if (s.step(x, g, {}).averaged) averaged.push_back(t);
  }
  s.finish(x);
  CHECK(averaged.front() == 3);
  for (std::size_t i = 1; i < averaged.size(); ++i)
    CHECK(averaged[i] - averaged[i - 1] == 4);
  CHECK(problem.loss(x) < 1e-3 * initial);
}

TEST_CASE("async_ps: every gradient applied exactly once under random delays, ragged shutdown") {
  auto c = mpi::world();
  const int n = c.size(), max_steps = 10;
  for (int j = 1; j <= n - 1; ++j)
    for (int bound : {-1, 1}) {
      CAPTURE(j);
      CAPTURE(bound);
      sync::async_ps<mpi> s(c, {.lr = 1.0f, .apply_after = j, .staleness_bound = bound});
      const std::size_t dim = static_cast<std::size_t>(n * max_steps);
      std::vector<float> x(dim, 0.0f), g(dim);
      s.start(x);
      const int steps = s.is_server() ? 0 : 3 * c.rank() + 1; // ragged: workers finish at different times
      std::mt19937 rng(static_cast<unsigned>(c.rank() * 31 + j));
      for (int k = 0; k < steps; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 2)(rng)));
        std::fill(g.begin(), g.end(), 0.0f);
        g[static_cast<std::size_t>(c.rank() * max_steps + k)] = 1.0f;
        s.step(x, g, {});
      }
      s.finish(x);
      // Every rank ends with the server's model; each one-hot slot was applied once with the logged factor
      // (the server checks against its log, everyone checks the slot count).
      std::size_t touched = 0;
      for (float v : x)
        touched += v != 0.0f ? 1 : 0;
      std::size_t expected = 0;
      for (int r = 1; r < n; ++r)
        expected += static_cast<std::size_t>(3 * r + 1);
      CHECK(touched == expected);
      if (s.is_server()) {
        std::set<std::pair<int, std::int64_t>> seen;
        for (const auto& u : s.log()) {
          CHECK(seen.insert({u.worker, u.step}).second);
          CHECK(x[static_cast<std::size_t>(u.worker * max_steps + u.step)] == -u.factor);
          CHECK(u.staleness == u.applied_at - u.computed_on);
        }
        CHECK(seen.size() == expected);
      }
      std::vector<float> all(dim * static_cast<std::size_t>(n));
      c.all_gather(std::span<const float>(x), std::span<float>(all));
      for (int r = 1; r < n; ++r)
        CHECK(std::memcmp(all.data(), all.data() + r * dim, dim * sizeof(float)) == 0);
    }
}

namespace {
using topk = compress::top_k_ef<>;
const sync::diloco_options streamed{.lr = 0.05f, .sync_every = 6, .fragments = 3, .delay = 2, .alpha = 0.5f};

bool serialized_threads() {
  if (boost::mpi::environment::thread_level() >= boost::mpi::threading::serialized) return true;
  MESSAGE("skipped: this MPI does not allow calls from a second thread (MPI_THREAD_SERIALIZED)");
  return false;
}

// The same run on n thread ranks in this process: every MPI rank computes all of it.
template <class Make>
std::vector<std::vector<float>> on_threads(int n, int steps, Make make) {
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(n));
  comm::local_group(n).run([&](comm::local& c) {
    auto s = make(c);
    std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
    s.start(x);
    for (int t = 0; t < steps; ++t) {
      const auto rows = problem.batch(c.rank(), n, t, 8);
      problem.gradient(x, rows, g);
      s.step(x, g, {.loss = problem.loss(x, rows)});
    }
    s.finish(x);
    finals[static_cast<std::size_t>(c.rank())] = x;
  });
  return finals;
}
} // namespace

TEST_CASE("diloco over MPI: one fragment with no delay gives the thread ranks' models bit for bit (top-k)") {
  auto c = mpi::world();
  if (!serialized_threads()) return;
  const sync::diloco_options o{.lr = 0.05f, .sync_every = 4, .outer = {.lr = 0.7f, .momentum = 0.9f}};
  sync::diloco<mpi, topk> sk(c, layers, o, [](std::size_t n) { return topk(n, {.density = 0.3}); });
  const auto want = on_threads(c.size(), 21, [&](comm::local& l) {
    return sync::diloco<comm::local, topk>(l, layers, o,
                                           [](std::size_t n) { return topk(n, {.density = 0.3}); });
  });
  CHECK(same_bits(run_sync(c, sk, 21), want[static_cast<std::size_t>(c.rank())]));
}

TEST_CASE("diloco over MPI: fragments on the exchange thread give the thread ranks' models") {
  auto c = mpi::world();
  if (!serialized_threads()) return;
  const int n = c.size(), steps = 25;
  // Top-k gathers the messages and sums them in rank order: the same bits as on threads.
  sync::diloco<mpi, topk> sk(c, layers, streamed,
                             [](std::size_t len) { return topk(len, {.density = 0.2}); });
  const auto want_k = on_threads(n, steps, [](comm::local& l) {
    return sync::diloco<comm::local, topk>(l, layers, streamed,
                                           [](std::size_t len) { return topk(len, {.density = 0.2}); });
  });
  CHECK(same_bits(run_sync(c, sk, steps), want_k[static_cast<std::size_t>(c.rank())]));
  // Floats summed by MPI_SUM, which may associate differently: equal within rounding.
  sync::diloco<mpi> s(c, layers, streamed);
  const auto want =
      on_threads(n, steps, [](comm::local& l) { return sync::diloco<comm::local>(l, layers, streamed); });
  const auto x = run_sync(c, s, steps);
  for (std::size_t i = 0; i < x.size(); ++i)
    CHECK(x[i] == doctest::Approx(want[static_cast<std::size_t>(c.rank())][i]).epsilon(1e-4));
}

TEST_CASE("diloco over MPI: a checkpoint with exchanges in flight resumes bit for bit") {
  auto c = mpi::world();
  if (!serialized_threads()) return;
  const int before = 10, after = 15;
  auto make = [&] {
    return sync::diloco<mpi, topk>(c, layers, streamed,
                                   [](std::size_t len) { return topk(len, {.density = 0.2}); });
  };
  std::string shared, local;
  std::vector<float> saved_x, straight;
  {
    auto s = make();
    std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
    s.start(x);
    for (int t = 0; t < before + after; ++t) {
      if (t == before) {
        CHECK((s.in_flight(0) || s.in_flight(1) || s.in_flight(2)));
        std::ostringstream sh, lo;
        s.save(sh, state::part::shared);
        s.save(lo, state::part::local);
        shared = sh.str();
        local = lo.str();
        saved_x = x;
      }
      problem.gradient(x, problem.batch(c.rank(), c.size(), t, 8), g);
      s.step(x, g);
    }
    s.finish(x);
    straight = x;
  }
  auto s = make();
  std::istringstream sh(shared), lo(local);
  s.load(sh, lo);
  auto x = saved_x;
  std::vector<float> g(x.size());
  s.start(x);
  for (int t = before; t < before + after; ++t) {
    problem.gradient(x, problem.batch(c.rank(), c.size(), t, 8), g);
    s.step(x, g);
  }
  s.finish(x);
  CHECK(same_bits(x, straight));
}

TEST_CASE("diloco over MPI: a non-finite pseudo-gradient of one rank is refused on every rank") {
  auto c = mpi::world();
  if (!serialized_threads()) return;
  sync::diloco<mpi> s(c, layers, {.lr = 0.05f, .sync_every = 4, .fragments = 2, .delay = 1});
  std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
  s.start(x);
  int refused = 0;
  for (int t = 0; t < 6; ++t) {
    problem.gradient(x, problem.batch(c.rank(), c.size(), t, 8), g);
    // Fragment 0 starts after inner step 4 (t = 3 here) and is applied after step 5; the last rank spoils it.
    if (t == 3 && c.rank() == c.size() - 1) x[0] = std::numeric_limits<float>::quiet_NaN();
    if (t == 4) std::fill(g.begin(), g.end(), 0.0f);
    try {
      s.step(x, g);
    } catch (const non_finite& e) {
      ++refused;
      CHECK(t == 4);
      CHECK(std::string(e.what()).find("fragment 0") != std::string::npos);
      CHECK_FALSE(s.in_flight(0));
      // The trainer mends its model from the common one and goes on.
      x[0] = s.global_model(0)[0];
    }
  }
  CHECK(refused == 1);
  s.finish(x);
  for (float v : x)
    CHECK(std::isfinite(v));
}
