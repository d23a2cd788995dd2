// CSSGD and its baselines under MPI (2 to 4 ranks): the same sums and the same byte counts as on threads.
#include "mpi/support.hpp"

#include <commsgd/coding/coding.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/mpi.hpp>
#include <commsgd/cost/coding_traffic.hpp>

#include <bit>
#include <cstdint>
#include <vector>

namespace coding = commsgd::coding;
namespace comm = commsgd::comm;
namespace cost = commsgd::cost;
using comm::mpi;

namespace {

float block_value(std::size_t q, std::size_t e) {
  const std::uint64_t h = ((q + 1) * 0x9E3779B97F4A7C15ull) ^ ((e + 3) * 0xC2B2AE3D27D4EB4Full);
  return (static_cast<float>((h >> 40) % 4096) - 2048.0f) / 256.0f; // [-8, 8): inside int32_sum's range
}

std::vector<std::vector<float>> gradients(std::span<const std::size_t> blocks, std::size_t d) {
  std::vector<std::vector<float>> g(blocks.size(), std::vector<float>(d));
  for (std::size_t j = 0; j < blocks.size(); ++j)
    for (std::size_t e = 0; e < d; ++e)
      g[j][e] = block_value(blocks[j], e);
  return g;
}

std::vector<float> fold(std::size_t blocks, std::size_t d) {
  std::vector<float> s(d, -0.0f);
  for (std::size_t q = 0; q < blocks; ++q)
    for (std::size_t e = 0; e < d; ++e)
      s[e] += block_value(q, e);
  return s;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  for (std::size_t e = 0; e < a.size(); ++e)
    if (std::bit_cast<std::uint32_t>(a[e]) != std::bit_cast<std::uint32_t>(b[e])) return false;
  return a.size() == b.size();
}

template <class Scheme>
std::vector<float> run(Scheme& s, std::size_t d) {
  const auto g = gradients(s.my_blocks(), d);
  const std::vector<std::span<const float>> v(g.begin(), g.end());
  std::vector<float> out(d);
  s.exchange(v, out);
  return out;
}

} // namespace

TEST_CASE("cssgd, uncoded shuffle and uncoded exchanges under MPI: exact sums, bytes equal the model") {
  comm::metered<mpi> m(mpi::world());
  const int n = m.size();
  for (int r = 1; r <= n; ++r)
    for (std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{1001}}) {
      CAPTURE(r);
      CAPTURE(d);
      const auto expected = fold(coding::binomial(n, r), d);

      auto coded = coding::make_cssgd<coding::xor_bits>(m, r);
      m.reset();
      CHECK(same_bits(run(coded, d), expected));
      CHECK(cost::measured(m.counters().total()) == cost::cssgd(n, r, d, 4));

      auto quantised = coding::make_cssgd<coding::int32_sum>(m, r);
      const auto q = run(quantised, d);
      for (std::size_t e = 0; e < d; ++e)
        CHECK(std::abs(q[e] - expected[e]) <= 1e-5f);

      coding::uncoded_shuffle<comm::metered<mpi>> plain(m, r);
      m.reset();
      CHECK(same_bits(run(plain, d), expected));
      CHECK(cost::measured(m.counters().total()) == cost::uncoded_shuffle(n, r, d, 4, m.rank()));
    }
  for (std::size_t d : {std::size_t{0}, std::size_t{1001}}) {
    const auto expected = fold(static_cast<std::size_t>(n), d);
    coding::uncoded<comm::metered<mpi>, coding::by_all_gather> gather(m);
    coding::uncoded<comm::metered<mpi>, coding::by_unicast> uni(m);
    coding::uncoded<comm::metered<mpi>, coding::by_ring_all_reduce> ring(m);
    m.reset();
    CHECK(same_bits(run(gather, d), expected));
    CHECK(cost::measured(m.counters().total()) == cost::all_gather(n, d, 4));
    m.reset();
    CHECK(same_bits(run(uni, d), expected));
    CHECK(cost::measured(m.counters().total()) == cost::unicast(n, d, 4));
    m.reset();
    const auto a = run(ring, d);
    CHECK(cost::measured(m.counters().total()) == cost::ring_all_reduce(n, d, 4, m.rank()));
    for (std::size_t e = 0; e < d; ++e)
      CHECK(a[e] == doctest::Approx(expected[e]).epsilon(1e-5));
  }
}
