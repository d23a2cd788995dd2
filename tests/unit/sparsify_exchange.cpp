// The sparse exchange on comm::local with 1 to 4 ranks: sums equal a dense reference built from what each
// rank sent, the dense fallback gives the same sums, metered bytes equal cost/sparse.hpp to the byte, empty
// selections do not hang, and bad input raises the same error on every rank.
#include "support/gradients.hpp"

#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/cost/sparse.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sparsify/none.hpp>
#include <commsgd/sparsify/sparse_exchange.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <random>
#include <vector>

namespace sp = commsgd::sparsify;
namespace sel = commsgd::select;
namespace cm = commsgd::comm;
namespace cost = commsgd::cost;

using test_data::gradient;
using test_data::same_bits;

namespace {

// What each rank sent, collected across the threads, so the reference sum is built independently of the
// exchange.
struct sent_log {
  explicit sent_log(int n) : msgs(static_cast<std::size_t>(n)) {}
  std::vector<sp::sparse_vector> msgs;
  void put(int r, sp::sparse_view<> v) {
    sp::sparse_vector s(v.length);
    for (std::size_t j = 0; j < v.size(); ++j)
      s.push_back(v.indices[j], v.values[j]);
    msgs[static_cast<std::size_t>(r)] = std::move(s);
  }
  std::vector<float> reference(std::size_t d) const {
    std::vector<float> ref(d, 0.0f);
    for (const auto& m : msgs)
      m.add_to(ref);
    return ref;
  }
};

// As a model states it: models do not count calls.
cm::traffic measured(const cm::metered<cm::local>& c) {
  auto t = c.counters().total();
  t.calls = 0;
  return t;
}

} // namespace

TEST_CASE("sums equal the reference from what each rank sent, and bytes equal the cost model") {
  const std::size_t d = 50000;
  for (int n = 1; n <= 4; ++n) {
    for (double density : {1e-3, 1e-2, 0.2, 0.6}) {
      CAPTURE(n);
      CAPTURE(density);
      const int steps = 4;
      std::vector<sent_log> logs(steps, sent_log(n));
      std::vector<std::vector<std::vector<float>>> sums(
          steps, std::vector<std::vector<float>>(static_cast<std::size_t>(n)));
      std::vector<std::vector<commsgd::comm::exchange_report>> reps(
          steps, std::vector<commsgd::comm::exchange_report>(static_cast<std::size_t>(n)));
      std::vector<std::vector<cm::traffic>> bytes(steps,
                                                  std::vector<cm::traffic>(static_cast<std::size_t>(n)));
      cm::local_group{n}.run([&](cm::local& raw) {
        cm::metered<cm::local> c(raw);
        const auto r = static_cast<std::size_t>(c.rank());
        sp::top_k<sel::laplace_bisect> s(d, {.density = density});
        sp::exchanger<> ex;
        std::vector<float> out(d);
        for (int t = 0; t < steps; ++t) {
          const auto g = gradient(d, 1000 * r + static_cast<std::uint64_t>(t));
          const auto msg = s.step(g);
          logs[static_cast<std::size_t>(t)].put(c.rank(), msg);
          c.reset();
          reps[static_cast<std::size_t>(t)][r] = ex.sum(c, msg, out);
          bytes[static_cast<std::size_t>(t)][r] = measured(c);
          sums[static_cast<std::size_t>(t)][r] = out;
        }
      });
      for (int t = 0; t < steps; ++t) {
        const auto ts = static_cast<std::size_t>(t);
        const auto ref = logs[ts].reference(d);
        for (int r = 0; r < n; ++r) {
          const auto rs = static_cast<std::size_t>(r);
          const auto& rep = reps[ts][rs];
          CHECK(rep.dense == reps[ts][0].dense);
          CHECK(rep.counts == reps[ts][0].counts);
          CHECK(rep.dense == cost::sparse_prefers_dense(rep.counts, d));
          if (rep.dense)
            CHECK(std::ranges::equal(sums[ts][rs], ref));
          else
            CHECK(same_bits(sums[ts][rs], ref));
          CHECK(same_bits(sums[ts][rs], sums[ts][0]));
          CHECK(bytes[ts][rs] == cost::sparse_exchange_traffic(rep.counts, d, r));
        }
      }
      // At 60 % density the union of four ranks is nearly the whole vector: the ring must win.
      if (n == 4 && density == 0.6) CHECK(reps[0][0].dense);
      if (density <= 1e-2) CHECK(!reps[0][0].dense);
    }
  }
}

TEST_CASE("the dense fallback gives the same sum as the sparse path") {
  const std::size_t d = 20000;
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    std::vector<std::vector<float>> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
    std::vector<cm::traffic> ba(static_cast<std::size_t>(n)), bb(static_cast<std::size_t>(n));
    std::vector<commsgd::comm::exchange_report> ra(static_cast<std::size_t>(n)),
        rb(static_cast<std::size_t>(n));
    cm::local_group{n}.run([&](cm::local& raw) {
      cm::metered<cm::local> c(raw);
      const auto r = static_cast<std::size_t>(c.rank());
      sp::top_k<sel::exact> s(d, {.density = 0.05});
      const auto msg = s.step(gradient(d, 77 + r));
      std::vector<float> out(d);
      c.reset();
      ra[r] = sp::all_sum(c, msg, out, {.path = cost::sparse_path::sparse});
      ba[r] = measured(c);
      a[r] = out;
      c.reset();
      rb[r] = sp::all_sum(c, msg, out, {.path = cost::sparse_path::dense});
      bb[r] = measured(c);
      b[r] = out;
    });
    for (int r = 0; r < n; ++r) {
      const auto rs = static_cast<std::size_t>(r);
      CHECK(!ra[rs].dense);
      CHECK(rb[rs].dense);
      CHECK(std::ranges::equal(a[rs], b[rs]));
      CHECK(ba[rs] == cost::sparse_exchange_traffic(ra[rs].counts, d, r, 8, cost::sparse_path::sparse));
      CHECK(bb[rs] == cost::sparse_exchange_traffic(rb[rs].counts, d, r, 8, cost::sparse_path::dense));
    }
  }
}

TEST_CASE("empty selections on some or all ranks take part without hanging") {
  const std::size_t d = 1000;
  for (int n = 1; n <= 4; ++n) {
    for (int pattern = 0; pattern < 3; ++pattern) {
      CAPTURE(n);
      CAPTURE(pattern);
      std::vector<std::vector<float>> sums(static_cast<std::size_t>(n));
      std::vector<cm::traffic> bytes(static_cast<std::size_t>(n));
      std::vector<commsgd::comm::exchange_report> reps(static_cast<std::size_t>(n));
      sent_log log(n);
      cm::local_group{n}.run([&](cm::local& raw) {
        cm::metered<cm::local> c(raw);
        // pattern 0: every rank empty; 1: even ranks empty; 2: only the last rank sends.
        const bool empty =
            pattern == 0 || (pattern == 1 && c.rank() % 2 == 0) || (pattern == 2 && c.rank() != n - 1);
        sp::top_k<sel::exact> s(d, empty ? sp::top_k_options{.k = 0} : sp::top_k_options{.density = 0.01});
        const auto msg = s.step(gradient(d, static_cast<std::uint64_t>(c.rank())));
        log.put(c.rank(), msg);
        std::vector<float> out(d, 5.0f);
        c.reset();
        reps[static_cast<std::size_t>(c.rank())] = sp::all_sum(c, msg, out);
        bytes[static_cast<std::size_t>(c.rank())] = measured(c);
        sums[static_cast<std::size_t>(c.rank())] = out;
      });
      const auto ref = log.reference(d);
      for (int r = 0; r < n; ++r) {
        const auto rs = static_cast<std::size_t>(r);
        CHECK(same_bits(sums[rs], ref));
        CHECK(bytes[rs] == cost::sparse_exchange_traffic(reps[rs].counts, d, r));
      }
    }
  }
}

TEST_CASE("a NaN never travels, and bad input raises the same error on every rank") {
  const std::size_t d = 100;
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    // One rank's output buffer is too short.
    CHECK_THROWS_WITH_AS(cm::local_group{n}.run([&](cm::local& c) {
      sp::sparse_vector v(d);
      v.push_back(3, 1.0f);
      std::vector<float> out(c.rank() == n - 1 ? d - 1 : d);
      sp::all_sum(c, v.view(), out);
    }),
                         doctest::Contains("'out'"), commsgd::size_mismatch);
    // Ranks disagree on the length.
    if (n > 1)
      CHECK_THROWS_WITH_AS(cm::local_group{n}.run([&](cm::local& c) {
        const std::size_t len = c.rank() == 1 ? d + 1 : d;
        sp::sparse_vector v(len);
        std::vector<float> out(len);
        sp::all_sum(c, v.view(), out);
      }),
                           doctest::Contains("'length'"), commsgd::size_mismatch);
    // A hand-made view with an index out of range or out of order.
    const std::vector<std::uint32_t> bad_idx{5, 3};
    const std::vector<float> vals{1.0f, 2.0f};
    CHECK_THROWS_WITH_AS(cm::local_group{n}.run([&](cm::local& c) {
      std::vector<float> out(d);
      sp::sparse_view<> v{
          d, c.rank() == 0 ? std::span<const std::uint32_t>(bad_idx) : std::span<const std::uint32_t>(),
          c.rank() == 0 ? std::span<const float>(vals) : std::span<const float>()};
      sp::all_sum(c, v, out);
    }),
                         doctest::Contains("'indices'"), commsgd::invalid_argument);
    // A NaN in a message is refused before it is sent.
    const std::vector<std::uint32_t> idx{1, 2, 3};
    const std::vector<float> nan_vals{1.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f};
    try {
      cm::local_group{n}.run([&](cm::local& c) {
        std::vector<float> out(d);
        sp::sparse_view<> v{d, idx,
                            c.rank() == n - 1 ? std::span<const float>(nan_vals)
                                              : std::span<const float>(vals.data(), 0)};
        if (c.rank() != n - 1) v.indices = {};
        sp::all_sum(c, v, out);
      });
      FAIL("no exception");
    } catch (const commsgd::non_finite& e) {
      CHECK(e.count() == 1);
      CHECK(e.first_index() == 1);
    }
    // A dense message with the wrong output size.
    CHECK_THROWS_WITH_AS(cm::local_group{n}.run([&](cm::local& c) {
      std::vector<float> g(d), out(d - 1);
      sp::all_sum(c, sp::dense_view{g}, out);
    }),
                         doctest::Contains("'out'"), commsgd::size_mismatch);
  }
}

TEST_CASE("none sums densely, with the ring's bytes") {
  const std::size_t d = 4097;
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    std::vector<std::vector<float>> sums(static_cast<std::size_t>(n));
    cm::local_group{n}.run([&](cm::local& raw) {
      cm::metered<cm::local> c(raw);
      sp::none s(d);
      const auto g = gradient(d, static_cast<std::uint64_t>(c.rank()));
      std::vector<float> out(d);
      sp::all_sum(c, s.step(g), out);
      CHECK(measured(c) == cost::dense_exchange_traffic(d, n, c.rank()));
      sums[static_cast<std::size_t>(c.rank())] = out;
    });
    std::vector<float> ref(d, 0.0f);
    for (int r = 0; r < n; ++r) {
      const auto g = gradient(d, static_cast<std::uint64_t>(r));
      for (std::size_t i = 0; i < d; ++i)
        ref[i] = r == 0 ? g[i] : ref[i] + g[i];
    }
    for (const auto& s : sums)
      CHECK(same_bits(s, ref));
  }
}

TEST_CASE("64-bit indices travel as 16-byte pairs and the model follows") {
  const std::size_t d = 3000;
  for (int n = 2; n <= 3; ++n) {
    cm::local_group{n}.run([&](cm::local& raw) {
      cm::metered<cm::local> c(raw);
      sp::top_k<sel::exact, std::uint64_t> s(d, {.density = 0.01});
      const auto msg = s.step(gradient(d, static_cast<std::uint64_t>(c.rank())));
      std::vector<float> out(d);
      const auto rep = sp::all_sum(c, msg, out);
      CHECK(measured(c) ==
            cost::sparse_exchange_traffic(rep.counts, d, c.rank(), sizeof(sp::entry<std::uint64_t>)));
    });
  }
}
