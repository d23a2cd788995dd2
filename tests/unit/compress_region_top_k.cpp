// compress::region_top_k, Ok-Topk's region sums for DiLoCo: every rank's k largest of each chunk (values in
// bf16) summed by the chunk's owner, the means over the senders cut to the chunk's k largest and gathered,
// against a reference written from the definition on random inputs (n = 1..5, sizes 0, 1, odd, chunks and
// none, decay, ties, signed zeros, many rounds); conservation bit for bit (what a cut dropped back in the
// residual); the bytes the meter counts against cost/; bytes a rank flat in n; a checkpoint; the refusals.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/region_top_k.hpp>
#include <commsgd/cost/diloco.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <support/compressor_ranks.hpp>
#include <support/forwarding_comm.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The k largest |p_i| of chunk [first, first + len), k = ceil(density len - 1e-9) at least 1, ties to the
// lowest index, rising: a stable sort, independent of the selectors.
std::vector<std::size_t> reference_top(const std::vector<float>& p, std::size_t first, std::size_t len,
                                       double density) {
  std::vector<std::size_t> order(len);
  std::iota(order.begin(), order.end(), first);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return std::fabs(p[a]) > std::fabs(p[b]); });
  const double want = std::ceil(density * static_cast<double>(len) - 1e-9);
  order.resize(std::clamp<std::size_t>(static_cast<std::size_t>(want), 1, len));
  std::sort(order.begin(), order.end());
  return order;
}

// Random magnitudes, runs of ties of both signs, +0 and -0; rank and round change them.
std::vector<float> awkward(std::mt19937& rng, std::size_t d, int round) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 5);
  std::vector<float> g(d);
  for (auto& v : g) {
    switch (pick(rng)) {
    case 0:
      v = 0.0f;
      break;
    case 1:
      v = -0.0f;
      break;
    case 2:
      v = u(rng) < 0 ? -0.5f : 0.5f;
      break;
    default:
      v = (round % 2 ? 0.01f : 3.0f) * u(rng) * u(rng);
    }
  }
  return g;
}

float bf16_round(float x) {
  return compress::bf16_format::decode(compress::bf16_format::encode(x));
}

// The mean over the senders times n, as the engine's mean over n then gives the senders' mean: in double,
// rounded once; the sum as it is where every rank or none sent.
float over_senders(float sum, std::uint32_t senders, std::uint32_t n) {
  if (senders == 0 || senders == n) return sum;
  return static_cast<float>(static_cast<double>(sum) * n / senders);
}

struct case_ {
  int n;
  std::size_t d, chunk;
  double density;
  float decay;
};

// Rounds of region_top_k on n ranks against the definition; the first failure, empty when all hold.
std::string matches_reference(const case_& k, int seed, int rounds) {
  const auto n = static_cast<std::size_t>(k.n);
  // Every rank's state before and after each round, gathered by rank.
  std::vector<std::vector<std::vector<float>>> g(rounds, std::vector<std::vector<float>>(n)), e(g), low(g),
      out(g), e_after(g), low_after(g);
  std::vector<std::vector<std::uint64_t>> metered(rounds, std::vector<std::uint64_t>(n)), said(metered);
  std::mutex mu;
  local_group(k.n).run([&](local& base) {
    comm::metered c(base);
    const auto r = static_cast<std::size_t>(c.rank());
    std::mt19937 rng(static_cast<unsigned>(seed * 31 + c.rank()));
    compress::region_top_k<> x(k.d, {.density = k.density, .chunk = k.chunk, .decay = k.decay});
    for (int t = 0; t < rounds; ++t) {
      const auto gt = awkward(rng, k.d, t + c.rank());
      std::vector<float> sum(k.d, 7.0f);
      const std::vector<float> e0(x.residual().begin(), x.residual().end()),
          l0(x.residual_low().begin(), x.residual_low().end());
      const auto before = c.counters().total().bytes_sent;
      x.reduce(c, gt, sum);
      std::lock_guard lock(mu);
      g[t][r] = gt;
      e[t][r] = e0;
      low[t][r] = l0;
      out[t][r] = sum;
      e_after[t][r].assign(x.residual().begin(), x.residual().end());
      low_after[t][r].assign(x.residual_low().begin(), x.residual_low().end());
      metered[t][r] = c.counters().total().bytes_sent - before;
      said[t][r] = x.wire_bytes();
    }
  });
  const auto chunks = cost::top_k_chunks::of(k.d, k.chunk, k.density);
  for (int t = 0; t < rounds; ++t) {
    auto fail = [&](const std::string& what) { return "round " + std::to_string(t) + ": " + what; };
    // p as error feedback forms it.
    std::vector<std::vector<float>> p(n, std::vector<float>(k.d));
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t i = 0; i < k.d; ++i) {
        const float s = k.decay == 1.0f ? g[t][r][i] + e[t][r][i] : g[t][r][i] + k.decay * e[t][r][i];
        const float l = k.decay == 1.0f ? low[t][r][i] : k.decay * low[t][r][i];
        p[r][i] = l == 0.0f ? s : s + l;
      }
    // Every rank's picks (bf16 values), their sums and counts in rank order, the means over the senders.
    std::vector<std::vector<std::uint8_t>> picked(n, std::vector<std::uint8_t>(k.d, 0));
    std::vector<float> sums(k.d, 0.0f);
    std::vector<std::uint32_t> senders(k.d, 0);
    for (std::size_t r = 0; r < n; ++r)
      for (std::uint64_t j = 0; j < chunks.count; ++j)
        for (auto i : reference_top(p[r], static_cast<std::size_t>(chunks.first(j)),
                                    static_cast<std::size_t>(chunks.length(j)), k.density)) {
          picked[r][i] = 1;
          sums[i] += bf16_round(p[r][i]);
          ++senders[i];
        }
    std::vector<float> mean(k.d);
    for (std::size_t i = 0; i < k.d; ++i)
      mean[i] = over_senders(sums[i], senders[i], static_cast<std::uint32_t>(n));
    // Each chunk's cut: the k largest means, rounded to bf16.
    std::vector<float> want(k.d, 0.0f);
    std::vector<std::uint8_t> cut(k.d, 0);
    for (std::uint64_t j = 0; j < chunks.count; ++j)
      for (auto i : reference_top(mean, static_cast<std::size_t>(chunks.first(j)),
                                  static_cast<std::size_t>(chunks.length(j)), k.density)) {
        cut[i] = 1;
        want[i] = bf16_round(mean[i]);
      }
    for (std::size_t r = 0; r < n; ++r) {
      if (!same_bits(out[t][r], want))
        return fail("rank " + std::to_string(r) + "'s sum is not the reference's");
      for (std::size_t i = 0; i < k.d; ++i) {
        const bool shared = picked[r][i] && cut[i];
        const float sent = shared ? bf16_round(p[r][i]) : 0.0f;
        const double total = static_cast<double>(sent) + (static_cast<double>(e_after[t][r][i]) +
                                                          static_cast<double>(low_after[t][r][i]));
        if (total != static_cast<double>(p[r][i]))
          return fail("rank " + std::to_string(r) + " index " + std::to_string(i) + ": sent + residual " +
                      std::to_string(total) + " != p " + std::to_string(p[r][i]));
        if (!shared && !same_bits(std::span(&e_after[t][r][i], 1), std::span(&p[r][i], 1)))
          return fail("rank " + std::to_string(r) + " index " + std::to_string(i) +
                      ": the residual is not p");
      }
      const auto want_bytes = cost::region_top_k_traffic(chunks, k.n).bytes_sent;
      if (metered[t][r] != want_bytes || said[t][r] != want_bytes)
        return fail("rank " + std::to_string(r) + " sent " + std::to_string(metered[t][r]) + " bytes (says " +
                    std::to_string(said[t][r]) + "), cost/ " + std::to_string(want_bytes));
    }
  }
  return {};
}

} // namespace

TEST_CASE("region_top_k is its definition: each rank's picks, the owners' sums over the senders cut to k") {
  int cases = 0;
  for (int n : {1, 2, 3, 5})
    for (std::size_t d : {0u, 1u, 7u, 100u, 1001u})
      for (std::size_t chunk : {0u, 1u, 4u, 64u})
        for (double density : {0.05, 0.3, 1.0})
          for (float decay : {1.0f, 0.9f}) {
            if (chunk == 1 && density != 1.0) continue; // every chunk of one value sends it: once is enough
            const case_ k{n, d, chunk, density, decay};
            CAPTURE(n);
            CAPTURE(d);
            CAPTURE(chunk);
            CAPTURE(density);
            CAPTURE(decay);
            const auto why = matches_reference(k, cases, n == 5 ? 3 : 4);
            CHECK_MESSAGE(why.empty(), why);
            ++cases;
          }
  CHECK(cases > 100);
}

TEST_CASE("region_top_k with laplace_bisect warm and trimmed gives exact selection's bits") {
  select::laplace_bisect::options o;
  o.trim = true;
  o.warm_start = true;
  local_group(3).run([&](local& c) {
    compress::region_top_k<> a(5000, {.density = 0.02, .chunk = 512, .decay = 0.95f});
    compress::region_top_k<select::laplace_bisect> b(5000, {.density = 0.02, .chunk = 512, .decay = 0.95f},
                                                     select::laplace_bisect(o));
    std::mt19937 rng(static_cast<unsigned>(c.rank() + 3));
    std::normal_distribution<float> z;
    std::vector<float> g(5000), sa(5000), sb(5000);
    for (int t = 0; t < 8; ++t) {
      for (auto& v : g)
        v = z(rng) * (t % 3 == 0 ? 1e-3f : 1.0f);
      a.reduce(c, g, sa);
      b.reduce(c, g, sb);
      CHECK(same_bits(sa, sb));
      CHECK(same_bits(a.residual(), b.residual()));
    }
  });
}

TEST_CASE("region_top_k's bytes a rank: flat in n while the chunks are at least n, the gathered code's not") {
  // 120,576 values (the small byte model) in chunks of 4096 at 1 %: 30 chunks. A rank sends 40 (n - 1)
  // bytes of verdicts and (n - 1) blocks of about 3.5 k / n bytes each way: about 7 k + 40 n.
  const auto c = cost::top_k_chunks::of(120576, 4096, 0.01);
  auto bytes = [&](int n) { return cost::region_top_k_traffic(c, n).bytes_sent; };
  const double ring8 = static_cast<double>(comm::ring_all_reduce_traffic(120576, 4, 8, 0).bytes_sent);
  CHECK(static_cast<double>(bytes(8)) <= 1.25 * static_cast<double>(bytes(4)));
  CHECK(ring8 / static_cast<double>(bytes(8)) >= 100.0);
  CHECK(bytes(30) < 8 * c.k() + 40 * 30);
  const auto gathered = cost::diloco_code::parse("topk-0.01-c4096-2bit-senders");
  CHECK(gathered.round_traffic(120576, 8, 0, false).bytes_sent >
        2 * gathered.round_traffic(120576, 4, 0, false).bytes_sent);
}

TEST_CASE("region_top_k through a checkpoint: the residual comes back, other parameters are refused") {
  local_group(3).run([&](local& c) {
    const compress::region_top_k_options o{.density = 0.1, .chunk = 16, .decay = 0.9f};
    compress::region_top_k<> a(100, o);
    std::mt19937 rng(static_cast<unsigned>(c.rank()));
    std::vector<std::vector<float>> gs;
    for (int t = 0; t < 6; ++t)
      gs.push_back(awkward(rng, 100, t));
    std::vector<float> out(100), again(100);
    for (int t = 0; t < 2; ++t)
      a.reduce(c, gs[t], out);
    std::stringstream saved;
    a.save(saved);
    compress::region_top_k<> b(100, o);
    b.load(saved);
    CHECK(b.steps() == 2);
    for (int t = 2; t < 6; ++t) {
      a.reduce(c, gs[t], out);
      b.reduce(c, gs[t], again);
      CHECK(same_bits(out, again));
      CHECK(same_bits(a.residual(), b.residual()));
    }
    std::stringstream other;
    compress::region_top_k<> z(100, {.density = 0.2, .chunk = 16, .decay = 0.9f});
    z.save(other);
    CHECK_THROWS_AS(b.load(other), corrupt_data);
  });
}

TEST_CASE("region_top_k refuses bad options, bad input on any rank and ranks built differently") {
  CHECK_THROWS_AS(compress::region_top_k<>(10, {.density = 0.0}), invalid_argument);
  CHECK_THROWS_AS(compress::region_top_k<>(10, {.density = 0.1, .decay = 1.5f}), invalid_argument);
  CHECK_THROWS_AS(compress::region_top_k<>(10, {.density = 0.1, .chunk = std::size_t{1} << 33}),
                  invalid_argument);
  CHECK_THROWS_AS(compress::region_top_k<select::laplace_bisect>(10, {}, select::laplace_bisect()),
                  invalid_argument);
  for (const float bad : {std::nanf(""), INFINITY}) {
    std::mutex mu;
    int refused = 0;
    local_group(3).run([&](local& c) {
      compress::region_top_k<> x(10, {.density = 0.3});
      std::vector<float> g(10, 1.0f), out(10);
      if (c.rank() == 1) g[4] = bad;
      try {
        x.reduce(c, g, out);
      } catch (const error&) {
        std::lock_guard lock(mu);
        ++refused;
      }
      CHECK(x.steps() == 0);
      CHECK(x.residual()[0] == 0.0f);
    });
    CHECK(refused == 3);
  }
  std::mutex mu;
  int disagree = 0;
  local_group(2).run([&](local& c) {
    compress::region_top_k<> x(10, {.density = c.rank() ? 0.3 : 0.2});
    std::vector<float> g(10, 1.0f), out(10);
    try {
      x.reduce(c, g, out);
    } catch (const invalid_argument& e) {
      std::lock_guard lock(mu);
      disagree += std::string(e.what()).find("disagree") != std::string::npos;
    }
  });
  CHECK(disagree == 2);
}

namespace {

// A communicator that overwrites, in every all-gather of bytes, the block from rank 0 with `fill` bytes (the
// owners' cut sums; the all-to-all's blocks travel point to point and are left alone).
struct damaged_sums : test_comm::forwarding<local> {
  std::byte fill;

  template <comm::transferable T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    inner.all_gather(mine, all);
    if constexpr (std::same_as<T, std::byte>)
      std::fill(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(mine.size()), fill);
  }
  damaged_sums split(int color, int key) { return {{inner.split(color, key)}, fill}; }
};
static_assert(comm::communicator<damaged_sums>);

} // namespace

TEST_CASE("a cut index outside its chunk, or not above the one before, is corrupt_data on every rank") {
  // Chunks of 10 at density 0.2: 2 values and 2 indices of 4 bits; rank 0 owns chunk 0. 0xff: index 15,
  // outside; zero: 0 after 0.
  for (std::byte fill : {std::byte{0xff}, std::byte{0}}) {
    CAPTURE(static_cast<int>(fill));
    std::mutex mu;
    int refused = 0, kept = 0;
    local_group(2).run([&](local& base) {
      damaged_sums c{{base}, fill};
      compress::region_top_k<> x(20, {.density = 0.2, .chunk = 10});
      std::vector<float> g(20), out(20);
      for (std::size_t i = 0; i < g.size(); ++i)
        g[i] = std::sin(static_cast<float>(i + 3 * static_cast<std::size_t>(base.rank())));
      x.reduce(base, g, out); // a residual to keep
      const std::vector<float> before(x.residual().begin(), x.residual().end());
      try {
        x.reduce(c, g, out);
      } catch (const corrupt_data& e) {
        std::lock_guard lock(mu);
        refused += std::string(e.what()).find(
                       fill == std::byte{0} ? "indices rise" : "outside [0, its length") != std::string::npos;
      }
      std::lock_guard lock(mu);
      kept += same_bits(before, x.residual()) && x.steps() == 1;
    });
    CHECK(refused == 2);
    CHECK(kept == 2);
  }
}

TEST_CASE("the regions code's name, parts and sizes in cost/") {
  const auto code = cost::diloco_code::parse("topk-0.01-c4096-b0.95-regions");
  CHECK(code.regions);
  CHECK(code.name() == "topk-0.01-c4096-b0.95-regions");
  CHECK(code.unit() == 4096);
  CHECK_FALSE(code.gathered());
  CHECK(code.message_bytes(8192) == 2 * 82 + (12 * 82 + 7) / 8);
  for (const char* bad : {"topk-0.01-2bit-regions", "topk-0.01-regions-senders", "topk-0.01-regions-shared",
                          "topk-0.01-regions-regions"})
    CHECK_THROWS_AS(cost::diloco_code::parse(bad), invalid_argument);
  for (int n : {1, 2, 3, 8})
    for (int r = 0; r < n; ++r)
      CHECK(code.round_traffic(10000, n, r, r == 0) ==
            cost::region_top_k_traffic(cost::top_k_chunks::of(10000, 4096, 0.01), n));
}
