// The cost model against what runs: comm::metered's byte counts and comm::simulated's clock must equal
// cost/coding_traffic.hpp and cost/time.hpp exactly, for every exchange and every (n, r) up to 7 nodes.
#include <commsgd/coding/coding.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/cost/coding_traffic.hpp>
#include <commsgd/cost/redundancy.hpp>
#include <commsgd/cost/time.hpp>

#include <doctest/doctest.h>

#include <vector>

namespace coding = commsgd::coding;
namespace comm = commsgd::comm;
namespace cost = commsgd::cost;
using comm::local;
using comm::local_group;
using kind = cost::exchange_kind;

namespace {

// Every holder of a block must hand in the same gradient (CSSGD's decoder checks that), so values depend on
// the block's global index.
std::vector<std::vector<float>> gradients(std::span<const std::size_t> blocks, std::size_t d) {
  std::vector<std::vector<float>> g(blocks.size(), std::vector<float>(d));
  for (std::size_t j = 0; j < blocks.size(); ++j)
    for (std::size_t e = 0; e < d; ++e)
      g[j][e] = static_cast<float>(blocks[j] + 1) * 0.25f - static_cast<float>(e % 7);
  return g;
}

// Runs one exchange of `k` on communicator c (already wrapped) and returns nothing; the wrapper counts.
template <class C>
void run_exchange(kind k, C& c, int r, std::size_t d, auto&& before) {
  auto go = [&](auto&& scheme) {
    const auto g = gradients(scheme.my_blocks(), d);
    const std::vector<std::span<const float>> v(g.begin(), g.end());
    std::vector<float> out(d);
    before();
    scheme.exchange(v, out);
  };
  switch (k) {
  case kind::ring_all_reduce:
    return go(coding::uncoded<C, coding::by_ring_all_reduce>(c));
  case kind::all_gather:
    return go(coding::uncoded<C, coding::by_all_gather>(c));
  case kind::unicast:
    return go(coding::uncoded<C, coding::by_unicast>(c));
  case kind::uncoded_shuffle:
    return go(coding::uncoded_shuffle<C>(c, r));
  case kind::cssgd:
    return go(coding::cssgd<coding::xor_bits, C>(c, r));
  }
}

constexpr kind all_kinds[] = {kind::ring_all_reduce, kind::all_gather, kind::unicast, kind::uncoded_shuffle,
                              kind::cssgd};

} // namespace

TEST_CASE("metered bytes and messages equal the cost model exactly") {
  for (int n = 1; n <= 7; ++n)
    for (int r = 1; r <= n; ++r)
      for (std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{1000}})
        for (kind k : all_kinds) {
          if (r > 1 && (k == kind::ring_all_reduce || k == kind::all_gather || k == kind::unicast)) continue;
          CAPTURE(n);
          CAPTURE(r);
          CAPTURE(d);
          CAPTURE(cost::exchange_name(k));
          local_group(n).run([&](local& c) {
            comm::metered<local> m(c);
            run_exchange(k, m, r, d, [&] { m.reset(); });
            CHECK(cost::measured(m.counters().total()) == cost::exchange_traffic(k, n, r, d, 4, c.rank()));
          });
        }
}

TEST_CASE("the cost model's closed forms: CSSGD sends G = C(n-1, r) packets of ceil(d/r), r copies each") {
  CHECK(cost::cssgd(10, 1, 1000, 4) == comm::traffic{9, 9 * 1000 * 4, 9, 9 * 1000 * 4});
  CHECK(cost::cssgd(10, 3, 1000, 4) == comm::traffic{3 * 84, 3 * 84 * 334 * 4, 3 * 84, 3 * 84 * 334 * 4});
  CHECK(cost::cssgd(5, 5, 1000, 4) == comm::traffic{});
  // The uncoded shuffle receives every lacking block exactly, no padding.
  CHECK(cost::uncoded_shuffle(10, 3, 1000, 4, 0).bytes_received == 84u * 1000 * 4);
  std::uint64_t sent = 0;
  for (int i = 0; i < 10; ++i)
    sent += cost::uncoded_shuffle(10, 3, 1000, 4, i).bytes_sent;
  CHECK(sent == 10u * 84 * 1000 * 4); // everything received was sent by someone
  // On a multicast medium a CSSGD node transmits r times less, receives the same.
  const auto mc = cost::cssgd_load(10, 3, 1000, 4, 0, comm::network_model::gigabit(comm::medium::multicast));
  CHECK(mc.messages_sent == 84);
  CHECK(mc.bytes_sent == 84u * 334 * 4);
  CHECK(mc.bytes_received == 3u * 84 * 334 * 4);
}

TEST_CASE("simulated time of every exchange equals the time model bit for bit") {
  comm::network_model tree = comm::network_model::gigabit();
  tree.broadcast = comm::broadcast_algorithm::binomial_tree;
  const comm::network_model nets[] = {comm::network_model::gigabit(),
                                      comm::network_model::gigabit(comm::medium::multicast),
                                      tree,
                                      {1e-6, 12.5e9, comm::medium::switched}};
  for (const auto& net : nets)
    for (int n = 1; n <= 6; ++n)
      for (int r = 1; r <= n; ++r)
        for (std::size_t d : {std::size_t{1}, std::size_t{1001}})
          for (kind k : all_kinds) {
            if (r > 1 && (k == kind::ring_all_reduce || k == kind::all_gather || k == kind::unicast))
              continue;
            CAPTURE(n);
            CAPTURE(r);
            CAPTURE(d);
            CAPTURE(cost::exchange_name(k));
            CAPTURE(static_cast<int>(net.medium));
            local_group(n).run([&](local& c) {
              comm::simulated<local> s(c, net);
              run_exchange(k, s, r, d, [&] { s.reset(); });
              CHECK(s.load() == cost::exchange_load(k, n, r, d, 4, c.rank(), net));
              CHECK(s.now() == cost::exchange_seconds(k, n, r, d, 4, c.rank(), net));
            });
          }
}

TEST_CASE("redundancy chooser") {
  cost::step_model m;
  m.n = 10;
  m.d = 1 << 20;
  m.batch = 512;
  m.network = comm::network_model::gigabit();

  SUBCASE("no compute cost: the r that moves the fewest bytes wins; r = n needs no exchange at all") {
    m.compute_seconds_per_sample = 0;
    const auto plan = cost::choose_redundancy(m);
    REQUIRE(plan.cssgd.size() == 10);
    CHECK(plan.best_r == 10);
    CHECK(plan.best_total_s == 0);
    CHECK_FALSE(plan.ring_is_better);
  }
  SUBCASE("realistic compute: ring all-reduce beats every r on a switched network") {
    m.compute_seconds_per_sample = 2e-3;
    const auto plan = cost::choose_redundancy(m);
    CHECK(plan.ring_is_better);
    for (const auto& o : plan.cssgd) {
      CAPTURE(o.r);
      CHECK(o.total_s == o.compute_s + o.comm_s);
      CHECK(o.comm_s == cost::exchange_seconds_slowest(kind::cssgd, 10, o.r, m.d, 4, m.network));
      CHECK(o.total_s > plan.ring_total_s);
    }
    // The paper's r Tcalc + Tcomm / r ignores that receptions grow with C(n-1, r): it is optimistic.
    CHECK(plan.cssgd[2].paper_total_s < plan.cssgd[2].total_s);
  }
  SUBCASE("bad input") {
    m.compute_seconds_per_sample = -1;
    CHECK_THROWS_AS(cost::choose_redundancy(m), commsgd::invalid_argument);
    m.compute_seconds_per_sample = 1;
    m.n = 0;
    CHECK_THROWS_AS(cost::choose_redundancy(m), commsgd::invalid_argument);
  }
}
