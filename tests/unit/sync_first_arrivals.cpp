// csync::first_arrivals on comm::local (real sleeps) and comm::simulated (virtual clock): the decoded sum on
// every rank against the code's own decode of every block, for every n from 2 to 12 and every r; random
// arrival orders; late messages drained and never counted; more than s missing raises on every rank in
// bounded time; metered bytes equal cost/; checkpoints resume bit for bit; data_parallel composes it.
#include <commsgd/coding/coding.hpp>
#include <commsgd/comm/clock.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/cost/gradient_code.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/sync/first_arrivals.hpp>

#include "support/checkpoint.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace coding = commsgd::coding;
namespace comm = commsgd::comm;
namespace csync = commsgd::sync;
namespace policy = commsgd::policy;
using coding::node_set;

namespace {

// Element e of block q's gradient in round t: the same on every holder, different every round, so a vector
// of another round decoded by mistake changes the sum.
float block_value(std::uint64_t t, std::size_t q, std::size_t e) {
  std::uint64_t h =
      (t + 1) * 0xD1B54A32D192ED03ull ^ (q + 3) * 0x9E3779B97F4A7C15ull ^ (e + 11) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  if (h % 13 == 0) return -0.0f;
  return (static_cast<float>(h >> 40) / static_cast<float>(1ull << 24) - 0.5f) * 6.0f;
}

struct round_data {
  std::vector<std::vector<float>> blocks; // every block of the round
  std::vector<std::vector<float>> mine;   // this rank's, in my_blocks() order
  std::vector<std::span<const float>> views;
};

template <class Code>
round_data make_round(const Code& code, int rank, std::uint64_t t, std::size_t d) {
  round_data r;
  r.blocks.assign(code.block_count(), std::vector<float>(d));
  for (std::size_t q = 0; q < code.block_count(); ++q)
    for (std::size_t e = 0; e < d; ++e)
      r.blocks[q][e] = block_value(t, q, e);
  for (std::size_t q : code.blocks_of(rank))
    r.mine.push_back(r.blocks[q]);
  r.views.assign(r.mine.begin(), r.mine.end());
  return r;
}

// What the code decodes from `responders`, every vector computed locally from the round's blocks.
template <class Code>
std::vector<float> reference(Code& code, node_set responders, const round_data& r, std::size_t d) {
  std::vector<std::vector<float>> vecs;
  for (int k : coding::members(responders)) {
    std::vector<std::span<const float>> mine;
    for (std::size_t q : code.blocks_of(k))
      mine.emplace_back(r.blocks[q]);
    vecs.emplace_back(d);
    code.encode(k, coding::block_gradients(mine), vecs.back());
  }
  std::vector<std::span<const float>> coded(vecs.begin(), vecs.end());
  std::vector<float> out(d);
  code.decode(responders, std::span<const std::span<const float>>(coded), out);
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t e = 0; e < a.size(); ++e)
    if (std::bit_cast<std::uint32_t>(a[e]) != std::bit_cast<std::uint32_t>(b[e])) return false;
  return true;
}

// Runs `rounds` rounds of first_arrivals with Kind over C on every rank; checks each rank's sum against the
// reference decode of the responders the root chose, and (fractional repetition) against the decode from
// everyone, bit for bit. Returns the messages the root drained; `chosen` collects each round's responders.
template <class Kind, class C>
std::uint64_t run_rounds(C& c, int r, std::size_t d, int rounds, csync::first_arrivals_options o,
                         std::vector<std::uint64_t>* sent = nullptr,
                         commsgd::comm::traffic* traffic = nullptr, std::vector<node_set>* chosen = nullptr) {
  coding::block_reducer<coding::gradient_code_scheme<Kind, C>> red(
      coding::gradient_code_scheme<Kind, C>(c, r));
  auto& code = red.scheme().code();
  csync::first_arrivals<C> s(c, d, o);
  std::vector<float> x(d, 0.0f);
  s.start(x);
  commsgd::comm::traffic before{};
  if constexpr (requires { c.counters(); }) before = commsgd::cost::measured(c.counters().total());
  std::uint64_t mine_sent = 0;
  for (int t = 0; t < rounds; ++t) {
    auto data = make_round(code, c.rank(), static_cast<std::uint64_t>(t), d);
    s.step(x, coding::block_gradients(data.views), red);
    const auto& rep = s.report();
    CHECK(rep.round == static_cast<std::uint64_t>(t));
    CHECK(coding::set_size(rep.responders) == code.needed());
    const auto want = reference(code, rep.responders, data, d);
    CHECK(same_bits(s.last_sum(), want));
    if constexpr (std::same_as<Kind, coding::fractional_repetition>) {
      const node_set all = coding::node_bit(c.size()) - 1;
      CHECK(same_bits(s.last_sum(), reference(code, all, data, d)));
    } else if constexpr (std::same_as<Kind, coding::cyclic>) {
      // Against the exact sum, within the bound the code states for these responders.
      std::vector<std::vector<float>> vecs;
      for (int k : coding::members(rep.responders)) {
        std::vector<std::span<const float>> theirs;
        for (std::size_t q : code.blocks_of(k))
          theirs.emplace_back(data.blocks[q]);
        vecs.emplace_back(d);
        code.encode(k, coding::block_gradients(theirs), vecs.back());
      }
      for (std::size_t e = 0; e < d; ++e) {
        long double exact = 0, abs_sum = 0;
        for (const auto& b : data.blocks) {
          exact += b[e];
          abs_sum += std::abs(b[e]);
        }
        std::vector<double> ce;
        for (const auto& v : vecs)
          ce.push_back(v[e]);
        const double bound =
            code.error_bound(rep.responders, static_cast<double>(exact), ce, static_cast<double>(abs_sum));
        CHECK(std::abs(static_cast<double>(s.last_sum()[e] - exact)) <= bound);
      }
    }
    mine_sent += rep.sent ? 1 : 0;
    if (chosen) chosen->push_back(rep.responders);
  }
  s.finish(x);
  if constexpr (requires { c.counters(); })
    if (traffic) {
      const auto now = commsgd::cost::measured(c.counters().total());
      *traffic = {now.messages_sent - before.messages_sent, now.bytes_sent - before.bytes_sent,
                  now.messages_received - before.messages_received,
                  now.bytes_received - before.bytes_received};
    }
  if (sent) {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(c.size()));
    c.all_gather(std::span<const std::uint64_t>(&mine_sent, 1), std::span<std::uint64_t>(all));
    *sent = all;
  }
  return s.drained();
}

} // namespace

TEST_CASE("first_arrivals on comm::local: exact sums on every rank, n = 2..12, every r, random arrivals") {
  for (int n = 2; n <= 12; ++n)
    for (int r = 1; r <= n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      csync::first_arrivals_options o;
      o.lr = 0.1f;
      o.timeout_s = 10;
      // Exponential delays of mean 0.3 ms: the arrival order changes every round and every run.
      o.delays = {.kind = csync::delay_kind::shifted_exponential,
                  .mean = 1.0,
                  .seed = static_cast<std::uint64_t>(n * 64 + r)};
      o.unit_s = 3e-4;
      o.root = (n + r) % n;
      comm::local_group{n}.run([&](comm::local& c) {
        run_rounds<coding::cyclic>(c, r, 7, 2, o);
        if (n % r == 0) run_rounds<coding::fractional_repetition>(c, r, 7, 2, o);
      });
    }
}

TEST_CASE(
    "first_arrivals on comm::simulated: exact sums on every rank, n = 2..12, every r, seeded arrivals") {
  const comm::network_model net{1e-5, 1e9};
  for (int n = 2; n <= 12; ++n)
    for (int r = 1; r <= n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      csync::first_arrivals_options o;
      o.lr = 0.1f;
      // Pareto delays of mean one unit (1 ms) against 30 us messages: the first n - s change every round.
      o.delays = {.kind = csync::delay_kind::pareto,
                  .mean = 1.0,
                  .shape = 1.5,
                  .seed = static_cast<std::uint64_t>(n * 64 + r)};
      o.unit_s = 1e-3;
      o.root = r % n;
      comm::local_group{n}.run([&](comm::local& base) {
        comm::simulated<comm::local> c(base, net);
        run_rounds<coding::cyclic>(c, r, 7, 3, o);
        if (n % r == 0) run_rounds<coding::fractional_repetition>(c, r, 7, 3, o);
      });
    }
}

TEST_CASE("first_arrivals: late vectors are drained, never decoded; bytes equal cost/ exactly") {
  // No delays: all n vectors leave at once, the root decodes from the first n - s and the other s arrive
  // late, to be drained in the next round or at finish.
  for (int n : {4, 6, 8}) {
    const int r = 2;
    const std::size_t d = 33;
    const int rounds = 6;
    std::atomic<std::uint64_t> drained{0};
    comm::local_group{n}.run([&](comm::local& base) {
      comm::metered<comm::local> c(base);
      csync::first_arrivals_options o;
      o.lr = 0.1f;
      std::vector<std::uint64_t> sent;
      commsgd::comm::traffic got;
      const auto late = run_rounds<coding::fractional_repetition>(c, r, d, rounds, o, &sent, &got);
      if (c.rank() == 0) drained = late;
      // Every vector sent is taken in once, decoded or drained.
      const auto want = commsgd::cost::first_arrivals_run(n, d, c.rank(), 0, rounds, sent);
      CHECK(got.bytes_sent == want.bytes_sent);
      CHECK(got.bytes_received == want.bytes_received);
      CHECK(got.messages_sent == want.messages_sent);
      CHECK(got.messages_received == want.messages_received);
    });
    CHECK(drained.load() > 0);
  }
}

TEST_CASE("first_arrivals: a slow node is left out and stays in step; a stopped node is tolerated up to s") {
  const int n = 4;
  comm::local_group{n}.run([&](comm::local& c) {
    csync::first_arrivals_options o;
    o.lr = 0.1f;
    o.unit_s = 0.05;
    o.delays = {.kind = csync::delay_kind::slow_node, .node = 2, .factor = 5.0};
    coding::block_reducer<coding::gradient_code_scheme<coding::cyclic, comm::local>> red(
        coding::gradient_code_scheme<coding::cyclic, comm::local>(c, 2));
    csync::first_arrivals<comm::local> s(c, 5, o);
    std::vector<float> x(5, 0.0f);
    s.start(x);
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < 4; ++t) {
      auto data = make_round(red.scheme().code(), c.rank(), static_cast<std::uint64_t>(t), 5);
      s.step(x, coding::block_gradients(data.views), red);
      CHECK_FALSE(coding::contains(s.report().responders, 2));
      if (c.rank() == 2) CHECK_FALSE(s.report().sent);
    }
    // Four rounds without waiting for the 200 ms the slow node would take each time.
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(400));
    s.finish(x);
  });
  comm::local_group{n}.run([&](comm::local& c) {
    csync::first_arrivals_options o;
    o.lr = 0.1f;
    o.timeout_s = 5;
    o.delays = {.kind = csync::delay_kind::stop, .node = 1, .from_step = 2};
    run_rounds<coding::fractional_repetition>(c, 2, 9, 5, o);
  });
}

TEST_CASE("first_arrivals: more than s missing raises stragglers_exceeded on every rank within the timeout") {
  for (int n : {2, 3, 5}) {
    std::atomic<int> raised{0};
    const auto t0 = std::chrono::steady_clock::now();
    comm::local_group{n}.run([&](comm::local& c) {
      csync::first_arrivals_options o;
      o.lr = 0.1f;
      o.timeout_s = 0.25;
      o.delays = {.kind = csync::delay_kind::stop, .node = n - 1, .from_step = 1};
      coding::block_reducer<coding::gradient_code_scheme<coding::cyclic, comm::local>> red(
          coding::gradient_code_scheme<coding::cyclic, comm::local>(c, 1));
      csync::first_arrivals<comm::local> s(c, 3, o);
      std::vector<float> x(3, 0.0f);
      s.start(x);
      for (int t = 0; t < 3; ++t) {
        auto data = make_round(red.scheme().code(), c.rank(), static_cast<std::uint64_t>(t), 3);
        try {
          s.step(x, coding::block_gradients(data.views), red);
          CHECK(t == 0);
        } catch (const coding::stragglers_exceeded& e) {
          CHECK(t == 1);
          CHECK(e.round() == 1);
          CHECK(e.needed() == n);
          CHECK(e.answered() == n - 1);
          CHECK(std::string(e.what()).find("tolerates s = 0 missing") != std::string::npos);
          ++raised;
          break;
        }
      }
      s.finish(x); // drains what is in flight, failed round included
    });
    CHECK(raised.load() == n);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  }
}

TEST_CASE("first_arrivals on comm::simulated: the virtual clock takes the first n - s, exact sums, bytes") {
  const int n = 6;
  const std::size_t d = 1000;
  const comm::network_model net{1e-5, 1e8};
  for (int r : {2, 3}) {
    comm::local_group{n}.run([&](comm::local& base) {
      using sim_t = comm::simulated<comm::local>;
      comm::metered<sim_t> c(sim_t(base, net));
      csync::first_arrivals_options o;
      o.lr = 0.1f;
      o.unit_s = 0.01;
      o.delays = {.kind = csync::delay_kind::slow_node, .node = 3, .factor = 5.0};
      coding::block_reducer<coding::gradient_code_scheme<coding::cyclic, comm::metered<sim_t>>> red(
          coding::gradient_code_scheme<coding::cyclic, comm::metered<sim_t>>(c, r));
      auto& code = red.scheme().code();
      csync::first_arrivals<comm::metered<sim_t>> s(c, d, o);
      std::vector<float> x(d, 0.0f);
      s.start(x);
      c.inner().reset();
      const double m = net.seconds(1, commsgd::cost::first_arrivals_message_bytes(d));
      for (int t = 0; t < 3; ++t) {
        // Each rank computed for 10 ms (rank 3 for 50 ms in all, by its delay) before the exchange.
        c.inner().advance(0.01);
        const double start = c.inner().now();
        const auto before = c.counters().total();
        auto data = make_round(code, c.rank(), static_cast<std::uint64_t>(t), d);
        s.step(x, coding::block_gradients(data.views), red);
        // Every fast rank is ready at `start`; the root (0) has its own at once and takes n - s - 1 more.
        node_set want = 0;
        for (int k = 0, got = 0; k < n && got < n - r + 1; ++k)
          if (k != 3) {
            want |= coding::node_bit(k);
            ++got;
          }
        CHECK(s.report().responders == want);
        CHECK(same_bits(s.last_sum(), reference(code, want, data, d)));
        const double end = start + m * (n - r) + m * (n - 1);
        CHECK(std::abs(c.inner().now() - end) <= 1e-12);
        const auto delta = c.counters().total();
        const auto cost = commsgd::cost::first_arrivals_round(
            n, d, c.rank(), 0, coding::contains(want, c.rank()) && c.rank() != 0,
            static_cast<std::uint64_t>(n - r));
        CHECK(delta.bytes_sent - before.bytes_sent == cost.bytes_sent);
        CHECK(delta.bytes_received - before.bytes_received == cost.bytes_received);
      }
      s.finish(x);
    });
  }
  // Beyond s on the virtual clock: every rank knows at once and raises the same error.
  std::atomic<int> raised{0};
  comm::local_group{n}.run([&](comm::local& base) {
    comm::simulated<comm::local> c(base, net);
    csync::first_arrivals_options o;
    o.lr = 0.1f;
    o.delays = {.kind = csync::delay_kind::stop, .node = 4, .from_step = 0};
    coding::block_reducer<
        coding::gradient_code_scheme<coding::fractional_repetition, comm::simulated<comm::local>>>
        red(coding::gradient_code_scheme<coding::fractional_repetition, comm::simulated<comm::local>>(c, 1));
    csync::first_arrivals<comm::simulated<comm::local>> s(c, 4, o);
    std::vector<float> x(4, 0.0f);
    auto data = make_round(red.scheme().code(), c.rank(), 0, 4);
    try {
      s.step(x, coding::block_gradients(data.views), red);
    } catch (const coding::stragglers_exceeded& e) {
      CHECK(e.answered() == n - 1);
      ++raised;
    }
  });
  CHECK(raised.load() == n);
}

TEST_CASE("first_arrivals on simulated<metered<X>>: the responders, sums, clock and bytes of "
          "metered<simulated<X>>") {
  using outer_meter = comm::metered<comm::simulated<comm::local>>;
  using inner_meter = comm::simulated<comm::metered<comm::local>>;
  static_assert(csync::first_arrivals<outer_meter>::virtual_clock);
  static_assert(csync::first_arrivals<inner_meter>::virtual_clock);
  static_assert(csync::first_arrivals<comm::metered<outer_meter>>::virtual_clock);
  const int n = 6;
  const comm::network_model net{1e-5, 1e8};
  csync::first_arrivals_options o;
  o.lr = 0.1f;
  o.unit_s = 1e-3;
  o.root = 2;
  o.delays = {.kind = csync::delay_kind::pareto, .mean = 1.0, .shape = 1.5, .seed = 17};
  struct outcome {
    std::vector<node_set> chosen;
    std::vector<std::uint64_t> sent;
    double now = 0;
    comm::traffic bytes;
  };
  // Each stack runs the same rounds (run_rounds checks every sum against the reference decode).
  auto run = [&](auto wrap, auto meter_of) {
    std::vector<outcome> out(static_cast<std::size_t>(n));
    comm::local_group{n}.run([&](comm::local& base) {
      auto c = wrap(base);
      auto& mine = out[static_cast<std::size_t>(c.rank())];
      run_rounds<coding::cyclic>(c, 3, 40, 5, o, &mine.sent, nullptr, &mine.chosen);
      mine.now = comm::clock_of(c).now();
      mine.bytes = commsgd::cost::measured(meter_of(c).counters().total());
    });
    return out;
  };
  const auto outer = run([&](comm::local& b) { return outer_meter(comm::simulated<comm::local>(b, net)); },
                         [](outer_meter & c) -> auto& { return c; });
  const auto inner = run([&](comm::local& b) { return inner_meter(comm::metered<comm::local>(b), net); },
                         [](inner_meter & c) -> auto& { return c.inner(); });
  for (int k = 0; k < n; ++k) {
    CAPTURE(k);
    const auto& a = outer[static_cast<std::size_t>(k)];
    const auto& b = inner[static_cast<std::size_t>(k)];
    CHECK(a.chosen == b.chosen);
    CHECK(a.sent == b.sent);
    CHECK(a.now > 0);
    CHECK(a.now == b.now); // the same charges in the same order: the same bits
    CHECK(a.bytes == b.bytes);
  }
}

namespace {

template <class Kind, class C>
using dp_t = commsgd::data_parallel<policy::gradient_code<Kind>, policy::dense, policy::first_arrivals, C>;

// Trains `steps` steps from `from` (a loaded trainer, or a fresh one when `from` is empty); returns params.
template <class Kind, class C>
std::vector<float> train(C& c, const typename dp_t<Kind, C>::options& o, int steps, std::vector<float> x,
                         const ckpt::bytes* from, ckpt::bytes* save_to) {
  dp_t<Kind, C> dp(c, x.size(), o);
  if (from) {
    auto is = ckpt::stream_of(*from);
    dp.load(is);
  }
  dp.start(x);
  for (int i = 0; i < steps; ++i) {
    const auto t = dp.steps();
    std::vector<std::vector<float>> g;
    for (std::size_t q : dp.my_blocks()) {
      g.emplace_back(x.size());
      for (std::size_t e = 0; e < x.size(); ++e)
        g.back()[e] = block_value(t, q, e) + 0.01f * x[e];
    }
    std::vector<std::span<const float>> v(g.begin(), g.end());
    dp.step(x, coding::block_gradients(v), {.compute_seconds = 1e-3});
  }
  dp.finish(x);
  if (save_to) *save_to = ckpt::save_bytes(dp);
  return x;
}

} // namespace

TEST_CASE(
    "first_arrivals through data_parallel: checkpoints resume bit for bit; a foreign stream is refused") {
  // Fractional repetition over real arrivals (the bits do not depend on who answered), cyclic over the
  // virtual clock (its responders are deterministic).
  for (int n : {2, 3, 4}) {
    comm::local_group{n}.run([&](comm::local& c) {
      dp_t<coding::fractional_repetition, comm::local>::options o{.lr = 0.05f,
                                                                  .coding = {.redundancy = n == 3 ? 3 : 2}};
      o.sync.delays = {.kind = csync::delay_kind::shifted_exponential, .mean = 1.0, .seed = 9};
      std::vector<float> x0(11, 0.5f);
      const auto whole = train<coding::fractional_repetition>(c, o, 6, x0, nullptr, nullptr);
      ckpt::bytes saved;
      const auto half = train<coding::fractional_repetition>(c, o, 3, x0, nullptr, &saved);
      const auto resumed = train<coding::fractional_repetition>(c, o, 3, half, &saved, nullptr);
      CHECK(same_bits(whole, resumed));
      auto other = o;
      other.sync.delays.seed = 10;
      dp_t<coding::fractional_repetition, comm::local> dp(c, 11, other);
      auto is = ckpt::stream_of(saved);
      CHECK_THROWS_WITH_AS(dp.load(is), doctest::Contains("delay model"), commsgd::corrupt_data);
    });
    comm::local_group{n}.run([&](comm::local& base) {
      using sim_t = comm::simulated<comm::local>;
      sim_t c(base, comm::network_model::gigabit());
      dp_t<coding::cyclic, sim_t>::options o{.lr = 0.05f, .coding = {.redundancy = 2}};
      o.sync.delays = {.kind = csync::delay_kind::pareto, .mean = 1.0, .shape = 1.5, .seed = 4};
      std::vector<float> x0(11, 0.5f);
      const auto whole = train<coding::cyclic>(c, o, 6, x0, nullptr, nullptr);
      ckpt::bytes saved;
      const auto half = train<coding::cyclic>(c, o, 3, x0, nullptr, &saved);
      const auto resumed = train<coding::cyclic>(c, o, 3, half, &saved, nullptr);
      CHECK(same_bits(whole, resumed));
    });
  }
}

TEST_CASE("gradient_code under policy::synchronous, and bad options") {
  comm::local_group{4}.run([&](comm::local& c) {
    commsgd::data_parallel<policy::gradient_code<coding::fractional_repetition>, policy::dense,
                           policy::synchronous>
        dp(c, 5, {.lr = 0.1f, .coding = {.redundancy = 2}});
    CHECK(dp.block_count() == 4);
    CHECK(dp.my_blocks().size() == 2);
    std::vector<float> x(5, 0.0f);
    dp.start(x);
    auto data = make_round(dp.coding().code(), c.rank(), 0, 5);
    dp.step(x, coding::block_gradients(data.views));
    std::vector<float> sum(5, -0.0f);
    for (const auto& b : data.blocks)
      for (std::size_t e = 0; e < 5; ++e)
        sum[e] += b[e];
    for (std::size_t e = 0; e < 5; ++e)
      CHECK(std::abs(x[e] + 0.1f * sum[e] / 4.0f) <= 1e-6f);
    dp.finish(x);

    csync::first_arrivals_options bad;
    bad.root = 4;
    CHECK_THROWS_WITH_AS(csync::first_arrivals<comm::local>(c, 5, bad), doctest::Contains("'root' = 4"),
                         commsgd::invalid_argument);
    bad = {};
    bad.timeout_s = 0;
    CHECK_THROWS_WITH_AS(csync::first_arrivals<comm::local>(c, 5, bad), doctest::Contains("'timeout_s' = 0"),
                         commsgd::invalid_argument);
    bad = {};
    bad.delays = {.kind = csync::delay_kind::pareto, .shape = 1.0};
    CHECK_THROWS_WITH_AS(csync::first_arrivals<comm::local>(c, 5, bad), doctest::Contains("'shape' = 1"),
                         commsgd::invalid_argument);
    bad = {};
    bad.delays = {.kind = csync::delay_kind::slow_node, .node = 7};
    CHECK_THROWS_WITH_AS(csync::first_arrivals<comm::local>(c, 5, bad),
                         doctest::Contains("'delay_model.node' = 7"), commsgd::invalid_argument);
    csync::first_arrivals<comm::local> s(c, 5, {});
    std::vector<float> g(5, 1.0f);
    CHECK_THROWS_AS(s.step(x, std::span<const float>(g)), commsgd::unsupported);
  });
}

TEST_CASE("delay models: seeded per (step, rank), the stated means") {
  csync::delay_model e{.kind = csync::delay_kind::shifted_exponential, .mean = 2.0, .seed = 1};
  csync::delay_model p{.kind = csync::delay_kind::pareto, .mean = 2.0, .shape = 3.0, .seed = 1};
  double se = 0, sp = 0;
  const int count = 200000;
  for (int i = 0; i < count; ++i) {
    se += e.delay(static_cast<std::uint64_t>(i / 8), i % 8, 0.5);
    sp += p.delay(static_cast<std::uint64_t>(i / 8), i % 8, 0.5);
  }
  CHECK(se / count == doctest::Approx(1.0).epsilon(0.02));
  CHECK(sp / count == doctest::Approx(1.0).epsilon(0.05));
  CHECK(e.delay(5, 3, 1.0) == e.delay(5, 3, 1.0));
  CHECK(e.delay(5, 3, 1.0) != e.delay(5, 4, 1.0));
  csync::delay_model slow{.kind = csync::delay_kind::slow_node, .node = 2, .factor = 5.0};
  CHECK(slow.delay(0, 2, 0.25) == 1.0);
  CHECK(slow.delay(0, 1, 0.25) == 0.0);
  csync::delay_model stop{.kind = csync::delay_kind::stop, .node = 1, .from_step = 3};
  CHECK(stop.delay(2, 1, 1.0) == 0.0);
  CHECK(std::isinf(stop.delay(3, 1, 1.0)));
}
