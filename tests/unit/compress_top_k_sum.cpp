// compress::top_k_ef's sum against the formula it stands for: the messages every rank gathered, each read
// back at the plan's offsets (cost/top_k_plan.hpp) and decoded by hand, added in rank order from +0 into a
// zeroed vector, and with sender_mean each value scaled by over_senders_value; bit for bit, with the NaN and
// inf count sum_non_finite() reports equal to a fresh count. Many seeds, ranks, lengths across the sum's
// blocks, chunks, float and 2-bit values, several rounds (the residual in play), and inputs whose sums
// overflow.
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/cost/top_k_plan.hpp>
#include <commsgd/select/validate.hpp>
#include <support/forwarding_comm.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

using namespace commsgd;
using comm::local;

namespace {

// comm::local that keeps what this rank's last byte all_gather received.
struct keeps_gathered : test_comm::forwarding<local> {
  std::vector<std::byte>* kept;

  template <comm::transferable T>
  void all_gather(std::span<const T> m, std::span<T> a) {
    inner.all_gather(m, a);
    if constexpr (std::is_same_v<T, std::byte>) kept->assign(a.begin(), a.end());
  }
  keeps_gathered split(int color, int key) { return {{inner.split(color, key)}, kept}; }
};
static_assert(comm::communicator<keeps_gathered>);

bool same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  return true;
}

// The sum the gathered messages stand for, read with the plan alone.
std::vector<float> reference_sum(std::span<const std::byte> all, std::size_t n, std::size_t d,
                                 const compress::top_k_ef_options& o) {
  const auto plan = cost::top_k_plan::of(d, o.chunk, o.density, o.two_bit);
  const auto bytes = static_cast<std::size_t>(plan.bytes);
  std::vector<float> sum(d, 0.0f);
  std::vector<std::uint32_t> senders(d, 0);
  for (std::size_t r = 0; r < n; ++r) {
    const auto m = all.subspan(r * bytes, bytes);
    std::size_t at = 0;
    for (std::uint64_t j = 0; j < plan.count; ++j) {
      const auto kj = static_cast<std::size_t>(plan.k_of(j));
      std::vector<std::uint32_t> rel(kj), code(kj);
      compress::detail::unpack_bits(m.subspan(static_cast<std::size_t>(plan.index_offset)), at, kj,
                                    plan.index_bits,
                                    [&](std::size_t i, std::uint32_t v) { rel[i - at] = v; });
      if (o.two_bit)
        compress::detail::unpack_bits(m.subspan(static_cast<std::size_t>(plan.code_offset)), at, kj, 2,
                                      [&](std::size_t i, std::uint32_t v) { code[i - at] = v; });
      for (std::size_t q = 0; q < kj; ++q) {
        float x;
        if (o.two_bit) {
          float s;
          std::memcpy(&s, m.data() + 4 * j, 4);
          x = compress::two_bit_code::decode(code[q], s);
        } else {
          std::memcpy(&x, m.data() + 4 * (at + q), 4);
        }
        const auto i = static_cast<std::size_t>(plan.first(j)) + rel[q];
        sum[i] += x;
        ++senders[i];
      }
      at += kj;
    }
  }
  if (o.sender_mean)
    for (std::size_t i = 0; i < d; ++i)
      sum[i] = compress::over_senders_value(sum[i], senders[i], static_cast<std::uint32_t>(n));
  return sum;
}

std::vector<float> input(std::mt19937& rng, std::size_t d, bool huge) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(d);
  for (auto& x : g)
    x = normal(rng);
  if (huge)
    for (std::size_t j = 0; j < d / 50 + 1 && d > 0; ++j)
      g[rng() % d] = (rng() % 2 ? 1.0f : -1.0f) * std::numeric_limits<float>::max() * 0.75f;
  if (d > 2) g[1] = g[0]; // a tie
  return g;
}

} // namespace

TEST_CASE("top_k_ef's sum is the gathered messages decoded and added in rank order from +0") {
  for (const int n : {1, 2, 3, 5}) {
    for (const std::size_t d :
         {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4097}, std::size_t{10007}}) {
      for (const std::size_t chunk : {std::size_t{0}, std::size_t{1000}}) {
        for (const bool two_bit : {false, true}) {
          for (const bool senders : {false, true}) {
            const compress::top_k_ef_options o{
                .density = d > 100 ? 0.05 : 0.5, .two_bit = two_bit, .chunk = chunk, .sender_mean = senders};
            CAPTURE(n);
            CAPTURE(d);
            CAPTURE(chunk);
            CAPTURE(two_bit);
            CAPTURE(senders);
            comm::local_group(n).run([&](local& c) {
              std::vector<std::byte> all;
              keeps_gathered k{{c}, &all};
              compress::top_k_ef<> x(d, o);
              std::mt19937 rng(1000u * static_cast<unsigned>(c.rank()) + static_cast<unsigned>(d + chunk));
              std::vector<float> out(d);
              for (int round = 0; round < 4; ++round) {
                const auto g = input(rng, d, round == 2);
                x.reduce(k, g, std::span<float>(out));
                const auto want = reference_sum(all, static_cast<std::size_t>(n), d, o);
                CHECK(same_bits(out, want));
                const auto bad = select::find_non_finite(std::span<const float>(out));
                CHECK(x.sum_non_finite().count == bad.count);
                CHECK(x.sum_non_finite().first == bad.first);
              }
            });
          }
        }
      }
    }
  }
}
