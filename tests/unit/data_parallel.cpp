// data_parallel<Coding, Compression, Sync>: every supported composition trains the toy problem, and the
// compositions that must agree bit for bit do.
#include <commsgd/comm/local.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sync/sgd.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

const toy::least_squares problem({.samples = 960, .dim = 12, .seed = 7});
constexpr std::size_t batch = 240;

// Rows of block q in the batch of step t: the batch is a window of the data set, cut by block_sizes.
toy::rows block_rows(const std::vector<std::size_t>& sizes, std::size_t q, std::int64_t t) {
  const std::size_t start = (static_cast<std::size_t>(t) * batch) % problem.samples();
  std::size_t first = start;
  for (std::size_t j = 0; j < q; ++j)
    first += sizes[j];
  return {first, sizes[q]};
}

// Runs `steps` steps of a block-gradient composition on every rank and returns rank 0's final model.
template <class Dp>
std::vector<float> train_blocks(int n, typename Dp::options o, int steps) {
  std::vector<float> result;
  std::mutex mu;
  local_group(n).run([&](local& c) {
    Dp dp(c, problem.dim(), o);
    std::vector<float> x(problem.dim(), 0.0f);
    dp.start(x);
    const auto sizes = dp.block_sizes(batch);
    std::vector<std::vector<float>> grads(dp.my_blocks().size(), std::vector<float>(problem.dim()));
    std::vector<std::span<const float>> views(grads.begin(), grads.end());
    for (int t = 0; t < steps; ++t) {
      for (std::size_t j = 0; j < grads.size(); ++j)
        problem.gradient(x, block_rows(sizes, dp.my_blocks()[j], t), grads[j]);
      dp.step(x, coding::block_gradients(views));
    }
    dp.finish(x);
    if (c.rank() == 0) {
      std::lock_guard lock(mu);
      result = x;
    }
  });
  return result;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace

TEST_CASE("synchronous uncoded ring equals single-process SGD over the same blocks, bit for bit") {
  // comm::local sums in rank order, and apply_mean_sum is what the strategy uses, so the reference can
  // replay the exact float operations.
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const auto got = train_blocks<data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>>(
        n, {.lr = 0.05f}, 30);
    const coding::assignment a(n, 1);
    const auto sizes = a.block_sizes(batch);
    std::vector<float> x(problem.dim(), 0.0f), g(problem.dim()), sum(problem.dim());
    for (int t = 0; t < 30; ++t) {
      for (std::size_t q = 0; q < a.block_count(); ++q) {
        problem.gradient(x, block_rows(sizes, q, t), g);
        for (std::size_t i = 0; i < g.size(); ++i)
          sum[i] = q == 0 ? g[i] : sum[i] + g[i];
      }
      sync::apply_mean_sum(x, sum, n, 0.05f);
    }
    CHECK(same_bits(got, x));
  }
}

TEST_CASE("cssgd with xor_bits trains exactly as the uncoded shuffle of the same assignment") {
  for (int n : {3, 4})
    for (int r = 1; r <= n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      const auto coded =
          train_blocks<data_parallel<policy::cssgd<coding::xor_bits>, policy::dense, policy::synchronous>>(
              n, {.lr = 0.5f, .coding = {.redundancy = r}}, 25);
      const auto shuffled =
          train_blocks<data_parallel<policy::uncoded_shuffle, policy::dense, policy::synchronous>>(
              n, {.lr = 0.5f, .coding = {.redundancy = r}}, 25);
      CHECK(same_bits(coded, shuffled));
      CHECK(problem.loss(coded) < 0.1 * problem.loss(std::vector<float>(problem.dim(), 0.0f)));
    }
}

TEST_CASE("cssgd with int32_sum stays within its quantisation error of the exact scheme") {
  const policy::redundancy_options o{.redundancy = 2};
  const auto exact =
      train_blocks<data_parallel<policy::cssgd<coding::xor_bits>, policy::dense, policy::synchronous>>(
          4, {.lr = 0.05f, .coding = o}, 10);
  const auto quantised =
      train_blocks<data_parallel<policy::cssgd<coding::int32_sum>, policy::dense, policy::synchronous>>(
          4, {.lr = 0.05f, .coding = o}, 10);
  for (std::size_t i = 0; i < exact.size(); ++i)
    CHECK(std::abs(exact[i] - quantised[i]) < 1e-5f);
}

TEST_CASE("every uncoded exchange variant gives the same model") {
  const auto ring = train_blocks<data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>>(
      3, {.lr = 0.05f}, 20);
  const auto gather =
      train_blocks<data_parallel<policy::uncoded<coding::by_all_gather>, policy::dense, policy::synchronous>>(
          3, {.lr = 0.05f}, 20);
  const auto unicast =
      train_blocks<data_parallel<policy::uncoded<coding::by_unicast>, policy::dense, policy::synchronous>>(
          3, {.lr = 0.05f}, 20);
  // All three sum in rank order here; the all-gather and unicast variants start from -0, the ring from
  // rank 0's value, which only differs in the sign of an exact zero.
  for (std::size_t i = 0; i < ring.size(); ++i) {
    CHECK(ring[i] == gather[i]);
    CHECK(ring[i] == unicast[i]);
  }
}

TEST_CASE("top_k at density 1 is the dense exchange; at low density error feedback still converges") {
  using exact_top_k = data_parallel<policy::uncoded<>, policy::top_k<select::exact>, policy::synchronous>;
  const auto dense = train_blocks<data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>>(
      3, {.lr = 0.05f}, 20);
  const auto sparse =
      train_blocks<exact_top_k>(3, {.lr = 0.05f, .compression = {.top_k = {.density = 1.0}}}, 20);
  for (std::size_t i = 0; i < dense.size(); ++i)
    CHECK(dense[i] == doctest::Approx(sparse[i]).epsilon(1e-6));

  const policy::top_k_settings thin{.top_k = {.density = 0.25}};
  const double start = problem.loss(std::vector<float>(problem.dim(), 0.0f));
  CHECK(problem.loss(train_blocks<exact_top_k>(3, {.lr = 0.05f, .compression = thin}, 200)) < 0.05 * start);
  using laplace_top_k =
      data_parallel<policy::uncoded<>, policy::top_k<select::laplace_bisect>, policy::synchronous>;
  CHECK(problem.loss(train_blocks<laplace_top_k>(3, {.lr = 0.05f, .compression = thin}, 200)) < 0.05 * start);
}

TEST_CASE("local_sgd, async_ps and partitioned compose with uncoded dense exchange and converge") {
  const double start = problem.loss(std::vector<float>(problem.dim(), 0.0f));
  auto run = [&]<class Dp>(int n, typename Dp::options o) {
    std::vector<std::vector<float>> finals(static_cast<std::size_t>(n));
    local_group(n).run([&](local& c) {
      Dp dp(c, problem.dim(), o);
      std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
      dp.start(x);
      for (int t = 0; t < 150 && dp.computes_gradients(); ++t) {
        problem.gradient(x, problem.batch(c.rank(), c.size(), t, 40), g);
        dp.step(x, std::span<const float>(g), {.loss = problem.loss(x)});
      }
      dp.finish(x);
      finals[static_cast<std::size_t>(c.rank())] = x;
    });
    return finals;
  };
  sync::local_sgd_options local;
  local.period = 4;
  for (const auto& x :
       run.template operator()<data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd>>(
           3, {.lr = 0.05f, .sync = local}))
    CHECK(problem.loss(x) < 0.05 * start);
  policy::partitioned_settings part{.layer_sizes = {5, 7}};
  part.partitioned.partition_elements = 3;
  part.partitioned.credit_bytes = 24;
  for (const auto& x :
       run.template operator()<data_parallel<policy::uncoded<>, policy::dense, policy::partitioned>>(
           3, {.lr = 0.05f, .sync = part}))
    CHECK(problem.loss(x) < 0.05 * start);
  // The server (rank 0) holds the model the workers trained.
  const auto ps = run.template operator()<data_parallel<policy::uncoded<>, policy::dense, policy::async_ps>>(
      3, {.lr = 0.05f});
  CHECK(problem.loss(ps[0]) < 0.05 * start);
}

TEST_CASE("bad input is refused with the argument named") {
  local_group(2).run([](local& c) {
    using dp_t = data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>;
    dp_t dp(c, 4, {.lr = 0.1f});
    std::vector<float> x(5), g(4);
    CHECK_THROWS_WITH_AS(dp.step(x, std::span<const float>(g)), doctest::Contains("'params'"), size_mismatch);
    std::vector<float> x4(4), g3(3);
    CHECK_THROWS_AS(dp.step(x4, std::span<const float>(g3)), size_mismatch);
  });
  CHECK_THROWS_AS(local_group(3).run([](local& c) {
    data_parallel<policy::cssgd<>, policy::dense, policy::synchronous> dp(c, 4,
                                                                          {.coding = {.redundancy = 4}});
  }),
                  invalid_argument);
  CHECK_THROWS_AS(local_group(2).run([](local& c) {
    data_parallel<policy::uncoded<>, policy::dense, policy::synchronous> dp(c, 4, {.lr = -1.0f});
  }),
                  invalid_argument);
}

namespace {

// What every composition offers, whatever its policies.
template <class Dp>
concept full_member_set = requires(Dp& dp, const Dp& cdp, std::span<float> x, std::span<const float> g,
                                   coding::block_gradients blocks) {
  { cdp.computes_gradients() } -> std::same_as<bool>;
  { cdp.length() } -> std::same_as<std::size_t>;
  { cdp.block_count() } -> std::same_as<std::size_t>;
  { cdp.my_blocks() } -> std::same_as<std::span<const std::size_t>>;
  { cdp.block_sizes(std::size_t{}) } -> std::same_as<std::vector<std::size_t>>;
  cdp.coding();
  dp.strategy();
  dp.start(x);
  { dp.step(x, g) } -> std::same_as<sync::step_result>;
  { dp.step(x, blocks, sync::step_info{}) } -> std::same_as<sync::step_result>;
  dp.finish(x);
  { cdp.last_coding() } -> std::same_as<const coding::exchange_result&>;
  { cdp.last_exchange() } -> std::same_as<const comm::exchange_report&>;
};
template <class Dp>
concept has_compression = requires(Dp& dp) {
  dp.compression();
};

using dense_ring = data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>;
using coded = data_parallel<policy::cssgd<coding::xor_bits>, policy::dense, policy::synchronous>;
using top_k32 = data_parallel<policy::uncoded<>, policy::top_k<select::exact>, policy::synchronous>;
using top_k64 =
    data_parallel<policy::uncoded<>, policy::top_k<select::exact, std::uint64_t>, policy::synchronous>;
using local_dp = data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd>;
using server_dp = data_parallel<policy::uncoded<>, policy::dense, policy::async_ps>;
using parts_dp = data_parallel<policy::uncoded<>, policy::dense, policy::partitioned>;

static_assert(full_member_set<dense_ring> && full_member_set<coded> && full_member_set<top_k32> &&
              full_member_set<top_k64> && full_member_set<local_dp> && full_member_set<server_dp> &&
              full_member_set<parts_dp>);
static_assert(has_compression<top_k32> && has_compression<top_k64>);
static_assert(!has_compression<dense_ring> && !has_compression<coded> && !has_compression<local_dp>);
static_assert(std::is_move_constructible_v<dense_ring> && std::is_move_constructible_v<coded> &&
              std::is_move_constructible_v<top_k32> && std::is_move_constructible_v<local_dp> &&
              std::is_move_constructible_v<server_dp> && std::is_move_constructible_v<parts_dp>);
static_assert(std::is_move_assignable_v<coded> && std::is_move_assignable_v<top_k32>);

// Trains `steps` steps, moving the object into a new one after `move_at` steps and back into the moved-from
// original after `back_at`; returns rank 0's model.
template <class Dp>
std::vector<float> train_moving(int n, typename Dp::options o, int steps, int move_at, int back_at) {
  std::vector<float> result;
  std::mutex mu;
  local_group(n).run([&](comm::local& c) {
    Dp first(c, problem.dim(), o);
    std::optional<Dp> second;
    Dp* dp = &first;
    std::vector<float> x(problem.dim(), 0.0f);
    dp->start(x);
    const auto sizes = dp->block_sizes(batch);
    std::vector<std::vector<float>> grads(dp->my_blocks().size(), std::vector<float>(problem.dim()));
    std::vector<std::span<const float>> views(grads.begin(), grads.end());
    for (int t = 0; t < steps; ++t) {
      if (t == move_at) {
        second.emplace(std::move(first));
        dp = &*second;
      }
      if (t == back_at) {
        first = std::move(*second);
        dp = &first;
      }
      for (std::size_t j = 0; j < grads.size(); ++j)
        problem.gradient(x, block_rows(sizes, dp->my_blocks()[j], t), grads[j]);
      dp->step(x, coding::block_gradients(views));
    }
    dp->finish(x);
    if (c.rank() == 0) {
      std::lock_guard lock(mu);
      result = x;
    }
  });
  return result;
}

} // namespace

TEST_CASE(
    "a data_parallel moved mid-training, and moved back into the moved-from one, trains on bit for bit") {
  const coded::options co{.lr = 0.05f, .coding = {.redundancy = 2}};
  CHECK(same_bits(train_moving<coded>(4, co, 30, 10, 20), train_blocks<coded>(4, co, 30)));
  const top_k32::options to{.lr = 0.05f, .compression = {.top_k = {.density = 0.25}}};
  CHECK(same_bits(train_moving<top_k32>(3, to, 30, 10, 20), train_blocks<top_k32>(3, to, 30)));
  CHECK(same_bits(train_moving<dense_ring>(3, {.lr = 0.05f}, 30, 5, 6),
                  train_blocks<dense_ring>(3, {.lr = 0.05f}, 30)));
}

TEST_CASE("top_k with 64-bit indices exchanges 64-bit pairs and trains exactly as with 32-bit ones") {
  static_assert(
      std::is_same_v<std::remove_cvref_t<decltype(std::declval<top_k64&>().compression())>::index_type,
                     std::uint64_t>);
  for (int n : {1, 3, 4})
    for (double density : {0.1, 0.25, 1.0})
      for (auto path : {cost::sparse_path::sparse, cost::sparse_path::dense}) {
        CAPTURE(n);
        CAPTURE(density);
        CAPTURE(static_cast<int>(path));
        const policy::top_k_settings s{.top_k = {.density = density}, .exchange = {.path = path}};
        const auto wide = train_blocks<top_k64>(n, {.lr = 0.05f, .compression = s}, 40);
        CHECK(same_bits(wide, train_blocks<top_k32>(n, {.lr = 0.05f, .compression = s}, 40)));
        CHECK(problem.loss(wide) < problem.loss(std::vector<float>(problem.dim(), 0.0f)));
      }
  // The pairs travel as 64-bit entries: each rank's count is what the sparsifier sent, on every path.
  local_group(3).run([](comm::local& c) {
    top_k64::options o{.lr = 0.05f};
    o.compression.top_k.k = 5;
    o.compression.exchange.path = cost::sparse_path::sparse;
    top_k64 dp(c, problem.dim(), o);
    std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
    dp.start(x);
    problem.gradient(x, problem.batch(c.rank(), c.size(), 0, 40), g);
    dp.step(x, std::span<const float>(g));
    CHECK_FALSE(dp.last_exchange().dense);
    CHECK(dp.last_exchange().counts == std::vector<std::uint64_t>{5, 5, 5});
    CHECK(dp.compression().last().size() == 5);
  });
}
