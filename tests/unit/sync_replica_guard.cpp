// sync::replica_guard: the model hash, the verdict on gathered hashes, and the guard inside data_parallel
// catching a rank that drifts, with the same error on every rank.
#include <commsgd/comm/local.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/sync/replica_guard.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

std::vector<float> random_model(std::size_t d, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(d);
  for (auto& v : x)
    v = dist(gen);
  return x;
}

float with_bits(std::uint32_t b) {
  return std::bit_cast<float>(b);
}

} // namespace

TEST_CASE("model_hash: any change of one word changes it; bits count, not values") {
  std::mt19937_64 gen(11);
  for (std::size_t d : {0u, 1u, 2u, 3u, 7u, 8u, 9u, 64u, 1001u}) {
    CAPTURE(d);
    const auto x = random_model(d, d + 1);
    const auto h = sync::model_hash(x);
    CHECK(sync::model_hash(x) == h); // deterministic
    // Length is part of the hash: a trailing +0 is not invisible.
    auto longer = x;
    longer.push_back(0.0f);
    CHECK(sync::model_hash(longer) != h);
    for (int trial = 0; trial < 40 && d > 0; ++trial) {
      auto y = x;
      const std::size_t i = gen() % d;
      const int bit = static_cast<int>(gen() % 32);
      y[i] = with_bits(std::bit_cast<std::uint32_t>(y[i]) ^ (1u << bit));
      CAPTURE(i);
      CAPTURE(bit);
      CHECK(sync::model_hash(y) != h);
    }
  }
  // -0 and +0 differ, and so do NaNs with different payloads.
  const std::vector<float> pz{0.0f, 1.0f}, nz{-0.0f, 1.0f};
  CHECK(sync::model_hash(pz) != sync::model_hash(nz));
  const std::vector<float> n1{with_bits(0x7fc00000u)}, n2{with_bits(0x7fc00001u)};
  CHECK(sync::model_hash(n1) != sync::model_hash(n2));
  // Swapping two values changes it (the lanes see positions).
  auto x = random_model(16, 3), y = x;
  std::swap(y[0], y[1]);
  CHECK(sync::model_hash(x) != sync::model_hash(y));
  std::swap(y[0], y[1]);
  std::swap(y[0], y[2]);
  CHECK(sync::model_hash(x) != sync::model_hash(y));
}

TEST_CASE("check_replica_hashes names the ranks outside the largest group") {
  using sync::check_replica_hashes;
  const std::vector<std::uint64_t> same{5, 5, 5, 5};
  CHECK_NOTHROW(check_replica_hashes(same, 3, "after step 3"));
  CHECK_NOTHROW(check_replica_hashes(std::vector<std::uint64_t>{}, 0, "x"));
  CHECK_NOTHROW(check_replica_hashes(std::vector<std::uint64_t>{9}, 0, "x"));

  auto verdict = [](std::vector<std::uint64_t> h) {
    try {
      check_replica_hashes(h, 42, "after step 42");
    } catch (const sync::replicas_differ& e) {
      CHECK(e.step() == 42);
      CHECK(std::string(e.what()).find("after step 42") != std::string::npos);
      return e.ranks();
    }
    FAIL("no replicas_differ");
    return std::vector<int>{};
  };
  CHECK(verdict({5, 5, 7, 5}) == std::vector<int>{2});
  CHECK(verdict({7, 5, 5, 5}) == std::vector<int>{0});
  CHECK(verdict({5, 6, 7, 5, 5}) == std::vector<int>{1, 2});
  // A tie: the group of the lowest rank is the reference.
  CHECK(verdict({5, 7, 7, 5}) == std::vector<int>{1, 2});
  CHECK(verdict({1, 2}) == std::vector<int>{1});
  CHECK(verdict({1, 2, 3}) == std::vector<int>{1, 2});
}

TEST_CASE("replica_guard refuses a negative period") {
  local_group(1).run([](local& c) {
    CHECK_THROWS_AS(sync::replica_guard<local>(c, -1), invalid_argument);
    CHECK_THROWS_WITH_AS(
        sync::replica_guard<local>(c, -5),
        doctest::Contains("'replica_check_every' = -5 is outside the allowed range [0, inf)"),
        invalid_argument);
    sync::replica_guard<local> off(c, 0);
    CHECK(!off.enabled());
  });
}

namespace {

// Trains `steps` steps of a composition on n ranks; rank `drifter` nudges one value of its model right after
// step `drift_after` (1-based). Returns each rank's error message (empty if none) and check count.
template <class Dp>
struct outcome {
  std::vector<std::string> errors;
  std::vector<std::int64_t> checks;
  std::vector<std::int64_t> steps; // the step replicas_differ names, -1 if none
  std::vector<std::vector<int>> ranks;
};

template <class Dp>
outcome<Dp> train(int n, typename Dp::options o, int steps, int drifter, int drift_after) {
  outcome<Dp> out;
  out.errors.resize(static_cast<std::size_t>(n));
  out.checks.resize(static_cast<std::size_t>(n));
  out.steps.assign(static_cast<std::size_t>(n), -1);
  out.ranks.resize(static_cast<std::size_t>(n));
  local_group(n).run([&](local& c) {
    const auto me = static_cast<std::size_t>(c.rank());
    const std::size_t d = 33;
    Dp dp(c, d, o);
    auto x = random_model(d, 1);
    std::vector<float> g(d);
    try {
      dp.start(x);
      for (int t = 1; t <= steps && dp.computes_gradients(); ++t) {
        for (std::size_t i = 0; i < d; ++i)
          g[i] = 0.01f * x[i] + 0.001f * static_cast<float>((i + me) % 5);
        dp.step(x, g);
        if (c.rank() == drifter && t == drift_after) x[d / 2] = std::nextafter(x[d / 2], 1e9f);
      }
      dp.finish(x);
    } catch (const sync::replicas_differ& e) {
      out.errors[me] = e.what();
      out.steps[me] = e.step();
      out.ranks[me] = e.ranks();
    }
    out.checks[me] = dp.replica_guard().checks();
  });
  return out;
}

template <class O>
void same_error_everywhere(const O& got, const std::string& step_text, std::vector<int> ranks) {
  for (std::size_t r = 0; r < got.errors.size(); ++r) {
    CAPTURE(r);
    CHECK(got.errors[r] == got.errors[0]);
    CHECK(got.ranks[r] == ranks);
  }
  CHECK(got.errors[0].find(step_text) != std::string::npos);
  CAPTURE(got.errors[0]);
  for (int bad : ranks)
    CHECK(got.errors[0].find("rank " + std::to_string(bad)) != std::string::npos);
}

using sync_dp = data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>;
using part_dp = data_parallel<policy::uncoded<>, policy::dense, policy::partitioned>;
using local_dp = data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd>;
using async_dp = data_parallel<policy::uncoded<>, policy::dense, policy::async_ps>;

} // namespace

TEST_CASE("data_parallel's guard: a rank that drifts is named, on every rank, at the next check") {
  for (int n : {2, 3, 4}) {
    for (int drifter = 0; drifter < n; ++drifter) {
      CAPTURE(n);
      CAPTURE(drifter);
      // Checks after steps 3, 6, 9, ...; the drift after step 4 is seen at step 6.
      const auto got = train<sync_dp>(n, {.lr = 0.1f, .replica_check_every = 3}, 20, drifter, 4);
      for (auto s : got.steps)
        CHECK(s == 6);
      for (auto k : got.checks)
        CHECK(k == 2);
      // With two ranks there is no majority: the lowest rank's model is the reference.
      same_error_everywhere(got, "after step 6", {n == 2 ? 1 : drifter});
    }
  }
  const auto part = train<part_dp>(3, {.lr = 0.1f, .replica_check_every = 1}, 10, 1, 7);
  same_error_everywhere(part, "after step 8", {1});
}

TEST_CASE("data_parallel's guard stays silent on identical replicas and is off by default") {
  const auto quiet = train<sync_dp>(4, {.lr = 0.1f, .replica_check_every = 2}, 10, -1, 0);
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(quiet.errors[r].empty());
    CHECK(quiet.checks[r] == 5 + 1); // steps 2, 4, ..., 10 and finish
  }
  const auto off = train<sync_dp>(3, {.lr = 0.1f}, 10, 1, 2); // drifts, but nobody looks
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK(off.errors[r].empty());
    CHECK(off.checks[r] == 0);
  }
}

TEST_CASE("local_sgd: checks only where models are averaged; drift between averages is healed") {
  local_dp::options o{.lr = 0.1f, .sync = {.period = 4, .warmup_steps = 2}, .replica_check_every = 1};
  // Sync points at steps 3, 7, 11 (1-based: warm-up steps 1 and 2 are synchronous, then t = 2, 6, 10).
  // A drift inside a local phase is averaged away; the guard does not fire.
  const auto healed = train<local_dp>(3, o, 11, 2, 5);
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK(healed.errors[r].empty());
    CHECK(healed.checks[r] == 2 + 3 + 1); // two warm-up steps, three averages, finish
  }
  // At_sync correction promises nothing after averages (and so nothing at finish).
  o.sync.correction = sync::correction_mode::at_sync;
  const auto pulled = train<local_dp>(3, o, 11, 2, 5);
  for (std::size_t r = 0; r < 3; ++r)
    CHECK(pulled.checks[r] == 2);
  // A drift during warm-up is caught at the next warm-up step.
  o.sync.correction = sync::correction_mode::none;
  const auto warm = train<local_dp>(3, o, 11, 0, 1);
  same_error_everywhere(warm, "after step 2", {0});
}

TEST_CASE("async_ps: checked at finish only, where every rank holds the final model") {
  const auto fine = train<async_dp>(3, {.lr = 0.1f, .replica_check_every = 1}, 6, -1, 0);
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK(fine.errors[r].empty());
    CHECK(fine.checks[r] == 1);
  }
}

TEST_CASE("replica_guard by itself: drift after finish names the rank and the step") {
  for (int n : {1, 2, 4}) {
    std::vector<std::string> messages(static_cast<std::size_t>(n));
    local_group(n).run([&](local& c) {
      sync::synchronous<local> s(c, {.lr = 0.5f});
      sync::replica_guard<local> guard(c, 2);
      std::vector<float> x(5, 1.0f), g(5, 0.25f);
      s.start(x);
      for (int t = 0; t < 4; ++t)
        guard.after_step(s, x, s.step(x, g));
      CHECK(guard.checks() == 2);
      s.finish(x);
      if (c.rank() == n - 1) x[4] = -x[4];
      try {
        guard.after_finish(s, x);
      } catch (const sync::replicas_differ& e) {
        messages[static_cast<std::size_t>(c.rank())] = e.what();
      }
    });
    for (const auto& m : messages) {
      CAPTURE(m);
      if (n == 1) {
        CHECK(m.empty());
      } else {
        CHECK(m == messages[0]);
        CHECK(m.find("at finish (after step 4)") != std::string::npos);
        CHECK(m.find("rank " + std::to_string(n - 1)) != std::string::npos);
      }
    }
  }
}

TEST_CASE("replica_guard::resume goes on from a loaded step count") {
  local_group(2).run([](local& c) {
    sync::synchronous<local> s(c, {.lr = 0.5f});
    sync::replica_guard<local> guard(c, 5);
    std::vector<float> x(3, 1.0f), g(3, 0.25f);
    s.start(x);
    guard.resume(7); // the next check falls due at step 10
    for (int t = 0; t < 2; ++t)
      CHECK(!guard.after_step(s, x, s.step(x, g)));
    CHECK(guard.after_step(s, x, s.step(x, g)));
    CHECK(guard.steps() == 10);
    CHECK(guard.checks() == 1);
    // Any count a stream may hold is taken without throwing.
    guard.resume(std::numeric_limits<std::uint64_t>::max());
    CHECK(guard.steps() == std::numeric_limits<std::int64_t>::max());
    sync::replica_guard<local> off(c, 0);
    off.resume(12);
    CHECK(off.steps() == 12);
  });
}
