// The sparse exchange under comm::mpi (2, 3 and 4 ranks): sums equal a reference built from every rank's
// message, bytes equal cost/sparse.hpp, empty selections take part, the dense fallback agrees, and bad
// input on one rank raises an error on every rank instead of a hang.
#include "mpi/support.hpp"

#include "support/gradients.hpp"

#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/mpi.hpp>
#include <commsgd/cost/sparse.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sparsify/sparse_exchange.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

namespace sp = commsgd::sparsify;
namespace sel = commsgd::select;
namespace cm = commsgd::comm;
namespace cost = commsgd::cost;

using test_data::gradient;
using test_data::same_bits;

namespace {

// Every rank's pairs, gathered over a separate communicator so the meter sees only the exchange, and summed
// in rank order: the reference the sparse path must match bit for bit.
struct reference {
  std::vector<float> sum, abs_sum;
};
reference reference_sum(cm::mpi& side, sp::sparse_view<> mine) {
  std::vector<sp::entry<std::uint32_t>> packed;
  for (std::size_t j = 0; j < mine.size(); ++j)
    packed.push_back({mine.indices[j], mine.values[j]});
  std::vector<sp::entry<std::uint32_t>> all;
  side.all_gather_v(std::span<const sp::entry<std::uint32_t>>(packed), all);
  reference r{std::vector<float>(mine.length, 0.0f), std::vector<float>(mine.length, 0.0f)};
  for (const auto& e : all) {
    r.sum[e.index] += e.value;
    r.abs_sum[e.index] += std::fabs(e.value);
  }
  return r;
}

// As a model states it: models do not count calls.
cm::traffic measured(const cm::metered<cm::mpi>& c) {
  auto t = c.counters().total();
  t.calls = 0;
  return t;
}

} // namespace

TEST_CASE("top_k over MPI: conservation, sums, bytes, and the switch") {
  auto side = cm::mpi::world();
  cm::metered<cm::mpi> c(cm::mpi::world());
  const int n = c.size();
  const std::size_t d = 40000;
  for (double density : {1e-3, 1e-2, 0.3}) {
    CAPTURE(density);
    sp::top_k<sel::laplace_bisect> s(d, {.density = density, .momentum = density > 0.1 ? 0.9 : 0.0});
    sp::exchanger<> ex;
    std::vector<float> out(d);
    for (int t = 0; t < 4; ++t) {
      const auto g = gradient(d, 1000 * static_cast<std::uint64_t>(c.rank()) + static_cast<std::uint64_t>(t));
      const std::vector<float> e_old(s.residual().begin(), s.residual().end());
      const auto msg = s.step(g);
      if (!s.has_momentum()) {
        // sent + new residual == old residual + gradient, bit for bit.
        std::vector<float> back(s.residual().begin(), s.residual().end());
        for (std::size_t j = 0; j < msg.size(); ++j)
          back[msg.indices[j]] += msg.values[j];
        std::vector<float> expect(d);
        for (std::size_t i = 0; i < d; ++i)
          expect[i] = g[i] + e_old[i];
        CHECK(std::ranges::equal(back, expect));
      }
      const auto ref = reference_sum(side, msg);
      c.reset();
      const auto rep = ex.sum(c, msg, out);
      CHECK(measured(c) == cost::sparse_exchange_traffic(rep.counts, d, c.rank()));
      CHECK(rep.dense == cost::sparse_prefers_dense(rep.counts, d));
      if (rep.dense) {
        std::size_t off = 0;
        for (std::size_t i = 0; i < d; ++i)
          off += std::fabs(out[i] - ref.sum[i]) > 1e-6f * ref.abs_sum[i];
        CHECK(off == 0);
      } else {
        CHECK(same_bits(out, ref.sum));
      }
    }
  }
  (void)n;
}

TEST_CASE("forced sparse and dense paths agree and match the model") {
  auto side = cm::mpi::world();
  cm::metered<cm::mpi> c(cm::mpi::world());
  const std::size_t d = 30000;
  sp::top_k<sel::exact> s(d, {.density = 0.05});
  const auto msg = s.step(gradient(d, 5 + static_cast<std::uint64_t>(c.rank())));
  const auto ref = reference_sum(side, msg);
  std::vector<float> a(d), b(d);
  c.reset();
  const auto ra = sp::all_sum(c, msg, a, {.path = cost::sparse_path::sparse});
  CHECK(measured(c) == cost::sparse_exchange_traffic(ra.counts, d, c.rank(), 8, cost::sparse_path::sparse));
  c.reset();
  const auto rb = sp::all_sum(c, msg, b, {.path = cost::sparse_path::dense});
  CHECK(measured(c) == cost::sparse_exchange_traffic(rb.counts, d, c.rank(), 8, cost::sparse_path::dense));
  CHECK(same_bits(a, ref.sum));
  std::size_t off = 0;
  for (std::size_t i = 0; i < d; ++i)
    off += std::fabs(a[i] - b[i]) > 1e-6f * ref.abs_sum[i];
  CHECK(off == 0);
  if (c.size() == 2) CHECK(std::ranges::equal(a, b)); // two addends: every order gives the same sum
}

TEST_CASE("empty selections on some or all ranks do not hang") {
  auto side = cm::mpi::world();
  cm::metered<cm::mpi> c(cm::mpi::world());
  const std::size_t d = 5000;
  for (int pattern = 0; pattern < 3; ++pattern) {
    CAPTURE(pattern);
    const bool empty =
        pattern == 0 || (pattern == 1 && c.rank() % 2 == 0) || (pattern == 2 && c.rank() != c.size() - 1);
    sp::top_k<sel::exact> s(d, empty ? sp::top_k_options{.k = 0} : sp::top_k_options{.density = 0.01});
    const auto msg = s.step(gradient(d, static_cast<std::uint64_t>(c.rank())));
    const auto ref = reference_sum(side, msg);
    std::vector<float> out(d, 3.0f);
    c.reset();
    const auto rep = sp::all_sum(c, msg, out);
    CHECK(same_bits(out, ref.sum));
    CHECK(measured(c) == cost::sparse_exchange_traffic(rep.counts, d, c.rank()));
  }
}

TEST_CASE("bad input on one rank raises on every rank") {
  cm::mpi c = cm::mpi::world();
  const std::size_t d = 100;
  const int last = c.size() - 1;
  {
    sp::sparse_vector v(d);
    v.push_back(3, 1.0f);
    std::vector<float> out(c.rank() == last ? d - 1 : d);
    CHECK_THROWS_WITH_AS(sp::all_sum(c, v.view(), out), doctest::Contains("'out'"), commsgd::size_mismatch);
  }
  {
    const std::size_t len = c.rank() == last ? d + 1 : d;
    sp::sparse_vector v(len);
    std::vector<float> out(len);
    CHECK_THROWS_WITH_AS(sp::all_sum(c, v.view(), out), doctest::Contains("'length'"),
                         commsgd::size_mismatch);
  }
  {
    const std::vector<std::uint32_t> idx{1, 2};
    const std::vector<float> vals{1.0f, std::numeric_limits<float>::quiet_NaN()};
    sp::sparse_view<> v{d, {}, {}};
    if (c.rank() == last) v = {d, idx, vals};
    std::vector<float> out(d);
    CHECK_THROWS_AS(sp::all_sum(c, v, out), commsgd::non_finite);
  }
  // The communicator is still usable afterwards: nobody was left inside a collective.
  std::vector<float> ok(d, 1.0f);
  sp::sparse_vector v(d);
  sp::all_sum(c, v.view(), ok);
  CHECK(std::ranges::all_of(ok, [](float x) { return x == 0.0f; }));
}
