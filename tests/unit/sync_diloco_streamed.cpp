// sync::diloco on thread ranks: one fragment with no delay is sync::diloco bit for bit; streamed
// fragments equal a serial reference bit for bit over random layouts, periods, delays and merges (alpha and
// keep_delay_steps); the schedule; fragments cover the model once; a checkpoint taken with exchanges in
// flight resumes bit for bit, either merge; a non-finite pseudo-gradient is refused on every rank and changes
// no outer state; bad options are named.
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/sync/diloco.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <support/least_squares.hpp>
#include <support/train_ranks.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace commsgd;
using sync::diloco;
using sync::fragment_layout;

namespace {

const std::vector<std::size_t> layers = {5, 17, 3, 9};
const toy::least_squares& problem() {
  static const toy::least_squares p({.samples = 480, .dim = 34, .seed = 13});
  return p;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The layout, written again from its definition: layer l goes to fragment l mod P (strided) or l P / L.
std::vector<std::vector<std::size_t>> fragment_indices(const std::vector<std::size_t>& sizes, int P,
                                                       fragment_layout layout) {
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(P));
  std::size_t at = 0;
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const std::size_t p = layout == fragment_layout::strided ? l % static_cast<std::size_t>(P)
                                                             : l * static_cast<std::size_t>(P) / sizes.size();
    for (std::size_t i = 0; i < sizes[l]; ++i)
      out[p].push_back(at + i);
    at += sizes[l];
  }
  return out;
}

// Streaming DiLoCo on n ranks, one after the other in one thread, with the float operations in the order the
// strategy takes them (sums in rank order, as comm::local's all_reduce_sum).
toy::finals_t reference(const toy::least_squares& prob, const std::vector<std::size_t>& sizes, int n,
                        int steps, const sync::diloco_options& o, bool finish) {
  const auto frags = fragment_indices(sizes, o.fragments, o.layout);
  const std::size_t P = frags.size();
  toy::finals_t x(static_cast<std::size_t>(n), std::vector<float>(prob.dim(), 0.0f));
  std::vector<std::vector<float>> global(P), velocity(P);
  for (std::size_t p = 0; p < P; ++p)
    for (auto i : frags[p])
      global[p].push_back(x[0][i]);
  struct flight {
    std::int64_t due;
    std::vector<float> sum;
    std::vector<std::vector<float>> start; // each rank's fragment values at the start (keep_delay_steps)
  };
  std::vector<std::optional<flight>> pending(P);
  std::vector<std::int64_t> applied_at(P, -1);
  // After inner step s (counted from 1).
  auto starts = [&](std::size_t p, std::int64_t s) {
    const std::int64_t first = static_cast<std::int64_t>(p) * o.sync_every / static_cast<std::int64_t>(P);
    return s >= 1 && s >= first && (s - first) % o.sync_every == 0;
  };
  auto launch = [&](std::size_t p, std::int64_t t) {
    std::vector<float> sum(frags[p].size());
    std::vector<std::vector<float>> start(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      for (std::size_t j = 0; j < frags[p].size(); ++j) {
        const float d = global[p][j] - x[static_cast<std::size_t>(r)][frags[p][j]];
        sum[j] = r == 0 ? d : sum[j] + d;
        start[static_cast<std::size_t>(r)].push_back(x[static_cast<std::size_t>(r)][frags[p][j]]);
      }
    pending[p] = flight{t + o.delay, std::move(sum), std::move(start)};
  };
  auto apply = [&](std::size_t p, std::int64_t t) {
    auto& g = global[p];
    const auto& s = pending[p]->sum;
    const float lr = o.outer.lr, mu = o.outer.momentum;
    if (mu != 0.0f && velocity[p].empty()) velocity[p].assign(g.size(), 0.0f);
    for (std::size_t j = 0; j < g.size(); ++j) {
      const float mean = s[j] / static_cast<float>(n);
      if (mu == 0.0f) {
        g[j] = g[j] - lr * mean;
      } else {
        velocity[p][j] = mu * velocity[p][j] + mean;
        g[j] = g[j] - lr * (mean + mu * velocity[p][j]);
      }
    }
    for (std::size_t r = 0; r < x.size(); ++r)
      for (std::size_t j = 0; j < g.size(); ++j) {
        float& v = x[r][frags[p][j]];
        const float moved = v - pending[p]->start[r][j]; // keep_delay_steps: the steps since the start
        if (o.keep_delay_steps)
          v = moved == 0.0f ? g[j] : g[j] + moved;
        else
          v = o.alpha == 0.0f ? g[j] : g[j] + o.alpha * (v - g[j]);
      }
    pending[p].reset();
    applied_at[p] = t;
  };
  std::vector<float> grad(prob.dim());
  for (int t = 0; t < steps; ++t) {
    for (int r = 0; r < n; ++r) {
      auto& xr = x[static_cast<std::size_t>(r)];
      prob.gradient(xr, prob.batch(r, n, t, 8), grad);
      for (std::size_t i = 0; i < xr.size(); ++i)
        xr[i] = xr[i] - o.lr * grad[i];
    }
    const std::int64_t s = t + 1;
    for (std::size_t p = 0; p < P; ++p)
      if (pending[p] && pending[p]->due <= s) apply(p, s);
    for (std::size_t p = 0; p < P; ++p)
      if (starts(p, s)) {
        launch(p, s);
        if (o.delay == 0) apply(p, s);
      }
  }
  if (finish) {
    const std::int64_t last = steps;
    for (std::size_t p = 0; p < P; ++p)
      if (pending[p]) apply(p, last);
    for (std::size_t p = 0; p < P; ++p) {
      const bool keeps_local = o.alpha != 0.0f || (o.keep_delay_steps && o.delay > 0);
      if (!keeps_local && applied_at[p] == last) continue;
      launch(p, last);
      apply(p, last);
    }
  }
  return x;
}

} // namespace

TEST_CASE(
    "one fragment, no delay: the serial reference bit for bit; lossless codes are uncompressed bit for bit") {
  const auto& prob = problem();
  for (int H : {1, 3, 7})
    for (float mu : {0.0f, 0.9f}) {
      CAPTURE(H);
      CAPTURE(mu);
      const sync::diloco_options o{.lr = 0.05f, .sync_every = H, .outer = {.lr = 0.7f, .momentum = mu}};
      for (bool finish : {false, true}) {
        const auto want = reference(prob, layers, 3, 23, o, finish);
        const auto got = toy::train_ranks(
            prob, 3, 23, [&](comm::local& c) { return diloco<comm::local>(c, layers, o); }, finish);
        for (std::size_t r = 0; r < 3; ++r)
          CHECK(same_bits(got[r], want[r]));
        // Top-k at density 1 sends every value as it is: the sum is the uncompressed sum, bit for bit.
        using topk = compress::top_k_ef<>;
        const auto got_k = toy::train_ranks(
            prob, 3, 23,
            [&](comm::local& c) {
              return diloco<comm::local, topk>(c, layers, o,
                                               [](std::size_t n) { return topk(n, {.density = 1.0}); });
            },
            finish);
        for (std::size_t r = 0; r < 3; ++r)
          CHECK(same_bits(got_k[r], want[r]));
      }
    }
}

TEST_CASE(
    "streamed fragments equal a serial reference bit for bit (random layouts, periods, delays, merges)") {
  std::mt19937 rng(20261126);
  for (int trial = 0; trial < 36; ++trial) {
    std::vector<std::size_t> sizes(1 + rng() % 6);
    for (auto& s : sizes)
      s = 1 + rng() % 9;
    std::size_t dim = 0;
    for (auto s : sizes)
      dim += s;
    const toy::least_squares prob({.samples = 120, .dim = dim, .seed = 100u + static_cast<unsigned>(trial)});
    sync::diloco_options o;
    o.lr = 0.02f;
    o.sync_every = 1 + static_cast<int>(rng() % 8);
    o.fragments = 1 + static_cast<int>(rng() % sizes.size());
    o.delay = static_cast<int>(rng() % static_cast<unsigned>(o.sync_every));
    o.alpha = trial % 3 == 0 ? 0.5f : 0.0f;
    o.keep_delay_steps = trial % 3 == 2;
    o.layout = trial % 2 == 0 ? fragment_layout::strided : fragment_layout::contiguous;
    o.outer = {.lr = trial % 4 == 1 ? 1.0f : 0.7f, .momentum = trial % 4 == 1 ? 0.0f : 0.9f};
    const int n = 1 + trial % 3, steps = 29;
    CAPTURE(trial);
    CAPTURE(o.sync_every);
    CAPTURE(o.fragments);
    CAPTURE(o.delay);
    for (bool finish : {false, true}) {
      CAPTURE(finish);
      const auto want = reference(prob, sizes, n, steps, o, finish);
      const auto got = toy::train_ranks(
          prob, n, steps, [&](comm::local& c) { return diloco<comm::local>(c, sizes, o); }, finish);
      for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r)
        CHECK(same_bits(got[r], want[r]));
    }
  }
}

TEST_CASE(
    "schedule: every H steps from p H / P, applied delay steps later, one fragment a step when H >= P") {
  for (int H : {1, 4, 9})
    for (int P = 1; P <= 4; ++P)
      for (int delay = 0; delay < H; delay += 2) {
        CAPTURE(H);
        CAPTURE(P);
        CAPTURE(delay);
        comm::local_group(1).run([&](comm::local& c) {
          diloco<comm::local> s(c, layers, {.sync_every = H, .fragments = P, .delay = delay});
          std::vector<float> x(problem().dim(), 1.0f), g(x.size(), 0.0f);
          s.start(x);
          std::uint64_t starts = 0;
          // Inner steps counted from 1: fragment p starts after step s >= max(1, t_p) with s = t_p mod H.
          auto starts_at = [&](std::size_t p, std::int64_t s) {
            const std::int64_t first = static_cast<std::int64_t>(p) * H / P;
            return s >= 1 && s >= first && (s - first) % H == 0;
          };
          for (std::int64_t s1 = 1; s1 <= 40; ++s1) {
            int starting = 0, due = 0;
            for (std::size_t p = 0; p < s.num_fragments(); ++p) {
              const bool want = starts_at(p, s1);
              CHECK(s.starts_after(p, s1) == want);
              starting += want ? 1 : 0;
              due += starts_at(p, s1 - delay) ? 1 : 0;
            }
            // The first round of fragment 0 is H whole steps.
            CHECK(s.starts_after(0, s1) == (s1 % H == 0));
            starts += static_cast<std::uint64_t>(starting);
            std::vector<std::size_t> touched;
            for (std::size_t p = 0; p < s.num_fragments(); ++p)
              if (starts_at(p, s1) || starts_at(p, s1 - delay)) touched.push_back(p);
            CHECK(s.touched_next() == touched);
            std::vector<std::size_t> applied;
            for (std::size_t p = 0; p < s.num_fragments(); ++p)
              if (starts_at(p, s1 - delay)) applied.push_back(p);
            CHECK(s.applied_next() == applied);
            const auto before = s.exchanges_started();
            const auto r = s1 % 2 ? s.step(x, g) : s.advance(x);
            CHECK(s.steps() == s1);
            CHECK(r.exchanged == (starting + due > 0));
            CHECK(r.averaged == (due > 0));
            // What the engine started, not what the formula above says it should: one fragment at most.
            CHECK(s.exchanges_started() - before == static_cast<std::uint64_t>(starting));
            if (H >= P) CHECK(s.exchanges_started() - before <= 1);
            for (std::size_t p = 0; p < s.num_fragments(); ++p) {
              // In flight after step s1: started after some u in (s1 - delay, s1].
              bool flying = false;
              for (std::int64_t u = s1 - delay + 1; u <= s1 && delay > 0; ++u)
                flying = flying || starts_at(p, u);
              CHECK(s.in_flight(p) == flying);
            }
          }
          CHECK(s.exchanges_started() == starts);
          s.finish(x);
          for (std::size_t p = 0; p < s.num_fragments(); ++p)
            CHECK_FALSE(s.in_flight(p));
        });
      }
}

TEST_CASE("fragments cover the model once, in order, strided or contiguous") {
  const std::vector<std::size_t> sizes = {3, 1, 4, 1, 5, 9, 2};
  for (auto layout : {fragment_layout::strided, fragment_layout::contiguous})
    for (int P = 1; P <= 7; ++P) {
      CAPTURE(P);
      comm::local_group(1).run([&](comm::local& c) {
        diloco<comm::local> s(c, sizes, {.sync_every = 8, .fragments = P, .layout = layout});
        const auto want = fragment_indices(sizes, P, layout);
        std::vector<int> seen(25, 0);
        for (std::size_t p = 0; p < s.num_fragments(); ++p) {
          std::vector<std::size_t> got;
          for (auto [off, len] : s.fragment_runs(p))
            for (std::size_t i = 0; i < len; ++i) {
              got.push_back(off + i);
              ++seen[off + i];
            }
          CHECK(got == want[p]);
          CHECK(s.fragment_length(p) == got.size());
          CHECK_FALSE(got.empty());
        }
        for (int v : seen)
          CHECK(v == 1);
      });
    }
}

TEST_CASE(
    "a checkpoint taken with exchanges in flight resumes bit for bit, uncompressed and top-k, either merge") {
  const auto& prob = problem();
  const int n = 3, before = 10, after = 15;
  sync::diloco_options o{.lr = 0.05f, .sync_every = 6, .fragments = 3, .delay = 2, .alpha = 0.5f};
  auto check = [&](auto make) {
    // One run straight through, one stopped after `before` steps and resumed from its checkpoint.
    toy::finals_t straight(n), resumed(n);
    std::string shared;
    std::vector<std::string> local(n);
    toy::finals_t saved_x(n);
    comm::local_group(n).run([&](comm::local& c) {
      auto s = make(c);
      std::vector<float> x(prob.dim(), 0.0f), g(x.size());
      s.start(x);
      for (int t = 0; t < before + after; ++t) {
        if (t == before) {
          bool flying = false;
          for (std::size_t p = 0; p < s.num_fragments(); ++p)
            flying = flying || s.in_flight(p);
          CHECK(flying);
          std::ostringstream sh, lo;
          s.save(sh, state::part::shared);
          s.save(lo, state::part::local);
          if (c.rank() == 0) shared = sh.str();
          local[static_cast<std::size_t>(c.rank())] = lo.str();
          saved_x[static_cast<std::size_t>(c.rank())] = x;
        }
        prob.gradient(x, prob.batch(c.rank(), n, t, 8), g);
        s.step(x, g);
      }
      s.finish(x);
      straight[static_cast<std::size_t>(c.rank())] = x;
    });
    comm::local_group(n).run([&](comm::local& c) {
      auto s = make(c);
      std::istringstream sh(shared), lo(local[static_cast<std::size_t>(c.rank())]);
      s.load(sh, lo);
      auto x = saved_x[static_cast<std::size_t>(c.rank())];
      std::vector<float> g(x.size());
      s.start(x);
      for (int t = before; t < before + after; ++t) {
        prob.gradient(x, prob.batch(c.rank(), n, t, 8), g);
        s.step(x, g);
      }
      s.finish(x);
      resumed[static_cast<std::size_t>(c.rank())] = x;
    });
    for (std::size_t r = 0; r < n; ++r)
      CHECK(same_bits(resumed[r], straight[r]));
  };
  for (bool keep : {false, true}) {
    CAPTURE(keep);
    o.alpha = keep ? 0.0f : 0.5f;
    o.keep_delay_steps = keep;
    check([&](comm::local& c) { return diloco<comm::local>(c, layers, o); });
    using topk = compress::top_k_ef<>;
    check([&](comm::local& c) {
      return diloco<comm::local, topk>(c, layers, o,
                                       [](std::size_t len) { return topk(len, {.density = 0.2}); });
    });
  }
}

TEST_CASE("a stream of other options or layers is refused") {
  const auto& prob = problem();
  const sync::diloco_options o{.lr = 0.05f, .sync_every = 6, .fragments = 3, .delay = 2, .alpha = 0.5f};
  std::string stream;
  comm::local_group(1).run([&](comm::local& c) {
    diloco<comm::local> s(c, layers, o);
    std::vector<float> x(prob.dim(), 0.0f);
    s.start(x);
    std::ostringstream os;
    s.save(os, state::part::all);
    stream = os.str();
    diloco<comm::local> other_delay(c, layers, {.sync_every = 6, .fragments = 3, .delay = 1});
    std::istringstream is(stream);
    CHECK_THROWS_AS(other_delay.load(is), corrupt_data);
    diloco<comm::local> other_layers(c, {17, 17}, {.sync_every = 6, .fragments = 2, .delay = 2});
    std::istringstream is2(stream);
    CHECK_THROWS_AS(other_layers.load(is2), corrupt_data);
    diloco<comm::local> other_merge(c, layers,
                                    {.sync_every = 6, .fragments = 3, .delay = 2, .keep_delay_steps = true});
    std::istringstream is3(stream);
    CHECK_THROWS_AS(other_merge.load(is3), corrupt_data);
  });
}

TEST_CASE("a non-finite pseudo-gradient is refused on every rank; the fragment's outer state is unchanged") {
  const auto& prob = problem();
  const int n = 3;
  auto run = [&](auto make, const char* label) {
    CAPTURE(label);
    std::vector<int> refused(n, 0);
    comm::local_group(n).run([&](comm::local& c) {
      auto s = make(c);
      std::vector<float> x(prob.dim(), 0.0f), g(x.size());
      s.start(x);
      // Fragment 0 (layers 0 and 2: elements 0-4 and 22-24) starts after inner steps 4 and 8 (t = 3, 7 here):
      // rank 1 spoils one of its values before step 4, the exchange started then is due after step 5.
      std::vector<float> global_before, velocity_before;
      for (int t = 0; t < 12; ++t) {
        prob.gradient(x, prob.batch(c.rank(), n, t, 8), g);
        if (t == 3 && c.rank() == 1) x[2] = std::numeric_limits<float>::quiet_NaN();
        if (t == 4) {
          // Rank 1's gradient at its spoilt model is not finite: every rank passes a zero one this step.
          std::fill(g.begin(), g.end(), 0.0f);
          global_before.assign(s.global_model(0).begin(), s.global_model(0).end());
          velocity_before.assign(s.outer(0).velocity().begin(), s.outer(0).velocity().end());
          try {
            s.step(x, g);
          } catch (const non_finite& e) {
            refused[static_cast<std::size_t>(c.rank())] = 1;
            CHECK(std::string(e.what()).find("fragment 0") != std::string::npos);
          }
          CHECK(same_bits(std::vector<float>(s.global_model(0).begin(), s.global_model(0).end()),
                          global_before));
          CHECK(same_bits(std::vector<float>(s.outer(0).velocity().begin(), s.outer(0).velocity().end()),
                          velocity_before));
          CHECK_FALSE(s.in_flight(0));
          // The trainer mends its model from the common one and goes on: the next turns come on schedule.
          if (c.rank() == 1) x[2] = s.global_model(0)[2];
          continue;
        }
        s.step(x, g);
      }
      s.finish(x);
      for (float v : x)
        CHECK(std::isfinite(v));
    });
    for (int v : refused)
      CHECK(v == 1);
  };
  const sync::diloco_options o{.lr = 0.05f, .sync_every = 4, .fragments = 2, .delay = 1};
  run([&](comm::local& c) { return diloco<comm::local>(c, layers, o); }, "uncompressed");
  using topk = compress::top_k_ef<>;
  run(
      [&](comm::local& c) {
        return diloco<comm::local, topk>(c, layers, o,
                                         [](std::size_t len) { return topk(len, {.density = 0.5}); });
      },
      "top-k");
}

TEST_CASE("bad options and calls are refused, naming the argument") {
  comm::local_group(1).run([&](comm::local& c) {
    auto refused = [&](sync::diloco_options o, std::vector<std::size_t> sizes, const char* name) {
      try {
        diloco<comm::local> s(c, std::move(sizes), o);
        FAIL_CHECK("accepted " << name);
      } catch (const invalid_argument& e) {
        CHECK(std::string(e.what()).find(name) != std::string::npos);
      }
    };
    refused({.lr = 0.0f}, layers, "lr");
    refused({.sync_every = 0}, layers, "sync_every");
    refused({.sync_every = 4, .fragments = 5}, layers, "fragments");
    refused({.sync_every = 4, .fragments = 0}, layers, "fragments");
    refused({.sync_every = 4, .delay = 4}, layers, "delay");
    refused({.sync_every = 4, .delay = -1}, layers, "delay");
    refused({.alpha = 1.5f}, layers, "alpha");
    refused({.alpha = 0.5f, .keep_delay_steps = true}, layers, "alpha");
    refused({.outer = {.lr = 0.7f, .momentum = 1.0f}}, layers, "outer.momentum");
    refused({}, {}, "layer_sizes");
    refused({.layout = static_cast<fragment_layout>(7)}, layers, "layout");

    diloco<comm::local> s(c, layers, {.sync_every = 4});
    std::vector<float> x(34, 0.0f), g(34, 0.0f), short_x(33, 0.0f);
    CHECK_THROWS_AS(s.step(x, g), invalid_argument); // before start()
    CHECK_THROWS_AS(s.start(short_x), invalid_argument);
    s.start(x);
    g[3] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_AS(s.step(x, g), non_finite);
    using topk = compress::top_k_ef<>;
    CHECK_THROWS_AS((diloco<comm::local, topk>(c, layers, {}, nullptr)), invalid_argument);
    CHECK_THROWS_AS((diloco<comm::local, topk>(c, layers, {.sync_every = 4, .fragments = 2},
                                               [](std::size_t) { return topk(3, {.density = 0.5}); })),
                    invalid_argument);
  });
}
