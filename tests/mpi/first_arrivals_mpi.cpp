// sync::first_arrivals over comm::mpi with real processes and real sleeps: the decoded sum on every rank
// against the code's decode of every block, every r, random arrivals; late vectors drained; a stopped rank
// beyond s raises on every rank in bounded time; checkpoints resume bit for bit.
#include "mpi/support.hpp"

#include <commsgd/coding/coding.hpp>
#include <commsgd/comm/mpi.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/sync/first_arrivals.hpp>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

using namespace commsgd;
using coding::node_set;
using comm::mpi;

namespace {

float block_value(std::uint64_t t, std::size_t q, std::size_t e) {
  std::uint64_t h =
      (t + 1) * 0xD1B54A32D192ED03ull ^ (q + 3) * 0x9E3779B97F4A7C15ull ^ (e + 11) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return (static_cast<float>(h >> 40) / static_cast<float>(1ull << 24) - 0.5f) * 6.0f;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t e = 0; e < a.size(); ++e)
    if (std::bit_cast<std::uint32_t>(a[e]) != std::bit_cast<std::uint32_t>(b[e])) return false;
  return true;
}

// Runs rounds of Kind with redundancy r; returns how many rounds matched the reference decode.
template <class Kind>
int rounds_matching(mpi& c, int r, std::size_t d, int rounds, const sync::first_arrivals_options& o,
                    std::uint64_t* drained = nullptr, std::uint64_t* used_from_others = nullptr) {
  coding::block_reducer<coding::gradient_code_scheme<Kind, mpi>> red(
      coding::gradient_code_scheme<Kind, mpi>(c, r));
  auto& code = red.scheme().code();
  sync::first_arrivals<mpi> s(c, d, o);
  std::vector<float> x(d, 0.0f);
  s.start(x);
  int ok = 0;
  for (int t = 0; t < rounds; ++t) {
    std::vector<std::vector<float>> blocks(code.block_count(), std::vector<float>(d));
    for (std::size_t q = 0; q < code.block_count(); ++q)
      for (std::size_t e = 0; e < d; ++e)
        blocks[q][e] = block_value(static_cast<std::uint64_t>(t), q, e);
    std::vector<std::span<const float>> mine;
    for (std::size_t q : code.blocks_of(c.rank()))
      mine.emplace_back(blocks[q]);
    s.step(x, coding::block_gradients(mine), red);
    const node_set f = s.report().responders;
    if (used_from_others)
      *used_from_others += static_cast<std::uint64_t>(coding::set_size(f) - (coding::contains(f, 0) ? 1 : 0));
    std::vector<std::vector<float>> vecs;
    for (int k : coding::members(f)) {
      std::vector<std::span<const float>> theirs;
      for (std::size_t q : code.blocks_of(k))
        theirs.emplace_back(blocks[q]);
      vecs.emplace_back(d);
      code.encode(k, coding::block_gradients(theirs), vecs.back());
    }
    std::vector<std::span<const float>> coded(vecs.begin(), vecs.end());
    std::vector<float> want(d);
    code.decode(f, std::span<const std::span<const float>>(coded), want);
    if (coding::set_size(f) == code.needed() && same_bits(s.last_sum(), want)) ++ok;
  }
  s.finish(x);
  if (drained) *drained = s.drained();
  return ok;
}

} // namespace

TEST_CASE("first_arrivals over MPI: exact sums on every rank for every r, random arrivals, late drained") {
  auto c = mpi::world();
  const int n = c.size();
  for (int r = 1; r <= n; ++r) {
    CAPTURE(r);
    sync::first_arrivals_options o;
    o.lr = 0.1f;
    o.timeout_s = 20;
    o.unit_s = 5e-4;
    o.delays = {
        .kind = sync::delay_kind::shifted_exponential, .mean = 1.0, .seed = static_cast<std::uint64_t>(r)};
    CHECK(rounds_matching<coding::cyclic>(c, r, 300, 4, o) == 4);
    if (n % r == 0) CHECK(rounds_matching<coding::fractional_repetition>(c, r, 300, 4, o) == 4);
    // Without delays every rank sends one vector a round. Which ones the root decodes with depends on who
    // arrives first, but none is lost: each other rank's vector is either decoded or drained as late.
    sync::first_arrivals_options plain;
    plain.lr = 0.1f;
    std::uint64_t drained = 0, used = 0;
    constexpr int rounds = 4;
    CHECK(rounds_matching<coding::cyclic>(c, r, 300, rounds, plain, &drained, &used) == rounds);
    if (c.rank() == 0) {
      CHECK(used + drained == static_cast<std::uint64_t>(n - 1) * rounds);
      if (r == 1) CHECK(drained == 0); // s = 0: every vector is needed
    }
  }
}

TEST_CASE("first_arrivals over MPI: a stopped rank beyond s raises on every rank within the timeout") {
  auto c = mpi::world();
  sync::first_arrivals_options o;
  o.lr = 0.1f;
  o.timeout_s = 0.5;
  o.delays = {.kind = sync::delay_kind::stop, .node = c.size() - 1, .from_step = 1};
  coding::block_reducer<coding::gradient_code_scheme<coding::cyclic, mpi>> red(
      coding::gradient_code_scheme<coding::cyclic, mpi>(c, 1));
  sync::first_arrivals<mpi> s(c, 8, o);
  std::vector<float> x(8, 0.0f), g(8, 1.0f);
  const std::span<const float> mine[1] = {g};
  s.start(x);
  const auto t0 = std::chrono::steady_clock::now();
  s.step(x, coding::block_gradients(mine), red);
  bool raised = false;
  try {
    s.step(x, coding::block_gradients(mine), red);
  } catch (const coding::stragglers_exceeded& e) {
    raised = e.round() == 1 && e.answered() == c.size() - 1;
  }
  CHECK(raised);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  s.finish(x);
}

TEST_CASE("first_arrivals over MPI through data_parallel: a checkpoint resumes bit for bit") {
  auto c = mpi::world();
  const int n = c.size();
  using dp_t = data_parallel<policy::gradient_code<coding::fractional_repetition>, policy::dense,
                             policy::first_arrivals, mpi>;
  dp_t::options o{.lr = 0.05f, .coding = {.redundancy = n % 2 == 0 ? 2 : n}};
  o.sync.delays = {.kind = sync::delay_kind::shifted_exponential, .mean = 1.0, .seed = 3};
  o.sync.unit_s = 2e-4;
  auto train = [&](int steps, std::vector<float> x, const std::string* from, std::string* to) {
    dp_t dp(c, x.size(), o);
    if (from) {
      std::istringstream is(*from, std::ios::binary);
      dp.load(is);
    }
    dp.start(x);
    for (int i = 0; i < steps; ++i) {
      std::vector<std::vector<float>> g;
      for (std::size_t q : dp.my_blocks()) {
        g.emplace_back(x.size());
        for (std::size_t e = 0; e < x.size(); ++e)
          g.back()[e] = block_value(dp.steps(), q, e) + 0.01f * x[e];
      }
      std::vector<std::span<const float>> v(g.begin(), g.end());
      dp.step(x, coding::block_gradients(v));
    }
    dp.finish(x);
    if (to) {
      std::ostringstream os(std::ios::binary);
      dp.save(os);
      *to = std::move(os).str();
    }
    return x;
  };
  const std::vector<float> x0(13, 0.25f);
  const auto whole = train(6, x0, nullptr, nullptr);
  std::string saved;
  const auto half = train(3, x0, nullptr, &saved);
  const auto resumed = train(3, half, &saved, nullptr);
  CHECK(same_bits(whole, resumed));
}
