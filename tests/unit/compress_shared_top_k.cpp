// compress::shared_top_k, top-k whose indices every rank shares: each chunk's indices are its round's leader's
// k largest magnitudes (ties to the lowest index), every rank's values there rounded once to 16 bits and
// summed by the ring, against a reference written from the definition on random inputs (n = 1..5, sizes 0, 1,
// odd, chunks and none, decay, ties, signed zeros, many rounds); conservation bit for bit; the bytes the meter
// counts against cost/; bytes a rank flat in n; a checkpoint mid-run; and the refusals.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/shared_top_k.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sync/diloco_codes.hpp>
#include <support/compressor_ranks.hpp>
#include <support/top_k_cases.hpp>

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

using namespace top_k_cases;

template <class S>
using shared = compress::shared_top_k<S>;

// The ring's sum of every rank's contribution (compress::bf16 without error feedback runs the same ring, on
// its own tested against a one-value reference), on n fresh thread ranks.
std::vector<float> ring_sum(const std::vector<std::vector<float>>& contributions) {
  const int n = static_cast<int>(contributions.size());
  std::vector<float> out(contributions[0].size());
  std::mutex mu;
  local_group(n).run([&](local& c) {
    compress::bf16 x(out.size());
    std::vector<float> sum(out.size());
    x.reduce(c, contributions[static_cast<std::size_t>(c.rank())], sum);
    if (c.rank() == 0) {
      std::lock_guard lock(mu);
      out = sum;
    }
  });
  return out;
}

// Rounds of shared_top_k on n ranks against the definition; the first failure, empty when all hold.
std::string matches_reference(const shape& k, int seed, int rounds) {
  const auto n = static_cast<std::size_t>(k.n);
  const auto rec = record_rounds(k, seed, rounds, [&] {
    return compress::shared_top_k<>(k.d, {.density = k.density, .chunk = k.chunk, .decay = k.decay});
  });
  const auto chunks = cost::top_k_chunks::of(k.d, k.chunk, k.density);
  for (int t = 0; t < rounds; ++t) {
    const auto& p = rec[static_cast<std::size_t>(t)].p;
    // The shared indices: chunk j's from rank (j + t) mod n.
    std::vector<std::size_t> mask;
    for (std::uint64_t j = 0; j < chunks.count; ++j) {
      const auto leader = static_cast<std::size_t>((j + static_cast<std::uint64_t>(t)) % n);
      const auto top = reference_top(p[leader], static_cast<std::size_t>(chunks.first(j)),
                                     static_cast<std::size_t>(chunks.length(j)), k.density);
      mask.insert(mask.end(), top.begin(), top.end());
    }
    std::vector<std::vector<float>> mine(n, std::vector<float>(mask.size()));
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t m = 0; m < mask.size(); ++m)
        mine[r][m] = bf16_round(p[r][mask[m]]);
    const auto sum = mask.empty() ? std::vector<float>{} : ring_sum(mine);
    std::vector<float> want(k.d, 0.0f);
    for (std::size_t m = 0; m < mask.size(); ++m) {
      want[mask[m]] = sum[m];
      double exact = 0.0;
      for (std::size_t r = 0; r < n; ++r)
        exact += mine[r][m];
      // The ring rounds each partial sum to bf16 (8 significant bits) at each of n - 1 hops.
      double scale = 0.0;
      for (std::size_t r = 0; r < n; ++r)
        scale += std::fabs(mine[r][m]);
      if (std::fabs(sum[m] - exact) > scale * n * 0x1p-8)
        return "round " + std::to_string(t) + ": " +
               ("the sum at " + std::to_string(mask[m]) + " is " + std::to_string(sum[m]) +
                ", far from the exact " + std::to_string(exact));
    }
    std::vector<std::int64_t> at(k.d, -1); // where index i is among the shared ones
    for (std::size_t m = 0; m < mask.size(); ++m)
      at[mask[m]] = static_cast<std::int64_t>(m);
    const auto why = check_round(
        rec[static_cast<std::size_t>(t)], want,
        [&](std::size_t r, std::size_t i) {
          return at[i] < 0 ? 0.0f : mine[r][static_cast<std::size_t>(at[i])];
        },
        [&](int r) { return cost::shared_top_k_traffic(chunks, k.n, r).bytes_sent; });
    if (!why.empty()) return "round " + std::to_string(t) + ": " + why;
  }
  return {};
}

} // namespace

TEST_CASE(
    "shared_top_k is its definition: the leaders' indices, every rank's bf16 values summed by the ring") {
  check_every_shape(matches_reference);
}

TEST_CASE(
    "shared_top_k with laplace_bisect warm and trimmed, or select::chunked, gives exact selection's bits") {
  warm_selectors_are_exact<shared>();
}

TEST_CASE(
    "shared_top_k's bytes a rank: bounded in n while the chunks are at least n, the gathered code's not") {
  // A rank sends 40 (n - 1) bytes of verdicts, (n - 1) slots of about 1.5 k / n bytes and 4 k (n - 1) / n bytes
  // of the ring: at most about 5.5 k + 40 n.
  // 120,576 values (the small byte model) in chunks of 4096 at 1 %: 30 chunks.
  const auto c = cost::top_k_chunks::of(120576, 4096, 0.01);
  auto most = [&](int n) {
    std::uint64_t m = 0;
    for (int r = 0; r < n; ++r)
      m = std::max(m, cost::shared_top_k_traffic(c, n, r).bytes_sent);
    return m;
  };
  const double ring8 = static_cast<double>(comm::ring_all_reduce_traffic(120576, 4, 8, 0).bytes_sent);
  CHECK(static_cast<double>(most(8)) <= 1.25 * static_cast<double>(most(4)));
  CHECK(ring8 / static_cast<double>(most(8)) >= 100.0);
  CHECK(static_cast<double>(most(16)) <= 1.25 * static_cast<double>(most(8)));
  CHECK(most(30) < 6 * c.k() + 40 * 30); // 30 ranks: one chunk a rank
  // The gathered top-k code of the same density grows with n.
  const auto gathered = sync::diloco_code::parse("topk-0.01-c4096-2bit");
  CHECK(gathered.round_traffic(120576, 8, 0, false).bytes_sent >
        2 * gathered.round_traffic(120576, 4, 0, false).bytes_sent);
}

TEST_CASE("shared_top_k through a checkpoint: the residual and the round (the leaders) come back") {
  checkpoint_comes_back<compress::shared_top_k<>>();
}

TEST_CASE("shared_top_k refuses bad options, bad input on any rank and ranks built differently") {
  refuses_bad_input<shared>();
  {
    // fp16 values: a shared value beyond its range refuses the round on every rank, naming it on its own.
    std::mutex mu;
    int named = 0, refused = 0;
    local_group(2).run([&](local& c) {
      compress::shared_top_k<select::exact, compress::fp16_format> x(8, {.density = 0.25});
      std::vector<float> g(8, 0.5f), out(8);
      if (c.rank() == 0) g[3] = 1e6f; // rank 0 leads the only chunk in round 0 and picks it
      try {
        x.reduce(c, g, out);
      } catch (const invalid_argument& e) {
        std::lock_guard lock(mu);
        named += std::string(e.what()).find("at index 3") != std::string::npos;
        ++refused;
      } catch (const non_finite&) {
        std::lock_guard lock(mu);
        ++refused;
      }
      CHECK(x.steps() == 0);
    });
    CHECK(refused == 2);
    CHECK(named == 1);
  }
}

TEST_CASE("an index outside its chunk, or not above the one before, is corrupt_data on every rank") {
  corrupt_gather_is_refused<compress::shared_top_k<>>();
}

TEST_CASE("the shared code's name, parts and sizes in cost/") {
  const auto code = sync::diloco_code::parse("topk-0.01-c4096-b0.95-shared");
  CHECK(code.shared);
  CHECK(code.name() == "topk-0.01-c4096-b0.95-shared");
  CHECK(code.unit() == 4096);
  CHECK_FALSE(code.gathered());
  // 2 bytes a value and 12-bit indices: 41 + 41 values over two chunks of 4096.
  CHECK(code.message_bytes(8192) == 2 * 82 + (12 * 82 + 7) / 8);
  for (const char* bad : {"topk-0.01-2bit-shared", "topk-0.01-shared-senders", "topk-0.01-shared-shared"})
    CHECK_THROWS_AS(sync::diloco_code::parse(bad), invalid_argument);
  for (int n : {1, 2, 3, 8})
    for (int r = 0; r < n; ++r)
      CHECK(code.round_traffic(10000, n, r, r == 0) ==
            cost::shared_top_k_traffic(cost::top_k_chunks::of(10000, 4096, 0.01), n, r));
}
