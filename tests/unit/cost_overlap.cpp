// The step-time model of DDP's overlap of bucket exchanges with backward (cost/overlap.hpp), against
// arithmetic done by hand.
#include <commsgd/cost/overlap.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

namespace cost = commsgd::cost;

namespace {

// Whole seconds, so every sum below is exact in double.
//   forward 10, backward 20, optimizer 5
//   bucket A: ready 8,  call 1, async 2, exchange 6
//   bucket B: ready 20, call 1, async 1, exchange 3
cost::step_profile two_buckets() {
  return {10, 20, 5, {{8, 1, 2, 6}, {20, 1, 1, 3}}};
}

} // namespace

TEST_CASE("overlapped_step: two buckets by hand, non-blocking") {
  // A: r = 8,          delay = 1, start = max(8 + 1, 0)   = 9,  chain = 9 + 2 + 6  = 17
  // B: r = 20 + 1 = 21, delay = 2, start = max(21 + 1, 17) = 22, chain = 22 + 1 + 3 = 26
  // backward_end = 20 + 2 = 22; total = 10 + max(22, 26) + 5 = 41
  // exposed = 41 - (10 + 20 + 5 + 1 + 1) = 4: B's exchange outlasts backward by 4
  const auto s = cost::overlapped_step(two_buckets(), false);
  CHECK(s.backward_end_s == 22);
  CHECK(s.exchange_end_s == 26);
  CHECK(s.total_s == 41);
  CHECK(s.exposed_s == 4);
}

TEST_CASE("overlapped_step: two buckets by hand, blocking") {
  // A: r = 8,           chain = 8 + 1 + 2 + 6  = 17, delay = 9
  // B: r = 20 + 9 = 29, chain = 29 + 1 + 1 + 3 = 34, delay = 14
  // backward_end = 20 + 14 = 34; total = 10 + 34 + 5 = 49; exposed = 49 - 37 = 12 (every async and exchange)
  const auto s = cost::overlapped_step(two_buckets(), true);
  CHECK(s.backward_end_s == 34);
  CHECK(s.exchange_end_s == 34);
  CHECK(s.total_s == 49);
  CHECK(s.exposed_s == 12);
  // Blocking pays exactly the sum of every bucket's async and exchange seconds.
  CHECK(s.exposed_s == (2 + 6) + (1 + 3));
}

TEST_CASE("overlapped_step: an exchange shorter than the rest of backward is hidden") {
  // One bucket ready at 5 of 20, exchange 3 + async 2: done at 10, long before backward ends.
  const cost::step_profile p{1, 20, 2, {{5, 0, 2, 3}}};
  const auto s = cost::overlapped_step(p);
  CHECK(s.exchange_end_s == 10);
  CHECK(s.backward_end_s == 20);
  CHECK(s.total_s == 23);
  CHECK(s.exposed_s == 0);
  // Blocking, the same exchange is paid in full.
  CHECK(cost::overlapped_step(p, true).total_s == 28);
}

TEST_CASE("overlapped_step: an exchange longer than the rest of backward shows only its tail") {
  // Ready at 15 of 20, exchange 10: done at 25, so 5 seconds are exposed, not 10.
  const cost::step_profile p{1, 20, 2, {{15, 0, 0, 10}}};
  const auto s = cost::overlapped_step(p);
  CHECK(s.exchange_end_s == 25);
  CHECK(s.total_s == 28);
  CHECK(s.exposed_s == 5);
  CHECK(cost::overlapped_step(p, true).exposed_s == 10);
}

TEST_CASE("overlapped_step: exchanges queue behind each other") {
  // Two buckets ready at 0, 6 seconds each: the second starts when the first is done (6), not at 0.
  const cost::step_profile p{0, 4, 0, {{0, 0, 0, 6}, {0, 0, 0, 6}}};
  const auto s = cost::overlapped_step(p);
  CHECK(s.exchange_end_s == 12);
  CHECK(s.total_s == 12);
  CHECK(s.exposed_s == 8);
}

TEST_CASE("overlapped_step: no buckets is forward + backward + optimizer") {
  const auto s = cost::overlapped_step({1, 2, 3, {}});
  CHECK(s.total_s == 6);
  CHECK(s.exposed_s == 0);
  CHECK(s.exchange_end_s == 0);
}

TEST_CASE("overlapped_step: validation names the argument") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto p = two_buckets();
  p.forward_s = -1;
  CHECK_THROWS_WITH_AS(cost::overlapped_step(p), doctest::Contains("'forward_s' = -1"),
                       commsgd::invalid_argument);
  p = two_buckets();
  p.optimizer_s = inf;
  CHECK_THROWS_WITH_AS(cost::overlapped_step(p), doctest::Contains("'optimizer_s'"),
                       commsgd::invalid_argument);
  p = two_buckets();
  p.buckets[1].call_s = nan;
  CHECK_THROWS_WITH_AS(cost::overlapped_step(p), doctest::Contains("'buckets[1].call_s'"),
                       commsgd::invalid_argument);
  p = two_buckets();
  p.buckets[0].exchange_s = -0.5;
  CHECK_THROWS_WITH_AS(cost::overlapped_step(p), doctest::Contains("'buckets[0].exchange_s'"),
                       commsgd::invalid_argument);
  p = two_buckets();
  p.buckets[1].ready_s = 21; // after backward ends
  CHECK_THROWS_WITH_AS(cost::overlapped_step(p), doctest::Contains("'buckets[1].ready_s' = 21"),
                       commsgd::invalid_argument);
  p = two_buckets();
  p.buckets[1].ready_s = 7; // before the bucket called ahead of it
  CHECK_THROWS_WITH_AS(cost::overlapped_step(p, true), doctest::Contains("'buckets[1].ready_s' = 7"),
                       commsgd::invalid_argument);
  p = two_buckets();
  p.buckets[0].ready_s = -1;
  CHECK_THROWS_AS(cost::overlapped_step(p), commsgd::invalid_argument);
}
