// Checkpoints of every sync strategy on comm::local: save at a random step, load into freshly built objects,
// and the next steps equal the uninterrupted run's bit for bit (async_ps: the same server state, given the
// same deliveries); damaged, truncated, other-version and foreign streams refused with the state untouched.
#include "support/checkpoint.hpp"

#include <commsgd/comm/local.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/sparsify/none.hpp>
#include <commsgd/sync/async_ps.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/partitioned.hpp>
#include <commsgd/sync/synchronous.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <mutex>
#include <random>
#include <string>
#include <vector>

// local_sgd with an outer optimizer: local SGD's sync points (PeriodicModelAverager's schedule) with the
// outer step of sync/outer_optimizer.hpp. sync::diloco is DiLoCo's own engine.
template <class C, class X = commsgd::sync::uncompressed>
using outer_local_sgd = commsgd::sync::local_sgd<C, commsgd::sync::all_reduce_exchange<C>, X>;

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

using models = std::vector<std::vector<float>>; // by step

const toy::least_squares& problem() {
  static const toy::least_squares p({.samples = 192, .dim = 11, .seed = 3});
  return p;
}

// A rank's model before start(): different on every rank, so that start()'s agreement matters.
std::vector<float> initial_model(int rank) {
  std::vector<float> x(problem().dim());
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = 0.1f * static_cast<float>(rank + 1) - 0.03f * static_cast<float>(i);
  return x;
}

// Steps [from, to) of the trainer's loop; the learning rate drops at step `drop` (state the checkpoint keeps).
template <class S>
void train(S& s, local& c, std::vector<float>& x, int from, int to, int drop, models* out) {
  const auto& p = problem();
  std::vector<float> g(p.dim());
  for (int t = from; t < to; ++t) {
    if (t == drop) s.set_learning_rate(s.learning_rate() * 0.5f);
    const auto rows = p.batch(c.rank(), c.size(), t, 4);
    p.gradient(x, rows, g);
    s.step(x, g, {.loss = p.loss(x, rows)});
    if (out) out->push_back(x);
  }
}

// rank 0's bytes on every rank (what a shared file gives them).
ckpt::bytes from_rank0(local& c, ckpt::bytes b) {
  std::uint64_t n = b.size();
  c.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&n, 1)), 0);
  b.resize(static_cast<std::size_t>(n));
  c.broadcast(std::span<std::byte>(b), 0);
  return b;
}

// Trains `total` steps uninterrupted, and again with a checkpoint after `at` steps that is loaded into a
// fresh strategy (every rank's part::all stream, or rank 0's shared part with every rank's local part);
// every step after the checkpoint must match, bit for bit, on every rank.
template <class Make>
void round_trip(int n, int total, int at, bool split, Make make) {
  CAPTURE(n);
  CAPTURE(at);
  CAPTURE(split);
  const int drop = total / 2;
  std::mutex mu;
  std::vector<std::string> failures;
  local_group(n).run([&](local& c) {
    models ref, resumed;
    {
      auto s = make(c);
      auto x = initial_model(c.rank());
      s.start(x);
      train(s, c, x, 0, total, drop, &ref);
    }
    ckpt::bytes all, shared, mine;
    std::vector<float> saved_x;
    {
      auto s = make(c);
      auto x = initial_model(c.rank());
      s.start(x);
      train(s, c, x, 0, at, drop, nullptr);
      all = ckpt::save_bytes(s);
      shared = ckpt::save_bytes(s, state::part::shared);
      mine = ckpt::save_bytes(s, state::part::local);
      saved_x = x;
      // Training on after a save changes nothing: save is const.
      train(s, c, x, at, total, drop, nullptr);
    }
    const auto shared0 = from_rank0(c, shared);
    std::string failure;
    if (shared0 != shared) failure = "the shared part differs between ranks";
    auto s = make(c);
    if (split)
      ckpt::load_bytes(s, shared0, mine);
    else
      ckpt::load_bytes(s, all);
    if (ckpt::save_bytes(s) != all) failure = "a loaded strategy saves other bytes than it loaded";
    auto x = saved_x;
    s.start(x);
    train(s, c, x, at, total, drop, &resumed);
    for (int t = at; t < total && failure.empty(); ++t)
      if (!ckpt::same_bits(ref[static_cast<std::size_t>(t)], resumed[static_cast<std::size_t>(t - at)]))
        failure = ckpt::say("rank ", c.rank(), ": the model after step ", t, " differs");
    if (!failure.empty()) {
      std::lock_guard lock(mu);
      failures.push_back(failure);
    }
  });
  for (const auto& f : failures)
    FAIL_CHECK(f);
}

// Random save points, every group size 1..4, both ways of splitting the stream.
template <class Make>
void round_trips(int min_n, Make make, std::uint64_t seed) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (int n = min_n; n <= 4; ++n)
    for (int k = 0; k < 3; ++k) {
      const int total = 24;
      const int at = k == 0 ? 0 : static_cast<int>(rng() % total);
      round_trip(n, total, at, k == 2, make);
    }
}

auto make_synchronous() {
  return [](local& c) { return sync::synchronous<local>(c, {.lr = 0.3f}); };
}
auto make_local_sgd(sync::local_sgd_options o) {
  return [o](local& c) { return sync::local_sgd<local>(c, o); };
}
auto make_partitioned() {
  return [](local& c) {
    return sync::partitioned<local>(c, {5, 6}, {.lr = 0.3f, .partition_elements = 2, .credit_bytes = 16});
  };
}

// Runs fn(strategy, comm) on every rank of a group of n with a strategy trained for `steps` steps.
template <class Make, class Fn>
void with_trained(int n, int steps, Make make, Fn fn) {
  local_group(n).run([&](local& c) {
    auto s = make(c);
    auto x = initial_model(c.rank());
    s.start(x);
    train(s, c, x, 0, steps, steps / 2, nullptr);
    fn(s, c);
  });
}

// The damage checks on rank 0 of a group of n: `good` from a trained strategy, loaded into a fresh one.
template <class Make>
void damage(int n, Make make) {
  std::mutex mu;
  std::vector<std::string> failures;
  local_group(n).run([&](local& c) {
    ckpt::bytes good;
    {
      auto s = make(c);
      auto x = initial_model(c.rank());
      s.start(x);
      train(s, c, x, 0, 7, 3, nullptr);
      good = ckpt::save_bytes(s);
    }
    auto fresh = make(c);
    std::string f = ckpt::check_damage(fresh, good);
    if (f.empty()) f = ckpt::check_repaired_edits(fresh, good, 11u + static_cast<unsigned>(c.rank()), 300);
    if (f.empty()) {
      try {
        ckpt::load_bytes(fresh, good);
        if (ckpt::save_bytes(fresh) != good) f = "the good stream does not save back to itself";
      } catch (const std::exception& e) {
        f = std::string("the good stream was refused: ") + e.what();
      }
    }
    if (!f.empty()) {
      std::lock_guard lock(mu);
      failures.push_back(f);
    }
  });
  for (const auto& f : failures)
    FAIL_CHECK(f);
}

// Loading `b` into s is refused naming `needle`, and s is untouched.
template <class S>
void refused(S& s, const ckpt::bytes& b, const std::string& needle) {
  const auto before = ckpt::save_bytes(s);
  const auto f = ckpt::expect_refused(
      s, before, [&] { ckpt::load_bytes(s, b); }, "foreign stream", needle);
  CHECK_MESSAGE(f.empty(), f);
}

} // namespace

TEST_CASE("synchronous resumes bit for bit from a checkpoint at any step") {
  round_trips(1, make_synchronous(), 1);
}

TEST_CASE("local_sgd resumes bit for bit: periodic, adaptive, and both corrections") {
  SUBCASE("periodic with warm-up") {
    round_trips(1, make_local_sgd({.lr = 0.3f, .period = 5, .warmup_steps = 3}), 2);
  }
  SUBCASE("adaptive (ADACOMM's F0 and lr0 saved)") {
    round_trips(1, make_local_sgd({.lr = 0.3f, .period = 3, .adaptive = true, .max_period = 8}), 3);
  }
  SUBCASE("every_step correction (the common model saved)") {
    round_trips(
        1,
        make_local_sgd(
            {.lr = 0.3f, .period = 4, .correction = sync::correction_mode::every_step, .alpha = 0.25f}),
        4);
  }
  SUBCASE("at_sync correction") {
    round_trips(1,
                make_local_sgd({.lr = 0.3f,
                                .period = 3,
                                .warmup_steps = 2,
                                .correction = sync::correction_mode::at_sync,
                                .alpha = 0.5f}),
                5);
  }
}

TEST_CASE("DiLoCo resumes bit for bit: outer momentum, the common model, compressor residuals") {
  SUBCASE("Nesterov outer step") {
    round_trips(1, make_local_sgd({.lr = 0.3f, .period = 3, .warmup_steps = 2, .outer = {}}), 6);
  }
  SUBCASE("outer step with every_step correction and the adaptive interval") {
    round_trips(1,
                make_local_sgd({.lr = 0.3f,
                                .period = 2,
                                .adaptive = true,
                                .max_period = 6,
                                .correction = sync::correction_mode::every_step,
                                .alpha = 0.25f,
                                .outer = {.lr = 0.5f, .momentum = 0.6f}}),
                7);
  }
  SUBCASE("top-k pseudo-gradients, float and 2-bit values (the residual in the local part)") {
    for (const bool two_bit : {false, true}) {
      CAPTURE(two_bit);
      round_trips(
          1,
          [two_bit](local& c) {
            return outer_local_sgd<local, compress::top_k_ef<>>(
                c, {.lr = 0.3f, .period = 3, .outer = {}},
                compress::top_k_ef<>(problem().dim(), {.density = 0.3, .two_bit = two_bit}));
          },
          9);
    }
  }
  SUBCASE("bf16 pseudo-gradients with error feedback (the residual in the local part)") {
    round_trips(
        1,
        [](local& c) {
          return outer_local_sgd<local, compress::bf16>(
              c, {.lr = 0.3f, .period = 3, .outer = {}},
              compress::bf16(problem().dim(), {.error_feedback = true}));
        },
        8);
  }
}

TEST_CASE("DiLoCo's damaged streams and other outer options are refused and change nothing") {
  damage(2, make_local_sgd({.lr = 0.3f, .period = 3, .outer = {}}));
  with_trained(2, 7, make_local_sgd({.lr = 0.3f, .period = 3, .outer = {}}), [](auto& s, local& c) {
    const auto good = ckpt::save_bytes(s);
    auto other =
        outer_local_sgd<local>(c, {.lr = 0.3f, .period = 3, .outer = {.lr = 0.7f, .momentum = 0.5f}});
    refused(other, good, "option 'outer.momentum'");
    auto plain = sync::local_sgd<local>(c, {.lr = 0.3f, .period = 3});
    refused(plain, good, "option 'outer.lr'");
  });
}

TEST_CASE("partitioned resumes bit for bit from a checkpoint at any step") {
  round_trips(1, make_partitioned(), 6);
}

TEST_CASE("damaged, truncated and other-version streams are refused and change nothing") {
  SUBCASE("synchronous") {
    damage(2, make_synchronous());
  }
  SUBCASE("local_sgd") {
    damage(2, make_local_sgd({.lr = 0.3f,
                              .period = 3,
                              .adaptive = true,
                              .max_period = 8,
                              .correction = sync::correction_mode::every_step}));
  }
  SUBCASE("partitioned") {
    damage(2, make_partitioned());
  }
}

TEST_CASE("streams of another strategy, options, group, rank or part are refused, naming what differs") {
  // Streams saved by a group of two.
  ckpt::bytes sync2, local2, local2_shared, local2_local1, part2;
  local_group(2).run([&](local& c) {
    auto s = make_synchronous()(c);
    auto l = make_local_sgd({.lr = 0.3f, .period = 5})(c);
    auto p = make_partitioned()(c);
    auto x = initial_model(c.rank());
    s.start(x);
    l.start(x);
    p.start(x);
    train(l, c, x, 0, 3, 100, nullptr);
    if (c.rank() == 0) {
      sync2 = ckpt::save_bytes(s);
      local2 = ckpt::save_bytes(l);
      local2_shared = ckpt::save_bytes(l, state::part::shared);
      part2 = ckpt::save_bytes(p);
    } else {
      local2_local1 = ckpt::save_bytes(l, state::part::local);
    }
  });
  local_group(2).run([&](local& c) {
    if (c.rank() != 0) return;
    auto s = make_synchronous()(c);
    auto l = make_local_sgd({.lr = 0.3f, .period = 5})(c);
    refused(s, local2, "is the state of 'sync::local_sgd', not of 'sync::synchronous'");
    refused(l, sync2, "is the state of 'sync::synchronous'");
    auto l4 = make_local_sgd({.lr = 0.3f, .period = 4})(c);
    refused(l4, local2, "option 'period' is 5, this one's is 4");
    auto la = make_local_sgd({.lr = 0.3f, .period = 5, .correction = sync::correction_mode::at_sync})(c);
    refused(la, local2, "option 'correction'");
    refused(l, local2_shared, "holds the shared part of the state where the all part is expected");
    // The local part of rank 1 on rank 0.
    const auto before = ckpt::save_bytes(l);
    const auto f = ckpt::expect_refused(
        l, before, [&] { ckpt::load_bytes(l, local2_shared, local2_local1); }, "rank 1's part", "rank");
    CHECK_MESSAGE(f.empty(), f);
    auto other =
        sync::partitioned<local>(c, {5, 7}, {.lr = 0.3f, .partition_elements = 2, .credit_bytes = 16});
    refused(other, part2, "layers");
    auto coarse =
        sync::partitioned<local>(c, {5, 6}, {.lr = 0.3f, .partition_elements = 3, .credit_bytes = 16});
    refused(coarse, part2, "option 'partition_elements'");
    // A sparsifier's state is a commsgd stream too, but not a strategy's.
    std::ostringstream os(std::ios::binary);
    sparsify::none(11).save(os);
    const auto str = os.str();
    refused(s,
            ckpt::bytes(reinterpret_cast<const std::byte*>(str.data()),
                        reinterpret_cast<const std::byte*>(str.data() + str.size())),
            "is the state of 'none'");
  });
  // A group of three is not a group of two.
  local_group(3).run([&](local& c) {
    if (c.rank() != 0) return;
    auto s = make_synchronous()(c);
    refused(s, sync2, "group size is 2, this one's is 3");
  });
}

TEST_CASE("saving is refused inside an open partitioned step") {
  local_group(1).run([&](local& c) {
    auto p = make_partitioned()(c);
    auto x = initial_model(0);
    p.start(x);
    std::vector<float> g(x.size(), 0.5f);
    p.begin_step(g);
    std::ostringstream os;
    CHECK_THROWS_AS(p.save(os), invalid_argument);
    for (std::size_t l = 2; l-- > 0;)
      p.gradient_ready(l);
    p.finish_step(x);
    CHECK_NOTHROW(p.save(os));
  });
}
