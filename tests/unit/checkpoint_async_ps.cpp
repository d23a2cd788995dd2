// Checkpoints of sync::async_ps on comm::local. A consistent checkpoint of the group is taken after
// finish(); fresh objects that load it and start() again reach the same server state as the objects that
// simply went on, given the same deliveries in the same order: with one worker the order is fixed, so the
// two runs match bit for bit; with several, the resumed server's model equals the checkpointed model with
// the logged gradients applied in the logged order, and no gradient is lost or applied twice.
#include "support/checkpoint.hpp"

#include <commsgd/comm/local.hpp>
#include <commsgd/sync/async_ps.hpp>

#include <doctest/doctest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

constexpr std::size_t dim = 9;

std::vector<float> initial_model() {
  std::vector<float> x(dim);
  for (std::size_t i = 0; i < dim; ++i)
    x[i] = 0.25f - 0.05f * static_cast<float>(i);
  return x;
}

// One serving session: start, steps [from, to) on every worker, finish.
void session(sync::async_ps<local>& s, local& c, std::vector<float>& x, int from, int to) {
  s.start(x);
  if (s.computes_gradients())
    for (int t = from; t < to; ++t)
      s.step(x, ckpt::fixed_gradient(dim, c.rank(), t));
  s.finish(x);
}

struct outcome {
  std::vector<float> server_model;
  std::vector<sync::applied_update> log;
  std::vector<std::int64_t> pushes;
  std::vector<std::vector<float>> finals; // by rank
  // Resumed runs: the model and log length at the checkpoint.
  std::vector<float> saved_model;
  std::size_t saved_log = 0;
  std::string failure;
};

// k1 steps, then k2 more: on the same objects (resume = false), or on fresh ones loaded from the checkpoint
// taken in between (every rank's part::all stream, or rank 0's shared part with each rank's local part).
outcome run(int n, sync::async_ps_options o, int k1, int k2, bool resume, bool split) {
  outcome out;
  out.finals.resize(static_cast<std::size_t>(n));
  std::mutex mu;
  ckpt::bytes shared0;
  local_group(n).run([&](local& c) {
    std::string failure;
    auto note = [&](const std::string& f) {
      if (failure.empty()) failure = f;
    };
    sync::async_ps<local> first(c, o);
    auto x = initial_model();
    session(first, c, x, 0, k1);
    sync::async_ps<local>* s = &first;
    sync::async_ps<local> second(c, o);
    if (resume) {
      const auto all = ckpt::save_bytes(first);
      const auto shared = ckpt::save_bytes(first, state::part::shared);
      const auto mine = ckpt::save_bytes(first, state::part::local);
      if (c.rank() == o.server) {
        out.saved_model = first.server()->model();
        out.saved_log = first.log().size();
        std::lock_guard lock(mu);
        shared0 = shared;
      }
      c.barrier();
      if (split)
        ckpt::load_bytes(second, shared0, mine);
      else
        ckpt::load_bytes(second, all);
      if (ckpt::save_bytes(second) != all) note("a loaded async_ps saves other bytes than it loaded");
      if (shared != shared0) note("the shared part differs between ranks");
      s = &second;
    }
    session(*s, c, x, k1, k1 + k2);
    std::lock_guard lock(mu);
    out.finals[static_cast<std::size_t>(c.rank())] = x;
    if (s->is_server()) {
      out.server_model = s->server()->model();
      out.log = s->log();
      out.pushes = s->server()->pushes();
    }
    if (!failure.empty()) out.failure = failure;
  });
  return out;
}

bool same_log(const std::vector<sync::applied_update>& a, const std::vector<sync::applied_update>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].worker != b[i].worker || a[i].step != b[i].step || a[i].computed_on != b[i].computed_on ||
        a[i].applied_at != b[i].applied_at || a[i].staleness != b[i].staleness ||
        a[i].arrival != b[i].arrival || !ckpt::same_bits({&a[i].factor, 1}, {&b[i].factor, 1}))
      return false;
  return true;
}

// What holds whatever the delivery order: every gradient applied once, the resumed model is the checkpoint's
// with the logged gradients applied in order, and every worker ends with the server's model.
void check_consistent(const outcome& r, int n, int server, int steps) {
  REQUIRE_MESSAGE(r.failure.empty(), r.failure);
  std::map<std::pair<int, std::int64_t>, int> seen;
  for (const auto& u : r.log)
    ++seen[{u.worker, u.step}];
  CHECK(seen.size() == static_cast<std::size_t>((n - 1) * steps));
  for (const auto& [key, count] : seen) {
    CHECK(count == 1);
    CHECK(key.second < steps);
  }
  for (const auto p : r.pushes)
    CHECK(p == steps);
  auto model = r.saved_model;
  for (std::size_t e = r.saved_log; e < r.log.size(); ++e) {
    const auto& u = r.log[e];
    const auto g = ckpt::fixed_gradient(dim, u.worker, u.step);
    for (std::size_t i = 0; i < dim; ++i)
      model[i] = model[i] - u.factor * g[i];
  }
  CHECK(ckpt::same_bits(model, r.server_model));
  for (int q = 0; q < n; ++q)
    if (q != server) CHECK(ckpt::same_bits(r.finals[static_cast<std::size_t>(q)], r.server_model));
}

} // namespace

TEST_CASE("async_ps with one worker resumes from a checkpoint bit for bit") {
  for (const sync::async_ps_options o :
       {sync::async_ps_options{.lr = 0.2f}, sync::async_ps_options{.lr = 0.2f, .staleness_scaling = true},
        sync::async_ps_options{.lr = 0.2f, .server = 1, .staleness_bound = 0}})
    for (bool split : {false, true}) {
      CAPTURE(split);
      const auto straight = run(2, o, 7, 9, false, false);
      const auto resumed = run(2, o, 7, 9, true, split);
      REQUIRE_MESSAGE(resumed.failure.empty(), resumed.failure);
      CHECK(ckpt::same_bits(straight.server_model, resumed.server_model));
      CHECK(same_log(straight.log, resumed.log));
      CHECK(straight.pushes == resumed.pushes);
      for (std::size_t r = 0; r < 2; ++r)
        CHECK(ckpt::same_bits(straight.finals[r], resumed.finals[r]));
      check_consistent(resumed, 2, o.server, 16);
    }
}

TEST_CASE("async_ps with several workers resumes to the same server state for the same deliveries") {
  for (int n = 3; n <= 4; ++n)
    for (const sync::async_ps_options o :
         {sync::async_ps_options{.lr = 0.1f}, sync::async_ps_options{.lr = 0.1f, .apply_after = 2},
          sync::async_ps_options{.lr = 0.1f, .server = 2, .staleness_scaling = true, .staleness_bound = 1}})
      for (bool split : {false, true}) {
        CAPTURE(n);
        CAPTURE(split);
        check_consistent(run(n, o, 5, 8, true, split), n, o.server, 13);
      }
}

TEST_CASE("async_ps streams: damage, another role, other options are refused and change nothing") {
  std::mutex mu;
  std::vector<std::string> failures;
  ckpt::bytes server_stream, worker_stream;
  local_group(2).run([&](local& c) {
    sync::async_ps<local> s(c, {.lr = 0.2f});
    auto x = initial_model();
    session(s, c, x, 0, 4);
    const auto good = ckpt::save_bytes(s);
    {
      std::lock_guard lock(mu);
      (s.is_server() ? server_stream : worker_stream) = good;
    }
    sync::async_ps<local> fresh(c, {.lr = 0.2f});
    std::string f = ckpt::check_damage(fresh, good);
    if (f.empty()) f = ckpt::check_repaired_edits(fresh, good, 7u + static_cast<unsigned>(c.rank()), 300);
    if (!f.empty()) {
      std::lock_guard lock(mu);
      failures.push_back(ckpt::say("rank ", c.rank(), ": ", f));
    }
  });
  for (const auto& f : failures)
    FAIL_CHECK(f);
  // The roles as well as the options must match; rank 1 is the worker, but a server on options 'server' = 1.
  local_group(2).run([&](local& c) {
    if (c.rank() != 1) return;
    sync::async_ps_worker<local> w(c, {.lr = 0.2f});
    auto before = ckpt::save_bytes(w);
    auto r = ckpt::expect_refused(
        w, before, [&] { ckpt::load_bytes(w, server_stream); }, "server's stream",
        "rank (the local part belongs to the rank that saved it) is 0");
    CHECK_MESSAGE(r.empty(), r);
    sync::async_ps_server<local> other(c, {.lr = 0.2f, .server = 1});
    before = ckpt::save_bytes(other);
    r = ckpt::expect_refused(
        other, before, [&] { ckpt::load_bytes(other, worker_stream); }, "worker's stream",
        "option 'server' is 0, this one's is 1");
    CHECK_MESSAGE(r.empty(), r);
  });
  local_group(2).run([&](local& c) {
    if (c.rank() != 0) return;
    sync::async_ps_server<local> j(c, {.lr = 0.2f, .staleness_bound = 3});
    const auto before = ckpt::save_bytes(j);
    const auto r = ckpt::expect_refused(
        j, before, [&] { ckpt::load_bytes(j, server_stream); }, "other bound",
        "option 'staleness_bound' is -1, this one's is 3");
    CHECK_MESSAGE(r.empty(), r);
  });
}
