// The collective choice of exchange (sync/choose_exchange.hpp, sync/choose_with_history.hpp) on comm::local:
// one choice on every rank, refusals on every rank, and the chooser's log through a checkpoint.
#include <commsgd/comm/local.hpp>
#include <commsgd/sync/choose_exchange.hpp>
#include <commsgd/sync/choose_with_history.hpp>
#include <commsgd/sync/measure_network.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace comm = commsgd::comm;
namespace cost = commsgd::cost;
namespace csync = commsgd::sync;
using comm::local;
using comm::local_group;

namespace {

const comm::network_model gigabit{50e-6, 125e6};
const comm::network_model free_network{0, std::numeric_limits<double>::infinity()};

// The 784-256-128-10 MLP in two buckets; each rank is a little slower than the one before, so the ranks'
// own predictions differ and only the agreement makes them choose alike.
csync::base_profile profile_of(int rank) {
  const double s = 1.0 + 0.1 * rank;
  return {2e-3 * s,
          4e-3 * s,
          0.5e-3 * s,
          {1.5e-3 * s, 4e-3 * s},
          {{34186, {{128, 10}, {256, 128}}}, {200960, {{784, 256}}}}};
}

std::vector<csync::candidate_plan> plans() {
  return {{"fp16", {{0, 0.1e-3}, {0, 0.3e-3}}, false},
          {"topk-0.01", {{0.2e-3, 0.5e-3}, {0.5e-3, 1e-3}}, false}};
}

// Runs fn on n ranks and collects each rank's result.
template <class T, class Fn>
std::vector<T> on_every_rank(int n, Fn fn) {
  std::vector<T> out(static_cast<std::size_t>(n));
  local_group(n).run([&](local& c) { out[static_cast<std::size_t>(c.rank())] = fn(c); });
  return out;
}

// Runs fn on n ranks and counts the ranks that raised invalid_argument.
template <class Fn>
int refusals(int n, Fn fn) {
  std::atomic<int> count{0};
  local_group(n).run([&](local& c) {
    try {
      fn(c);
    } catch (const commsgd::invalid_argument&) {
      ++count;
    }
  });
  return count.load();
}

} // namespace

TEST_CASE("choose_exchange: every rank gets the same choice") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    const auto p = plans();
    const auto slow = on_every_rank<csync::exchange_choice>(
        n, [&](local& c) { return csync::choose_exchange(c, profile_of(c.rank()), p, gigabit); });
    const auto free = on_every_rank<csync::exchange_choice>(
        n, [&](local& c) { return csync::choose_exchange(c, profile_of(c.rank()), p, free_network); });
    for (std::size_t r = 0; r < slow.size(); ++r) {
      CAPTURE(r);
      CHECK(slow[r].name == slow[0].name);
      CHECK(slow[r].predicted == slow[0].predicted);
      CHECK(slow[r].reason == slow[0].reason);
      CHECK(free[r].name == "dense");
    }
    CHECK(slow[0].name == "topk-0.01");
    // The agreed prediction is the slowest rank's: here the last rank's own.
    const auto last = csync::choose(p, profile_of(n - 1), n, gigabit);
    CHECK(slow[0].predicted == last.predicted);
  }
}

TEST_CASE("choose_exchange: bad settings raise on every rank") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    const auto p = plans();
    CHECK(refusals(n, [&](local& c) { csync::choose_exchange(c, profile_of(c.rank()), p, gigabit, 1.0); }) ==
          n);
    CHECK(refusals(n, [&](local& c) {
            csync::choose_exchange(c, profile_of(c.rank()), p, {50e-6, -1});
          }) == n);
    const std::vector<csync::candidate_plan> unknown{{"zip", {}, false}};
    CHECK(refusals(n, [&](local& c) { csync::choose_exchange(c, profile_of(c.rank()), unknown, gigabit); }) ==
          n);
    // One rank's profile alone is wrong: every rank raises all the same.
    CHECK(refusals(n, [&](local& c) {
            auto prof = profile_of(c.rank());
            if (c.rank() == 1) prof.ready_s[1] = 1.0; // after backward ends
            csync::choose_exchange(c, prof, p, gigabit);
          }) == n);
    // Ranks that disagree on the margin would choose differently: every rank raises.
    CHECK(refusals(n, [&](local& c) {
            csync::choose_exchange(c, profile_of(c.rank()), p, gigabit, c.rank() == 0 ? 0.05 : 0.1);
          }) == n);
  }
  CHECK_THROWS_AS(csync::exchange_chooser({{50e-6, 0}, 0.05}), commsgd::invalid_argument);
  CHECK_THROWS_AS(csync::exchange_chooser({gigabit, -0.5}), commsgd::invalid_argument);
}

TEST_CASE("exchange_chooser: the log and the choice survive a checkpoint") {
  const int n = 3;
  const auto p = plans();
  std::vector<std::string> saved(static_cast<std::size_t>(n));
  std::vector<csync::exchange_chooser> before(static_cast<std::size_t>(n),
                                              csync::exchange_chooser({gigabit, 0.05}));
  local_group(n).run([&](local& c) {
    auto& ch = before[static_cast<std::size_t>(c.rank())];
    CHECK(ch.current() == "dense");
    CHECK(ch.decide(c, profile_of(c.rank()), p, 20).choice == "topk-0.01");
    // A much faster backward at step 500 hides less of the exchange; decide again.
    auto fast = profile_of(c.rank());
    fast.forward_s /= 10;
    ch.decide(c, fast, p, 500);
    std::ostringstream os(std::ios::binary);
    ch.save(os);
    saved[static_cast<std::size_t>(c.rank())] = os.str();
  });
  for (std::size_t r = 0; r < saved.size(); ++r) {
    CAPTURE(r);
    CHECK(saved[r] == saved[0]); // shared state: identical on every rank
    csync::exchange_chooser after({free_network, 0.05});
    std::istringstream is(saved[r], std::ios::binary);
    after.load(is);
    CHECK(after.current() == before[r].current());
    REQUIRE(after.log().size() == 2);
    CHECK(after.log() == before[r].log());
    CHECK(after.log()[0].step == 20);
    CHECK(after.log()[1].step == 500);
    CHECK(after.log()[0].names.size() == 3);
  }
  // A damaged stream is refused.
  std::string broken = saved[0];
  broken[broken.size() / 2] ^= 0x5a;
  csync::exchange_chooser victim;
  std::istringstream is(broken, std::ios::binary);
  CHECK_THROWS_AS(victim.load(is), commsgd::corrupt_data);
  CHECK(victim.current() == "dense");
  CHECK(victim.log().empty());
}

TEST_CASE("measure_network: one model on every rank, usable by the choice") {
  const auto nets = on_every_rank<comm::network_model>(
      3, [](local& c) { return csync::measure_network(c, {.large_floats = 1 << 16, .repeats = 2}); });
  for (const auto& net : nets) {
    CHECK(net.latency_s == nets[0].latency_s);
    CHECK(net.bandwidth_bytes_per_s == nets[0].bandwidth_bytes_per_s);
    CHECK(std::isfinite(net.latency_s));
    CHECK(net.latency_s >= 0);
    CHECK(net.bandwidth_bytes_per_s > 0);
  }
  CHECK_NOTHROW(csync::choose(plans(), profile_of(0), 3, nets[0]));
  const auto one = on_every_rank<comm::network_model>(1, [](local& c) { return csync::measure_network(c); });
  CHECK(one[0].latency_s == 0);
  CHECK(std::isinf(one[0].bandwidth_bytes_per_s));
}

TEST_CASE("fit_network: latency over the ring's messages, bandwidth from the large all-reduce's excess") {
  // 4 ranks, 2^20 floats: 6 messages and 1.5 x 4 MiB = 6 MiB each way on every rank.
  const std::size_t m = std::size_t{1} << 20;
  const double bytes = 1.5 * 4 * static_cast<double>(m);
  const std::vector<double> small{60e-6, 60e-6, 90e-6, 60e-6};
  const std::vector<double> large{60e-6 + bytes / 1e9, 60e-6 + bytes / 1e9, 90e-6 + bytes / 1e9,
                                  60e-6 + bytes / 5e8};
  const auto net = csync::fit_network(small, large, m);
  CHECK(net.latency_s == doctest::Approx(15e-6));           // the worst rank's: 90 us over 6 messages
  CHECK(net.bandwidth_bytes_per_s == doctest::Approx(5e8)); // the slowest rank's link
  // A large all-reduce no slower than the small one: bytes cost nothing measurable.
  const auto free_bytes = csync::fit_network(small, small, m);
  CHECK(std::isinf(free_bytes.bandwidth_bytes_per_s));
  const auto one = csync::fit_network(std::vector<double>{1e-3}, std::vector<double>{2e-3}, m);
  CHECK(one.latency_s == 0);
  CHECK(std::isinf(one.bandwidth_bytes_per_s));
  CHECK_THROWS_AS(csync::fit_network(small, std::vector<double>{1, 2, 3}, m), commsgd::size_mismatch);
  CHECK_THROWS_AS(csync::fit_network(std::vector<double>{1e-3, -1.0}, std::vector<double>{1e-3, 1e-3}, m),
                  commsgd::invalid_argument);
  CHECK_THROWS_AS(csync::fit_network(std::vector<double>{}, std::vector<double>{}, m),
                  commsgd::invalid_argument);
}
