// sync::async_ps under random delays: every gradient applied exactly once, staleness as recorded, j = n is a
// synchronous parameter server, the SSP bound holds, shutdown never hangs.
#include <commsgd/comm/local.hpp>
#include <commsgd/sync/async_ps.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {
struct outcome {
  std::vector<sync::applied_update> log;
  std::vector<float> server_model;
  std::vector<std::vector<float>> worker_models;             // by rank
  std::map<std::pair<int, std::int64_t>, std::int64_t> seen; // (rank, step) -> version the worker computed on
  std::vector<std::int64_t> pushes;                          // by rank
};

// Every worker pushes one-hot gradients: worker rank r, step k sets index slot(r, k) to 1. With x0 = 0 each
// index is touched by one gradient only, so x[slot] = -factor exactly if it was applied once, -2 factor if
// twice, 0 if lost.
std::size_t slot(int rank, int step, int max_steps) {
  return static_cast<std::size_t>(rank) * static_cast<std::size_t>(max_steps) +
         static_cast<std::size_t>(step);
}

template <class Steps, class Delay>
outcome run_ps(int n, sync::async_ps_options opt, int max_steps, Steps steps_of, Delay delay_ms) {
  outcome out;
  out.worker_models.resize(static_cast<std::size_t>(n));
  out.pushes.assign(static_cast<std::size_t>(n), 0);
  std::mutex mu;
  const std::size_t dim = slot(n, 0, max_steps);
  local_group(n).run([&](local& c) {
    sync::async_ps<local> s(c, opt);
    std::vector<float> x(dim, 0.0f), g(dim, 0.0f);
    s.start(x);
    if (s.computes_gradients()) {
      std::mt19937 rng(static_cast<unsigned>(c.rank() * 7919 + 1));
      const int steps = steps_of(c.rank());
      for (int k = 0; k < steps; ++k) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay_ms(c.rank(), rng) * 1000));
        std::fill(g.begin(), g.end(), 0.0f);
        g[slot(c.rank(), k, max_steps)] = 1.0f;
        {
          std::lock_guard lock(mu);
          out.seen[{c.rank(), k}] = s.version();
        }
        s.step(x, g, {});
      }
      std::lock_guard lock(mu);
      out.pushes[static_cast<std::size_t>(c.rank())] = steps;
    }
    s.finish(x);
    std::lock_guard lock(mu);
    if (s.is_server()) {
      out.log = s.log();
      out.server_model = x;
    } else {
      out.worker_models[static_cast<std::size_t>(c.rank())] = x;
    }
  });
  return out;
}

// What every run must satisfy, whatever the options.
void check_exactly_once(const outcome& o, int n, int server, int max_steps) {
  std::set<std::pair<int, std::int64_t>> applied;
  for (const auto& u : o.log) {
    CHECK(applied.insert({u.worker, u.step}).second); // never twice
    CHECK(u.staleness == u.applied_at - u.computed_on);
    CHECK(u.staleness >= 0);
    CHECK(o.seen.at({u.worker, u.step}) == u.computed_on); // the version the worker really computed on
    CHECK(o.server_model[slot(u.worker, static_cast<int>(u.step), max_steps)] == -u.factor);
  }
  std::size_t pushed = 0;
  for (int r = 0; r < n; ++r)
    pushed += static_cast<std::size_t>(o.pushes[static_cast<std::size_t>(r)]);
  CHECK(applied.size() == pushed); // none lost
  CHECK(o.seen.size() == pushed);
  for (int r = 0; r < n; ++r)
    if (r != server)
      CHECK(std::memcmp(o.worker_models[static_cast<std::size_t>(r)].data(), o.server_model.data(),
                        o.server_model.size() * sizeof(float)) == 0);
}

auto jitter = [](int, std::mt19937& rng) { return std::uniform_int_distribution<int>(0, 3)(rng); };
} // namespace

TEST_CASE("plain ASGD (j = 1) under random delays applies every gradient exactly once") {
  for (int n = 2; n <= 4; ++n)
    for (int server : {0, n - 1}) {
      CAPTURE(n);
      CAPTURE(server);
      const int steps = 12;
      const auto o = run_ps(
          n, {.lr = 1.0f, .server = server}, steps, [](int) { return steps; }, jitter);
      check_exactly_once(o, n, server, steps);
      // One gradient per update: versions 0, 1, 2, ... in order.
      for (std::size_t i = 0; i < o.log.size(); ++i) {
        CHECK(o.log[i].applied_at == static_cast<std::int64_t>(i));
        CHECK(o.log[i].factor == 1.0f);
      }
    }
}

TEST_CASE("staleness-aware scaling divides lr by the recorded staleness") {
  const int n = 4, steps = 10;
  const auto o = run_ps(
      n, {.lr = 0.5f, .staleness_scaling = true}, steps, [](int) { return steps; }, jitter);
  check_exactly_once(o, n, 0, steps);
  bool saw_stale = false;
  for (const auto& u : o.log) {
    CHECK(u.factor == 0.5f / static_cast<float>(std::max<std::int64_t>(u.staleness, 1)));
    saw_stale = saw_stale || u.staleness > 1;
  }
  CHECK(saw_stale); // three workers racing make some gradients older than one version
}

TEST_CASE("j = n workers behaves as a synchronous parameter server") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    const int workers = n - 1, steps = 8;
    const auto o = run_ps(
        n, {.lr = 1.0f, .apply_after = workers}, steps, [](int) { return steps; }, jitter);
    check_exactly_once(o, n, 0, steps);
    std::map<std::int64_t, std::set<int>> batches;
    for (const auto& u : o.log) {
      CHECK(u.staleness == 0);
      CHECK(u.computed_on == u.step); // every worker's k-th gradient is computed on version k
      CHECK(u.factor == 1.0f / static_cast<float>(workers));
      batches[u.applied_at].insert(u.worker);
    }
    CHECK(batches.size() == static_cast<std::size_t>(steps));
    for (const auto& [version, who] : batches)
      CHECK(who.size() == static_cast<std::size_t>(workers)); // one gradient of every worker per update
  }
}

TEST_CASE("soft synchronisation with 1 < j < n applies batches of j") {
  const int n = 4, steps = 9;
  const auto o = run_ps(
      n, {.lr = 1.0f, .apply_after = 2}, steps, [](int) { return steps; }, jitter);
  check_exactly_once(o, n, 0, steps);
  std::map<std::int64_t, std::vector<int>> batches;
  std::map<int, std::int64_t> last_version; // by worker: the update that took its last gradient
  for (const auto& u : o.log) {
    batches[u.applied_at].push_back(u.worker);
    last_version[u.worker] = std::max(last_version[u.worker], u.applied_at);
  }
  for (const auto& [v, who] : batches) {
    CHECK(who.size() <= 2);
    // A short batch only when no other worker can push any more: all others have finished.
    if (who.size() < 2)
      for (const auto& [w, last] : last_version)
        if (w != who[0]) CHECK(last < v);
  }
}

TEST_CASE("the staleness bound holds back a worker too far ahead") {
  // Worker 1 is slow (4 ms per step), the others fast. With bound s, a worker may start step c only when
  // every other unfinished worker has pushed at least c - s gradients; the server's arrival order shows it.
  for (int s : {0, 1, 3}) {
    CAPTURE(s);
    const int n = 4, steps = 10;
    auto delay = [](int rank, std::mt19937&) { return rank == 1 ? 4 : 0; };
    const auto o = run_ps(
        n, {.lr = 1.0f, .staleness_bound = s}, steps, [](int) { return steps; }, delay);
    check_exactly_once(o, n, 0, steps);
    std::vector<sync::applied_update> by_arrival = o.log;
    std::sort(by_arrival.begin(), by_arrival.end(),
              [](const auto& a, const auto& b) { return a.arrival < b.arrival; });
    std::map<int, std::int64_t> count;
    for (const auto& u : by_arrival) {
      for (int v = 1; v < n; ++v)
        if (v != u.worker) CHECK(count[v] >= std::min<std::int64_t>(u.step - s, steps));
      ++count[u.worker];
    }
  }
  // Without a bound the fast workers do run ahead of the slow one (the bound above is not vacuous). The slow
  // worker stops before its third step until the fast one has begun its last (5 s at most), then takes 20 ms:
  // a pace alone (4 ms, then 20 ms a step) let a loaded machine (ThreadSanitizer beside other jobs on two
  // cores) starve the fast worker into the slow one's pace. With a bound the fast one could not get there.
  const int n = 3, steps = 10;
  std::atomic<int> fast_started{0};
  int slow_started = 0; // rank 1's thread alone
  auto delay = [&](int rank, std::mt19937&) {
    if (rank == 2) ++fast_started;
    if (rank != 1) return 0;
    if (++slow_started == 3) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (fast_started.load() < steps && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return 20;
  };
  const auto o = run_ps(
      n, {.lr = 1.0f}, steps, [](int) { return steps; }, delay);
  std::vector<sync::applied_update> by_arrival = o.log;
  std::sort(by_arrival.begin(), by_arrival.end(),
            [](const auto& a, const auto& b) { return a.arrival < b.arrival; });
  std::int64_t slow_before_fast_last = 0;
  for (const auto& u : by_arrival) {
    if (u.worker == 2 && u.step == steps - 1) break;
    if (u.worker == 1) ++slow_before_fast_last;
  }
  CHECK(slow_before_fast_last < steps - 2);
}

TEST_CASE("shutdown with workers finishing at different times never hangs") {
  using clock_type = std::chrono::steady_clock;
  for (int n = 2; n <= 4; ++n)
    for (int j = 1; j <= n - 1; ++j)
      for (int bound : {-1, 0, 2}) {
        CAPTURE(n);
        CAPTURE(j);
        CAPTURE(bound);
        const int max_steps = 12;
        // Rank r does 4 (r - 1) steps: rank 1 none at all, the last one the most.
        const auto start = clock_type::now();
        const auto o = run_ps(
            n, {.lr = 1.0f, .apply_after = j, .staleness_bound = bound}, max_steps,
            [](int r) { return 4 * (r - 1); },
            [](int, std::mt19937& rng) { return std::uniform_int_distribution<int>(0, 1)(rng); });
        CHECK(clock_type::now() - start < std::chrono::seconds(10));
        check_exactly_once(o, n, 0, max_steps);
      }
}

TEST_CASE("async_ps refuses bad arguments with their name, value and range") {
  local_group(1).run([](local& c) {
    CHECK_THROWS_WITH_AS(sync::async_ps<local>(c, {}), doctest::Contains("size = 1"),
                         commsgd::invalid_argument);
  });
  local_group(3).run([](local& c) {
    using ps = sync::async_ps<local>;
    CHECK_THROWS_WITH_AS(ps(c, {.apply_after = 0}),
                         doctest::Contains("'apply_after' = 0 is outside the allowed range [1, workers = 2]"),
                         commsgd::invalid_argument);
    CHECK_THROWS_AS(ps(c, {.apply_after = 3}), commsgd::invalid_argument);
    CHECK_THROWS_AS(ps(c, {.lr = -0.5f}), commsgd::invalid_argument);
    CHECK_THROWS_AS(ps(c, {.server = 3}), commsgd::invalid_argument);
    CHECK_THROWS_AS(ps(c, {.staleness_bound = -2}), commsgd::invalid_argument);
    ps s(c, {});
    std::vector<float> x(3), g(3);
    if (s.is_server()) {
      s.start(x);
      CHECK_THROWS_WITH_AS(s.step(x, g, {}), doctest::Contains("parameter server"),
                           commsgd::invalid_argument);
    } else {
      CHECK_THROWS_AS(s.push(g), commsgd::invalid_argument); // before start
      s.start(x);
      std::vector<float> wrong(2);
      CHECK_THROWS_AS(s.push(wrong), commsgd::size_mismatch);
    }
    s.finish(x);
  });
}

TEST_CASE("the server and worker roles are two types; each refuses the other's rank") {
  static_assert(sync::sync_strategy<sync::async_ps_server<local>>);
  static_assert(sync::sync_strategy<sync::async_ps_worker<local>>);
  constexpr int n = 4, steps = 5;
  const std::size_t dim = slot(n, 0, steps);
  // The roles driven directly, rank 2 serving: every one-hot gradient lands exactly once, as with async_ps.
  std::vector<float> server_model;
  std::vector<sync::applied_update> log;
  std::vector<std::vector<float>> worker_models(n);
  std::mutex mu;
  const sync::async_ps_options opt{.lr = 1.0f, .server = 2, .apply_after = 2};
  local_group(n).run([&](local& c) {
    std::vector<float> x(dim, 0.0f), g(dim, 0.0f);
    if (c.rank() == opt.server) {
      CHECK_THROWS_WITH_AS(sync::async_ps_worker<local>(c, opt), doctest::Contains("async_ps_server there"),
                           commsgd::invalid_argument);
      sync::async_ps_server<local> server(c, opt);
      CHECK_FALSE(server.computes_gradients());
      server.start(x);
      CHECK_THROWS_WITH_AS(server.step(x, g, {}), doctest::Contains("parameter server"),
                           commsgd::invalid_argument);
      server.finish(x);
      std::lock_guard lock(mu);
      server_model = x;
      log = server.log();
    } else {
      CHECK_THROWS_WITH_AS(sync::async_ps_server<local>(c, opt), doctest::Contains("async_ps_worker there"),
                           commsgd::invalid_argument);
      sync::async_ps_worker<local> worker(c, opt);
      CHECK(worker.computes_gradients());
      worker.start(x);
      for (int k = 0; k < steps; ++k) {
        std::fill(g.begin(), g.end(), 0.0f);
        g[slot(c.rank(), k, steps)] = 1.0f;
        worker.step(x, g, {});
      }
      worker.finish(x);
      std::lock_guard lock(mu);
      worker_models[static_cast<std::size_t>(c.rank())] = x;
    }
  });
  CHECK(log.size() == static_cast<std::size_t>((n - 1) * steps));
  for (int r = 0; r < n; ++r) {
    if (r == opt.server) continue;
    for (int k = 0; k < steps; ++k) {
      const auto v = server_model[slot(r, k, steps)];
      CHECK((v == -1.0f || v == -0.5f)); // lr / batch, the batch being 1 or 2 gradients
    }
    CHECK(std::memcmp(worker_models[static_cast<std::size_t>(r)].data(), server_model.data(),
                      dim * sizeof(float)) == 0);
  }
  std::set<std::pair<int, std::int64_t>> applied;
  for (const auto& u : log) {
    CHECK(applied.insert({u.worker, u.step}).second);
    CHECK(server_model[slot(u.worker, static_cast<int>(u.step), steps)] == -u.factor);
  }
}
