// The code examples in the comments of sync/*.hpp and data_parallel.hpp, written out as a user would copy
// them, so that they keep compiling; each runs a few steps of the toy problem and checks what its comment
// promises.
#include <commsgd/comm/local.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/sync/sync.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

const toy::least_squares problem({.samples = 480, .dim = 10, .seed = 3});
constexpr int steps = 30;

double start_loss() {
  return problem.loss(std::vector<float>(problem.dim(), 0.0f));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// sync/strategy.hpp: the life cycle every strategy shares.
template <class S>
void train(S& s, local& c, std::vector<float>& params) {
  std::vector<float> grad(params.size());
  s.start(params);
  for (int t = 0; t < steps; ++t) {
    if (!s.computes_gradients()) break;
    problem.gradient(params, problem.batch(c.rank(), c.size(), t, 20), grad);
    s.step(params, grad, {.loss = problem.loss(params)});
  }
  s.finish(params);
}

// Runs `body` on n ranks; returns every rank's final model.
template <class F>
std::vector<std::vector<float>> on_ranks(int n, F body) {
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(n));
  local_group(n).run([&](local& comm) {
    std::vector<float> x(problem.dim(), 0.0f);
    body(comm, x);
    finals[static_cast<std::size_t>(comm.rank())] = x;
  });
  return finals;
}

} // namespace

TEST_CASE("sync/synchronous.hpp and sync/dense_exchange.hpp: replicas stay bit-identical") {
  const auto ring = on_ranks(3, [](local& comm, std::vector<float>& x) {
    sync::synchronous s(comm, {.lr = 0.1f});
    train(s, comm, x);
  });
  const auto ordered = on_ranks(3, [](local& comm, std::vector<float>& x) {
    sync::synchronous<local, sync::ordered_exchange<local>> s(comm, {.lr = 0.1f});
    train(s, comm, x);
  });
  for (std::size_t r = 0; r < ring.size(); ++r) {
    CHECK(same_bits(ring[r], ring[0]));
    CHECK(same_bits(ordered[r], ordered[0]));
  }
  CHECK(problem.loss(ring[0]) < 0.2 * start_loss());
}

TEST_CASE("sync/local_sgd.hpp: warm-up, then local steps and periodic averages") {
  const auto finals = on_ranks(3, [](local& comm, std::vector<float>& x) {
    sync::local_sgd s(comm, {.lr = 0.1f, .period = 8, .warmup_steps = 20});
    train(s, comm, x);
    CHECK(s.steps() == steps);
  });
  // finish() averages the local steps since the last sync point.
  for (const auto& x : finals)
    CHECK(same_bits(x, finals[0]));
  CHECK(problem.loss(finals[0]) < 0.2 * start_loss());
}

TEST_CASE("sync/async_ps.hpp: the server ends with the model every worker receives") {
  const auto finals = on_ranks(3, [](local& comm, std::vector<float>& x) {
    sync::async_ps s(comm, {.lr = 0.1f, .apply_after = 1, .staleness_bound = 4});
    train(s, comm, x);
    CHECK(s.is_server() == (comm.rank() == 0));
  });
  for (const auto& x : finals)
    CHECK(same_bits(x, finals[0]));
  CHECK(problem.loss(finals[0]) < 0.2 * start_loss());
}

TEST_CASE("sync/partitioned.hpp: the overlapped loop equals step() and synchronous, bit for bit") {
  const std::vector<std::size_t> layer_sizes{4, 6};
  const auto overlapped = on_ranks(3, [&](local& comm, std::vector<float>& x) {
    sync::partitioned s(comm, layer_sizes, {.lr = 0.1f, .partition_elements = 3, .credit_bytes = 64 << 10});
    std::vector<float> grad(x.size());
    s.start(x);
    for (int t = 0; t < steps; ++t) {
      s.begin_step(grad);
      problem.gradient(x, problem.batch(comm.rank(), comm.size(), t, 20), grad);
      for (std::size_t layer = layer_sizes.size(); layer-- > 0;)
        s.gradient_ready(layer);
      s.finish_step(x);
    }
    s.finish(x);
  });
  // partitioned sums in rank order, as comm::local's all-reduce does.
  const auto plain = on_ranks(3, [](local& comm, std::vector<float>& x) {
    sync::synchronous s(comm, {.lr = 0.1f});
    train(s, comm, x);
  });
  for (std::size_t r = 0; r < overlapped.size(); ++r)
    CHECK(same_bits(overlapped[r], plain[r]));
}

TEST_CASE("data_parallel.hpp: the block loop of its opening comment") {
  constexpr std::size_t batch = 120;
  std::vector<double> losses;
  std::mutex mu;
  local_group(4).run([&](local& comm) {
    using dp = commsgd::data_parallel<policy::cssgd<coding::xor_bits>, policy::dense, policy::synchronous,
                                      comm::local>;
    std::vector<float> params(problem.dim(), 0.0f);
    dp trainer(comm, params.size(), {.lr = 0.1f, .coding = {.redundancy = 2}});
    trainer.start(params);
    std::vector<std::vector<float>> grads(trainer.my_blocks().size(), std::vector<float>(params.size()));
    std::vector<std::span<const float>> views(grads.begin(), grads.end());
    for (int t = 0; t < steps; ++t) {
      if (!trainer.computes_gradients()) break;
      const auto sizes = trainer.block_sizes(batch);
      std::vector<std::size_t> first(sizes.size(), (static_cast<std::size_t>(t) * batch) % problem.samples());
      for (std::size_t q = 1; q < sizes.size(); ++q)
        first[q] = first[q - 1] + sizes[q - 1];
      for (std::size_t j = 0; j < grads.size(); ++j) {
        const std::size_t q = trainer.my_blocks()[j];
        problem.gradient(params, {first[q], sizes[q]}, grads[j]);
      }
      trainer.step(params, coding::block_gradients(views), {.loss = problem.loss(params)});
    }
    trainer.finish(params);
    std::lock_guard lock(mu);
    losses.push_back(problem.loss(params));
  });
  for (double l : losses) {
    CHECK(l == losses[0]);
    CHECK(l < 0.2 * start_loss());
  }
}
