// Components that share one communicator: comm::reserve_tags hands each a block of tags of its own, so
// async_ps and partitioned (and two partitioned) run interleaved on one communicator with their defaults.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/tags.hpp>
#include <commsgd/sync/async_ps.hpp>
#include <commsgd/sync/partitioned.hpp>
#include <commsgd/sync/sgd.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

TEST_CASE("reserve_tags: blocks are disjoint, first fit, released on destruction, checked by hand") {
  const int anchor = 0; // any object stands for a communicator
  {
    auto a = comm::reserve_tags(anchor, 4, "a");
    auto b = comm::reserve_tags(anchor, 10, "b");
    CHECK(a.first() == comm::user_tags_end);
    CHECK(b.first() == a.first() + 4);
    CHECK(comm::reserved_tag_blocks(anchor) == 2);
    {
      auto c = comm::reserve_tags(anchor, 3, "c");
      CHECK(c.first() == b.first() + 10);
    }
    // c's block is free again; a released gap is reused when it fits.
    auto d = comm::reserve_tags(anchor, 3, "d");
    CHECK(d.first() == b.first() + 10);
    a = comm::tag_lease{};
    auto e = comm::reserve_tags(anchor, 5, "e"); // does not fit in a's 4
    CHECK(e.first() == d.first() + 3);
    auto f = comm::reserve_tags(anchor, 4, "f"); // fits exactly
    CHECK(f.first() == comm::user_tags_end);
    // Moving a lease moves the block, it does not free it.
    auto g = std::move(f);
    CHECK(!f.held());
    CHECK(g.held());
    CHECK(comm::reserved_tag_blocks(anchor) == 4);

    // By hand: anywhere, unless it overlaps a live block; the message names both owners.
    auto mine = comm::reserve_tags_at(anchor, 10, 5, "mine");
    CHECK(mine.first() == 10);
    CHECK_THROWS_WITH_AS(comm::reserve_tags_at(anchor, b.first() + 9, 2, "late"),
                         doctest::Contains("overlap tags [1004, 1014) held by b"), invalid_argument);
    CHECK_THROWS_AS(comm::reserve_tags_at(anchor, 12, 1, "x"), invalid_argument);
    CHECK_NOTHROW(comm::reserve_tags_at(anchor, 15, 1, "x"));
    CHECK_THROWS_AS(comm::reserve_tags_at(anchor, -1, 1, "x"), invalid_argument);
    CHECK_THROWS_AS(comm::reserve_tags(anchor, 0, "x"), invalid_argument);
    CHECK_THROWS_AS(comm::reserve_tags(anchor, 29001, "x"), invalid_argument);
    // Another communicator object has a tag space of its own.
    const int other = 0;
    CHECK(comm::reserve_tags(other, 4, "z").first() == comm::user_tags_end);
  }
  CHECK(comm::reserved_tag_blocks(anchor) == 0);

  // Exhaustion is an error, not a collision.
  std::vector<comm::tag_lease> all;
  all.push_back(comm::reserve_tags(anchor, 29000 - 1, "big"));
  all.push_back(comm::reserve_tags(anchor, 1, "last"));
  CHECK_THROWS_WITH_AS(comm::reserve_tags(anchor, 1, "one more"),
                       doctest::Contains("no block of 1 free tags"), invalid_argument);
}

TEST_CASE("two components handed the same tags by hand are refused, not left to collide") {
  local_group(2).run([](local& c) {
    sync::partitioned<local> p(c, {64}, {.lr = 0.1f, .partition_elements = 16, .tag_base = 1000});
    CHECK_THROWS_WITH_AS(sync::async_ps<local>(c, {.lr = 0.1f, .tag_base = 1006}),
                         doctest::Contains("held by partitioned"), invalid_argument);
    CHECK_NOTHROW(sync::async_ps<local>(c, {.lr = 0.1f, .tag_base = 1008}));
  });
}

namespace {

// One-hot gradients for async_ps: worker r's step k touches one index only, so each index ends at -lr if its
// gradient was applied exactly once.
std::size_t slot(int rank, int step, int steps) {
  return static_cast<std::size_t>(rank * steps + step);
}

float grad_value(int rank, std::size_t i, int step) {
  return 0.25f * static_cast<float>((static_cast<int>(i) * 7 + rank * 3 + step) % 11) - 1.0f;
}

} // namespace

TEST_CASE("async_ps and partitioned interleaved on one communicator, with default tags") {
  // Every rank opens a partitioned step (its receives posted, its contributions in flight), runs a whole
  // asynchronous training in the middle of it, then completes the partitioned step; a second partitioned
  // instance has a step open around both. Shared tags would deliver one's messages to the other.
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    constexpr int async_steps = 6, part_steps = 3;
    const std::vector<std::size_t> layers{40, 7, 33};
    const std::size_t d = 80;
    const float lr = 0.125f;
    std::vector<std::vector<float>> part_a(static_cast<std::size_t>(n)), part_b(part_a), async_x(part_a);
    local_group(n).run([&](local& c) {
      const int me = c.rank();
      sync::partitioned<local> a(c, layers, {.lr = lr, .partition_elements = 8, .credit_bytes = 64});
      sync::partitioned<local> b(c, layers, {.lr = lr, .partition_elements = 16});
      std::vector<float> xa(d, 0.5f), xb(d, -0.5f), ga(d), gb(d);
      a.start(xa);
      b.start(xb);
      for (int t = 0; t < part_steps; ++t) {
        for (std::size_t i = 0; i < d; ++i) {
          ga[i] = grad_value(me, i, t);
          gb[i] = grad_value(me, i, t + 100);
        }
        b.begin_step(gb);
        a.begin_step(ga);
        for (std::size_t l = layers.size(); l-- > 0;)
          a.gradient_ready(l);
        b.gradient_ready(1);
        if (t == 1) {
          sync::async_ps<local> s(c, {.lr = lr});
          const std::size_t dim = slot(n, 0, async_steps);
          std::vector<float> x(dim, 0.0f), g(dim, 0.0f);
          s.start(x);
          if (s.computes_gradients())
            for (int k = 0; k < async_steps; ++k) {
              std::fill(g.begin(), g.end(), 0.0f);
              g[slot(me, k, async_steps)] = 1.0f;
              s.step(x, g);
              a.poll();
            }
          s.finish(x);
          async_x[static_cast<std::size_t>(me)] = x;
        }
        b.gradient_ready(0);
        b.gradient_ready(2);
        a.finish_step(xa);
        b.finish_step(xb);
      }
      a.finish(xa);
      b.finish(xb);
      part_a[static_cast<std::size_t>(me)] = xa;
      part_b[static_cast<std::size_t>(me)] = xb;
    });

    // partitioned: the rank-ordered sum, applied by apply_mean_sum, on every rank.
    auto reference = [&](float x0, int offset) {
      std::vector<float> x(d, x0), sum(d);
      for (int t = 0; t < part_steps; ++t) {
        for (std::size_t i = 0; i < d; ++i) {
          sum[i] = grad_value(0, i, t + offset);
          for (int r = 1; r < n; ++r)
            sum[i] += grad_value(r, i, t + offset);
        }
        sync::apply_mean_sum(x, sum, n, lr);
      }
      return x;
    };
    const auto want_a = reference(0.5f, 0), want_b = reference(-0.5f, 100);
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(std::memcmp(part_a[static_cast<std::size_t>(r)].data(), want_a.data(), d * sizeof(float)) == 0);
      CHECK(std::memcmp(part_b[static_cast<std::size_t>(r)].data(), want_b.data(), d * sizeof(float)) == 0);
      // async_ps: every worker's every gradient applied exactly once, on every rank's final model.
      const auto& x = async_x[static_cast<std::size_t>(r)];
      for (int w = 1; w < n; ++w)
        for (int k = 0; k < async_steps; ++k)
          CHECK(x[slot(w, k, async_steps)] == -lr);
      for (int k = 0; k < async_steps; ++k)
        CHECK(x[slot(0, k, async_steps)] == 0.0f);
    }
  }
}
