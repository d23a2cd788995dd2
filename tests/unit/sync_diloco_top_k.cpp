// compress::top_k_ef, DiLoCo's top-k pseudo-gradients with error feedback: the selection (the k largest
// magnitudes of each chunk, ties to the lowest index), conservation (sent + new residual == decayed old
// residual + input, exactly) with float and 2-bit values, whole or chunked, with and without decay, the same sum and model on every rank, density 1 against uncompressed DiLoCo,
// the bytes the meter counts, the residual through a checkpoint, and the refusals.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/select/chunked.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/select/radix.hpp>
#include <commsgd/sync/diloco.hpp>
#include <support/compressor_ranks.hpp>
#include <support/forwarding_comm.hpp>
#include <support/least_squares.hpp>
#include <support/top_k_cases.hpp>
#include <support/train_ranks.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

// DiLoCo's engine over one layer of the problem's size, its pseudo-gradients in top-k with selector S.
template <class S = select::exact>
sync::diloco<local, compress::top_k_ef<S>> top_k_diloco(local& c, std::size_t dim, sync::diloco_options o,
                                                        compress::top_k_ef_options t) {
  return {c, {dim}, o, [t](std::size_t d) { return compress::top_k_ef<S>(d, t); }};
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

using toy::decoded;

// The indices of the k largest |p_i| of each chunk of `chunk` values (0: one chunk), k = ceil(density * its
// length) at least 1, ties to the lowest index: a stable sort, independent of the selectors and of cost/.
std::vector<std::size_t> reference_top(const std::vector<float>& p, std::size_t chunk, double density) {
  std::vector<std::size_t> out;
  const std::size_t size = chunk == 0 ? p.size() : chunk;
  for (std::size_t first = 0; first < p.size(); first += size) {
    const std::size_t len = std::min(size, p.size() - first);
    std::vector<std::size_t> order(len);
    std::iota(order.begin(), order.end(), first);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return std::fabs(p[a]) > std::fabs(p[b]); });
    const double want = std::ceil(density * static_cast<double>(len) - 1e-9);
    order.resize(std::clamp<std::size_t>(static_cast<std::size_t>(want), 1, len));
    std::sort(order.begin(), order.end());
    out.insert(out.end(), order.begin(), order.end());
  }
  return out;
}

// Inputs that stress the selection: random magnitudes up to 1, runs of ties, +0 and -0.
std::vector<float> awkward(std::mt19937& rng, std::size_t d, int round) {
  return top_k_cases::awkward(rng, d, round, 1.0f);
}

// Rounds of `x` on awkward inputs; returns the first failure, empty when every round holds:
//   conservation  d + e' + r' == p as real numbers, p = g + decay e (+ decay r) as error_feedback forms it
//                 (double holds
//                 e' + r' exactly, and the sum with d is p, a float, so no rounding can hide a loss)
//   selection     exactly the reference's k indices carry a value; without two_bit they carry p_i itself
//                 and the residual keeps p_i bit for bit everywhere else (signed zeros included)
template <class X>
std::string conserves(X x, int seed, std::size_t d) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  const bool two_bit = x.options().two_bit;
  const float decay = x.options().decay;
  for (int round = 0; round < 5; ++round) {
    const auto g = awkward(rng, d, round);
    const std::vector<float> e(x.residual().begin(), x.residual().end());
    const std::vector<float> r(x.residual_low().begin(), x.residual_low().end());
    std::vector<float> p(d);
    for (std::size_t i = 0; i < d; ++i) {
      const float s = decay == 1.0f ? g[i] + e[i] : g[i] + decay * e[i];
      const float low = decay == 1.0f ? r[i] : decay * r[i];
      p[i] = low == 0.0f ? s : s + low;
    }
    const auto top = reference_top(p, x.options().chunk, x.options().density);
    if (top.size() != x.k())
      return "k " + std::to_string(x.k()) + " != the reference's " + std::to_string(top.size());
    const auto out = decoded(x, g);
    auto fail = [&](std::size_t i, const std::string& what) {
      return "round " + std::to_string(round) + " index " + std::to_string(i) + ": " + what;
    };
    std::size_t next = 0;
    for (std::size_t i = 0; i < d; ++i) {
      const double total = static_cast<double>(out[i]) +
                           (static_cast<double>(x.residual()[i]) + static_cast<double>(x.residual_low()[i]));
      if (total != static_cast<double>(p[i]))
        return fail(i, "sent + residual " + std::to_string(total) + " != " + std::to_string(p[i]));
      const bool chosen = next < top.size() && top[next] == i;
      next += chosen;
      if (!chosen && !(out[i] == 0.0f && !std::signbit(out[i])))
        return fail(i, "not among the k largest, yet sent " + std::to_string(out[i]));
      if (two_bit) continue;
      if (chosen && out[i] != p[i]) return fail(i, "sent " + std::to_string(out[i]) + ", not p");
      if (!chosen && !same_bits(std::span(&x.residual()[i], 1), std::span(&p[i], 1)))
        return fail(i, "the residual is not p bit for bit");
      if (x.residual_low()[i] != 0.0f) return fail(i, "a float subtraction was inexact");
    }
  }
  return {};
}

// laplace_bisect as an exact code may use it: warm-started, trimmed to exactly k.
select::laplace_bisect warm_exact() {
  select::laplace_bisect::options o;
  o.trim = true;
  o.warm_start = true;
  return select::laplace_bisect(o);
}

// The ranks of two whose round refused top_k_ef's built with options(rank) as ranks that disagree.
template <class Options>
int disagreements(Options options) {
  std::mutex mu;
  int refusals = 0;
  local_group(2).run([&](local& c) {
    compress::top_k_ef<> x(10, options(c.rank()));
    std::vector<float> g(10, 1.0f), out(10);
    try {
      x.reduce(c, g, out);
    } catch (const invalid_argument& e) {
      if (std::string(e.what()).find("disagree") != std::string::npos) {
        std::lock_guard lock(mu);
        ++refusals;
      }
    }
  });
  return refusals;
}

const toy::least_squares& problem() {
  static const toy::least_squares prob({.samples = 256, .dim = 23, .seed = 12});
  return prob;
}

} // namespace

TEST_CASE("top_k_ef sends the k largest magnitudes, ties to the lowest index, and keeps the rest") {
  compress::top_k_ef<> x(6, {.density = 0.5});
  CHECK(x.k() == 3);
  const auto out = decoded(x, {0.5f, -2.0f, 0.5f, -0.5f, 1.0f, 0.0f});
  CHECK(out == std::vector<float>{0.5f, -2.0f, 0.0f, 0.0f, 1.0f, 0.0f}); // of three 0.5s, index 0 is sent
  CHECK(std::vector<float>(x.residual().begin(), x.residual().end()) ==
        std::vector<float>{0.0f, 0.0f, 0.5f, -0.5f, 0.0f, 0.0f});
  // The Python twin's k: ceil(density d - 1e-9), at least 1.
  CHECK(compress::top_k_ef_count(100, 0.07) == 7);
  CHECK(compress::top_k_ef_count(100, 0.001) == 1);
  CHECK(compress::top_k_ef_count(7, 1.0) == 7);
  CHECK(compress::top_k_ef_count(0, 0.5) == 0);
  // Ten values in one chunk: indices in 4 bits. In chunks of 4: 3 chunks, 2 bits an index.
  CHECK(compress::top_k_ef<>::message_bytes(10, {.density = 1.0}) == 40 + 5);
  CHECK(compress::top_k_ef<>::message_bytes(10, {.density = 1.0, .two_bit = true}) == 4 + 3 + 5);
  CHECK(compress::top_k_ef<>::message_bytes(10, {.density = 0.5, .two_bit = true, .chunk = 4}) ==
        3 * 4 + 2 + 2); // k = 2 + 2 + 1: three scales, ten bits of codes, ten bits of indices
  // SparseLoCo's shape: chunks of 4096, 41 values each at 1 %, 12-bit indices.
  CHECK(compress::top_k_ef<>::message_bytes(8192, {.density = 0.01, .two_bit = true, .chunk = 4096}) ==
        8 + (2 * 82 + 7) / 8 + (12 * 82 + 7) / 8);
}

TEST_CASE("2-bit values: the sign and half or one and a half times the mean magnitude of the message") {
  compress::top_k_ef<> x(5, {.density = 0.6, .two_bit = true});
  // Sent: 3, -2, -1 (mean magnitude 2): 3 >= 2 -> 3, -1 < 2 -> -1, -2 >= 2 -> -3.
  const auto out = decoded(x, {3.0f, -1.0f, 0.5f, -2.0f, 0.0f});
  CHECK(out == std::vector<float>{3.0f, -1.0f, 0.0f, -3.0f, 0.0f});
  CHECK(std::vector<float>(x.residual().begin(), x.residual().end()) ==
        std::vector<float>{0.0f, 0.0f, 0.5f, 1.0f, 0.0f});
  // A message of zeros has scale 0: everything decodes to zero, and nothing is lost.
  compress::top_k_ef<> z(3, {.density = 1.0, .two_bit = true});
  CHECK(decoded(z, {0.0f, -0.0f, 0.0f}) == std::vector<float>{0.0f, 0.0f, 0.0f});
  // The largest magnitudes decode to a finite value, 1.5 times the mean clamped to the largest float.
  const float big = std::numeric_limits<float>::max();
  CHECK(compress::two_bit_code::decode(compress::two_bit_code::encode(-big, big), big) == -big);
}

// One rank and a few hundred values (no selector thread starts): ThreadSanitizer's run leaves it out.
TEST_CASE("top_k_ef conserves every value with its residual, with float and 2-bit values, exact and radix" *
          doctest::test_suite("single_thread")) {
  for (std::size_t d : {0u, 1u, 2u, 7u, 33u, 257u})
    for (double density : {0.01, 0.1, 0.37, 0.5, 1.0})
      for (const bool two_bit : {false, true})
        for (int seed = 0; seed < 8; ++seed) {
          CAPTURE(d);
          CAPTURE(density);
          CAPTURE(two_bit);
          CAPTURE(seed);
          const compress::top_k_ef_options o{.density = density, .two_bit = two_bit};
          const auto a = conserves(compress::top_k_ef<>(d, o), seed, d);
          CHECK_MESSAGE(a.empty(), "exact: " << a);
          const auto b = conserves(compress::top_k_ef<select::radix>(d, o), seed, d);
          CHECK_MESSAGE(b.empty(), "radix: " << b);
          const auto m = conserves(compress::top_k_ef<select::chunked>(d, o), seed, d);
          CHECK_MESSAGE(m.empty(), "chunked: " << m);
        }
}

TEST_CASE(
    "chunked top-k with a decayed residual: each chunk's own k largest, and nothing lost but the decay" *
    doctest::test_suite("single_thread")) {
  // Chunks of 1 (every value sent), chunks that do and do not divide d, one chunk larger than d; decay 1,
  // SparseLoCo's 0.95, an awkward 0.3 and 0 (no error feedback at all). (d, chunk) pairs rather than every
  // combination: each chunk is a selector call, and a thousand chunks of one value prove nothing five don't.
  const std::pair<std::size_t, std::size_t> shapes[] = {
      {0, 3}, {1, 1}, {5, 1}, {5, 3}, {64, 3}, {64, 16}, {257, 16}, {257, 64}, {500, 64}, {500, 4096}};
  for (const auto& [d, chunk] : shapes)
    for (double density : {0.01, 0.2, 1.0})
      for (float decay : {1.0f, 0.95f, 0.3f, 0.0f})
        for (const bool two_bit : {false, true})
          for (int seed = 0; seed < 1; ++seed) {
            CAPTURE(d);
            CAPTURE(chunk);
            CAPTURE(density);
            CAPTURE(decay);
            CAPTURE(two_bit);
            CAPTURE(seed);
            const compress::top_k_ef_options o{
                .density = density, .two_bit = two_bit, .chunk = chunk, .decay = decay};
            const auto a = conserves(compress::top_k_ef<select::radix>(d, o), seed, d);
            CHECK_MESSAGE(a.empty(), a);
            // Warm-started from each chunk's last threshold, trimmed to exactly k: the same set whatever the
            // start (the rounds alternate between two scales a hundred times apart, so it is often wrong).
            const auto w = conserves(compress::top_k_ef<select::laplace_bisect>(d, o, warm_exact()), seed, d);
            CHECK_MESSAGE(w.empty(), "laplace_bisect, trimmed: " << w);
            // Every chunk in one call, each warm-started from its own last threshold (DiLoCo's codes); with
            // options.small = 8 the longer chunks go to laplace_bisect inside it.
            const auto m = conserves(compress::top_k_ef<select::chunked>(d, o), seed, d);
            CHECK_MESSAGE(m.empty(), "chunked: " << m);
            const auto l =
                conserves(compress::top_k_ef<select::chunked>(d, o, select::chunked({.small = 8})), seed, d);
            CHECK_MESSAGE(l.empty(), "chunked, small = 8: " << l);
          }
  // A decay of 0 keeps nothing of the last round: the second round sends as if the first had not been.
  compress::top_k_ef<> x(4, {.density = 0.25, .decay = 0.0f});
  CHECK(decoded(x, {1.0f, 0.5f, 0.0f, 0.0f}) == std::vector<float>{1.0f, 0.0f, 0.0f, 0.0f});
  CHECK(decoded(x, {0.0f, 0.0f, 0.25f, 0.0f}) == std::vector<float>{0.0f, 0.0f, 0.25f, 0.0f});
  // Per chunk: two chunks of 3 send one value each, though both of the largest are in the first.
  compress::top_k_ef<> y(6, {.density = 0.3, .chunk = 3});
  CHECK(decoded(y, {4.0f, -5.0f, 0.0f, 1.0f, 0.0f, -0.5f}) ==
        std::vector<float>{0.0f, -5.0f, 0.0f, 1.0f, 0.0f, 0.0f});
  // 2-bit values against each chunk's own scale: chunk 0's mean is 4, chunk 1's is 1.
  compress::top_k_ef<> z(4, {.density = 1.0, .two_bit = true, .chunk = 2});
  CHECK(decoded(z, {6.0f, -2.0f, 1.0f, -1.0f}) == std::vector<float>{6.0f, -2.0f, 1.5f, -1.5f});
}

TEST_CASE("chunked top-k refuses a chunk or decay out of range, and a non-finite input on every rank with "
          "nothing changed") {
  CHECK_THROWS_WITH_AS(compress::top_k_ef<>(10, {.decay = 1.5f}),
                       doctest::Contains("argument 'decay' = 1.5 is outside the allowed range [0, 1]"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(compress::top_k_ef<>(10, {.decay = std::numeric_limits<float>::quiet_NaN()}),
                       doctest::Contains("argument 'decay' = nan"), invalid_argument);
  CHECK_THROWS_WITH_AS(compress::top_k_ef<>(10, {.chunk = std::size_t{1} << 33}),
                       doctest::Contains("argument 'chunk' = 8589934592 is outside the allowed range"),
                       invalid_argument);
  // One rank's pseudo-gradient holds a NaN: every rank refuses, and every residual stays what it was.
  std::mutex mu;
  int refusals = 0, kept = 0;
  local_group(3).run([&](local& c) {
    compress::top_k_ef<select::radix> x(50, {.density = 0.1, .two_bit = true, .chunk = 16, .decay = 0.9f});
    std::vector<float> g(50), out(50);
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = std::sin(static_cast<float>(i + 3 * static_cast<std::size_t>(c.rank())));
    x.reduce(c, g, out);
    const std::vector<float> e(x.residual().begin(), x.residual().end());
    const std::vector<float> r(x.residual_low().begin(), x.residual_low().end());
    if (c.rank() == 1) g[17] = std::numeric_limits<float>::quiet_NaN();
    bool refused = false;
    try {
      x.reduce(c, g, out);
    } catch (const non_finite&) {
      refused = true;
    }
    std::lock_guard lock(mu);
    refusals += refused;
    kept += same_bits(x.residual(), e) && same_bits(x.residual_low(), r) && x.steps() == 1;
  });
  CHECK(refusals == 3);
  CHECK(kept == 3);
}

namespace {
// A local communicator whose message gather fails (comm_error on every rank, before anything moves) while
// *fail is set; the verdicts' gather goes through.
struct gather_fails : test_comm::forwarding<local> {
  const bool* fail;

  template <comm::transferable T>
  void all_gather(std::span<const T> m, std::span<T> a) {
    if constexpr (std::is_same_v<T, std::byte>)
      if (*fail) throw comm_error("the test's message gather fails");
    inner.all_gather(m, a);
  }
  gather_fails split(int color, int key) { return {{inner.split(color, key)}, fail}; }
};
static_assert(comm::communicator<gather_fails>);

// code() a stretch at a time from g, then the collective rest; the sum read back in its parts.
template <class X>
std::vector<float> coded_round(X& x, gather_fails& c, const std::vector<float>& g) {
  x.code([&](std::size_t first, std::size_t m) { return std::span<const float>(g).subspan(first, m); });
  x.reduce_coded(c);
  std::vector<float> sum(g.size()), scratch;
  x.for_each_sum_part(scratch, [&](std::size_t first, std::span<const float> part) {
    std::copy(part.begin(), part.end(), sum.begin() + static_cast<std::ptrdiff_t>(first));
  });
  return sum;
}
} // namespace

// code() selects each chunk and splits its new residual as the chunk is formed, before the round is agreed
// on: a round refused for a NaN late in the input (chunks before it selected and split already) or whose
// gather fails must leave the residual as it was, and the next round must be a twin's that never saw them.
TEST_CASE("top_k_ef coded in stretches: a refused or failed round changes nothing, the next is a twin's") {
  const std::size_t d = 10007;
  for (const compress::top_k_ef_options& o :
       {compress::top_k_ef_options{.density = 0.05, .two_bit = true, .chunk = 64, .decay = 0.9f},
        compress::top_k_ef_options{.density = 0.03, .chunk = 4096},
        compress::top_k_ef_options{.density = 0.02, .two_bit = true, .chunk = 1000, .decay = 0.95f},
        compress::top_k_ef_options{.density = 0.01}}) {
    CAPTURE(o.chunk);
    std::mutex mu;
    std::vector<std::string> failures;
    local_group(3).run([&](local& l) {
      bool fail = false;
      gather_fails c{{l}, &fail};
      compress::top_k_ef<select::chunked> x(d, o), twin(d, o);
      std::mt19937 rng(7u + static_cast<unsigned>(c.rank()));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::uniform_int_distribution<int> binade(-12, 12);
      // Magnitudes over 24 binades, so that p minus a 2-bit value is often inexact and low words are kept.
      const auto input = [&] {
        std::vector<float> g(d);
        for (auto& v : g)
          v = std::ldexp(normal(rng), binade(rng));
        return g;
      };
      auto complain = [&](const std::string& what) {
        std::lock_guard lock(mu);
        failures.push_back("rank " + std::to_string(c.rank()) + ": " + what);
      };
      const auto g0 = input();
      coded_round(x, c, g0);
      coded_round(twin, c, g0);
      const std::vector<float> e(x.residual().begin(), x.residual().end());
      const std::vector<float> r(x.residual_low().begin(), x.residual_low().end());
      auto bad = input();
      if (c.rank() == 1) bad[9001] = std::numeric_limits<float>::quiet_NaN();
      try {
        coded_round(x, c, bad);
        complain("a NaN was not refused");
      } catch (const non_finite&) {
      }
      fail = true;
      try {
        coded_round(x, c, input());
        complain("the failing gather did not throw");
      } catch (const comm_error&) {
      }
      fail = false;
      if (!same_bits(x.residual(), e) || !same_bits(x.residual_low(), r) || x.steps() != 1)
        complain("the residual or the step count moved");
      // (The first case keeps some; with 20 values of a 1,000 taken, those are all near the top binade.)
      if (o.chunk == 64 && std::all_of(r.begin(), r.end(), [](float v) { return v == 0.0f; }))
        complain("no low word was kept: the inputs do not test them");
      const auto g1 = input();
      if (!same_bits(coded_round(x, c, g1), coded_round(twin, c, g1))) complain("the next sum differs");
      if (!same_bits(x.residual(), twin.residual()) || !same_bits(x.residual_low(), twin.residual_low()))
        complain("the next residual differs");
    });
    CHECK(failures.empty());
    for (const auto& f : failures)
      FAIL_CHECK(f);
  }
}

TEST_CASE(
    "every rank sums the messages in rank order to the same bits; the meter counts verdict and message") {
  for (int n = 2; n <= 4; ++n)
    for (const bool two_bit : {false, true}) {
      CAPTURE(n);
      CAPTURE(two_bit);
      const std::size_t d = 301;
      const compress::top_k_ef_options o{.density = 0.05, .two_bit = two_bit};
      auto [sums, mine, sent, wire] = toy::reduce_on_ranks(n, d, [&] { return compress::top_k_ef<>(d, o); });
      std::vector<float> want(d, 0.0f);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < d; ++i)
          want[i] += mine[static_cast<std::size_t>(r)][i];
      CHECK(compress::top_k_ef<>(d, o).k() == 16); // ceil(0.05 * 301)
      const auto per_peer = 40 + compress::top_k_ef<>::message_bytes(d, o);
      for (int r = 0; r < n; ++r) {
        const auto ri = static_cast<std::size_t>(r);
        CHECK(same_bits(sums[ri], want));
        CHECK(sent[ri] == per_peer * static_cast<std::uint64_t>(n - 1));
        CHECK(wire[ri] == sent[ri]);
      }
    }
}

TEST_CASE("DiLoCo with top-k pseudo-gradients: every rank ends with the same model bits, and it trains") {
  const auto& prob = problem();
  const double start = prob.loss(std::vector<float>(prob.dim(), 0.0f));
  for (int n = 1; n <= 4; ++n)
    for (const bool two_bit : {false, true}) {
      CAPTURE(n);
      CAPTURE(two_bit);
      const auto got = toy::train_ranks(prob, n, 150, [&](local& c) {
        return top_k_diloco(c, prob.dim(),
                            {.lr = 0.1f, .sync_every = 5, .outer = {.lr = 0.7f, .momentum = 0.5f}},
                            {.density = 0.3, .two_bit = two_bit});
      });
      for (int r = 1; r < n; ++r)
        CHECK(same_bits(got[static_cast<std::size_t>(r)], got[0]));
      CHECK(prob.loss(got[0]) < 0.1 * start);
    }
}

TEST_CASE("density 1 without 2-bit values is uncompressed DiLoCo bit for bit; exact and radix agree") {
  // Bit for bit up to the sign of a zero: the compressor sums from +0, the all-reduce from rank 0's value,
  // so a sum of -0 alone would come out +0. The pseudo-gradients here hold no -0.
  const auto& prob = problem();
  for (int n = 1; n <= 4; ++n)
    for (const sync::outer_sgd_options o :
         {sync::outer_sgd_options{}, sync::outer_sgd_options{0.5f, 0.0f}, sync::outer_sgd_options{1.0f, 0.3f},
          sync::outer_sgd_options{1.0f, 0.0f}}) {
      CAPTURE(n);
      CAPTURE(o.lr);
      CAPTURE(o.momentum);
      const sync::diloco_options opt{.lr = 0.1f, .sync_every = 3, .outer = o};
      const auto plain =
          toy::train_ranks(prob, n, 31, [&](local& c) { return sync::diloco<local>(c, {prob.dim()}, opt); });
      const auto topk = toy::train_ranks(
          prob, n, 31, [&](local& c) { return top_k_diloco(c, prob.dim(), opt, {.density = 1.0}); });
      for (int r = 0; r < n; ++r)
        CHECK(same_bits(topk[static_cast<std::size_t>(r)], plain[static_cast<std::size_t>(r)]));
    }
  // A sparse run: the radix selector picks the same set as the exact one, so the models agree bit for bit.
  for (const bool two_bit : {false, true}) {
    CAPTURE(two_bit);
    const sync::diloco_options opt{.lr = 0.1f, .sync_every = 4};
    const compress::top_k_ef_options o{.density = 0.2, .two_bit = two_bit};
    const auto a =
        toy::train_ranks(prob, 3, 40, [&](local& c) { return top_k_diloco(c, prob.dim(), opt, o); });
    const auto b = toy::train_ranks(
        prob, 3, 40, [&](local& c) { return top_k_diloco<select::radix>(c, prob.dim(), opt, o); });
    for (std::size_t r = 0; r < 3; ++r)
      CHECK(same_bits(a[r], b[r]));
  }
}

TEST_CASE("DiLoCo's checkpoint keeps the top-k residual: a resumed run goes on bit for bit") {
  const auto& prob = problem();
  for (const bool two_bit : {false, true}) {
    CAPTURE(two_bit);
    const int n = 3, at = 13, total = 30;
    using S = sync::diloco<local, compress::top_k_ef<>>;
    auto make = [&](local& c) {
      return top_k_diloco(c, prob.dim(), {.lr = 0.1f, .sync_every = 4},
                          {.density = 0.25, .two_bit = two_bit});
    };
    std::mutex mu;
    std::vector<std::string> failures;
    local_group(n).run([&](local& c) {
      auto train = [&](S& s, std::vector<float>& x, int from, int to) {
        std::vector<float> g(prob.dim());
        for (int t = from; t < to; ++t) {
          prob.gradient(x, prob.batch(c.rank(), n, t, 8), g);
          s.step(x, g);
        }
      };
      auto s = make(c);
      std::vector<float> x(prob.dim(), 0.0f);
      s.start(x);
      train(s, x, 0, at);
      std::stringstream saved;
      s.save(saved);
      auto y = x;
      const std::vector<float> residual(s.compressor(0).residual().begin(), s.compressor(0).residual().end());
      train(s, x, at, total);
      auto t = make(c);
      t.load(saved);
      t.start(y);
      std::string f;
      if (std::all_of(residual.begin(), residual.end(), [](float v) { return v == 0.0f; }))
        f = "the residual was empty at the checkpoint, so the test proves nothing";
      if (!same_bits(t.compressor(0).residual(), residual)) f += " / the residual did not round-trip";
      train(t, y, at, total);
      if (!same_bits(x, y)) f += " / the resumed model differs";
      if (!f.empty()) {
        std::lock_guard lock(mu);
        failures.push_back("rank " + std::to_string(c.rank()) + ": " + f);
      }
    });
    for (const auto& f : failures)
      FAIL_CHECK(f);
  }
  // A state of another density or value width is refused, naming the field.
  compress::top_k_ef<> x(10, {.density = 0.3});
  decoded(x, std::vector<float>(10, 1.0f));
  std::stringstream a, b;
  x.save(a);
  x.save(b);
  compress::top_k_ef<> other_k(10, {.density = 0.5}), other_bits(10, {.density = 0.3, .two_bit = true});
  CHECK_THROWS_WITH_AS(other_k.load(a), doctest::Contains("k"), corrupt_data);
  CHECK_THROWS_WITH_AS(other_bits.load(b), doctest::Contains("two_bit"), corrupt_data);
}

TEST_CASE("top_k_ef's bad options and ranks that disagree are refused, naming the argument") {
  auto refused = [](double density, const char* needle) {
    CAPTURE(density);
    CHECK_THROWS_WITH_AS(compress::top_k_ef<>(10, {.density = density}), doctest::Contains(needle),
                         invalid_argument);
  };
  refused(0.0, "argument 'density' = 0 is outside the allowed range (0, 1]");
  refused(-0.5, "argument 'density' = -0.5 is outside the allowed range (0, 1]");
  refused(1.5, "argument 'density' = 1.5 is outside the allowed range (0, 1]");
  refused(std::numeric_limits<double>::quiet_NaN(), "argument 'density' = nan");
  refused(std::numeric_limits<double>::infinity(), "argument 'density' = inf");
  // A selector that may return more than k would make the ranks' messages differ in size.
  CHECK_THROWS_WITH_AS(compress::top_k_ef<select::laplace_bisect>(10, {}, select::laplace_bisect{}),
                       doctest::Contains("argument 'selector' = laplace_bisect does not select exactly k"),
                       invalid_argument);
  CHECK_NOTHROW(compress::top_k_ef<select::laplace_bisect>(10, {}, warm_exact()));
  // Ranks built with other densities would gather messages of other sizes: every rank refuses.
  CHECK(disagreements(
            [](int rank) { return compress::top_k_ef_options{.density = rank == 0 ? 0.3 : 0.5}; }) == 2);
}

TEST_CASE("sender_mean: each value of the sum scaled to n over the ranks that sent it; residuals unchanged") {
  // Three ranks, 6 values, k = 2 each: index 0 is sent by every rank, index 1 by ranks 0 and 1, index 4 by
  // rank 2 alone, and 2, 3, 5 by none (rank 1's 0.25 at index 5 is not among its two largest).
  const std::vector<std::vector<float>> g = {{4, 3, 0, 0, 0, 0}, {2, -5, 0, 0, 0, 0.25f}, {1, 0, 0, 0, 8, 0}};
  // Sum over the senders of each index, scaled by n / senders: the engine's mean over 3 is then over them.
  const std::vector<float> want = {4 + 2 + 1, (3 - 5) * 3.0f / 2.0f, 0, 0, 8 * 3.0f, 0};
  for (const bool two_bit : {false, true}) {
    CAPTURE(two_bit);
    comm::local_group(3).run([&](local& c) {
      const compress::top_k_ef_options o{.density = 2.0 / 6.0, .two_bit = two_bit, .sender_mean = true};
      compress::top_k_ef<> x(6, o), plain(6, {.density = 2.0 / 6.0, .two_bit = two_bit});
      std::vector<float> out(6), out_plain(6);
      const auto& mine = g[static_cast<std::size_t>(c.rank())];
      x.reduce(c, mine, out);
      plain.reduce(c, mine, out_plain);
      // The residuals do not depend on how the sum is taken.
      CHECK(same_bits(x.residual(), plain.residual()));
      CHECK(same_bits(x.residual_low(), plain.residual_low()));
      if (!two_bit) {
        CHECK(out == want);
      } else {
        // 2-bit values: each index's senders are those of the float case; a value every rank sent keeps its
        // plain sum's bits, one rank's is 3 times it, two ranks' 1.5 times.
        CHECK(same_bits(std::span(&out[0], 1), std::span(&out_plain[0], 1)));
        CHECK(out[1] == 1.5f * out_plain[1]);
        CHECK(out[4] == 3.0f * out_plain[4]);
        CHECK((out[2] == 0.0f && out[3] == 0.0f && out[5] == 0.0f));
      }
    });
  }
  // Ranks that take the sum differently would hold different models: every rank refuses.
  CHECK(disagreements([](int rank) {
          return compress::top_k_ef_options{.density = 0.3, .sender_mean = rank == 0};
        }) == 2);
}

namespace {

// comm::local whose gathered top-k messages arrive with rank 1's indices overwritten by `fill` (every rank
// receives the same damaged bytes, as from a corrupt peer).
struct damaged_indices : test_comm::forwarding<local> {
  std::size_t message_bytes, index_offset;
  std::byte fill;

  template <comm::transferable T>
  void all_gather(std::span<const T> m, std::span<T> a) {
    inner.all_gather(m, a);
    if constexpr (std::is_same_v<T, std::byte>)
      if (m.size() == message_bytes)
        std::fill(a.begin() + static_cast<std::ptrdiff_t>(message_bytes + index_offset),
                  a.begin() + static_cast<std::ptrdiff_t>(2 * message_bytes), fill);
  }
  damaged_indices split(int color, int key) {
    return {{inner.split(color, key)}, message_bytes, index_offset, fill};
  }
};
static_assert(comm::communicator<damaged_indices>);

} // namespace

TEST_CASE(
    "a gathered index outside its chunk, or not above the one before it, is corrupt_data on every rank") {
  // 60 values, k = 15 floats: 6-bit indices after 60 bytes of values. 0xff bytes: every index 63, outside the
  // chunk; zero bytes: every index 0, repeated.
  const std::size_t len = 60;
  const compress::top_k_ef_options o{.density = 0.25};
  const std::size_t bytes = compress::top_k_ef<>::message_bytes(len, o), k = 15;
  for (std::byte fill : {std::byte{0xff}, std::byte{0}}) {
    CAPTURE(static_cast<int>(fill));
    std::vector<int> refused(2, 0), kept(2, 0);
    local_group(2).run([&](local& c) {
      damaged_indices d{{c}, bytes, 4 * k, fill};
      compress::top_k_ef<> x(len, o);
      std::vector<float> g(len), out(len);
      std::mt19937 rng(static_cast<unsigned>(c.rank()));
      std::normal_distribution<float> nd;
      for (auto& v : g)
        v = nd(rng);
      x.reduce(c, std::span<const float>(g), std::span<float>(out)); // a residual to keep
      const std::vector<float> before(x.residual().begin(), x.residual().end());
      try {
        x.reduce(d, std::span<const float>(g), std::span<float>(out));
      } catch (const corrupt_data& e) {
        refused[static_cast<std::size_t>(c.rank())] =
            std::string(e.what()).find(fill == std::byte{0} ? "indices rise" : "outside [0, its length") !=
            std::string::npos;
      }
      kept[static_cast<std::size_t>(c.rank())] = same_bits(before, x.residual());
    });
    CHECK(refused == std::vector<int>{1, 1});
    CHECK(kept == std::vector<int>{1, 1});
  }
}
