// The sparse all-reduce under comm::mpi (2, 3 and 4 ranks): through the reducer with top_k, the
// error-feedback invariant holds bit for bit on every rank and step (p = fl(g + e_old) either went into the
// sum and the residual holds +0, or the residual holds p), out is the rank-ordered sum of the applied values
// with the same bits on every rank, metered bytes and messages equal cost/sparse_allreduce.hpp, empty
// contributions take part, the dense fallback matches its model, and bad input on one rank raises on every
// rank, leaving the communicator usable.
#include "mpi/support.hpp"

#include "support/gradients.hpp"

#include <commsgd/coding/uncoded.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/mpi.hpp>
#include <commsgd/cost/sparse_allreduce.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/sparsify/allreduce.hpp>
#include <commsgd/sparsify/allreduce_reducer.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <bit>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace sp = commsgd::sparsify;
namespace sel = commsgd::select;
namespace cm = commsgd::comm;
namespace cost = commsgd::cost;

using test_data::gradient;
using test_data::same_bits;

namespace {

std::uint32_t bits(float x) {
  return std::bit_cast<std::uint32_t>(x);
}

bool metered_equals_model(const cm::metered<cm::mpi>& c, const sp::allreduce_report& rep, std::uint64_t d) {
  const auto m = c.counters().total();
  const auto l = cost::sparse_allreduce_load(rep.shape(), c.size(), c.rank(), d);
  return m.bytes_sent == l.bytes_sent && m.bytes_received == l.bytes_received &&
         m.messages_sent == l.messages_sent && m.messages_received == l.messages_received;
}

// Every rank's copy of v, rank-major, over the unmetered side communicator.
std::vector<float> gather_all(cm::mpi& side, const std::vector<float>& v) {
  std::vector<float> all(v.size() * static_cast<std::size_t>(side.size()));
  side.all_gather(std::span<const float>(v), std::span<float>(all));
  return all;
}

} // namespace

TEST_CASE("sparse all-reduce over MPI: the error-feedback invariant, sums, same bits, bytes") {
  auto side = cm::mpi::world();
  cm::metered<cm::mpi> c(cm::mpi::world());
  const int n = c.size();
  const auto un = static_cast<std::size_t>(n);
  using scheme = commsgd::coding::uncoded<cm::metered<cm::mpi>>;
  for (std::size_t d : {1u, 999u, 20000u})
    for (double density : {0.001, 0.02, 0.3}) {
      CAPTURE(d);
      CAPTURE(density);
      sp::allreduce_options o;
      o.refresh_steps = 3;
      o.path = cost::sparse_path::sparse;
      sp::allreduce_reducer<sp::top_k<sel::exact>, scheme, cm::metered<cm::mpi>> red(
          c, scheme(c), sp::top_k<sel::exact>(d, {.density = density}), o);
      std::vector<float> out(d), p(d);
      for (int t = 0; t < 5; ++t) {
        CAPTURE(t);
        const auto g =
            gradient(d, 1000 * static_cast<std::uint64_t>(c.rank()) + static_cast<std::uint64_t>(t));
        for (std::size_t i = 0; i < d; ++i)
          p[i] = g[i] + red.compression().residual()[i];
        const std::span<const float> blocks[1] = {g};
        c.reset();
        const auto& rep = red.reduce(blocks, out);
        CHECK(metered_equals_model(c, rep, d));
        const std::vector<float> e(red.compression().residual().begin(), red.compression().residual().end());
        const auto ps = gather_all(side, p), es = gather_all(side, e), outs = gather_all(side, out);
        std::vector<float> want(d, 0.0f);
        std::size_t broken = 0;
        for (std::size_t r = 0; r < un; ++r)
          for (std::size_t i = 0; i < d; ++i) {
            const float pi = ps[r * d + i], ei = es[r * d + i];
            const bool applied = bits(ei) == 0 && bits(pi) != 0;
            if (applied)
              want[i] += pi;
            else if (bits(ei) != bits(pi))
              ++broken;
          }
        CHECK(broken == 0);
        CHECK(same_bits(out, want));
        for (std::size_t r = 0; r < un; ++r)
          CHECK(same_bits(std::span<const float>(outs).subspan(r * d, d), out));
      }
    }
}

TEST_CASE("empty contributions, K = 0 and the dense fallback over MPI") {
  cm::metered<cm::mpi> c(cm::mpi::world());
  const std::size_t d = 5000;
  for (int pattern = 0; pattern < 3; ++pattern)
    for (auto path : {cost::sparse_path::sparse, cost::sparse_path::dense})
      for (std::uint64_t k : {0u, 50u}) {
        CAPTURE(pattern);
        CAPTURE(k);
        const bool empty =
            pattern == 0 || (pattern == 1 && c.rank() % 2 == 0) || (pattern == 2 && c.rank() != c.size() - 1);
        sp::top_k<sel::exact> s(d, empty ? sp::top_k_options{.k = 0} : sp::top_k_options{.density = 0.01});
        const auto msg = s.step(gradient(d, static_cast<std::uint64_t>(c.rank())));
        sp::allreducer<> ex({.path = path});
        std::vector<float> out(d, 3.0f);
        c.reset();
        const auto& rep = ex.sum(c, msg, k, out);
        CHECK(rep.dense == (path == cost::sparse_path::dense));
        CHECK(metered_equals_model(c, rep, d));
        if (pattern == 0) CHECK(std::ranges::all_of(out, [](float x) { return bits(x) == 0; }));
        if (k == 0 && !rep.dense) CHECK(ex.returned_indices().size() == msg.size());
      }
}

TEST_CASE("bad input on one rank raises on every rank over MPI") {
  cm::mpi c = cm::mpi::world();
  const std::size_t d = 100;
  const int last = c.size() - 1;
  sp::allreducer<> ex;
  {
    const std::vector<std::uint32_t> idx{static_cast<std::uint32_t>(c.rank() == last ? d : 1)};
    const std::vector<float> val{1.0f};
    std::vector<float> out(d);
    CHECK_THROWS_WITH_AS(ex.sum(c, sp::sparse_view<>{d, idx, val}, 4, out), doctest::Contains("'indices'"),
                         commsgd::invalid_argument);
  }
  {
    std::vector<float> out(d);
    CHECK_THROWS_WITH_AS(ex.sum(c, sp::sparse_view<>{d, {}, {}}, c.rank() == last ? 5 : 4, out),
                         doctest::Contains("'k_global'"), commsgd::size_mismatch);
  }
  {
    const std::vector<std::uint32_t> idx{2};
    const std::vector<float> val{c.rank() == last ? std::numeric_limits<float>::infinity() : 1.0f};
    std::vector<float> out(d);
    CHECK_THROWS_AS(ex.sum(c, sp::sparse_view<>{d, idx, val}, 4, out), commsgd::non_finite);
  }
  // Still usable: nobody was left inside a collective.
  std::vector<float> ok(d, 1.0f);
  const std::vector<std::uint32_t> idx{static_cast<std::uint32_t>(c.rank())};
  const std::vector<float> val{1.0f};
  ex.sum(c, sp::sparse_view<>{d, idx, val}, 100, ok);
  for (int r = 0; r < c.size(); ++r)
    CHECK(ok[static_cast<std::size_t>(r)] == 1.0f);
}

TEST_CASE("a gradient the sparsifier refuses on one rank raises on every rank over MPI") {
  cm::mpi c = cm::mpi::world();
  using scheme = commsgd::coding::uncoded<cm::mpi>;
  const std::size_t d = 500;
  sp::allreduce_reducer<sp::top_k<sel::exact>, scheme, cm::mpi> red(
      c, scheme(c), sp::top_k<sel::exact>(d, {.density = 0.02}));
  std::vector<float> out(d);
  auto g = gradient(d, 3 + static_cast<std::uint64_t>(c.rank()));
  if (c.rank() == c.size() - 1) g[7] = std::numeric_limits<float>::quiet_NaN();
  const std::span<const float> blocks[1] = {g};
  if (c.rank() == c.size() - 1)
    CHECK_THROWS_AS(red.reduce(blocks, out), commsgd::non_finite);
  else
    CHECK_THROWS_AS(red.reduce(blocks, out), commsgd::comm_aborted);
  // The exchange is where it was on every rank, so the next step runs normally.
  g[7] = 0.0f;
  red.reduce(blocks, out);
  // A rank that went through the failed step kept its whole message in the residual: nothing lost.
  CHECK(red.compression().steps() == (c.rank() == c.size() - 1 ? 1u : 2u));
  CHECK(red.exchange().history() == 1);
}
