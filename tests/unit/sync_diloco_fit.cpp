// A -fit code (sync/diloco_codes.hpp): the gathered -2bit -senders code while a round's bytes stay within the
// budget, the region sums past it, a refusal when neither does. Checked as properties of the choice against
// float32's ring over random sizes, densities, chunks, budgets and rank counts; at the 2.7 M model's size
// where the results files measured it; and through the engine: coded_diloco of a -fit code is, bit for bit and
// byte for byte, the engine of the code it chose, every rank choosing alike, and its checkpoint is that code's.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/over_messages.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/sync/coded_diloco.hpp>
#include <commsgd/sync/diloco_codes.hpp>
#include <support/checkpoint.hpp>
#include <support/least_squares.hpp>
#include <support/train_ranks.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace commsgd;
using sync::diloco_code;

namespace {

// What all n ranks send in a steady round of d values: the code's (cost/) and float32's ring.
double round_bytes(const diloco_code& c, std::uint64_t d, int n) {
  double s = 0;
  for (int r = 0; r < n; ++r)
    s += static_cast<double>(c.round_traffic(d, n, r, false).bytes_sent);
  return s;
}
double ring_bytes(std::uint64_t d, int n) {
  double s = 0;
  for (int r = 0; r < n; ++r)
    s += static_cast<double>(comm::ring_all_reduce_traffic(d, sizeof(float), n, r).bytes_sent);
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

} // namespace

TEST_CASE("a -fit code's name round-trips; bad fits and the parts it picks itself are refused") {
  for (const char* name :
       {"topk-0.01-fit100", "topk-0.01-c4096-b0.95-fit100", "topk-0.03-c64-fit1", "topk-0.5-fit2.5"}) {
    CAPTURE(name);
    const auto c = diloco_code::parse(name);
    CHECK(c.fit >= 1.0);
    CHECK(c.name() == name);
    CHECK_FALSE(c.gathered());
  }
  CHECK(diloco_code::parse("topk-0.01-c4096-fit100").unit() == 4096);
  for (const char* bad :
       {"topk-0.01-fit0", "topk-0.01-fit0.5", "topk-0.01-fit-1", "topk-0.01-fitnan", "topk-0.01-fitinf",
        "topk-0.01-fit", "topk-0.01-fit1e400", "topk-0.01-2bit-fit10", "topk-0.01-fit10-senders",
        "topk-0.01-fit10-regions", "topk-0.01-shared-fit10", "topk-0.01-fit10-fit10"}) {
    CAPTURE(bad);
    try {
      (void)diloco_code::parse(bad);
      FAIL("parsed");
    } catch (const invalid_argument& e) {
      const std::string what = e.what();
      CHECK(what.find(std::string("'compression' = '") + bad + "'") != std::string::npos);
      CHECK(what.find("a fit of at least 1") != std::string::npos);
    }
  }
  // Its message and round are those of its choice, which the whole model's size makes, not a fragment's.
  CHECK_THROWS_AS((void)diloco_code::parse("topk-0.01-fit10").message_bytes(1000), invalid_argument);
  CHECK_THROWS_AS((void)diloco_code::parse("topk-0.01-fit10").round_traffic(1000, 4, 0, false),
                  invalid_argument);
}

TEST_CASE(
    "the choice: within the budget, the gathered code whenever it fits, a refusal only when neither does") {
  std::mt19937_64 rng(55);
  int gathered = 0, regions = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::uint64_t d = std::uniform_int_distribution<std::uint64_t>(1, 3'000'000)(rng);
    const int n = std::uniform_int_distribution<int>(1, 40)(rng);
    const double density = std::uniform_real_distribution<double>(1e-4, 0.2)(rng);
    const std::uint64_t chunk =
        (rng() & 1) ? 0 : std::uint64_t{1} << std::uniform_int_distribution<int>(4, 16)(rng);
    const double fit = std::uniform_real_distribution<double>(1.0, 400.0)(rng);
    diloco_code c{sync::diloco_format::top_k, density, chunk};
    c.decay = 0.95;
    c.fit = fit;
    CAPTURE(c.name());
    CAPTURE(d);
    CAPTURE(n);
    diloco_code g = c, s = c;
    g.fit = s.fit = 0;
    g.two_bit = g.sender_mean = true;
    s.regions = true;
    const double ring = ring_bytes(d, n);
    const bool g_fits = round_bytes(g, d, n) * fit <= ring, s_fits = round_bytes(s, d, n) * fit <= ring;
    try {
      const auto got = c.chosen(d, n);
      CHECK(got.fit == 0.0);
      CHECK(round_bytes(got, d, n) * fit <= ring);
      if (got.regions) {
        CHECK_FALSE(g_fits);
        CHECK(got.name() == s.name());
        ++regions;
      } else {
        CHECK(got.name() == g.name());
        ++gathered;
      }
    } catch (const invalid_argument& e) {
      CHECK_FALSE(g_fits);
      CHECK_FALSE(s_fits);
      CHECK(std::string(e.what()).find("the allowed fit here is at most") != std::string::npos);
      ++refused;
    }
    CHECK(g.chosen(d, n).name() == g.name()); // any other code is its own choice
  }
  // The draw reaches every outcome.
  CHECK(gathered > 100);
  CHECK(regions > 30);
  CHECK(refused > 100);
}

TEST_CASE("the choice leaves the gathered code once, as n grows, and never returns to it") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    const std::uint64_t d = std::uniform_int_distribution<std::uint64_t>(10'000, 3'000'000)(rng);
    diloco_code c{sync::diloco_format::top_k, std::uniform_real_distribution<double>(0.002, 0.05)(rng), 4096};
    c.fit = std::uniform_real_distribution<double>(2.0, 120.0)(rng);
    CAPTURE(c.name());
    CAPTURE(d);
    bool left = false;
    for (int n = 1; n <= 64; ++n) {
      CAPTURE(n);
      try {
        const bool g = !c.chosen(d, n).regions;
        CHECK_FALSE((left && g));
        left = left || !g;
      } catch (const invalid_argument&) {
        left = true;
      }
    }
  }
}

TEST_CASE(
    "at the 2.7 M model's size, a budget of 100x takes the gathered 1 % up to 4 replicas, regions past") {
  // 2,743,296 values, top-k 1 % in chunks of 4096: the gathered code sends 108.1x fewer bytes than float32's
  // ring at 4 replicas and 86.4x at 5 (bench/results/diloco-sparse-large-n-2026-12-01.md); the region sums
  // about 114x at any n.
  const auto c = diloco_code::parse("topk-0.01-c4096-b0.95-fit100");
  const std::uint64_t d = 2743296;
  for (int n = 1; n <= 4; ++n)
    CHECK(c.chosen(d, n).name() == "topk-0.01-c4096-2bit-b0.95-senders");
  for (int n = 5; n <= 64; ++n)
    CHECK(c.chosen(d, n).name() == "topk-0.01-c4096-b0.95-regions");
  try {
    (void)diloco_code::parse("topk-0.01-c4096-b0.95-fit200").chosen(d, 8);
    FAIL("a fit of 200 was met");
  } catch (const invalid_argument& e) {
    const std::string what = e.what();
    CHECK(what.find("'compression' = 'topk-0.01-c4096-b0.95-fit200'") != std::string::npos);
    CHECK(what.find("over 8 ranks of 2743296 values") != std::string::npos);
    CHECK(what.find("the allowed fit here is at most 113.") != std::string::npos);
  }
}

TEST_CASE("coded_diloco of a -fit code is the engine of its choice, bit for bit and byte for byte") {
  const toy::least_squares prob({.samples = 240, .dim = 34, .seed = 5});
  const std::vector<std::size_t> layers = {5, 17, 3, 9};
  const sync::diloco_options o{.lr = 0.05f, .sync_every = 3, .fragments = 2, .delay = 1};
  const auto fit = diloco_code::parse("topk-0.3-c4-b0.95-fit1.2");
  std::vector<std::string> chose;
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    const auto want = fit.chosen(34, n);
    chose.push_back(want.name());
    const int steps = 13;
    auto run = [&](const diloco_code& code) {
      return toy::train_ranks(prob, n, steps, [&](comm::local& c) {
        sync::coded_diloco<comm::local> s(c, layers, o, code);
        CHECK(s.code().name() == want.name());
        return s;
      });
    };
    const auto got = run(fit), ref = run(want);
    for (std::size_t r = 0; r < got.size(); ++r)
      CHECK(same_bits(got[r], ref[r]));
    // What each rank's rounds put on the wire, every collective as the point-to-point messages it sends.
    auto wire = [&](const diloco_code& code) {
      std::vector<std::uint64_t> sent(static_cast<std::size_t>(n));
      comm::local_group(n).run([&](comm::local& base) {
        comm::over_messages<comm::metered<comm::local>> c{comm::metered<comm::local>(base)};
        sync::coded_diloco<comm::over_messages<comm::metered<comm::local>>> s(c, layers, o, code);
        std::vector<float> x(prob.dim(), 0.0f), g(x.size());
        s.start(x);
        const auto broadcast = c.inner().counters().total().bytes_sent;
        for (int t = 0; t < steps; ++t) {
          prob.gradient(x, prob.batch(c.rank(), n, t, 8), g);
          s.step(x, g);
        }
        s.finish(x);
        sent[static_cast<std::size_t>(c.rank())] = c.inner().counters().total().bytes_sent - broadcast;
        CHECK(s.bytes_sent() == sent[static_cast<std::size_t>(c.rank())]);
      });
      return sent;
    };
    CHECK(wire(fit) == wire(want));
  }
  // This toy reaches every outcome (its 34 values make the verdicts a large part of a round): gathered on 1
  // and 2 ranks, the region sums on 3, and on 4 neither meets 1.2x, which every rank refuses as it is built.
  CHECK(chose[1] == "topk-0.3-c4-2bit-b0.95-senders");
  CHECK(chose[2] == "topk-0.3-c4-b0.95-regions");
  CHECK_THROWS_AS(
      comm::local_group(4).run([&](comm::local& c) { sync::coded_diloco<comm::local> s(c, layers, o, fit); }),
      invalid_argument);
}

TEST_CASE("a -fit engine's checkpoint is its choice's: it resumes alike, and the other choice refuses it") {
  const std::vector<std::size_t> layers = {5, 17, 3, 9};
  const sync::diloco_options o{.lr = 0.05f, .sync_every = 3, .fragments = 2};
  const auto fit = diloco_code::parse("topk-0.3-c4-b0.95-fit1.2");
  const int n = 2;
  REQUIRE_FALSE(fit.chosen(34, n).regions);
  comm::local_group(n).run([&](comm::local& c) {
    std::vector<float> x(34);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = 0.01f * static_cast<float>(i) * static_cast<float>(c.rank() + 1);
    sync::coded_diloco<comm::local> a(c, layers, o, fit);
    a.start(x);
    for (int t = 0; t < 4; ++t) {
      for (auto& v : x)
        v -= 0.001f * static_cast<float>(c.rank() + 1 + t);
      a.advance(x);
    }
    const auto blob = ckpt::save_bytes(a);
    const auto model = x;
    sync::coded_diloco<comm::local> b(c, layers, o, fit);
    ckpt::load_bytes(b, blob);
    auto y = model;
    b.start(y);
    for (int t = 0; t < 5; ++t) {
      for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] += 0.002f * static_cast<float>(i % 3);
        y[i] += 0.002f * static_cast<float>(i % 3);
      }
      a.advance(x);
      b.advance(y);
    }
    CHECK(same_bits(x, y));
    sync::coded_diloco<comm::local> regions(c, layers, o, diloco_code::parse("topk-0.3-c4-b0.95-regions"));
    CHECK_THROWS_AS(ckpt::load_bytes(regions, blob), commsgd::error);
  });
}
