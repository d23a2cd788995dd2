// Checkpoints over comm::mpi (2, 3 and 4 processes): every strategy and several data_parallel compositions
// save at a random step (the same on every rank), fresh objects load the streams (each rank's own, or rank
// 0's shared part broadcast with each rank's local part) and the next steps match the uninterrupted run bit
// for bit; async_ps resumes to the state its log replays; damaged streams are refused with the state
// untouched. Failures are collected and CHECKed at the end, so no rank leaves the others in a collective.
#include "mpi/support.hpp"
#include "support/checkpoint.hpp"

#include <commsgd/comm/mpi.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sync/async_ps.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/partitioned.hpp>
#include <commsgd/sync/synchronous.hpp>
#include <support/least_squares.hpp>

#include <map>
#include <random>
#include <string>
#include <vector>

using namespace commsgd;
using comm::mpi;

namespace {

const toy::least_squares problem({.samples = 480, .dim = 10, .seed = 17});
constexpr std::size_t batch = 48;

std::vector<float> initial_model(int rank) {
  std::vector<float> x(problem.dim());
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = 0.05f * static_cast<float>(rank + 1) - 0.02f * static_cast<float>(i);
  return x;
}

ckpt::bytes from_rank0(mpi& c, ckpt::bytes b) {
  std::uint64_t n = b.size();
  c.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&n, 1)), 0);
  b.resize(static_cast<std::size_t>(n));
  c.broadcast(std::span<std::byte>(b), 0);
  return b;
}

// One step of a strategy (one gradient per rank) or of a data_parallel (its blocks).
template <class S>
void step(S& s, mpi& c, std::vector<float>& x, int t) {
  if constexpr (requires { s.my_blocks(); }) {
    const auto sizes = s.block_sizes(batch);
    std::vector<std::vector<float>> grads(s.my_blocks().size(), std::vector<float>(problem.dim()));
    const std::size_t start = (static_cast<std::size_t>(t) * batch) % problem.samples();
    for (std::size_t j = 0; j < grads.size(); ++j) {
      std::size_t first = start;
      for (std::size_t q = 0; q < s.my_blocks()[j]; ++q)
        first += sizes[q];
      problem.gradient(x, {first, sizes[s.my_blocks()[j]]}, grads[j]);
    }
    std::vector<std::span<const float>> views(grads.begin(), grads.end());
    s.step(x, coding::block_gradients(views), {.loss = problem.loss(x)});
  } else {
    std::vector<float> g(problem.dim());
    const auto rows = problem.batch(c.rank(), c.size(), t, 8);
    problem.gradient(x, rows, g);
    s.step(x, g, {.loss = problem.loss(x, rows)});
  }
}

// Uninterrupted, then with a checkpoint after `at` steps loaded into a fresh object; returns what differs.
template <class Make>
std::string round_trip(mpi& c, Make make, int total, int at, bool split) {
  std::vector<std::vector<float>> ref;
  {
    auto s = make(c);
    auto x = initial_model(c.rank());
    s.start(x);
    for (int t = 0; t < total; ++t) {
      step(s, c, x, t);
      ref.push_back(x);
    }
  }
  ckpt::bytes all, shared, mine;
  std::vector<float> x;
  {
    auto s = make(c);
    x = initial_model(c.rank());
    s.start(x);
    for (int t = 0; t < at; ++t)
      step(s, c, x, t);
    all = ckpt::save_bytes(s);
    shared = ckpt::save_bytes(s, state::part::shared);
    mine = ckpt::save_bytes(s, state::part::local);
  }
  const auto shared0 = from_rank0(c, shared);
  std::string failure;
  if (shared0 != shared) failure = "the shared part differs from rank 0's";
  auto s = make(c);
  std::string refused;
  try {
    if (split)
      ckpt::load_bytes(s, shared0, mine);
    else
      ckpt::load_bytes(s, all);
  } catch (const std::exception& e) {
    refused = ckpt::say("the checkpoint was refused: ", e.what());
  }
  // Every rank goes on to the next collective only if every rank loaded.
  std::int32_t bad = refused.empty() ? 0 : 1;
  c.all_reduce_sum(std::span<std::int32_t>(&bad, 1));
  if (bad != 0) return refused.empty() ? std::string("another rank refused its checkpoint") : refused;
  s.start(x);
  for (int t = at; t < total; ++t) {
    step(s, c, x, t);
    if (failure.empty() && !ckpt::same_bits(x, ref[static_cast<std::size_t>(t)]))
      failure = ckpt::say("rank ", c.rank(), ": the model after step ", t, " differs (saved at ", at, ")");
  }
  return failure;
}

// A save point drawn from a seed every rank shares.
template <class Make>
void round_trips(mpi& c, Make make, unsigned seed) {
  std::mt19937 rng(seed);
  for (int k = 0; k < 3; ++k) {
    const int total = 14, at = k == 0 ? 0 : static_cast<int>(rng() % total);
    CAPTURE(at);
    const auto f = round_trip(c, make, total, at, k == 2);
    CHECK_MESSAGE(f.empty(), f);
  }
}

policy::top_k_settings top_k_options() {
  policy::top_k_settings o;
  o.top_k.density = 0.3;
  o.top_k.momentum = 0.5;
  return o;
}

} // namespace

TEST_CASE("every strategy resumes bit for bit over MPI") {
  auto c = mpi::world();
  round_trips(
      c, [](mpi& w) { return sync::synchronous<mpi>(w, {.lr = 0.2f}); }, 1);
  round_trips(
      c,
      [](mpi& w) {
        return sync::local_sgd<mpi>(w, {.lr = 0.2f,
                                        .period = 3,
                                        .warmup_steps = 2,
                                        .adaptive = true,
                                        .max_period = 6,
                                        .correction = sync::correction_mode::every_step,
                                        .alpha = 0.25f});
      },
      2);
  round_trips(
      c,
      [](mpi& w) {
        return sync::partitioned<mpi>(w, {4, 6}, {.lr = 0.2f, .partition_elements = 3, .credit_bytes = 12});
      },
      3);
}

TEST_CASE("data_parallel resumes bit for bit over MPI: uncoded, cssgd, top_k, local_sgd") {
  auto c = mpi::world();
  round_trips(
      c,
      [](mpi& w) {
        return data_parallel<policy::uncoded<>, policy::dense, policy::synchronous, mpi>(w, problem.dim(),
                                                                                         {.lr = 0.2f});
      },
      4);
  round_trips(
      c,
      [](mpi& w) {
        return data_parallel<policy::cssgd<coding::xor_bits>, policy::dense, policy::synchronous, mpi>(
            w, problem.dim(), {.lr = 0.2f, .coding = {.redundancy = 2}});
      },
      5);
  round_trips(
      c,
      [](mpi& w) {
        return data_parallel<policy::uncoded<>, policy::top_k<select::laplace_bisect>, policy::synchronous,
                             mpi>(w, problem.dim(), {.lr = 0.2f, .compression = top_k_options()});
      },
      6);
  round_trips(
      c,
      [](mpi& w) {
        return data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd, mpi>(
            w, problem.dim(), {.lr = 0.2f, .sync = {.period = 3}});
      },
      7);
}

TEST_CASE("async_ps resumes over MPI to the state its log replays, nothing lost or doubled") {
  auto c = mpi::world();
  constexpr std::size_t dim = 9;
  constexpr int k1 = 5, k2 = 7;
  const sync::async_ps_options o{.lr = 0.1f, .staleness_bound = 2};
  std::vector<float> x(dim, 0.25f);
  sync::async_ps<mpi> first(c, o);
  auto session = [&](sync::async_ps<mpi>& s, int from, int to) {
    s.start(x);
    if (s.computes_gradients())
      for (int t = from; t < to; ++t)
        s.step(x, ckpt::fixed_gradient(dim, c.rank(), t));
    s.finish(x);
  };
  session(first, 0, k1);
  const auto all = ckpt::save_bytes(first);
  const auto saved_model = x;
  const std::size_t saved_log = first.log().size();
  sync::async_ps<mpi> second(c, o);
  std::string failure;
  try {
    ckpt::load_bytes(second, all);
  } catch (const std::exception& e) {
    failure = ckpt::say("the checkpoint was refused: ", e.what());
  }
  std::int32_t bad = failure.empty() ? 0 : 1;
  c.all_reduce_sum(std::span<std::int32_t>(&bad, 1));
  CHECK_MESSAGE(failure.empty(), failure);
  if (bad != 0) return;
  session(second, k1, k1 + k2);
  // Every rank ends with the server's model; the server's log replays onto the checkpoint's model.
  auto server_model = x;
  c.broadcast(std::span<float>(server_model), o.server);
  CHECK(ckpt::same_bits(x, server_model));
  if (second.is_server()) {
    const auto& log = second.log();
    std::map<std::pair<int, std::int64_t>, int> seen;
    for (const auto& u : log)
      ++seen[{u.worker, u.step}];
    CHECK(seen.size() == static_cast<std::size_t>((c.size() - 1) * (k1 + k2)));
    for (const auto& [key, count] : seen)
      CHECK(count == 1);
    auto model = saved_model;
    for (std::size_t e = saved_log; e < log.size(); ++e) {
      const auto g = ckpt::fixed_gradient(dim, log[e].worker, log[e].step);
      for (std::size_t i = 0; i < dim; ++i)
        model[i] = model[i] - log[e].factor * g[i];
    }
    CHECK(ckpt::same_bits(model, x));
  }
}

TEST_CASE("damaged data_parallel streams are refused over MPI with the state untouched") {
  auto c = mpi::world();
  using dp =
      data_parallel<policy::uncoded<>, policy::top_k<select::laplace_bisect>, policy::synchronous, mpi>;
  dp trained(c, problem.dim(), {.lr = 0.2f, .compression = top_k_options()});
  auto x = initial_model(c.rank());
  trained.start(x);
  for (int t = 0; t < 4; ++t)
    step(trained, c, x, t);
  const auto good = ckpt::save_bytes(trained);
  dp fresh(c, problem.dim(), {.lr = 0.2f, .compression = top_k_options()});
  auto f = ckpt::check_damage(fresh, good);
  if (f.empty()) f = ckpt::check_repaired_edits(fresh, good, 31u + static_cast<unsigned>(c.rank()), 200);
  CHECK_MESSAGE(f.empty(), f);
}
