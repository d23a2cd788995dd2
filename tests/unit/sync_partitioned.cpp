// sync::partitioned: equals synchronous bit for bit, every partition exchanged exactly once, sends start in
// strict priority order within the credit, any order of gradient_ready calls works.
#include <commsgd/comm/local.hpp>
#include <commsgd/sync/partitioned.hpp>
#include <commsgd/sync/synchronous.hpp>
#include <support/forwarding_comm.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;
using event = sync::partition_event;

namespace {

// comm::local whose sends report completion only after `lag` calls to test(): a slow network, so that the
// credit actually binds and the send queue fills up (comm::local alone completes every send at once).
struct lagging_request {
  comm::local_request inner;
  int remaining = 0;
  void wait() {
    inner.wait();
    remaining = 0;
  }
  bool test() {
    if (remaining > 0) {
      --remaining;
      return false;
    }
    return inner.test();
  }
};

struct lagging : test_comm::forwarding<local> {
  using request_type = lagging_request;
  int lag;

  template <comm::transferable T>
  lagging_request isend(std::span<const T> d, int dest, int tag) {
    return {inner.isend(d, dest, tag), lag};
  }
  template <comm::transferable T>
  lagging_request irecv(std::span<T> d, int source, int tag) {
    return {inner.irecv(d, source, tag), 0};
  }
  lagging split(int color, int key) { return {{inner.split(color, key)}, lag}; }
};
static_assert(comm::communicator<lagging>);

const std::vector<std::size_t> layers = {5, 17, 3, 9}; // 34 elements
constexpr std::size_t dim = 34;

// The order a rank reports layers in: reversed (as backward does), or a per-rank shuffle.
std::vector<std::size_t> ready_order(int rank, bool shuffled) {
  std::vector<std::size_t> order(layers.size());
  std::iota(order.rbegin(), order.rend(), std::size_t{0});
  if (shuffled) std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(rank + 3)));
  return order;
}

template <class Comm>
std::vector<float> run_partitioned(Comm& c, const toy::least_squares& prob, int steps,
                                   sync::partitioned_options opt, bool shuffled,
                                   std::vector<event>* log = nullptr) {
  sync::partitioned<Comm> s(c, layers, opt);
  std::vector<float> x(dim, 0.0f), g(dim);
  s.start(x);
  for (int t = 0; t < steps; ++t) {
    prob.gradient(x, prob.batch(c.rank(), c.size(), t, 8), g);
    s.begin_step(g);
    for (std::size_t l : ready_order(c.rank(), shuffled)) {
      s.gradient_ready(l);
      s.poll();
    }
    s.finish_step(x);
  }
  s.finish(x);
  if (log) *log = s.log();
  return x;
}

// Replays a rank's log against the scheduler's contract: each send starts only when it is the
// highest-priority ready send (partition, then contributions before results, then destination), bytes in
// flight never exceed the credit, and every partition is exchanged exactly once per step.
void check_log(const std::vector<event>& log, const std::vector<sync::partition>& parts, int me, int n,
               std::size_t credit, int steps) {
  using job = std::tuple<std::size_t, bool, int>;
  std::set<job> queued;
  std::map<std::tuple<std::int64_t, std::size_t, int>, int> sends, dones;
  std::map<std::pair<std::int64_t, std::size_t>, int> reduced, results;
  for (const auto& e : log) {
    CHECK(e.in_flight <= credit);
    const bool owner = parts[e.partition].owner == me;
    switch (e.kind) {
    case event::what::ready:
      if (!owner) queued.insert({e.partition, false, parts[e.partition].owner});
      break;
    case event::what::reduced:
      CHECK(owner);
      ++reduced[{e.step, e.partition}];
      for (int r = 0; r < n; ++r)
        if (r != me) queued.insert({e.partition, true, r});
      break;
    case event::what::send_start: {
      REQUIRE_FALSE(queued.empty());
      const job started{e.partition, owner, e.peer};
      CHECK(started == *queued.begin()); // strict priority
      queued.erase(started);
      ++sends[{e.step, e.partition, e.peer}];
      break;
    }
    case event::what::send_done:
      ++dones[{e.step, e.partition, e.peer}];
      break;
    case event::what::result_received:
      CHECK_FALSE(owner);
      CHECK(e.peer == parts[e.partition].owner);
      ++results[{e.step, e.partition}];
      break;
    }
  }
  CHECK(queued.empty());
  for (int t = 0; t < steps; ++t)
    for (std::size_t p = 0; p < parts.size(); ++p) {
      if (n == 1) continue;
      if (parts[p].owner == me) {
        CHECK(reduced[{t, p}] == 1);
        for (int r = 0; r < n; ++r)
          if (r != me) CHECK(sends[{t, p, r}] == 1);
      } else {
        CHECK(sends[{t, p, parts[p].owner}] == 1);
        CHECK(results[{t, p}] == 1);
      }
    }
  CHECK(sends == dones);
}

} // namespace

TEST_CASE("partitioned equals synchronous bit for bit, whatever order layers become ready in") {
  // Both sum each element over ranks in rank order (partition owners do it by hand, comm::local's all-reduce
  // does it too) and both apply apply_mean_sum, so the bits agree.
  const toy::least_squares prob({.samples = 256, .dim = dim, .seed = 9});
  for (int n = 1; n <= 4; ++n)
    for (bool shuffled : {false, true}) {
      CAPTURE(n);
      CAPTURE(shuffled);
      std::vector<std::vector<float>> want(static_cast<std::size_t>(n)), got(static_cast<std::size_t>(n));
      local_group(n).run([&](local& c) {
        sync::synchronous<local> s(c, {.lr = 0.2f});
        std::vector<float> x(dim, 0.0f), g(dim);
        s.start(x);
        for (int t = 0; t < 12; ++t) {
          prob.gradient(x, prob.batch(c.rank(), n, t, 8), g);
          s.step(x, g, {});
        }
        want[static_cast<std::size_t>(c.rank())] = x;
      });
      local_group(n).run([&](local& c) {
        got[static_cast<std::size_t>(c.rank())] =
            run_partitioned(c, prob, 12, {.lr = 0.2f, .partition_elements = 4, .credit_bytes = 16}, shuffled);
      });
      for (int r = 0; r < n; ++r)
        CHECK(std::memcmp(got[r].data(), want[r].data(), dim * sizeof(float)) == 0);
    }
}

TEST_CASE("every partition is exchanged exactly once, in priority order, within the credit") {
  const toy::least_squares prob({.samples = 256, .dim = dim, .seed = 4});
  for (int n = 1; n <= 4; ++n)
    for (int lag : {0, 3})
      for (std::size_t credit : {16u, 40u, 1000u}) {
        CAPTURE(n);
        CAPTURE(lag);
        CAPTURE(credit);
        const int steps = 3;
        local_group(n).run([&](local& c) {
          lagging slow{{c}, lag};
          const sync::partitioned_options opt{
              .lr = 0.1f, .partition_elements = 4, .credit_bytes = credit, .keep_log = true};
          std::vector<event> log;
          run_partitioned(slow, prob, steps, opt, c.rank() % 2 == 1, &log);
          const sync::partitioned<lagging> layout(slow, layers, opt);
          check_log(log, layout.partitions(), c.rank(), n, credit, steps);
        });
      }
}

TEST_CASE("a layer that becomes ready last still goes first once credit frees up") {
  // Two ranks, one partition of credit, sends that take a few polls: layers 3, 2, 1 fill the queue, and when
  // layer 0 is reported, its partitions jump ahead of everything still queued.
  local_group(2).run([](local& c) {
    lagging slow{{c}, 4};
    sync::partitioned<lagging> s(slow, {8, 8, 8, 8},
                                 {.lr = 0.1f, .partition_elements = 4, .credit_bytes = 16, .keep_log = true});
    std::vector<float> x(32, 0.0f), g(32, 1.0f);
    s.start(x);
    s.begin_step(g);
    for (std::size_t l : {3u, 2u, 1u})
      s.gradient_ready(l);
    s.gradient_ready(0);
    s.finish_step(x);
    // After layer 0 is reported, the next send is one of its partitions (0 or 1), although contributions
    // of layers 1 to 3 that were ready earlier still wait in the queue and start after it.
    const auto& log = s.log();
    const auto ready0 = std::find_if(log.begin(), log.end(), [](const event& e) {
      return e.kind == event::what::ready && e.partition == 0;
    });
    REQUIRE(ready0 != log.end());
    std::vector<std::size_t> later;
    for (auto it = ready0; it != log.end(); ++it)
      if (it->kind == event::what::send_start) later.push_back(it->partition);
    REQUIRE_FALSE(later.empty());
    CHECK(later.front() < 2);
    CHECK(std::any_of(later.begin(), later.end(), [](std::size_t p) { return p >= 2; }));
    for (float v : x)
      CHECK(v == -0.1f);
  });
}

TEST_CASE("partitioned refuses bad arguments with their name, value and range") {
  local_group(1).run([](local& c) {
    using pt = sync::partitioned<local>;
    CHECK_THROWS_WITH_AS(pt(c, {8}, {.credit_bytes = 0}), doctest::Contains("'credit_bytes' = 0"),
                         commsgd::invalid_argument);
    CHECK_THROWS_AS(pt(c, {8}, {.partition_elements = 4, .credit_bytes = 15}), commsgd::invalid_argument);
    CHECK_THROWS_AS(pt(c, {8}, {.partition_elements = 0}), commsgd::invalid_argument);
    CHECK_THROWS_AS(pt(c, {8}, {.lr = 0.0f}), commsgd::invalid_argument);
    CHECK_THROWS_AS(pt(c, {}, {}), commsgd::invalid_argument);
    CHECK_THROWS_AS(pt(c, {4, 0}, {}), commsgd::invalid_argument);
    CHECK_THROWS_AS(pt(c, {1u << 20}, {.partition_elements = 1}), commsgd::invalid_argument); // too many tags
    pt s(c, {4, 4}, {.partition_elements = 2, .credit_bytes = 8});
    std::vector<float> x(8), g(8), short_g(7);
    CHECK_THROWS_AS(s.gradient_ready(0), commsgd::invalid_argument); // before begin_step
    CHECK_THROWS_AS(s.begin_step(short_g), commsgd::size_mismatch);
    s.begin_step(g);
    CHECK_THROWS_WITH_AS(s.gradient_ready(2), doctest::Contains("'layer' = 2"), commsgd::invalid_argument);
    s.gradient_ready(1);
    CHECK_THROWS_AS(s.gradient_ready(1), commsgd::invalid_argument);
    CHECK_THROWS_WITH_AS(s.finish_step(x), doctest::Contains("layer 0 was never marked ready"),
                         commsgd::invalid_argument);
    g[1] = NAN;
    CHECK_THROWS_AS(s.gradient_ready(0), commsgd::non_finite);
  });
}
