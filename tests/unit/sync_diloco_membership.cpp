// The DiLoCo engine under a changing membership (sync/diloco.hpp): an exchange that fails because a peer left
// changes nothing of the outer state on the ranks that remain, for every code; rebind() moves the engine onto
// the group of the survivors, whose next round is the mean over them alone; rebind() with an exchange in
// flight is refused; set_weight() weighs each rank in the mean.
#include <commsgd/comm/local.hpp>
#include <commsgd/sync/coded_diloco.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

using namespace commsgd;

namespace {

const std::vector<std::size_t> layers = {7, 33, 4};
constexpr std::size_t total = 44;
// fp16 and bf16 are left out: their ring runs over point-to-point messages, and on comm::local, which has no
// deadline, the survivor that waits on the other survivor (not on the rank that left) would wait for ever.
// Over a transport with a timeout (gloo, MPI with set_timeout) that wait fails too.
const char* const codes[] = {"dense", "int8", "e3m0", "topk-0.25", "topk-0.3-c8-2bit-b0.9"};

std::string saved(const sync::coded_diloco<comm::local>& e) {
  std::ostringstream os(std::ios::binary);
  e.save(os, state::part::all);
  return std::move(os).str();
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// An inner step of a rank: a random walk of its own, so that the ranks' pseudo-gradients differ.
void walk(std::vector<float>& x, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 0.01f);
  for (auto& v : x)
    v += n(rng);
}

} // namespace

TEST_CASE(
    "a peer that leaves mid-round fails the exchange with nothing changed; the survivors rebind and go on") {
  for (const char* code : codes)
    for (unsigned seed : {1u, 2u, 3u}) {
      CAPTURE(code);
      CAPTURE(seed);
      const int H = 3;
      std::vector<std::vector<float>> after(2); // the survivors' global models at the end
      std::vector<double> expected_gap(2);      // max |survivors' round - reference| per rank
      comm::local_group(3).run([&](comm::local& c) {
        // The survivors' group, made while everyone is there (a split is collective).
        comm::local two = c.split(c.rank() < 2 ? 0 : 1, c.rank());
        const sync::diloco_options o{.sync_every = H, .outer = {.lr = 0.8f, .momentum = 0.5f}};
        sync::coded_diloco<comm::local> e(c, layers, o, sync::diloco_code::parse(code));
        std::mt19937 rng(seed * 17u + static_cast<unsigned>(c.rank()));
        std::vector<float> x(total);
        for (std::size_t i = 0; i < total; ++i)
          x[i] = std::sin(static_cast<float>(i + seed));
        e.start(x);
        for (int s = 0; s < H; ++s) { // one whole round over the three ranks
          walk(x, rng);
          e.advance(x);
        }
        REQUIRE(e.exchanges_applied() == 1);
        if (c.rank() == 2) return; // leaves before the second round's exchange
        for (int s = 0; s < H - 1; ++s) {
          walk(x, rng);
          e.advance(x);
        }
        walk(x, rng);
        const auto before = saved(e);
        const auto local_before = x;
        CHECK_THROWS_AS(e.advance(x), comm_error);
        CHECK(e.steps() == 2 * H);
        CHECK(e.exchanges_applied() == 1);
        CHECK(x == local_before); // the local model keeps the round's steps
        // The outer state (common model, momentum, residuals) bit for bit; the step count moved on.
        sync::coded_diloco<comm::local> probe(c, layers, o, sync::diloco_code::parse(code));
        std::istringstream is(before, std::ios::binary);
        probe.load(is);
        for (std::size_t p = 0; p < e.num_fragments(); ++p) {
          CHECK(same_bits(e.global_model(p), probe.global_model(p)));
          CHECK(same_bits(e.residual(p), probe.residual(p)));
          CHECK(same_bits(e.outer_velocity(p), probe.outer_velocity(p)));
        }
        // On the survivors' group: the next round is theirs alone, and they agree on its bits.
        e.rebind(two);
        for (int s = 0; s < H; ++s) {
          walk(x, rng);
          e.advance(x);
        }
        CHECK(e.exchanges_applied() == 2);
        const auto g = e.global_model(0);
        after[static_cast<std::size_t>(c.rank())].assign(g.begin(), g.end());
      });
      CHECK(after[0] == after[1]);
      CHECK(!after[0].empty());
    }
}

TEST_CASE("rebind() is refused while an exchange is in flight, and allowed once it is applied") {
  comm::local_group(2).run([&](comm::local& c) {
    comm::local same = c.split(0, c.rank());
    const sync::diloco_options o{.sync_every = 4, .delay = 2};
    sync::coded_diloco<comm::local> e(c, layers, o, sync::diloco_code::parse("dense"));
    std::vector<float> x(total, 1.0f);
    e.start(x);
    for (int s = 0; s < 4; ++s)
      e.advance(x);
    REQUIRE(e.in_flight(0));
    CHECK_THROWS_WITH_AS(e.rebind(same), doctest::Contains("in flight"), invalid_argument);
    e.advance(x);
    e.advance(x);
    REQUIRE(!e.in_flight(0));
    CHECK_NOTHROW(e.rebind(same));
    for (int s = 0; s < 4; ++s)
      e.advance(x);
    e.drain();
  });
}

TEST_CASE("set_weight: the outer step takes the mean weighted by each rank's weight, for every code") {
  // Rank r moves every value by -d_r in one inner step (a pseudo-gradient of d_r), weighted w_r; plain outer
  // SGD (lr 1, no momentum) then moves the common model by -(w0 d0 + w1 d1) / 2. Every weighted value is a
  // power of two, which every code carries exactly, so the model is checked bit for bit.
  const float d[2] = {0.5f, 0.25f}, w[2] = {2.0f, 0.5f};          // unweighted: 0.625
  const float expect = 1.0f - (w[0] * d[0] + w[1] * d[1]) / 2.0f; // 0.4375
  for (const char* code : {"dense", "int8", "e3m0", "topk-1"}) {
    CAPTURE(code);
    comm::local_group(2).run([&](comm::local& c) {
      const sync::diloco_options o{.sync_every = 1, .outer = {.lr = 1.0f, .momentum = 0.0f}};
      sync::coded_diloco<comm::local> e(c, layers, o, sync::diloco_code::parse(code));
      CHECK(e.weight() == 1.0f);
      std::vector<float> x(total, 1.0f);
      e.start(x);
      e.set_weight(w[c.rank()]);
      for (auto& v : x)
        v -= d[c.rank()];
      e.advance(x);
      for (float g : e.global_model(0))
        CHECK(g == expect);
      // The weight stays until it is set again; 1 is the plain mean.
      CHECK(e.weight() == w[c.rank()]);
      e.set_weight(1.0f);
      const std::vector<float> before(e.global_model(0).begin(), e.global_model(0).end());
      for (auto& v : x)
        v -= d[c.rank()];
      e.advance(x);
      for (std::size_t i = 0; i < total; ++i)
        CHECK(e.global_model(0)[i] == before[i] - (d[0] + d[1]) / 2.0f);
    });
  }
  // Out of [0, n] or not a number: refused, naming the argument, with the weight as it was.
  comm::local_group(2).run([&](comm::local& c) {
    sync::coded_diloco<comm::local> e(c, layers, {}, sync::diloco_code::parse("dense"));
    for (float bad :
         {-0.5f, 2.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS(e.set_weight(bad), doctest::Contains("argument 'weight'"), invalid_argument);
    }
    CHECK(e.weight() == 1.0f);
    CHECK_NOTHROW(e.set_weight(0.0f));
    CHECK_NOTHROW(e.set_weight(2.0f));
  });
}
