// What the tests of the flat-in-n top-k codes (compress::shared_top_k, compress::region_top_k) share: a
// reference selection, inputs that stress it, and the checks every such code must pass whatever its exchange
// (a checkpoint mid-run, the refusals, a corrupt block of indices gathered from rank 0).
#pragma once

#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/chunked.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <support/forwarding_comm.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace top_k_cases {

using commsgd::comm::local;
using commsgd::comm::local_group;

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The k largest |p_i| of chunk [first, first + len), k = ceil(density len - 1e-9) at least 1, ties to the
// lowest index, rising: a stable sort, independent of the selectors.
inline std::vector<std::size_t> reference_top(const std::vector<float>& p, std::size_t first, std::size_t len,
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

// Random magnitudes (up to `big` in even rounds, 0.01 in odd ones), runs of ties of both signs, +0 and -0;
// rank and round change them.
inline std::vector<float> awkward(std::mt19937& rng, std::size_t d, int round, float big = 3.0f) {
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
      v = (round % 2 ? 0.01f : big) * u(rng) * u(rng);
    }
  }
  return g;
}

inline float bf16_round(float x) {
  return commsgd::compress::bf16_format::decode(commsgd::compress::bf16_format::encode(x));
}

struct shape {
  int n;
  std::size_t d, chunk;
  double density;
  float decay;
};

// f(shape, seed) for every rank count, size (0, 1, odd), chunk (none, 1, small), density and decay; how many.
template <class F>
int for_each_shape(F&& f) {
  int cases = 0;
  for (int n : {1, 2, 3, 5})
    for (std::size_t d : {0u, 1u, 7u, 100u, 1001u})
      for (std::size_t chunk : {0u, 1u, 4u, 64u})
        for (double density : {0.05, 0.3, 1.0})
          for (float decay : {1.0f, 0.9f}) {
            if (chunk == 1 && density != 1.0) continue; // every chunk of one value sends it: once is enough
            f(shape{n, d, chunk, density, decay}, cases++);
          }
  return cases;
}

// matches(shape, seed, rounds) for every shape, a case each: empty, or what failed.
template <class Matches>
void check_every_shape(Matches&& matches) {
  const int cases = for_each_shape([&](const shape& k, int seed) {
    CAPTURE(k.n);
    CAPTURE(k.d);
    CAPTURE(k.chunk);
    CAPTURE(k.density);
    CAPTURE(k.decay);
    const auto why = matches(k, seed, k.n == 5 ? 3 : 4);
    CHECK_MESSAGE(why.empty(), why);
  });
  CHECK(cases > 100);
}

// What every rank held in one round of a code: its p (as error feedback forms it from the input and the
// residual before the round), the sum it returned, its residual after, and the bytes it sent (metered, and
// as the code says).
struct round_record {
  std::vector<std::vector<float>> p, out, e_after, low_after;
  std::vector<std::uint64_t> metered, said;
};

// `rounds` rounds of make() on k.n thread ranks, rank r's input awkward(seed * 31 + r); a record a round.
template <class Make>
std::vector<round_record> record_rounds(const shape& k, int seed, int rounds, Make make) {
  const auto n = static_cast<std::size_t>(k.n);
  std::vector<round_record> rec(static_cast<std::size_t>(rounds));
  for (auto& x : rec) {
    x.p.resize(n);
    x.out.resize(n);
    x.e_after.resize(n);
    x.low_after.resize(n);
    x.metered.resize(n);
    x.said.resize(n);
  }
  std::mutex mu;
  local_group(k.n).run([&](local& base) {
    commsgd::comm::metered c(base);
    const auto r = static_cast<std::size_t>(c.rank());
    std::mt19937 rng(static_cast<unsigned>(seed * 31 + c.rank()));
    auto x = make();
    for (int t = 0; t < rounds; ++t) {
      const auto g = awkward(rng, k.d, t + c.rank());
      std::vector<float> p(k.d), sum(k.d, 7.0f);
      for (std::size_t i = 0; i < k.d; ++i) {
        const float e = x.residual()[i], low = x.residual_low()[i];
        const float s = k.decay == 1.0f ? g[i] + e : g[i] + k.decay * e;
        const float l = k.decay == 1.0f ? low : k.decay * low;
        p[i] = l == 0.0f ? s : s + l;
      }
      const auto before = c.counters().total().bytes_sent;
      x.reduce(c, g, sum);
      std::lock_guard lock(mu);
      auto& at = rec[static_cast<std::size_t>(t)];
      at.p[r] = p;
      at.out[r] = sum;
      at.e_after[r].assign(x.residual().begin(), x.residual().end());
      at.low_after[r].assign(x.residual_low().begin(), x.residual_low().end());
      at.metered[r] = c.counters().total().bytes_sent - before;
      at.said[r] = x.wire_bytes();
    }
  });
  return rec;
}

// A round against its reference: every rank's sum is `want` bit for bit; sent(r, i) (what rank r's value at
// i became on the wire, 0 where it sent none) plus its new residual is p exactly, and the residual is p bit
// for bit where it sent none; each rank sent bytes(r), by the meter and by its own count. Empty when all hold.
template <class Sent, class Bytes>
std::string check_round(const round_record& x, const std::vector<float>& want, Sent&& sent, Bytes&& bytes) {
  for (std::size_t r = 0; r < x.p.size(); ++r) {
    const auto who = "rank " + std::to_string(r);
    if (!same_bits(x.out[r], want)) return who + "'s sum is not the reference's";
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float s = sent(r, i);
      const double total = static_cast<double>(s) +
                           (static_cast<double>(x.e_after[r][i]) + static_cast<double>(x.low_after[r][i]));
      if (total != static_cast<double>(x.p[r][i]))
        return who + " index " + std::to_string(i) + ": sent + residual " + std::to_string(total) + " != p " +
               std::to_string(x.p[r][i]);
      if (s == 0.0f && !std::signbit(s) &&
          !same_bits(std::span(&x.e_after[r][i], 1), std::span(&x.p[r][i], 1)))
        return who + " index " + std::to_string(i) + ": sent nothing, yet the residual is not p";
    }
    const std::uint64_t b = bytes(static_cast<int>(r));
    if (x.metered[r] != b || x.said[r] != b)
      return who + " sent " + std::to_string(x.metered[r]) + " bytes (says " + std::to_string(x.said[r]) +
             "), cost/ " + std::to_string(b);
  }
  return {};
}

// laplace_bisect warm-started and trimmed, and select::chunked, give the bits of exact selection, round after
// round.
template <template <class> class X>
void warm_selectors_are_exact() {
  commsgd::select::laplace_bisect::options o;
  o.trim = true;
  o.warm_start = true;
  local_group(3).run([&](local& c) {
    X<commsgd::select::exact> a(5000, {.density = 0.02, .chunk = 512, .decay = 0.95f});
    X<commsgd::select::laplace_bisect> b(5000, {.density = 0.02, .chunk = 512, .decay = 0.95f},
                                         commsgd::select::laplace_bisect(o));
    // Every chunk in one call where the code takes it so (select::chunked), one chunk a call otherwise.
    X<commsgd::select::chunked> m(5000, {.density = 0.02, .chunk = 512, .decay = 0.95f});
    std::mt19937 rng(static_cast<unsigned>(c.rank() + 3));
    std::normal_distribution<float> z;
    std::vector<float> g(5000), sa(5000), sb(5000), sm(5000);
    for (int t = 0; t < 8; ++t) {
      for (auto& v : g)
        v = z(rng) * (t % 3 == 0 ? 1e-3f : 1.0f);
      a.reduce(c, g, sa);
      b.reduce(c, g, sb);
      m.reduce(c, g, sm);
      CHECK(same_bits(sa, sb));
      CHECK(same_bits(a.residual(), b.residual()));
      CHECK(same_bits(sa, sm));
      CHECK(same_bits(a.residual(), m.residual()));
    }
  });
}

// Two rounds, a save, four more rounds on the saved and the loaded one alike; a state of other parameters is
// refused.
template <class X>
void checkpoint_comes_back() {
  local_group(3).run([&](local& c) {
    X a(100, {.density = 0.1, .chunk = 16, .decay = 0.9f});
    std::mt19937 rng(static_cast<unsigned>(c.rank()));
    std::vector<std::vector<float>> gs;
    for (int t = 0; t < 6; ++t)
      gs.push_back(awkward(rng, 100, t));
    std::vector<float> out(100), again(100);
    for (int t = 0; t < 2; ++t)
      a.reduce(c, gs[t], out);
    std::stringstream saved;
    a.save(saved);
    X b(100, {.density = 0.1, .chunk = 16, .decay = 0.9f});
    b.load(saved);
    CHECK(b.steps() == 2);
    for (int t = 2; t < 6; ++t) {
      a.reduce(c, gs[t], out);
      b.reduce(c, gs[t], again);
      CHECK(same_bits(out, again));
      CHECK(same_bits(a.residual(), b.residual()));
    }
    std::stringstream other;
    X z(100, {.density = 0.2, .chunk = 16, .decay = 0.9f});
    z.save(other);
    CHECK_THROWS_AS(b.load(other), commsgd::corrupt_data);
  });
}

// Bad options, an inexact selector, NaN or inf on one rank (every rank refuses, nothing changes), ranks built
// with different densities (every rank says they disagree).
template <template <class> class X>
void refuses_bad_input() {
  using commsgd::invalid_argument;
  using Y = X<commsgd::select::exact>;
  CHECK_THROWS_AS(Y(10, {.density = 0.0}), invalid_argument);
  CHECK_THROWS_AS(Y(10, {.density = 0.1, .decay = 1.5f}), invalid_argument);
  CHECK_THROWS_AS(Y(10, {.density = 0.1, .chunk = std::size_t{1} << 33}), invalid_argument);
  CHECK_THROWS_AS(X<commsgd::select::laplace_bisect>(10, {}, commsgd::select::laplace_bisect()),
                  invalid_argument);
  for (const float bad : {std::nanf(""), INFINITY}) {
    std::mutex mu;
    int refused = 0;
    local_group(3).run([&](local& c) {
      Y x(10, {.density = 0.3});
      std::vector<float> g(10, 1.0f), out(10);
      if (c.rank() == 1) g[4] = bad;
      try {
        x.reduce(c, g, out);
      } catch (const commsgd::error&) {
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
    Y x(10, {.density = c.rank() ? 0.3 : 0.2});
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

// A communicator that overwrites, in every all-gather of bytes, the block gathered from rank 0 with `fill`.
struct damaged_gather : test_comm::forwarding<local> {
  std::byte fill;

  template <commsgd::comm::transferable T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    inner.all_gather(mine, all);
    if constexpr (std::same_as<T, std::byte>)
      std::fill(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(mine.size()), fill);
  }
  damaged_gather split(int color, int key) { return {{inner.split(color, key)}, fill}; }
};
static_assert(commsgd::comm::communicator<damaged_gather>);

// Two ranks, 20 values in chunks of 10 at density 0.2 (2 indices of 4 bits a chunk), a round that leaves a
// residual, then one whose gathered block from rank 0 is all 0xff (index 15: outside its chunk) or all zero
// (0 after 0): corrupt_data naming it on both ranks, the residual and step count as they were.
template <class X>
void corrupt_gather_is_refused() {
  for (std::byte fill : {std::byte{0xff}, std::byte{0}}) {
    CAPTURE(static_cast<int>(fill));
    std::mutex mu;
    int refused = 0, kept = 0;
    local_group(2).run([&](local& base) {
      damaged_gather c{{base}, fill};
      X x(20, {.density = 0.2, .chunk = 10});
      std::vector<float> g(20), out(20);
      for (std::size_t i = 0; i < g.size(); ++i)
        g[i] = std::sin(static_cast<float>(i + 3 * static_cast<std::size_t>(base.rank())));
      x.reduce(base, g, out);
      const std::vector<float> before(x.residual().begin(), x.residual().end());
      try {
        x.reduce(c, g, out);
      } catch (const commsgd::corrupt_data& e) {
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

} // namespace top_k_cases
