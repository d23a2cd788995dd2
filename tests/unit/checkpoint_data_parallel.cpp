// Checkpoints of data_parallel on comm::local: several compositions save at a random step, fresh objects
// load the stream and the next steps match the uninterrupted run bit for bit; damaged, truncated,
// other-version and foreign streams (another composition, length, redundancy, group) are refused with the
// state untouched, including when only the strategy's part refuses after the sparsifier's was accepted.
#include "support/checkpoint.hpp"

#include <commsgd/comm/local.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <mutex>
#include <random>
#include <string>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

const toy::least_squares& problem() {
  static const toy::least_squares p({.samples = 480, .dim = 10, .seed = 9});
  return p;
}
constexpr std::size_t batch = 48;

std::vector<float> initial_model(int rank) {
  std::vector<float> x(problem().dim());
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = 0.05f * static_cast<float>(rank + 1) - 0.02f * static_cast<float>(i);
  return x;
}

// Steps [from, to): the gradient of every block this rank computes, from the rows the block covers.
template <class Dp>
void train(Dp& dp, std::vector<float>& x, int from, int to, std::vector<std::vector<float>>* out) {
  const auto sizes = dp.block_sizes(batch);
  std::vector<std::vector<float>> grads(dp.my_blocks().size(), std::vector<float>(problem().dim()));
  std::vector<std::span<const float>> views(grads.begin(), grads.end());
  for (int t = from; t < to; ++t) {
    const std::size_t start = (static_cast<std::size_t>(t) * batch) % problem().samples();
    for (std::size_t j = 0; j < grads.size(); ++j) {
      std::size_t first = start;
      for (std::size_t q = 0; q < dp.my_blocks()[j]; ++q)
        first += sizes[q];
      problem().gradient(x, {first, sizes[dp.my_blocks()[j]]}, grads[j]);
    }
    dp.step(x, coding::block_gradients(views), {.loss = problem().loss(x)});
    if (out) out->push_back(x);
  }
}

ckpt::bytes from_rank0(local& c, ckpt::bytes b) {
  std::uint64_t n = b.size();
  c.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&n, 1)), 0);
  b.resize(static_cast<std::size_t>(n));
  c.broadcast(std::span<std::byte>(b), 0);
  return b;
}

template <class Dp>
void round_trip(int n, const typename Dp::options& o, int total, int at, bool split) {
  CAPTURE(n);
  CAPTURE(at);
  CAPTURE(split);
  std::mutex mu;
  std::vector<std::string> failures;
  local_group(n).run([&](local& c) {
    std::vector<std::vector<float>> ref, resumed;
    {
      Dp dp(c, problem().dim(), o);
      auto x = initial_model(c.rank());
      dp.start(x);
      train(dp, x, 0, total, &ref);
    }
    ckpt::bytes all, shared, mine;
    std::vector<float> saved_x;
    {
      Dp dp(c, problem().dim(), o);
      auto x = initial_model(c.rank());
      dp.start(x);
      train(dp, x, 0, at, nullptr);
      all = ckpt::save_bytes(dp);
      shared = ckpt::save_bytes(dp, state::part::shared);
      mine = ckpt::save_bytes(dp, state::part::local);
      saved_x = x;
    }
    std::string failure;
    const auto shared0 = from_rank0(c, shared);
    if (shared0 != shared) failure = "the shared part differs between ranks";
    Dp dp(c, problem().dim(), o);
    if (split)
      ckpt::load_bytes(dp, shared0, mine);
    else
      ckpt::load_bytes(dp, all);
    if (dp.steps() != static_cast<std::uint64_t>(at)) failure = "the step count was not restored";
    if (ckpt::save_bytes(dp) != all) failure = "a loaded data_parallel saves other bytes than it loaded";
    auto x = saved_x;
    dp.start(x);
    train(dp, x, at, total, &resumed);
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

template <class Dp>
void round_trips(int min_n, const typename Dp::options& o, unsigned seed) {
  std::mt19937 rng(seed);
  for (int n = min_n; n <= 4; ++n)
    for (int k = 0; k < 3; ++k) {
      const int total = 16;
      round_trip<Dp>(n, o, total, k == 0 ? 0 : static_cast<int>(rng() % total), k == 2);
    }
}

using plain_dp = data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>;
using cssgd_dp = data_parallel<policy::cssgd<coding::xor_bits>, policy::dense, policy::synchronous>;
using top_k_dp = data_parallel<policy::uncoded<>, policy::top_k<select::exact>, policy::synchronous>;
using warm_top_k_dp =
    data_parallel<policy::uncoded<>, policy::top_k<select::laplace_bisect>, policy::synchronous>;
using local_dp = data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd>;
using parts_dp = data_parallel<policy::uncoded<>, policy::dense, policy::partitioned>;
using server_dp = data_parallel<policy::uncoded<>, policy::dense, policy::async_ps>;

template <class Dp>
typename Dp::options top_k_options() {
  typename Dp::options o{.lr = 0.2f};
  o.compression.top_k.density = 0.3;
  o.compression.top_k.momentum = 0.5;
  return o;
}

// Rebuilds a data_parallel stream with its strategy's shared part replaced (the frame repaired), so that
// every identity check passes and only the strategy refuses.
ckpt::bytes with_strategy_shared(const ckpt::bytes& good, const ckpt::bytes& strategy_shared) {
  state::reader r(good, "data_parallel");
  state::writer w("data_parallel");
  const auto part = r.get<std::uint32_t>();
  w.put<std::uint32_t>(part);
  w.put<std::uint32_t>(r.get<std::uint32_t>());
  w.put<std::int32_t>(r.get<std::int32_t>());
  for (int i = 0; i < 3; ++i)
    w.put_string(r.get_string());
  w.put<std::uint64_t>(r.get<std::uint64_t>());
  w.put<std::uint64_t>(r.get<std::uint64_t>());
  w.put<std::uint64_t>(r.get<std::uint64_t>());
  (void)r.get_bytes();
  w.put_bytes(strategy_shared);
  const auto blocks = r.get_vector<std::size_t>();
  w.put_array(std::span<const std::size_t>(blocks));
  w.put<std::uint32_t>(r.get<std::uint32_t>());
  w.put_bytes(r.get_bytes());
  w.put_bytes(r.get_bytes());
  r.expect_end();
  return std::move(w).finish();
}

} // namespace

TEST_CASE("data_parallel resumes bit for bit: uncoded, cssgd, top_k, local_sgd, partitioned") {
  SUBCASE("uncoded, dense, synchronous") {
    round_trips<plain_dp>(1, {.lr = 0.2f}, 1);
  }
  SUBCASE("cssgd(xor_bits), redundancy 2") {
    round_trips<cssgd_dp>(2, {.lr = 0.2f, .coding = {.redundancy = 2}}, 2);
  }
  SUBCASE("top_k(exact) with momentum") {
    round_trips<top_k_dp>(1, top_k_options<top_k_dp>(), 3);
  }
  SUBCASE("top_k(laplace_bisect), warm-start state") {
    round_trips<warm_top_k_dp>(1, top_k_options<warm_top_k_dp>(), 4);
  }
  SUBCASE("local_sgd, adaptive") {
    local_dp::options o{.lr = 0.2f};
    o.sync = {.period = 3, .adaptive = true, .max_period = 6};
    round_trips<local_dp>(1, o, 5);
  }
  SUBCASE("partitioned") {
    parts_dp::options o{.lr = 0.2f, .sync = {.layer_sizes = {4, 6}}};
    o.sync.partitioned = {.partition_elements = 3, .credit_bytes = 12};
    round_trips<parts_dp>(1, o, 6);
  }
}

TEST_CASE(
    "data_parallel over async_ps resumes from a checkpoint taken after finish, bit for bit with one worker") {
  auto run = [](bool resume) {
    std::vector<std::vector<float>> finals(2);
    std::vector<sync::applied_update> log;
    std::mutex mu;
    local_group(2).run([&](local& c) {
      const server_dp::options o{.lr = 0.1f};
      server_dp first(c, problem().dim(), o);
      auto x = initial_model(0);
      auto session = [&](server_dp& dp, int from, int to) {
        dp.start(x);
        if (dp.computes_gradients()) train(dp, x, from, to, nullptr);
        dp.finish(x);
      };
      session(first, 0, 6);
      server_dp second(c, problem().dim(), o);
      server_dp* dp = &first;
      if (resume) {
        ckpt::load_bytes(second, ckpt::save_bytes(first));
        dp = &second;
      }
      session(*dp, 6, 14);
      std::lock_guard lock(mu);
      finals[static_cast<std::size_t>(c.rank())] = x;
      if (dp->strategy().is_server()) log = dp->strategy().log();
    });
    return std::pair(finals, log);
  };
  const auto [straight, straight_log] = run(false);
  const auto [resumed, resumed_log] = run(true);
  for (std::size_t r = 0; r < 2; ++r)
    CHECK(ckpt::same_bits(straight[r], resumed[r]));
  REQUIRE(straight_log.size() == resumed_log.size());
  CHECK(resumed_log.size() == 14);
  for (std::size_t i = 0; i < straight_log.size(); ++i) {
    CHECK(straight_log[i].step == resumed_log[i].step);
    CHECK(straight_log[i].applied_at == resumed_log[i].applied_at);
  }
}

TEST_CASE("data_parallel streams: damage refused, state untouched") {
  std::mutex mu;
  std::vector<std::string> failures;
  local_group(2).run([&](local& c) {
    ckpt::bytes good;
    {
      warm_top_k_dp dp(c, problem().dim(), top_k_options<warm_top_k_dp>());
      auto x = initial_model(c.rank());
      dp.start(x);
      train(dp, x, 0, 5, nullptr);
      good = ckpt::save_bytes(dp);
    }
    warm_top_k_dp fresh(c, problem().dim(), top_k_options<warm_top_k_dp>());
    std::string f = ckpt::check_damage(fresh, good);
    if (f.empty()) f = ckpt::check_repaired_edits(fresh, good, 21u + static_cast<unsigned>(c.rank()), 300);
    if (!f.empty()) {
      std::lock_guard lock(mu);
      failures.push_back(ckpt::say("rank ", c.rank(), ": ", f));
    }
  });
  for (const auto& f : failures)
    FAIL_CHECK(f);
}

TEST_CASE("data_parallel streams of another composition, length, redundancy or group are refused") {
  ckpt::bytes plain2, top_k2, cssgd2, strategy_of_one;
  local_group(1).run([&](local& c) {
    sync::synchronous<local> s(c, {.lr = 0.2f});
    strategy_of_one = ckpt::save_bytes(s, state::part::shared);
  });
  local_group(2).run([&](local& c) {
    plain_dp a(c, problem().dim(), {.lr = 0.2f});
    top_k_dp b(c, problem().dim(), top_k_options<top_k_dp>());
    cssgd_dp d(c, problem().dim(), {.lr = 0.2f, .coding = {.redundancy = 2}});
    auto x = initial_model(0);
    b.start(x);
    train(b, x, 0, 3, nullptr);
    if (c.rank() == 0) {
      plain2 = ckpt::save_bytes(a);
      top_k2 = ckpt::save_bytes(b);
      cssgd2 = ckpt::save_bytes(d);
    }
  });
  auto refused = [](auto& dp, const ckpt::bytes& b, const std::string& needle) {
    const auto before = ckpt::save_bytes(dp);
    const auto f = ckpt::expect_refused(
        dp, before, [&] { ckpt::load_bytes(dp, b); }, "foreign stream", needle);
    CHECK_MESSAGE(f.empty(), f);
  };
  local_group(2).run([&](local& c) {
    // Built on every rank (a coded scheme's construction is collective); rank 0 alone loads.
    plain_dp a(c, problem().dim(), {.lr = 0.2f});
    top_k_dp b(c, problem().dim(), top_k_options<top_k_dp>());
    warm_top_k_dp w(c, problem().dim(), top_k_options<warm_top_k_dp>());
    cssgd_dp d1(c, problem().dim(), {.lr = 0.2f, .coding = {.redundancy = 1}});
    plain_dp longer(c, problem().dim() + 1, {.lr = 0.2f});
    if (c.rank() != 0) return;
    refused(a, top_k2, "the sparsifier policy is");
    refused(b, plain2, "the sparsifier policy is");
    refused(w, top_k2, "the sparsifier policy is");
    refused(a, cssgd2, "the coding policy is");
    refused(d1, cssgd2, "block count is");
    refused(longer, plain2, "length is 10, this one's is 11");
    {
      std::ostringstream os(std::ios::binary);
      sync::synchronous<local>(c, {.lr = 0.2f}).save(os);
      const auto s = os.str();
      refused(a,
              ckpt::bytes(reinterpret_cast<const std::byte*>(s.data()),
                          reinterpret_cast<const std::byte*>(s.data() + s.size())),
              "is the state of 'sync::synchronous', not of 'data_parallel'");
    }
    // Everything matches but the strategy's part, which comes from a group of one: the sparsifier's part
    // loads first and must be put back when the strategy refuses.
    refused(b, with_strategy_shared(top_k2, strategy_of_one), "group size is 1, this one's is 2");
    // The same stream with its own strategy part goes in.
    CHECK_NOTHROW(ckpt::load_bytes(b, top_k2));
  });
  local_group(3).run([&](local& c) {
    if (c.rank() != 0) return;
    plain_dp a(c, problem().dim(), {.lr = 0.2f});
    refused(a, plain2, "group size is 2, this one's is 3");
  });
}
