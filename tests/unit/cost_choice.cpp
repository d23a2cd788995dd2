// The candidates' network seconds per bucket (cost/candidate.hpp) against the cost/ functions they stand
// on and against hand arithmetic, and the automatic choice (sync/choose_from_plans.hpp) on a free and a
// slow network.
#include <commsgd/compress/powersgd_plan.hpp>
#include <commsgd/cost/candidate.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/cost/sparse_allreduce.hpp>
#include <commsgd/cost/time.hpp>
#include <commsgd/sync/choose_from_plans.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace comm = commsgd::comm;
namespace compress = commsgd::compress;
namespace cost = commsgd::cost;
namespace csync = commsgd::sync;

namespace {

const comm::network_model gigabit{50e-6, 125e6};
const comm::network_model free_network{0, std::numeric_limits<double>::infinity()};

// A 784-256-128-10 MLP (235,146 values) in two DDP buckets, last layers first as DDP fills them:
// bucket 0: 128x10 and 256x128 with their biases (10 + 128), bucket 1: 784x256 with its bias (256).
cost::bucket_shape bucket0() {
  return {1280 + 32768 + 138, {{128, 10}, {256, 128}}};
}
cost::bucket_shape bucket1() {
  return {200704 + 256, {{784, 256}}};
}

double ring(std::uint64_t d, std::size_t size, int n, const comm::network_model& net) {
  return cost::exchange_seconds_slowest(cost::exchange_kind::ring_all_reduce, n, 1, d, size, net);
}

// Forward 2 ms, backward 4 ms (bucket 0 ready at 1.5 ms, bucket 1 at the end), optimizer 0.5 ms.
csync::base_profile mlp_profile() {
  return {2e-3, 4e-3, 0.5e-3, {1.5e-3, 4e-3}, {bucket0(), bucket1()}};
}

} // namespace

TEST_CASE("the two buckets hold the MLP's 235,146 values") {
  CHECK(bucket0().values + bucket1().values == 235146);
}

TEST_CASE("exchange_seconds: dense, fp16, bf16 and local SGD are the float and 2-byte rings") {
  for (int n : {1, 2, 3, 4, 7}) {
    CAPTURE(n);
    const auto b = bucket1();
    CHECK(cost::exchange_seconds("dense", b, n, gigabit) == ring(b.values, 4, n, gigabit));
    CHECK(cost::exchange_seconds("fp16", b, n, gigabit) == ring(b.values, 2, n, gigabit));
    CHECK(cost::exchange_seconds("bf16", b, n, gigabit) == ring(b.values, 2, n, gigabit));
    CHECK(cost::exchange_seconds("localsgd-h4", b, n, gigabit) == ring(b.values, 4, n, gigabit) / 4);
  }
  // By hand at n = 4: 2 (n - 1) = 6 messages each way and 2 * 3/4 of 4 * 200,960 bytes = 1,205,760 bytes.
  CHECK(cost::exchange_seconds("dense", bucket1(), 4, gigabit) ==
        doctest::Approx(6 * 50e-6 + 1205760 / 125e6));
  CHECK(cost::exchange_seconds("fp16", bucket1(), 4, gigabit) == doctest::Approx(6 * 50e-6 + 602880 / 125e6));
}

TEST_CASE("exchange_seconds: powersgd is three float rings over PowerSGD's plan") {
  // Bucket 0 at rank 4: 128x10 compresses ((138) 4 = 552 < 1280): P 512, Q 40; 256x128 ((384) 4 < 32768):
  // P 1024, Q 512; the biases stay dense: 138 dense values, P 1536, Q 552.
  const std::vector<compress::layer_shape> layers{{128, 10}, {10, 1}, {256, 128}, {128, 1}};
  const auto plan = compress::make_powersgd_plan(bucket0().values, layers, 4, 1.0);
  REQUIRE(plan.dense_size == 138);
  REQUIRE(plan.p_size == 1536);
  REQUIRE(plan.q_size == 552);
  for (int n : {2, 4, 5}) {
    CAPTURE(n);
    CHECK(cost::exchange_seconds("powersgd-r4", bucket0(), n, gigabit) ==
          ring(138, 4, n, gigabit) + ring(1536, 4, n, gigabit) + ring(552, 4, n, gigabit));
  }
  // A rank so high that no matrix shrinks: one dense round of everything (the empty P and Q are not sent).
  CHECK(cost::exchange_seconds("powersgd-r200", bucket0(), 4, gigabit) ==
        ring(bucket0().values, 4, 4, gigabit));
  // No matrices: everything in the dense round.
  CHECK(cost::exchange_seconds("powersgd-r1", {100, {}}, 4, gigabit) == ring(100, 4, 4, gigabit));
}

TEST_CASE("exchange_seconds: topk is the all-gather exchange with its header, or its dense fallback") {
  const auto b = bucket1();
  // k = ceil(0.01 * 200,960) = 2010 pairs. At n = 4 each way: header 3 x 32 bytes, pairs 3 x (8 k + 8)
  // sent and 3 x 8 k + 3 x 8 received: 48,360 bytes and 6 messages each way.
  const double hand = 6 * 50e-6 + 48360 / 125e6;
  CHECK(cost::exchange_seconds("topk-0.01", b, 4, gigabit) == doctest::Approx(hand));
  CHECK(cost::exchange_seconds("topk-0.01", b, 4, gigabit) ==
        comm::busy_seconds(cost::sparse_gather_balanced_load(4, b.values, 2010, false), gigabit));
  // At density 0.5 the gathered pairs outweigh the ring: the exchange falls back to dense, header included.
  const double fallback =
      comm::busy_seconds(cost::sparse_gather_balanced_load(4, b.values, 100480, true), gigabit);
  CHECK(cost::exchange_seconds("topk-0.5", b, 4, gigabit) == fallback);
  CHECK(fallback > cost::exchange_seconds("dense", b, 4, gigabit));
}

TEST_CASE("exchange_seconds: sparse-allreduce is the balanced sparse all-reduce refreshed every 8 steps") {
  const auto b = bucket1();
  for (int n : {2, 4, 8}) {
    CAPTURE(n);
    CHECK(cost::exchange_seconds("sparse-allreduce-0.01", b, n, gigabit) ==
          cost::sparse_allreduce_balanced_seconds(n, b.values, 2010, 2010, 8, gigabit));
  }
  CHECK(cost::exchange_seconds("sparse-allreduce-0.01", b, 1, gigabit) == 0);
}

TEST_CASE("exchange_seconds: qsgd is compress::qsgd's all-gather with its header") {
  const auto b = bucket1();
  for (int n : {2, 4}) {
    CAPTURE(n);
    const auto bytes = cost::qsgd_traffic(b.values, 1, 8, n);
    // 2 (n - 1) messages each way (header and payload), sent = received.
    const double hand = 2 * (n - 1) * 50e-6 + static_cast<double>(bytes.bytes_sent) / 125e6;
    CHECK(cost::exchange_seconds("qsgd8", b, n, gigabit) == doctest::Approx(hand));
  }
  // 8 levels take 1 + 4 bits a value: 200,960 x 5 / 8 = 125,600 bytes plus a 4-byte norm.
  CHECK(cost::qsgd_message_bytes(b.values, 1, 8) == 125604);
}

TEST_CASE("exchange_seconds: a free network costs nothing") {
  for (const char* name :
       {"dense", "fp16", "powersgd-r2", "topk-0.001", "sparse-allreduce-0.01", "qsgd4", "localsgd-h8"})
    CHECK(cost::exchange_seconds(name, bucket1(), 4, free_network) == 0);
}

TEST_CASE("parse_candidate: the forms and what is refused") {
  CHECK(cost::parse_candidate("powersgd-r4").count == 4);
  CHECK(cost::parse_candidate("topk-0.001").density == 0.001);
  CHECK(cost::parse_candidate("sparse-allreduce-1").density == 1);
  CHECK(cost::parse_candidate("qsgd255").kind == cost::candidate_kind::qsgd);
  CHECK(cost::parse_candidate("localsgd-h16").count == 16);
  for (const char* bad :
       {"", "Dense", "fp32", "powersgd-r0", "powersgd-r", "powersgd-r4x", "topk-0", "topk-1.5", "topk-nan",
        "topk-", "qsgd", "qsgd0", "qsgd70000", "localsgd-h0", "sparse-allreduce-2"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(cost::parse_candidate(bad), doctest::Contains("argument 'candidate'"),
                         commsgd::invalid_argument);
  }
  CHECK_THROWS_WITH_AS(cost::parse_candidate("magic"), doctest::Contains("'magic' is not a known exchange"),
                       commsgd::invalid_argument);
}

TEST_CASE("exchange_seconds: settings outside their ranges are refused") {
  CHECK_THROWS_WITH_AS(cost::exchange_seconds("dense", bucket1(), 4, {50e-6, -1}),
                       doctest::Contains("'bandwidth_bytes_per_s' = -1"), commsgd::invalid_argument);
  CHECK_THROWS_AS(cost::exchange_seconds("dense", bucket1(), 4, {50e-6, 0}), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(cost::exchange_seconds("dense", bucket1(), 4, {-1e-6, 1e9}),
                       doctest::Contains("'latency_s'"), commsgd::invalid_argument);
  CHECK_THROWS_AS(
      cost::exchange_seconds("dense", bucket1(), 4, {std::numeric_limits<double>::quiet_NaN(), 1e9}),
      commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(cost::exchange_seconds("dense", bucket1(), 0, gigabit), doctest::Contains("'n' = 0"),
                       commsgd::invalid_argument);
  CHECK_THROWS_AS(cost::exchange_seconds("dense", {100, {{20, 10}}}, 4, gigabit), commsgd::size_mismatch);
  CHECK_THROWS_AS(cost::exchange_seconds("dense", {0, {}}, 4, gigabit), commsgd::invalid_argument);
}

TEST_CASE("choose: dense on a free network") {
  // Each compressor costs some compute of its own; with nothing to save on the wire, dense wins.
  const std::vector<csync::candidate_plan> plans{{"fp16", {{0, 0.1e-3}, {0, 0.3e-3}}, false},
                                                 {"topk-0.001", {{0.2e-3, 0.5e-3}, {0.5e-3, 1e-3}}, false},
                                                 {"powersgd-r4", {{0, 0.4e-3}, {0, 1e-3}}, false}};
  const auto c = csync::choose(plans, mlp_profile(), 4, free_network);
  CHECK(c.name == "dense");
  REQUIRE(c.names.size() == 4); // dense added, last
  CHECK(c.index == 3);
  CHECK(c.predicted[3] == doctest::Approx(6.5e-3));
  CHECK(c.reason.find("dense: ") == 0);
  // Even with no compute at all the others only tie dense, and a tie keeps dense.
  const std::vector<csync::candidate_plan> idle{{"dense", {}, false}, {"fp16", {}, false}};
  CHECK(csync::choose(idle, mlp_profile(), 4, free_network).name == "dense");
}

TEST_CASE("choose: a compressed exchange on a slow network") {
  // 1 Gbit/s, 50 us, 4 ranks: dense moves 1.2 MB for bucket 1 (9.9 ms), after backward has ended.
  const std::vector<csync::candidate_plan> plans{{"dense", {}, false},
                                                 {"fp16", {{0, 0.1e-3}, {0, 0.3e-3}}, false},
                                                 {"topk-0.01", {{0.2e-3, 0.5e-3}, {0.5e-3, 1e-3}}, false},
                                                 {"powersgd-r4", {{0, 0.4e-3}, {0, 1e-3}}, false}};
  const auto c = csync::choose(plans, mlp_profile(), 4, gigabit);
  CAPTURE(c.reason);
  CHECK(c.name != "dense");
  CHECK(c.name != "fp16");
  CHECK(c.predicted[c.index] < c.predicted[0] * 0.95);
  for (double p : c.predicted)
    CHECK(c.predicted[c.index] <= p);
  CHECK(c.reason.find(c.name + ": ") == 0);
  CHECK(c.reason.find("against dense") != std::string::npos);
}

TEST_CASE("choose: a blocking hook is charged its whole exchange") {
  const std::vector<csync::candidate_plan> overlapped{{"fp16", {}, false}};
  const std::vector<csync::candidate_plan> blocking{{"fp16", {}, true}};
  const auto a = csync::choose(overlapped, mlp_profile(), 4, gigabit);
  const auto b = csync::choose(blocking, mlp_profile(), 4, gigabit);
  // Bucket 0's exchange would have hidden under the rest of backward; blocking, it cannot.
  CHECK(b.predicted[0] > a.predicted[0]);
}

TEST_CASE("choose: never a candidate predicted slower than dense x (1 - margin)") {
  // fp16 with compute that makes its step just 3% shorter than dense's: inside the 5% margin, dense stays.
  const auto profile = mlp_profile();
  const double dense = csync::predicted_step({"dense", {}, false}, profile, 4, gigabit);
  const double fp16_free = csync::predicted_step({"fp16", {}, false}, profile, 4, gigabit);
  REQUIRE(fp16_free < dense);
  const double extra = (dense * 0.97 - fp16_free); // async seconds on the last bucket add one for one
  REQUIRE(extra > 0);
  const std::vector<csync::candidate_plan> plans{{"fp16", {{0, 0}, {0, extra}}, false}};
  const auto c = csync::choose(plans, profile, 4, gigabit, 0.05);
  CHECK(c.predicted[0] == doctest::Approx(dense * 0.97));
  CHECK(c.name == "dense");
  CHECK(csync::choose(plans, profile, 4, gigabit, 0.0).name == "fp16");

  // And over random profiles and networks, whatever wins is never predicted slower than the bar.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  for (int t = 0; t < 200; ++t) {
    const double backward = 1e-3 + 10e-3 * u(rng);
    const csync::base_profile p{
        1e-3 * u(rng), backward, 1e-3 * u(rng), {backward * u(rng) * 0.5, backward}, {bucket0(), bucket1()}};
    const comm::network_model net{100e-6 * u(rng), 1e8 + 1e10 * u(rng)};
    const double margin = 0.2 * u(rng);
    std::vector<csync::candidate_plan> all{{"dense", {}, false}};
    for (const char* name : {"fp16", "topk-0.01", "powersgd-r2", "qsgd4", "sparse-allreduce-0.01"})
      all.push_back({name, {{1e-3 * u(rng), 1e-3 * u(rng)}, {1e-3 * u(rng), 3e-3 * u(rng)}}, u(rng) < 0.3});
    const auto c = csync::choose(all, p, 2 + t % 7, net, margin);
    CHECK(c.predicted[c.index] <= c.predicted[0]);
    if (c.index != 0) CHECK(c.predicted[c.index] < c.predicted[0] * (1 - margin));
  }
}

TEST_CASE("choose: settings outside their ranges are refused") {
  const std::vector<csync::candidate_plan> plans{{"fp16", {}, false}};
  const auto p = mlp_profile();
  CHECK_THROWS_WITH_AS(
      csync::choose(std::vector<csync::candidate_plan>{{"topk-2", {}, false}}, p, 4, gigabit),
      doctest::Contains("'topk-2'"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(csync::choose(plans, p, 4, {50e-6, -125e6}),
                       doctest::Contains("'bandwidth_bytes_per_s'"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(csync::choose(plans, p, 0, gigabit), doctest::Contains("'n'"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(csync::choose(plans, p, 4, gigabit, 1.0), doctest::Contains("'margin' = 1"),
                       commsgd::invalid_argument);
  CHECK_THROWS_AS(csync::choose(plans, p, 4, gigabit, -0.1), commsgd::invalid_argument);
  CHECK_THROWS_AS(csync::choose(std::vector<csync::candidate_plan>{{"fp16", {}, false}, {"fp16", {}, false}},
                                p, 4, gigabit),
                  commsgd::invalid_argument);
  CHECK_THROWS_AS(csync::choose(std::vector<csync::candidate_plan>{{"fp16", {{0, 0}}, false}}, p, 4, gigabit),
                  commsgd::size_mismatch);
  auto bad = p;
  bad.ready_s[0] = 5e-3; // after backward ends
  CHECK_THROWS_AS(csync::choose(plans, bad, 4, gigabit), commsgd::invalid_argument);
}

TEST_CASE("choose: the steps factor weighs a faster step against the steps it costs") {
  // The same slow network: by step alone a compressed candidate wins; charged enough extra steps, dense.
  std::vector<csync::candidate_plan> plans{{"dense", {}, false},
                                           {"topk-0.01", {{0, 0.5e-3}, {0, 1e-3}}, false}};
  const auto by_step = csync::choose(plans, mlp_profile(), 4, gigabit);
  REQUIRE(by_step.name == "topk-0.01");
  const double speedup = by_step.predicted[0] / by_step.predicted[1];
  // Just below the break-even factor it still wins, just above it loses (margin 0).
  plans[1].steps_factor = 0.99 * speedup;
  CHECK(csync::choose(plans, mlp_profile(), 4, gigabit, 0.0).name == "topk-0.01");
  plans[1].steps_factor = 1.01 * speedup;
  const auto weighed = csync::choose(plans, mlp_profile(), 4, gigabit, 0.0);
  CHECK(weighed.name == "dense");
  CHECK(weighed.predicted[1] == doctest::Approx(by_step.predicted[1])); // the step itself is unchanged
  CHECK(weighed.weighed(1) == doctest::Approx(by_step.predicted[1] * 1.01 * speedup));
  CHECK(weighed.reason.find(" steps") != std::string::npos);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    plans[1].steps_factor = bad;
    CHECK_THROWS_AS(csync::choose(plans, mlp_profile(), 4, gigabit), commsgd::invalid_argument);
  }
}
