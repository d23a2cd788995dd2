// CSSGD and its baselines on comm::local: assignment (Algorithm 2), exact decoding (Algorithms 3 and 4),
// the int32 quantiser's error bound and clipping counts, bad input and corrupt packets.
#include <commsgd/coding/coding.hpp>
#include <commsgd/comm/local.hpp>

#include <doctest/doctest.h>
#include <support/forwarding_comm.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace coding = commsgd::coding;
namespace comm = commsgd::comm;
using comm::local;
using comm::local_group;

namespace {

// The gradient value of element e of block q: the same on every holder, deterministic, and covering the
// cases that break sloppy code: signed zeros, subnormals, values outside the int32 quantiser's range.
float block_value(std::size_t q, std::size_t e, bool wide) {
  std::uint64_t h = (q + 1) * 0x9E3779B97F4A7C15ull ^ (e + 7) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  switch (h % 16) {
  case 0:
    return -0.0f;
  case 1:
    return 0.0f;
  case 2:
    return wide ? std::numeric_limits<float>::denorm_min() * static_cast<float>(h % 100) : 1e-3f;
  case 3:
    return wide ? -12.5f : 3.0f; // clipped by int32_sum
  case 4:
    return wide ? 1e30f : -9.75f;
  default:
    return (static_cast<float>(h >> 40) / static_cast<float>(1ull << 24) - 0.5f) * 8.0f;
  }
}

std::vector<std::vector<float>> my_gradients(const coding::assignment& a, int rank, std::size_t d,
                                             bool wide) {
  std::vector<std::vector<float>> g;
  for (std::size_t q : a.blocks_of(rank)) {
    g.emplace_back(d);
    for (std::size_t e = 0; e < d; ++e)
      g.back()[e] = block_value(q, e, wide);
  }
  return g;
}

std::vector<std::span<const float>> views(const std::vector<std::vector<float>>& g) {
  return {g.begin(), g.end()};
}

std::vector<float> reference_fold(std::size_t blocks, std::size_t d, bool wide) {
  std::vector<float> s(d, -0.0f);
  for (std::size_t q = 0; q < blocks; ++q)
    for (std::size_t e = 0; e < d; ++e)
      s[e] += block_value(q, e, wide);
  return s;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t e = 0; e < a.size(); ++e)
    if (std::bit_cast<std::uint32_t>(a[e]) != std::bit_cast<std::uint32_t>(b[e])) return false;
  return true;
}

} // namespace

TEST_CASE("assignment: every block has r holders, node i holds C(n-1, r-1), blocks in lexicographic order") {
  for (int n = 1; n <= 7; ++n)
    for (int r = 1; r <= n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      coding::assignment a(n, r);
      REQUIRE(a.block_count() == coding::binomial(n, r));
      std::vector<int> count(static_cast<std::size_t>(n), 0);
      for (std::size_t q = 0; q < a.block_count(); ++q) {
        CHECK(coding::set_size(a.holders(q)) == r);
        CHECK(a.index_of(a.holders(q)) == q);
        if (q > 0) CHECK(coding::members(a.holders(q - 1)) < coding::members(a.holders(q)));
        for (int i : coding::members(a.holders(q)))
          ++count[static_cast<std::size_t>(i)];
      }
      for (int i = 0; i < n; ++i) {
        CHECK(count[static_cast<std::size_t>(i)] == static_cast<int>(coding::binomial(n - 1, r - 1)));
        CHECK(a.blocks_of(i).size() == coding::binomial(n - 1, r - 1));
        for (std::size_t q : a.blocks_of(i))
          CHECK(coding::contains(a.holders(q), i));
      }
      for (std::size_t batch : {0u, 1u, 5u, 128u, 1000u}) {
        const auto sizes = a.block_sizes(batch);
        std::size_t total = 0;
        for (auto s : sizes) {
          total += s;
          CHECK(s <= batch / a.block_count() + 1);
        }
        CHECK(total == batch);
      }
    }
}

TEST_CASE("assignment: weights give each node work proportional to its speed") {
  // Uneven weights can be met exactly for small r; for larger r a node cannot do more than the whole batch
  // and blocks would need negative sizes, so only mild weights are exact there.
  for (int r = 1; r < 5; ++r) {
    CAPTURE(r);
    const std::vector<double> w =
        r <= 2 ? std::vector<double>{1.0, 2.0, 1.5, 1.0, 2.5} : std::vector<double>{1.0, 1.1, 0.9, 1.0, 1.05};
    coding::assignment a(5, r, w);
    double total = 0;
    for (double x : w)
      total += x;
    for (int i = 0; i < 5; ++i) {
      double work = 0;
      for (std::size_t q : a.blocks_of(i))
        work += a.shares()[q];
      CHECK(work == doctest::Approx(r * w[static_cast<std::size_t>(i)] / total).epsilon(1e-12));
    }
    const auto sizes = a.block_sizes(997);
    std::size_t sum = 0;
    for (auto s : sizes)
      sum += s;
    CHECK(sum == 997);
  }
  CHECK_THROWS_AS(coding::assignment(3, 2, std::vector<double>{1.0, 2.0}), commsgd::size_mismatch);
  CHECK_THROWS_AS(coding::assignment(3, 2, std::vector<double>{1.0, 0.0, 1.0}), commsgd::invalid_argument);
}

TEST_CASE("cssgd<xor_bits> and uncoded_shuffle sums are bit-identical to the block-order fold") {
  for (int n = 1; n <= 7; ++n)
    for (int r = 1; r <= n; ++r)
      for (std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{2 * 3 * 5 * 7 + 1}}) {
        CAPTURE(n);
        CAPTURE(r);
        CAPTURE(d);
        const auto expected = reference_fold(coding::binomial(n, r), d, true);
        local_group(n).run([&](local& c) {
          auto coded = coding::make_cssgd<coding::xor_bits>(c, r);
          coding::uncoded_shuffle<local> plain(c, r);
          const auto g = my_gradients(coded.assignment(), c.rank(), d, true);
          const auto v = views(g);
          std::vector<float> out(d, 42.0f);
          CHECK(coded.exchange(v, out).clipped == 0);
          CHECK(same_bits(out, expected));
          std::vector<float> out2(d, 42.0f);
          plain.exchange(v, out2);
          CHECK(same_bits(out2, expected));
          // A second step reuses the groups and buffers.
          std::fill(out.begin(), out.end(), 0.0f);
          coded.exchange(v, out);
          CHECK(same_bits(out, expected));
        });
      }
}

TEST_CASE("cssgd<int32_sum>: exact integer sum of quantised values, error bound, clipping counted") {
  using q32 = coding::int32_sum;
  for (int n = 1; n <= 7; ++n)
    for (int r = 1; r <= n; ++r)
      for (std::size_t d : {std::size_t{1}, std::size_t{100}}) {
        CAPTURE(n);
        CAPTURE(r);
        CAPTURE(d);
        const std::size_t p = coding::binomial(n, r);
        std::vector<float> expected(d);
        std::vector<double> exact(d, 0.0);
        for (std::size_t e = 0; e < d; ++e) {
          std::int64_t s = 0;
          for (std::size_t q = 0; q < p; ++q) {
            const float x = block_value(q, e, false);
            s += q32::quantise(x);
            exact[e] += std::clamp(static_cast<double>(x), -10.0, 10.0);
          }
          expected[e] = static_cast<float>(static_cast<double>(s) * q32::step);
        }
        local_group(n).run([&](local& c) {
          auto scheme = coding::make_cssgd<q32>(c, r);
          const auto g = my_gradients(scheme.assignment(), c.rank(), d, false);
          std::uint64_t clipped = 0;
          for (const auto& b : g)
            for (float x : b)
              clipped += std::abs(x) > 10.0f ? 1u : 0u;
          std::vector<float> out(d);
          const auto res = scheme.exchange(views(g), out);
          CHECK(res.clipped == clipped);
          CHECK(same_bits(out, expected));
          for (std::size_t e = 0; e < d; ++e) {
            // Quantisation: at most half a level per term; then one rounding of the result to float.
            const double bound =
                static_cast<double>(p) * q32::step +
                std::abs(static_cast<double>(out[e])) * std::numeric_limits<float>::epsilon();
            CHECK(std::abs(static_cast<double>(out[e]) - exact[e]) <= bound);
          }
        });
      }
}

TEST_CASE("uncoded: ring all-reduce, all-gather and unicast sum one block per rank") {
  for (int n = 1; n <= 7; ++n)
    for (std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
      CAPTURE(n);
      CAPTURE(d);
      const auto expected = reference_fold(static_cast<std::size_t>(n), d, false);
      local_group(n).run([&](local& c) {
        coding::uncoded<local, coding::by_ring_all_reduce> ring(c);
        coding::uncoded<local, coding::by_all_gather> gather(c);
        coding::uncoded<local, coding::by_unicast> uni(c);
        REQUIRE(ring.my_blocks().size() == 1);
        CHECK(ring.my_blocks()[0] == static_cast<std::size_t>(c.rank()));
        const auto g = my_gradients(ring.assignment(), c.rank(), d, false);
        std::vector<float> a(d), b(d), u(d);
        ring.exchange(views(g), a);
        gather.exchange(views(g), b);
        uni.exchange(views(g), u);
        CHECK(same_bits(b, expected));
        CHECK(same_bits(u, expected));
        for (std::size_t e = 0; e < d; ++e)
          CHECK(a[e] == doctest::Approx(expected[e]).epsilon(1e-5));
      });
    }
}

TEST_CASE("bad input names the argument, its value and the allowed range") {
  local_group(3).run([](local& c) {
    auto message = [&](auto&& f) {
      try {
        f();
      } catch (const commsgd::invalid_argument& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    const auto m0 = message([&] { coding::make_cssgd<coding::xor_bits>(c, 0); });
    CHECK(m0.find("'r' = 0") != std::string::npos);
    CHECK(m0.find("[1, n = 3]") != std::string::npos);
    const auto m4 = message([&] { coding::uncoded_shuffle<local>(c, 4); });
    CHECK(m4.find("'r' = 4") != std::string::npos);
    CHECK_THROWS_AS(coding::assignment(0, 1), commsgd::invalid_argument);

    auto scheme = coding::make_cssgd<coding::xor_bits>(c, 2);
    const auto g = my_gradients(scheme.assignment(), c.rank(), 10, false);
    auto v = views(g);
    std::vector<float> out(10), short_out(9);
    CHECK_THROWS_AS(scheme.exchange(std::span(v).first(1), out), commsgd::size_mismatch);
    const auto mlen = message([&] { scheme.exchange(v, short_out); });
    CHECK(mlen.find("'blocks[0]' holds 10") != std::string::npos);
    auto bad = g;
    bad[1][3] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_AS(scheme.exchange(views(bad), out), commsgd::non_finite);
    // Nothing was sent by the failed calls, so the scheme still works.
    scheme.exchange(v, out);
    CHECK(same_bits(out, reference_fold(3, 10, false)));
  });
}

namespace {

// comm::local with one fault: the packet a chosen root broadcasts is damaged on the root's side.
enum class fault { truncate, flip_last_word };

struct faulty : test_comm::forwarding<local> {
  fault kind;
  int bad_world_rank;
  int world_rank;

  template <comm::transferable T>
  void broadcast(std::span<T> d, int root) {
    const bool damage = world_rank == bad_world_rank && rank() == root && !d.empty();
    if (damage && kind == fault::truncate) return inner.broadcast(d.first(d.size() - 1), root);
    if (damage) {
      if constexpr (std::is_same_v<T, std::uint32_t>) d.back() ^= 0x1u;
    }
    inner.broadcast(d, root);
  }
  faulty split(int color, int key) { return {{inner.split(color, key)}, kind, bad_world_rank, world_rank}; }
};
static_assert(comm::communicator<faulty>);

} // namespace

TEST_CASE("a truncated or corrupted packet raises corrupt_data") {
  // d = 10, r = 3: packets of 4 words, the last segment has 2, so every packet has padding to check.
  for (fault kind : {fault::truncate, fault::flip_last_word}) {
    CHECK_THROWS_AS(local_group(4).run([&](local& c) {
      faulty f{{c}, kind, 3, c.rank()}; // rank 3 owns the short last segment in every packet
      auto scheme = coding::make_cssgd<coding::xor_bits>(f, 3);
      const auto g = my_gradients(scheme.assignment(), c.rank(), 10, false);
      std::vector<float> out(10);
      scheme.exchange(views(g), out);
    }),
                    commsgd::corrupt_data);
  }
}
