// The gradient codes' arithmetic (coding/gradient_code.hpp): assignment, encoding and decoding from every
// responder set, checked against references: fractional repetition bit for bit, cyclic within its stated
// bound, backup workers as the scaled partial sum; bad input.
#include <commsgd/coding/gradient_code.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace coding = commsgd::coding;
using coding::node_set;

namespace {

// Block gradients with signed zeros, tiny and large magnitudes, different per seed.
std::vector<std::vector<float>> random_blocks(int n, std::size_t d, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::vector<float>> g(static_cast<std::size_t>(n), std::vector<float>(d));
  for (auto& b : g)
    for (auto& v : b) {
      const auto k = gen() % 10;
      if (k == 0)
        v = -0.0f;
      else if (k == 1)
        v = 0.0f;
      else if (k == 2)
        v = std::ldexp(static_cast<float>(gen() % 1000) - 500.0f, -30);
      else
        v = std::uniform_real_distribution<float>(-4.0f, 4.0f)(gen);
    }
  return g;
}

template <class Kind>
std::vector<std::vector<float>> encode_all(const coding::gradient_code<Kind>& code,
                                           const std::vector<std::vector<float>>& g, std::size_t d) {
  std::vector<std::vector<float>> c(static_cast<std::size_t>(code.nodes()), std::vector<float>(d));
  for (int i = 0; i < code.nodes(); ++i) {
    std::vector<std::span<const float>> mine;
    for (std::size_t q : code.blocks_of(i))
      mine.emplace_back(g[q]);
    code.encode(i, coding::block_gradients(mine), c[static_cast<std::size_t>(i)]);
  }
  return c;
}

template <class Kind>
std::vector<float> decode(coding::gradient_code<Kind>& code, node_set f,
                          const std::vector<std::vector<float>>& c, std::size_t d) {
  std::vector<std::span<const float>> coded;
  for (int k : coding::members(f))
    coded.emplace_back(c[static_cast<std::size_t>(k)]);
  std::vector<float> out(d);
  code.decode(f, std::span<const std::span<const float>>(coded), out);
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t e = 0; e < a.size(); ++e)
    if (std::bit_cast<std::uint32_t>(a[e]) != std::bit_cast<std::uint32_t>(b[e])) return false;
  return true;
}

// Every subset of {0..n-1} of size k when there are at most `cap` of them, else `cap` random ones.
std::vector<node_set> responder_sets(int n, int k, std::size_t cap, std::mt19937_64& gen) {
  std::vector<node_set> out;
  if (coding::binomial(n, k) <= cap) return coding::subsets_lex(n, k);
  for (std::size_t t = 0; t < cap; ++t) {
    std::vector<int> nodes(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      nodes[static_cast<std::size_t>(i)] = i;
    std::shuffle(nodes.begin(), nodes.end(), gen);
    node_set s = 0;
    for (int i = 0; i < k; ++i)
      s |= coding::node_bit(nodes[static_cast<std::size_t>(i)]);
    out.push_back(s);
  }
  return out;
}

} // namespace

TEST_CASE("gradient codes: every block on r nodes, and any n - s nodes hold every block") {
  for (int n = 1; n <= 12; ++n)
    for (int r = 1; r <= n; ++r) {
      auto check = [&](const auto& code, int per_node) {
        CAPTURE(n);
        CAPTURE(r);
        CHECK(code.block_count() == static_cast<std::size_t>(n));
        CHECK(code.needed() == n - r + 1);
        for (int i = 0; i < n; ++i)
          CHECK(code.blocks_of(i).size() == static_cast<std::size_t>(per_node));
        for (std::size_t q = 0; q < code.block_count(); ++q)
          CHECK(coding::set_size(code.holders(q)) == per_node);
        if (per_node == 1) return;
        for (node_set f : coding::subsets_lex(n, n - r + 1)) {
          node_set covered = 0;
          for (int i : coding::members(f))
            for (std::size_t q : code.blocks_of(i))
              covered |= coding::node_bit(static_cast<int>(q));
          CHECK(covered == (n == 64 ? ~node_set{0} : coding::node_bit(n) - 1));
        }
      };
      check(coding::gradient_code<coding::cyclic>(n, r), r);
      check(coding::gradient_code<coding::backup_workers>(n, r), 1);
      if (n % r == 0) check(coding::gradient_code<coding::fractional_repetition>(n, r), r);
    }
  const auto sizes = coding::gradient_code<coding::cyclic>(7, 3).block_sizes(100);
  std::size_t total = 0;
  for (auto s : sizes) {
    CHECK((s == 14 || s == 15));
    total += s;
  }
  CHECK(total == 100);
}

TEST_CASE("fractional repetition: the same bits as the group-order fold from every set of n - s responders") {
  std::mt19937_64 gen(23);
  const std::size_t d = 37;
  for (int n = 2; n <= 12; ++n)
    for (int r = 1; r <= n; ++r) {
      if (n % r != 0) continue;
      CAPTURE(n);
      CAPTURE(r);
      coding::gradient_code<coding::fractional_repetition> code(n, r);
      for (std::uint64_t seed = 0; seed < 3; ++seed) {
        const auto g = random_blocks(n, d, seed * 131 + static_cast<std::uint64_t>(n * 16 + r));
        // Reference: the fold of each group's blocks in block order, then of the groups in group order.
        std::vector<float> want(d, -0.0f);
        for (int grp = 0; grp < n / r; ++grp) {
          std::vector<float> part(d, -0.0f);
          for (int j = 0; j < r; ++j)
            for (std::size_t e = 0; e < d; ++e)
              part[e] += g[static_cast<std::size_t>(grp * r + j)][e];
          for (std::size_t e = 0; e < d; ++e)
            want[e] += part[e];
        }
        const auto c = encode_all(code, g, d);
        // Members of a group send the same bits.
        for (int i = 0; i < n; ++i)
          CHECK(same_bits(c[static_cast<std::size_t>(i)], c[static_cast<std::size_t>(i / r * r)]));
        for (int k = code.needed(); k <= n; ++k)
          for (node_set f : responder_sets(n, k, 400, gen)) {
            CAPTURE(f);
            CHECK(same_bits(decode(code, f, c, d), want));
          }
        // And the sum is the sum: against a double reference.
        double worst = 0;
        for (std::size_t e = 0; e < d; ++e) {
          double ref = 0, mag = 0;
          for (const auto& b : g) {
            ref += b[e];
            mag += std::abs(b[e]);
          }
          worst = std::max(worst, std::abs(want[e] - ref) / (mag + 1e-30));
        }
        CHECK(worst <= static_cast<double>(n) * std::ldexp(1.0, -23));
      }
    }
}

// Decodes from responders f and CHECKs every element's error against code.error_bound; returns the largest
// error / bound seen (how close the bound comes to being reached).
template <class Code, class Blocks, class Coded>
double check_error_bound(Code& code, coding::node_set f, const Blocks& g, const Coded& c, std::size_t d) {
  const auto out = decode(code, f, c, d);
  double worst = 0;
  for (std::size_t e = 0; e < d; ++e) {
    long double exact = 0, abs_sum = 0;
    for (const auto& b : g) {
      exact += b[e];
      abs_sum += std::abs(b[e]);
    }
    std::vector<double> ce;
    for (int m : coding::members(f))
      ce.push_back(c[static_cast<std::size_t>(m)][e]);
    const double bound = code.error_bound(f, static_cast<double>(exact), ce, static_cast<double>(abs_sum));
    const double err = static_cast<double>(std::abs(static_cast<long double>(out[e]) - exact));
    CHECK(err <= bound);
    if (bound > 0) worst = std::max(worst, err / bound);
  }
  return worst;
}

// The largest of err / bound over every responder set of n - s and n - s + 1 nodes for blocks g; fails a
// CHECK where the error exceeds the bound.
double worst_over_responders(coding::gradient_code<coding::cyclic>& code,
                             const std::vector<std::vector<float>>& g, std::size_t d) {
  const auto c = encode_all(code, g, d);
  const int n = code.nodes();
  std::mt19937_64 gen(3);
  double worst = 0;
  for (int k = code.needed(); k <= std::min(n, code.needed() + 1); ++k)
    for (node_set f : responder_sets(n, k, 200, gen)) {
      CAPTURE(f);
      worst = std::max(worst, check_error_bound(code, f, g, c, d));
    }
  return worst;
}

TEST_CASE(
    "cyclic: the bound holds for subnormal blocks, where a float rounding is off by an absolute amount") {
  const float unit = std::ldexp(1.0f, -149); // the smallest subnormal
  SUBCASE("n = 3, r = 2, blocks {8, -18, -6} x 2^-149 with nodes 0 and 2 answering") {
    // Without the underflow term the bound was 2.0e-50 here, against an error of 2.8e-45.
    coding::gradient_code<coding::cyclic> code(3, 2);
    const std::vector<std::vector<float>> g{{8 * unit}, {-18 * unit}, {-6 * unit}};
    const auto c = encode_all(code, g, 1);
    const node_set f = coding::node_bit(0) | coding::node_bit(2);
    const auto out = decode(code, f, c, 1);
    const double exact = -16.0 * std::ldexp(1.0, -149);
    std::vector<double> ce{c[0][0], c[2][0]};
    const double bound = code.error_bound(f, exact, ce, 32.0 * std::ldexp(1.0, -149));
    const double err = std::abs(static_cast<double>(out[0]) - exact);
    CAPTURE(err);
    CAPTURE(bound);
    CHECK(err <= bound);
    // The bound stays tight at this scale: a few subnormal spacings, not orders of magnitude more.
    CHECK(bound < 64.0 * std::ldexp(1.0, -149));
  }
  SUBCASE("random subnormal and near-subnormal blocks, n = 2..8, every r, every responder set") {
    std::mt19937_64 gen(17);
    const std::size_t d = 24;
    for (int n = 2; n <= 8; ++n)
      for (int r = 1; r <= n; ++r) {
        CAPTURE(n);
        CAPTURE(r);
        coding::gradient_code<coding::cyclic> code(n, r);
        std::vector<std::vector<float>> g(static_cast<std::size_t>(n), std::vector<float>(d));
        for (auto& b : g)
          for (auto& v : b)
            v = static_cast<float>(static_cast<int>(gen() % 4001) - 2000) * unit *
                (gen() % 3 == 0 ? 4096.0f : 1.0f);
        worst_over_responders(code, g, d);
      }
  }
}

TEST_CASE("cyclic: within the stated bound from every set of n - s responders, n = 2..12 and 20, every r") {
  std::mt19937_64 gen(5);
  const std::size_t d = 16;
  auto run = [&](int n, int r, std::size_t cap) {
    CAPTURE(n);
    CAPTURE(r);
    coding::gradient_code<coding::cyclic> code(n, r);
    // Row i of B is supported on i..i+s (mod n) with B[i][i] = 1.
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const bool in = ((j - i + n) % n) < r;
        CHECK((code.coefficient(i, static_cast<std::size_t>(j)) != 0.0) == in);
      }
    CHECK(code.coefficient(0, 0) == 1.0);
    const auto g = random_blocks(n, d, static_cast<std::uint64_t>(n * 100 + r));
    const auto c = encode_all(code, g, d);
    double worst_ratio = 0;
    for (int k = code.needed(); k <= std::min(n, code.needed() + 1); ++k)
      for (node_set f : responder_sets(n, k, cap, gen)) {
        CAPTURE(f);
        CHECK(code.decoding_residual(f) < 1e-9);
        worst_ratio = std::max(worst_ratio, check_error_bound(code, f, g, c, d));
      }
    // The bound is not vacuous: errors come within a few hundred times of it somewhere.
    if (r > 1) CHECK(worst_ratio > 1e-4);
  };
  for (int n = 2; n <= 12; ++n)
    for (int r = 1; r <= n; ++r)
      run(n, r, 120);
  run(20, 2, 60);
  run(20, 3, 60);
}

TEST_CASE("backup workers: the sum of the responders scaled by n / answered, exact when all answer") {
  const std::size_t d = 9;
  coding::gradient_code<coding::backup_workers> code(6, 3);
  const auto g = random_blocks(6, d, 77);
  const auto c = encode_all(code, g, d);
  for (int i = 0; i < 6; ++i)
    CHECK(same_bits(c[static_cast<std::size_t>(i)], g[static_cast<std::size_t>(i)]));
  std::vector<float> all(d, -0.0f);
  for (const auto& b : g)
    for (std::size_t e = 0; e < d; ++e)
      all[e] += b[e];
  CHECK(same_bits(decode(code, 0b111111, c, d), all));
  const node_set f = 0b110110; // 1, 2, 4, 5
  const auto out = decode(code, f, c, d);
  for (std::size_t e = 0; e < d; ++e) {
    float part = -0.0f;
    for (int k : {1, 2, 4, 5})
      part += g[static_cast<std::size_t>(k)][e];
    CHECK(std::bit_cast<std::uint32_t>(out[e]) == std::bit_cast<std::uint32_t>(part * 1.5f));
  }
}

TEST_CASE("gradient codes: bad input names the argument, its value and the allowed range") {
  using fr = coding::gradient_code<coding::fractional_repetition>;
  using cy = coding::gradient_code<coding::cyclic>;
  CHECK_THROWS_WITH_AS(fr(6, 4), doctest::Contains("'r' = 4 must divide n = 6"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(cy(5, 0), doctest::Contains("'r' = 0 is outside the allowed range [1, n = 5]"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(cy(0, 1), doctest::Contains("'n' = 0"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(cy(65, 1), doctest::Contains("'n' = 65"), commsgd::invalid_argument);
  fr code(6, 2);
  CHECK_THROWS_WITH_AS(code.blocks_of(6), doctest::Contains("'node' = 6"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(code.used(0b1000000), doctest::Contains("'responders'"), commsgd::invalid_argument);
  // Four answered but both members of group {2, 3} are missing; and three is fewer than n - s = 5.
  CHECK_THROWS_AS(code.used(0b110011), coding::stragglers_exceeded);
  try {
    code.used(0b000111);
    FAIL("expected stragglers_exceeded");
  } catch (const coding::stragglers_exceeded& e) {
    CHECK(e.answered() == 3);
    CHECK(e.needed() == 5);
    CHECK(std::string(e.what()).find("at most s = 1 missing") != std::string::npos);
  }
  std::vector<float> g(4, 1.0f), out(4), shortv(3);
  std::vector<std::span<const float>> blocks{g, g};
  CHECK_THROWS_AS(code.encode(0, coding::block_gradients(blocks), shortv), commsgd::size_mismatch);
  std::vector<std::span<const float>> one{g};
  CHECK_THROWS_AS(code.encode(0, coding::block_gradients(one), out), commsgd::size_mismatch);
  g[2] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(code.encode(0, coding::block_gradients(blocks), out), commsgd::non_finite);
  std::vector<std::span<const float>> coded(5, std::span<const float>(out));
  CHECK_THROWS_AS(code.decode(0b111111, std::span<const std::span<const float>>(coded), out),
                  commsgd::size_mismatch);
}
