// error_feedback's fused passes (accumulate_counted, whole or in parts, commit_sparse: what top_k_ef's round
// uses) against the passes they stand for (accumulate then select::find_non_finite; commit with a dense d
// that is +0 but at the sent indices): the same p, count and first bad index, the same residual and low
// word bit for bit, over many rounds of random values with the awkward ones mixed in (+0 and -0,
// subnormals, the largest floats, sums that round, NaN and inf in some rounds' inputs), with and without a
// decay, through a loaded state and a dense commit in between.
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/select/validate.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <vector>

using namespace commsgd;

namespace {

bool same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  return true;
}

float awkward(std::mt19937& rng) {
  static const float pool[] = {0.0f,
                               -0.0f,
                               std::numeric_limits<float>::denorm_min(),
                               -std::numeric_limits<float>::denorm_min(),
                               0x1p-127f,
                               std::numeric_limits<float>::max() / 4,
                               -std::numeric_limits<float>::max() / 4,
                               1.0f,
                               0x1.000002p0f,
                               -0x1p-24f,
                               3.0f};
  return pool[std::uniform_int_distribution<std::size_t>(0, std::size(pool) - 1)(rng)];
}

std::vector<float> values(std::mt19937& rng, std::size_t d, bool with_bad) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  std::vector<float> g(d);
  for (auto& x : g)
    x = pick(rng) == 0 ? awkward(rng) : normal(rng) * std::ldexp(1.0f, pick(rng) - 5);
  if (with_bad && d > 0) {
    const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity()};
    const std::size_t count = 1 + rng() % 3;
    for (std::size_t j = 0; j < count; ++j)
      g[rng() % d] = bad[rng() % 3];
  }
  return g;
}

// A sent value as a sparse code's decode gives it: p itself (top-k's floats), or a value near p that leaves
// a rounding error (2-bit codes' scales), or +0 and -0.
float decoded(std::mt19937& rng, float p) {
  switch (rng() % 4) {
  case 0:
    return p;
  case 1:
    return p * 1.5f + 0x1p-20f;
  case 2:
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(p) ^ 0x1u) / 3.0f;
  default:
    return (rng() % 2) ? 0.0f : -0.0f;
  }
}

} // namespace

TEST_CASE("accumulate_counted and commit_sparse give the dense passes' bits, round after round") {
  for (const float decay : {1.0f, 0.95f, 0.0f, 0.5f}) {
    for (const std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{64},
                                std::size_t{65}, std::size_t{1000}, std::size_t{4099}}) {
      for (unsigned seed = 0; seed < 6; ++seed) {
        CAPTURE(decay);
        CAPTURE(d);
        CAPTURE(seed);
        std::mt19937 rng(seed * 7919u + static_cast<unsigned>(d));
        compress::error_feedback fused(d, true), ref(d, true), parted(d, true);
        std::vector<float> p_fused(d), p_ref(d), p_parted(d);
        for (int round = 0; round < 12; ++round) {
          CAPTURE(round);
          const bool with_bad = round % 5 == 4;
          const auto g = values(rng, d, with_bad);
          const auto scan = fused.accumulate_counted(g, p_fused, decay);
          ref.accumulate(g, p_ref, decay);
          const auto want = select::find_non_finite(p_ref);
          REQUIRE(same_bits(p_fused, p_ref));
          REQUIRE(scan.count == want.count);
          REQUIRE(scan.first == want.first);
          // accumulate_counted_part in rising parts of random lengths, one cursor: the same p and count.
          std::size_t cursor = 0, parted_bad = 0;
          for (std::size_t first = 0; first < d;) {
            const std::size_t m = std::min(d - first, std::size_t{1} + rng() % 300);
            parted_bad += parted.accumulate_counted_part(std::span<const float>(g).subspan(first, m),
                                                         std::span<float>(p_parted).subspan(first, m), first,
                                                         cursor, decay);
            first += m;
          }
          REQUIRE(same_bits(p_parted, p_ref));
          REQUIRE(parted_bad == want.count);
          if (want.count > 0) continue; // a refused round commits nothing
          // The sent indices: a random few, in random order, each once.
          std::vector<std::size_t> order(d);
          std::iota(order.begin(), order.end(), std::size_t{0});
          std::shuffle(order.begin(), order.end(), rng);
          order.resize(d == 0 ? 0 : rng() % (d / 8 + 2) % (d + 1));
          std::vector<float> at_val, dense(d, 0.0f);
          for (const std::size_t i : order) {
            at_val.push_back(decoded(rng, p_ref[i]));
            dense[i] = at_val.back();
          }
          if (round == 7) { // a dense commit in between: the low word may then be anywhere
            fused.commit(p_fused, dense);
            parted.commit(p_parted, dense);
          } else {
            // The indices in random order: commit_sparse keeps the low word's positions rising all the same,
            // as the parts' cursor reads them.
            fused.commit_sparse(p_fused, order, at_val);
            parted.commit_sparse(p_parted, order, at_val);
          }
          ref.commit(p_ref, dense);
          REQUIRE(same_bits(fused.residual(), ref.residual()));
          REQUIRE(same_bits(fused.residual_low(), ref.residual_low()));
          REQUIRE(same_bits(parted.residual(), ref.residual()));
          REQUIRE(same_bits(parted.residual_low(), ref.residual_low()));
          if (round == 9) { // a loaded state: its low word's non-zeros found again
            fused.replace(std::vector<float>(ref.residual().begin(), ref.residual().end()),
                          std::vector<float>(ref.residual_low().begin(), ref.residual_low().end()));
            parted.replace(std::vector<float>(ref.residual().begin(), ref.residual().end()),
                           std::vector<float>(ref.residual_low().begin(), ref.residual_low().end()));
          }
        }
      }
    }
  }
}

TEST_CASE("commit_sparse leaves p holding scratch of the residual's length, and off it does nothing") {
  compress::error_feedback on(5, true), off(5, false);
  std::vector<float> p{1.0f, -2.0f, 0.0f, -0.0f, 3.0f};
  const std::vector<std::size_t> at{4, 1};
  const std::vector<float> val{3.0f, -1.5f};
  on.commit_sparse(p, at, val);
  CHECK(p.size() == 5);
  const std::vector<float> e{1.0f, -0.5f, 0.0f, -0.0f, 0.0f};
  CHECK(same_bits(on.residual(), e));
  CHECK(std::signbit(on.residual()[3]));
  std::vector<float> q{1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  off.commit_sparse(q, at, val);
  CHECK(q[0] == 1.0f);
  CHECK(off.residual().empty());
}

TEST_CASE("accumulate_part and commit_split give accumulate's and commit's bits, part by part") {
  // What int8 and e3m0 use: p formed in rising parts of random lengths (one cursor over the low word's
  // positions), the residual split from p - d elsewhere and committed whole; through a dense commit (low
  // words anywhere) and a loaded state in between.
  for (const std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{64},
                              std::size_t{65}, std::size_t{1000}, std::size_t{4099}}) {
    for (unsigned seed = 0; seed < 6; ++seed) {
      CAPTURE(d);
      CAPTURE(seed);
      std::mt19937 rng(seed * 104729u + static_cast<unsigned>(d));
      compress::error_feedback fused(d, true), ref(d, true);
      std::vector<float> p_fused(d), p_ref(d);
      std::size_t lows = 0;
      for (int round = 0; round < 12; ++round) {
        CAPTURE(round);
        const auto g = values(rng, d, false);
        std::size_t cursor = 0;
        for (std::size_t first = 0; first < d;) {
          const std::size_t m = std::min(d - first, std::size_t{1} + rng() % 300);
          fused.accumulate_part(std::span<const float>(g).subspan(first, m),
                                std::span<float>(p_fused).subspan(first, m), first, cursor);
          first += m;
        }
        ref.accumulate(g, p_ref);
        REQUIRE(same_bits(p_fused, p_ref));
        if (select::find_non_finite(p_ref).count > 0) continue;
        std::vector<float> dense(d);
        for (std::size_t i = 0; i < d; ++i)
          dense[i] = rng() % 3 == 0 ? decoded(rng, p_ref[i]) : 0.0f;
        if (round == 7) { // a dense commit in between: the next parts read the low word everywhere
          fused.commit(p_fused, dense);
        } else {
          std::vector<std::size_t> low_at;
          std::vector<float> low_val;
          for (std::size_t i = 0; i < d; ++i) {
            float e, r;
            compress::split_difference(p_fused[i], dense[i], e, r);
            p_fused[i] = e;
            if (r != 0.0f) {
              low_at.push_back(i);
              low_val.push_back(r);
            }
          }
          lows += low_at.size();
          fused.commit_split(p_fused, low_at, low_val);
          REQUIRE(p_fused.size() == d); // scratch of the residual's length
        }
        ref.commit(p_ref, dense);
        REQUIRE(same_bits(fused.residual(), ref.residual()));
        REQUIRE(same_bits(fused.residual_low(), ref.residual_low()));
        if (round == 9)
          fused.replace(std::vector<float>(ref.residual().begin(), ref.residual().end()),
                        std::vector<float>(ref.residual_low().begin(), ref.residual_low().end()));
      }
      if (d >= 64) CHECK(lows > 0); // the low word's path was taken
    }
  }
}

TEST_CASE("accumulate_part and accumulate_counted_part take g as a difference a - b with g's bits") {
  // What sync::diloco gives its codes: theta_global - theta_local, taken in the pass that forms p. Against
  // the same parts given the difference as a span (the pass it replaces), for decays 1 and not, through
  // sparse commits (low words at a few places), a dense commit (low words anywhere) and off; NaN and inf in
  // either operand in some rounds, and the awkward values (+-0, subnormals, sums that round) in both.
  for (const float decay : {1.0f, 0.95f}) {
    for (const std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{64},
                                std::size_t{65}, std::size_t{1000}, std::size_t{4099}}) {
      for (unsigned seed = 0; seed < 4; ++seed) {
        CAPTURE(decay);
        CAPTURE(d);
        CAPTURE(seed);
        std::mt19937 rng(seed * 15485863u + static_cast<unsigned>(d));
        const bool on = seed != 3;
        compress::error_feedback counted(d, on), plain(d, on), counted_ref(d, on), plain_ref(d, on);
        std::vector<float> pc(d), pp(d), pc_ref(d), pp_ref(d);
        for (int round = 0; round < 10; ++round) {
          CAPTURE(round);
          const auto a = values(rng, d, round % 4 == 3);
          const auto b = values(rng, d, round % 4 == 1);
          std::vector<float> g(d);
          for (std::size_t i = 0; i < d; ++i)
            g[i] = a[i] - b[i];
          std::size_t cc = 0, pc_cursor = 0, cr = 0, pr = 0, bad = 0, bad_ref = 0;
          for (std::size_t first = 0; first < d;) {
            const std::size_t m = std::min(d - first, std::size_t{1} + rng() % 300);
            const compress::difference diff(std::span<const float>(a).subspan(first, m), b.data() + first);
            const auto gs = std::span<const float>(g).subspan(first, m);
            bad += counted.accumulate_counted_part(diff, std::span<float>(pc).subspan(first, m), first, cc,
                                                   decay);
            bad_ref += counted_ref.accumulate_counted_part(gs, std::span<float>(pc_ref).subspan(first, m),
                                                           first, cr, decay);
            plain.accumulate_part(diff, std::span<float>(pp).subspan(first, m), first, pc_cursor);
            plain_ref.accumulate_part(gs, std::span<float>(pp_ref).subspan(first, m), first, pr);
            first += m;
          }
          REQUIRE(same_bits(pc, pc_ref));
          REQUIRE(same_bits(pp, pp_ref));
          REQUIRE(bad == bad_ref);
          REQUIRE(bad == select::find_non_finite(pc_ref).count);
          if (bad > 0 || select::find_non_finite(pp_ref).count > 0) continue;
          // The same commit on both pairs: +0 but at a few sent values, or dense every fourth round.
          std::vector<std::size_t> order(d);
          std::iota(order.begin(), order.end(), std::size_t{0});
          std::shuffle(order.begin(), order.end(), rng);
          order.resize(d == 0 ? 0 : rng() % (d / 8 + 2) % (d + 1));
          std::vector<float> at_val_c, at_val_p, dense_c(d, 0.0f), dense_p(d, 0.0f);
          for (const std::size_t i : order) {
            const unsigned how = rng();
            std::mt19937 r1(how), r2(how);
            at_val_c.push_back(decoded(r1, pc_ref[i]));
            at_val_p.push_back(decoded(r2, pp_ref[i]));
            dense_c[i] = at_val_c.back();
            dense_p[i] = at_val_p.back();
          }
          if (round % 4 == 2) {
            counted.commit(pc, dense_c);
            counted_ref.commit(pc_ref, dense_c);
            plain.commit(pp, dense_p);
            plain_ref.commit(pp_ref, dense_p);
          } else {
            counted.commit_sparse(pc, order, at_val_c);
            counted_ref.commit_sparse(pc_ref, order, at_val_c);
            plain.commit_sparse(pp, order, at_val_p);
            plain_ref.commit_sparse(pp_ref, order, at_val_p);
          }
          REQUIRE(same_bits(counted.residual(), counted_ref.residual()));
          REQUIRE(same_bits(counted.residual_low(), counted_ref.residual_low()));
          REQUIRE(same_bits(plain.residual(), plain_ref.residual()));
          REQUIRE(same_bits(plain.residual_low(), plain_ref.residual_low()));
        }
      }
    }
  }
}

TEST_CASE("stretch_of asks an input for a difference where it gives one, else wraps its span") {
  const std::vector<float> a{1.0f, 2.0f, -0.0f}, b{0.5f, 2.0f, 0.0f};
  const auto span_only = [&](std::size_t first, std::size_t m) {
    return std::span<const float>(a).subspan(first, m);
  };
  const auto both = compress::difference_input{
      span_only, [&](std::size_t first, std::size_t m, compress::as_difference_t) {
        return compress::difference(std::span<const float>(a).subspan(first, m), b.data() + first);
      }};
  const auto s = compress::stretch_of(span_only, 1, 2);
  CHECK(s.b == nullptr);
  CHECK(s.size() == 2);
  CHECK(s[0] == 2.0f);
  const auto t = compress::stretch_of(both, 0, 3);
  REQUIRE(t.b == b.data());
  CHECK(t[0] == 0.5f);
  CHECK(t[1] == 0.0f);
  CHECK_FALSE(std::signbit(t[1]));
  CHECK(std::signbit(t[2])); // -0 - +0 is -0
  CHECK(t.subspan(1, 2)[1] == t[2]);
}
