// The sparse all-reduce on comm::local with 1 to 8 ranks, checked against references built from what each
// rank contributed:
// - out is, on every rank with the same bits, +0 outside the selected set S and, at i in S, the sum from +0
//   in rank order of every rank's value at i; S is exactly the indices whose total sum has a magnitude key
//   at or above the reported threshold, and a refreshed threshold is the histogram bin edge the rule defines;
// - every rank's pairs split exactly into applied (index in S) and returned, in index order;
// - through the reducer with top_k, per rank and index, bit for bit: with p = fl(g + e_old), either p was
//   applied and e_new is +0, or nothing was applied and e_new is p (the error-feedback invariant), and
//   out = the rank-ordered sum of the applied p's;
// - metered bytes and messages, and the simulated clock, equal cost/sparse_allreduce.hpp exactly;
// - empty contributions, K = 0, d = 0 and 1, the dense fallback, and bad input that raises the same error on
//   every rank.
#include "support/gradients.hpp"

#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/cost/sparse_allreduce.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/policy/top_k_allreduce.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/sparsify/allreduce.hpp>
#include <commsgd/sparsify/allreduce_reducer.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

namespace sp = commsgd::sparsify;
namespace sel = commsgd::select;
namespace cm = commsgd::comm;
namespace cost = commsgd::cost;

using test_data::gradient;
using test_data::same_bits;

namespace {

using metered_sim = cm::metered<cm::simulated<cm::local>>;

std::uint32_t bits(float x) {
  return std::bit_cast<std::uint32_t>(x);
}

// A random message: a random subset of [0, d) with values from a small set, so that magnitudes tie and sums
// cancel to exact zeros, plus -0 now and then.
sp::sparse_vector random_message(std::size_t d, std::size_t most, std::mt19937_64& rng) {
  sp::sparse_vector m(d);
  if (d == 0) return m;
  std::uniform_int_distribution<std::size_t> count(0, std::min(d, most));
  const std::size_t c = count(rng);
  std::vector<std::uint32_t> idx(d);
  for (std::size_t i = 0; i < d; ++i)
    idx[i] = static_cast<std::uint32_t>(i);
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(c);
  std::sort(idx.begin(), idx.end());
  std::uniform_int_distribution<int> v(-8, 8);
  for (auto i : idx) {
    const int q = v(rng);
    m.push_back(i, q == 0 ? -0.0f : static_cast<float>(q) * 0.25f);
  }
  return m;
}

// One rank's view of one exchange.
struct seen {
  sp::sparse_vector mine;
  std::vector<float> out;
  std::vector<std::uint32_t> back_idx;
  std::vector<float> back_val;
  sp::allreduce_report rep;
  bool bytes_match = false, clock_match = false;
};

// Checks one exchange from every rank's view against the references built from the messages alone.
void check_exchange(const std::vector<seen>& v, std::size_t d, std::uint64_t k_global) {
  const auto n = v.size();
  const auto& r0 = v[0].rep;
  for (std::size_t r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(same_bits(v[r].out, v[0].out));
    CHECK(v[r].rep.dense == r0.dense);
    CHECK(v[r].rep.threshold_key == r0.threshold_key);
    CHECK(v[r].bytes_match);
    CHECK(v[r].clock_match);
  }
  if (r0.dense) {
    // Every pair applied, none returned: the ring's sum of each rank's densified message.
    std::vector<float> want(d, 0.0f);
    for (const auto& s : v)
      for (std::size_t j = 0; j < s.mine.size(); ++j)
        want[s.mine.indices()[j]] += s.mine.values()[j];
    for (std::size_t r = 0; r < n; ++r) {
      CHECK(v[r].back_idx.empty());
      for (std::size_t i = 0; i < d; ++i)
        CHECK(v[r].out[i] == want[i]);
    }
    return;
  }
  // The total sum of each index from +0 in rank order, and which indices anyone sent.
  std::vector<float> total(d, 0.0f);
  std::vector<char> sent(d, 0);
  for (const auto& s : v)
    for (std::size_t j = 0; j < s.mine.size(); ++j) {
      total[s.mine.indices()[j]] += s.mine.values()[j];
      sent[s.mine.indices()[j]] = 1;
    }
  std::vector<char> in_s(d, 0);
  std::uint64_t union_count = 0, s_count = 0;
  for (std::size_t i = 0; i < d; ++i) {
    if (!sent[i]) continue;
    ++union_count;
    in_s[i] = sel::magnitude_key(total[i]) >= r0.threshold_key;
    s_count += in_s[i] ? 1 : 0;
  }
  CHECK(r0.selected_total == s_count);
  for (std::size_t i = 0; i < d; ++i) {
    const float want = in_s[i] ? total[i] : 0.0f;
    if (bits(v[0].out[i]) != bits(want)) {
      CAPTURE(i);
      CHECK(bits(v[0].out[i]) == bits(want));
    }
  }
  // Each rank's pairs: applied exactly where the index is in S; the rest returned with their bits, in order.
  for (std::size_t r = 0; r < n; ++r) {
    CAPTURE(r);
    std::vector<std::uint32_t> bi;
    std::vector<float> bv;
    for (std::size_t j = 0; j < v[r].mine.size(); ++j)
      if (!in_s[v[r].mine.indices()[j]]) {
        bi.push_back(v[r].mine.indices()[j]);
        bv.push_back(v[r].mine.values()[j]);
      }
    CHECK(v[r].back_idx == bi);
    CHECK(same_bits(v[r].back_val, bv));
    CHECK(v[r].rep.returned == bi.size());
  }
  if (r0.refreshed) {
    // The bin rule: the count at or above t reaches K (or takes every sum), the count above t's bin does not.
    const std::uint64_t width = std::uint64_t{1} << cost::allreduce_histogram_shift;
    std::uint64_t above_bin = 0;
    for (std::size_t i = 0; i < d; ++i)
      if (sent[i] && sel::magnitude_key(total[i]) >= std::uint64_t{r0.threshold_key} + width) ++above_bin;
    if (k_global == 0) {
      CHECK(s_count == 0);
    } else if (union_count < k_global) {
      CHECK(r0.threshold_key == 0);
      CHECK(s_count == union_count);
    } else {
      CHECK(s_count >= k_global);
      CHECK(above_bin < k_global);
    }
  }
}

// Runs `steps` exchanges of random messages on n ranks; returns every step's views.
std::vector<std::vector<seen>> run_random(int n, std::size_t d, std::uint64_t k_global,
                                          sp::allreduce_options o, int steps, std::uint64_t seed,
                                          double empty_share = 0.2) {
  std::vector<std::vector<seen>> all(static_cast<std::size_t>(steps),
                                     std::vector<seen>(static_cast<std::size_t>(n)));
  cm::local_group(n).run([&](cm::local& base) {
    metered_sim c(cm::simulated<cm::local>(base, cm::network_model::gigabit()));
    sp::allreducer<> ex(o);
    std::mt19937_64 rng(seed * 131 + static_cast<std::uint64_t>(base.rank()));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<float> out(d);
    for (int t = 0; t < steps; ++t) {
      auto& s = all[static_cast<std::size_t>(t)][static_cast<std::size_t>(base.rank())];
      s.mine = u(rng) < empty_share ? sp::sparse_vector(d) : random_message(d, 3 * k_global + 2, rng);
      c.reset();
      c.inner().reset();
      const auto& rep = ex.sum(c, s.mine.view(), k_global, out);
      s.out = out;
      s.back_idx.assign(ex.returned_indices().begin(), ex.returned_indices().end());
      s.back_val.assign(ex.returned_values().begin(), ex.returned_values().end());
      s.rep = rep;
      const auto load = cost::sparse_allreduce_load(rep.shape(), n, base.rank(), d);
      const auto m = c.counters().total();
      s.bytes_match =
          m.bytes_sent == load.bytes_sent && m.bytes_received == load.bytes_received &&
          m.messages_sent == load.messages_sent && m.messages_received == load.messages_received &&
          load == cm::traffic{m.messages_sent, m.bytes_sent, m.messages_received, m.bytes_received};
      s.clock_match =
          c.inner().load() == load && c.inner().now() == cm::busy_seconds(load, cm::network_model::gigabit());
    }
  });
  return all;
}

} // namespace

TEST_CASE("sparse all-reduce: sums, selection and returns equal the reference; bytes equal the model") {
  std::uint64_t seed = 1;
  for (int n = 1; n <= 8; ++n)
    for (std::size_t d : {0u, 1u, 2u, 7u, 64u, 1001u})
      for (std::uint64_t k : {0u, 1u, 5u, 40u})
        for (std::uint64_t refresh : {1u, 3u}) {
          CAPTURE(n);
          CAPTURE(d);
          CAPTURE(k);
          CAPTURE(refresh);
          sp::allreduce_options o;
          o.refresh_steps = refresh;
          o.path = commsgd::cost::sparse_path::sparse;
          const auto all = run_random(n, d, k, o, 4, ++seed);
          for (std::size_t t = 0; t < all.size(); ++t) {
            CAPTURE(t);
            check_exchange(all[t], d, k);
            if (t == 0) CHECK(all[t][0].rep.refreshed);
          }
        }
}

TEST_CASE("sparse all-reduce: region boundaries follow the previous selection") {
  for (int n : {2, 3, 5, 8}) {
    CAPTURE(n);
    const std::size_t d = 2000;
    sp::allreduce_options o;
    o.path = commsgd::cost::sparse_path::sparse;
    const auto all = run_random(n, d, 60, o, 5, 77 + static_cast<std::uint64_t>(n), 0.0);
    // Boundaries start even and then sit at every (G / n)-th selected index of the step before.
    for (int j = 0; j <= n; ++j)
      CHECK(all[0][0].rep.bounds[static_cast<std::size_t>(j)] ==
            d * static_cast<std::size_t>(j) / static_cast<std::size_t>(n));
    for (std::size_t t = 1; t < all.size(); ++t) {
      std::vector<std::uint32_t> chosen;
      for (std::size_t i = 0; i < d; ++i)
        if (all[t - 1][0].out[i] != 0.0f || false) chosen.push_back(static_cast<std::uint32_t>(i));
      // out can hold a selected exact zero; rebuild S from the returns instead when that happens.
      const auto& prev = all[t - 1][0].rep;
      if (chosen.size() != prev.selected_total) continue;
      const auto& b = all[t][0].rep.bounds;
      for (int q = 1; q < n; ++q)
        CHECK(b[static_cast<std::size_t>(q)] ==
              chosen[static_cast<std::size_t>(q) * chosen.size() / static_cast<std::size_t>(n)]);
      for (const auto& s : all[t])
        CHECK(s.rep.bounds == b);
    }
  }
}

TEST_CASE("sparse all-reduce: the dense fallback applies everything; bytes equal the model") {
  for (int n = 1; n <= 5; ++n)
    for (std::size_t d : {1u, 50u, 333u}) {
      CAPTURE(n);
      CAPTURE(d);
      sp::allreduce_options o;
      o.path = commsgd::cost::sparse_path::dense;
      const auto all = run_random(n, d, 10, o, 2, 900 + static_cast<std::uint64_t>(n));
      for (const auto& step : all) {
        CHECK(step[0].rep.dense);
        check_exchange(step, d, 10);
      }
      // Left to itself, a dense enough exchange picks the ring from the announced counts.
      o.path = commsgd::cost::sparse_path::automatic;
      const auto autos = run_random(n, d, d, o, 1, 950 + static_cast<std::uint64_t>(n), 0.0);
      const auto& r = autos[0][0].rep;
      CHECK(r.dense == cost::sparse_allreduce_prefers_dense(r.counts, d, d));
      check_exchange(autos[0], d, d);
    }
}

TEST_CASE("sparse all-reduce: same bits run to run") {
  sp::allreduce_options o;
  o.refresh_steps = 2;
  const auto a = run_random(6, 500, 20, o, 5, 4242);
  const auto b = run_random(6, 500, 20, o, 5, 4242);
  for (std::size_t t = 0; t < a.size(); ++t)
    for (std::size_t r = 0; r < a[t].size(); ++r) {
      CHECK(same_bits(a[t][r].out, b[t][r].out));
      CHECK(a[t][r].back_idx == b[t][r].back_idx);
    }
}

TEST_CASE("sparse all-reduce: bad input on one rank raises the same error on every rank") {
  struct verdict {
    std::string type, what;
  };
  const auto run_bad = [](int n, int bad, int kind) {
    std::vector<verdict> got(static_cast<std::size_t>(n));
    cm::local_group(n).run([&](cm::local& c) {
      const std::size_t d = 100;
      sp::sparse_vector m(d);
      m.push_back(static_cast<std::uint32_t>(3 + c.rank()), 1.0f);
      std::vector<std::uint32_t> idx(m.indices().begin(), m.indices().end());
      std::vector<float> val(m.values().begin(), m.values().end());
      std::vector<float> out(d);
      std::size_t length = d;
      std::uint64_t k = 4;
      if (c.rank() == bad) {
        if (kind == 0) idx[0] = 100;                                     // out of range
        if (kind == 1) val[0] = std::numeric_limits<float>::quiet_NaN(); // not finite
        if (kind == 2) out.resize(d + 1);                                // wrong output size
        if (kind == 3) length = d + 1, out.resize(d + 1);                // ranks disagree on the length
        if (kind == 4) k = 5;                                            // ranks disagree on K
        if (kind == 5) val.push_back(2.0f);                              // ragged
      }
      sp::allreducer<> ex;
      try {
        ex.sum(c, sp::sparse_view<>{length, idx, val}, k, out);
        got[static_cast<std::size_t>(c.rank())] = {"none", ""};
      } catch (const commsgd::error& e) {
        got[static_cast<std::size_t>(c.rank())] = {typeid(e).name(), e.what()};
        // Nothing is lost: every pair counts as returned.
        CHECK(ex.returned_indices().size() == idx.size());
      }
    });
    return got;
  };
  for (int n : {1, 2, 4, 7})
    for (int kind = 0; kind < 6; ++kind) {
      if (n == 1 && kind >= 3) continue; // one rank cannot disagree with itself
      CAPTURE(n);
      CAPTURE(kind);
      const int bad = n - 1;
      const auto got = run_bad(n, bad, kind);
      for (const auto& g : got) {
        CHECK(g.type != "none");
        CHECK(g.type == got[0].type);
      }
      if (kind == 0 || kind == 3 || kind == 4) {
        for (const auto& g : got)
          CHECK(g.what.find(std::string(kind == 0   ? "indices"
                                        : kind == 3 ? "length"
                                                    : "k_global")) != std::string::npos);
      }
    }
  CHECK_THROWS_AS(sp::allreducer<>({.refresh_steps = 0}), commsgd::invalid_argument);
  CHECK_THROWS_AS(sp::allreducer<>({.drift = 0.5}), commsgd::invalid_argument);
}

TEST_CASE("top_k::restore_unsent puts values back with their bits, and checks before it changes anything") {
  sp::top_k<sel::exact> s(8, {.k = 4});
  const std::vector<float> g{-0.0f, 5.0f, -4.0f, 0.5f, 3.0f, -0.25f, 0.0f, 2.0f};
  const auto msg = s.step(g);
  REQUIRE(msg.size() == 4);
  const std::vector<std::uint32_t> idx(msg.indices.begin(), msg.indices.end());
  const std::vector<float> val(msg.values.begin(), msg.values.end());
  s.restore_unsent(idx, val);
  std::vector<float> p(g.size());
  for (std::size_t i = 0; i < g.size(); ++i)
    p[i] = g[i] + 0.0f; // what the step summed: gradient + the zero residual
  CHECK(same_bits(s.residual(), p));
  const std::vector<float> before(s.residual().begin(), s.residual().end());
  const std::uint32_t far[] = {8};
  const float one[] = {1.0f};
  const float nan[] = {std::numeric_limits<float>::quiet_NaN()};
  const std::uint32_t first[] = {0};
  CHECK_THROWS_AS(s.restore_unsent(far, one), commsgd::invalid_argument);
  CHECK_THROWS_AS(s.restore_unsent(first, nan), commsgd::non_finite);
  CHECK_THROWS_AS(s.restore_unsent(first, std::span<const float>()), commsgd::size_mismatch);
  CHECK(same_bits(s.residual(), before));
  // A -0 comes back as -0 onto a sent (+0) position; elsewhere values add.
  sp::top_k<sel::exact> z(3, {.k = 3});
  const std::vector<float> gz{1.0f, 2.0f, 3.0f};
  z.step(gz);
  const std::uint32_t iz[] = {0, 2};
  const float vz[] = {-0.0f, 0.5f};
  z.restore_unsent(iz, vz);
  CHECK(bits(z.residual()[0]) == bits(-0.0f));
  CHECK(z.residual()[2] == 0.5f);
  z.restore_unsent(iz, vz);
  CHECK(z.residual()[2] == 1.0f);
}

TEST_CASE("allreduce_reducer: the error-feedback invariant holds bit for bit on every rank, every step") {
  using scheme = commsgd::coding::uncoded<cm::local>;
  for (int n = 1; n <= 8; ++n)
    for (std::size_t d : {1u, 17u, 1000u, 4097u})
      for (double density : {0.001, 0.05, 0.5}) {
        CAPTURE(n);
        CAPTURE(d);
        CAPTURE(density);
        const int steps = 5;
        // [step][rank]: p = fl(g + e_old), the new residual, the output.
        std::vector<std::vector<std::vector<float>>> p(steps), e_new(steps), outs(steps);
        for (int t = 0; t < steps; ++t) {
          p[static_cast<std::size_t>(t)].resize(static_cast<std::size_t>(n));
          e_new[static_cast<std::size_t>(t)].resize(static_cast<std::size_t>(n));
          outs[static_cast<std::size_t>(t)].resize(static_cast<std::size_t>(n));
        }
        cm::local_group(n).run([&](cm::local& c) {
          sp::allreduce_options o;
          o.refresh_steps = 2;
          o.path = commsgd::cost::sparse_path::sparse;
          sp::allreduce_reducer<sp::top_k<sel::exact>, scheme, cm::local> red(
              c, scheme(c), sp::top_k<sel::exact>(d, {.density = density}), o);
          std::vector<float> out(d);
          const auto r = static_cast<std::size_t>(c.rank());
          for (int t = 0; t < steps; ++t) {
            const auto tt = static_cast<std::size_t>(t);
            const auto g = gradient(d, 1000 * r + tt + 17 * d);
            auto& pp = p[tt][r];
            pp.resize(d);
            for (std::size_t i = 0; i < d; ++i)
              pp[i] = g[i] + red.compression().residual()[i];
            const std::span<const float> blocks[1] = {g};
            red.reduce(blocks, out);
            e_new[tt][r].assign(red.compression().residual().begin(), red.compression().residual().end());
            outs[tt][r] = out;
          }
        });
        for (int t = 0; t < steps; ++t) {
          const auto tt = static_cast<std::size_t>(t);
          std::vector<float> want(d, 0.0f);
          std::vector<char> applied_somewhere(d, 0);
          for (int r = 0; r < n; ++r) {
            const auto rr = static_cast<std::size_t>(r);
            for (std::size_t i = 0; i < d; ++i) {
              const float pi = p[tt][rr][i], ei = e_new[tt][rr][i];
              // Either applied (the residual holds +0 and p went into the sum) or kept whole.
              const bool applied = bits(ei) == 0 && bits(pi) != 0;
              if (!applied && bits(ei) != bits(pi)) {
                CAPTURE(i);
                CAPTURE(r);
                CHECK(bits(ei) == bits(pi));
              }
              if (applied) {
                want[i] += pi;
                applied_somewhere[i] = 1;
              }
            }
          }
          for (int r = 0; r < n; ++r) {
            const auto& o = outs[tt][static_cast<std::size_t>(r)];
            for (std::size_t i = 0; i < d; ++i)
              if (bits(o[i]) != bits(want[i]) &&
                  !(o[i] == 0.0f && want[i] == 0.0f && !applied_somewhere[i])) {
                CAPTURE(i);
                CHECK(bits(o[i]) == bits(want[i]));
              }
            CHECK(same_bits(o, outs[tt][0]));
          }
        }
      }
}

TEST_CASE("data_parallel composes top_k_allreduce; every rank ends with the same model") {
  using commsgd::data_parallel;
  namespace policy = commsgd::policy;
  using dp = data_parallel<policy::uncoded<>, policy::top_k_allreduce<sel::exact>, policy::synchronous>;
  static_assert(policy::builds_reducer<policy::top_k_allreduce<sel::exact>, dp::coding_type, cm::local>);
  for (int n : {1, 3, 4}) {
    CAPTURE(n);
    const std::size_t d = 300;
    std::vector<std::vector<float>> finals(static_cast<std::size_t>(n));
    cm::local_group(n).run([&](cm::local& c) {
      dp::options o;
      o.lr = 0.1f;
      o.compression.top_k.density = 0.05;
      dp trainer(c, d, o);
      std::vector<float> x(d, 0.0f);
      trainer.start(x);
      for (int t = 0; t < 6; ++t) {
        const auto g = gradient(d, static_cast<std::uint64_t>(c.rank() * 100 + t));
        trainer.step(x, std::span<const float>(g));
        CHECK(trainer.last_exchange().total > 0);
        CHECK(trainer.compression().steps() == static_cast<std::uint64_t>(t + 1));
      }
      trainer.finish(x);
      finals[static_cast<std::size_t>(c.rank())] = x;
    });
    for (const auto& x : finals)
      CHECK(same_bits(x, finals[0]));
  }
}

TEST_CASE("allreduce_reducer: a gradient refused on one rank raises on every rank; the next step runs") {
  using scheme = commsgd::coding::uncoded<cm::local>;
  for (int n : {2, 5}) {
    CAPTURE(n);
    cm::local_group(n).run([&](cm::local& c) {
      const std::size_t d = 300;
      sp::allreduce_reducer<sp::top_k<sel::exact>, scheme, cm::local> red(
          c, scheme(c), sp::top_k<sel::exact>(d, {.density = 0.02}));
      std::vector<float> out(d);
      auto g = gradient(d, 3 + static_cast<std::uint64_t>(c.rank()));
      const bool bad = c.rank() == 1;
      if (bad) g[7] = std::numeric_limits<float>::infinity();
      const std::span<const float> blocks[1] = {g};
      if (bad)
        CHECK_THROWS_AS(red.reduce(blocks, out), commsgd::non_finite);
      else
        CHECK_THROWS_AS(red.reduce(blocks, out), commsgd::comm_aborted);
      g[7] = 0.0f;
      red.reduce(blocks, out);
      // A rank that went through the failed step kept its whole message in the residual: nothing lost.
      CHECK(red.compression().steps() == (bad ? 1u : 2u));
      CHECK(red.exchange().history() == 1);
    });
  }
}

TEST_CASE("cost: the balanced sparse all-reduce receives about k + K pairs whatever n is") {
  for (int n : {1, 2, 3, 8, 64, 1000})
    for (std::uint64_t k : {0u, 1u, 7u, 1000u, 16778u})
      for (bool refreshed : {false, true}) {
        CAPTURE(n);
        CAPTURE(k);
        const std::uint64_t d = 1u << 24;
        const auto l = cost::sparse_allreduce_balanced_load(n, d, k, k, refreshed);
        if (n == 1) {
          CHECK(l == cm::traffic{});
          continue;
        }
        const auto peers = static_cast<std::uint64_t>(n - 1);
        // Pairs: this owner's share of every other rank's k and the other owners' shares of K: at most k + K.
        const std::uint64_t fixed =
            peers * cost::allreduce_header_bytes + peers * 8 +
            (refreshed ? cm::ring_all_reduce_share(cost::allreduce_histogram_bins, n, 0).received * 4 : 0);
        CHECK(l.bytes_received >= fixed);
        CHECK(l.bytes_received - fixed <= 8 * 2 * k);
        // The gather alone brings the other owners' selections.
        CHECK(l.bytes_received - fixed >=
              8 * (k - (k + static_cast<std::uint64_t>(n) - 1) / static_cast<std::uint64_t>(n)));
        // With nothing to move, only the fixed part remains.
        const auto shape_load = cost::sparse_allreduce_load(
            {false, refreshed, std::vector<std::uint64_t>(static_cast<std::size_t>(n), 0),
             std::vector<std::uint64_t>(static_cast<std::size_t>(n), 0),
             std::vector<std::uint64_t>(static_cast<std::size_t>(n), 0)},
            n, 0, d);
        CHECK(shape_load.bytes_received == fixed);
      }
  // The switch: a message as long as the vector makes the ring cheaper; a thin one does not.
  const std::vector<std::uint64_t> thin(8, 10), thick(8, 1000);
  CHECK_FALSE(cost::sparse_allreduce_prefers_dense(thin, 1000, 10));
  CHECK(cost::sparse_allreduce_prefers_dense(thick, 1000, 1000));
}
