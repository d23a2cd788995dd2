// compress::region_top_k, Ok-Topk's region sums for DiLoCo: every rank's k largest of each chunk (values in
// bf16) summed by the chunk's owner, the means over the senders cut to the chunk's k largest and gathered,
// against a reference written from the definition on random inputs (n = 1..5, sizes 0, 1, odd, chunks and
// none, decay, ties, signed zeros, many rounds); conservation bit for bit (what a cut dropped back in the
// residual); the bytes the meter counts against cost/; bytes a rank flat in n; a checkpoint; the refusals.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/region_top_k.hpp>
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
using regions = compress::region_top_k<S>;

// The mean over the senders times n, as the engine's mean over n then gives the senders' mean: in double,
// rounded once; the sum as it is where every rank or none sent.
float over_senders(float sum, std::uint32_t senders, std::uint32_t n) {
  if (senders == 0 || senders == n) return sum;
  return static_cast<float>(static_cast<double>(sum) * n / senders);
}

// Rounds of region_top_k on n ranks against the definition; the first failure, empty when all hold.
std::string matches_reference(const shape& k, int seed, int rounds) {
  const auto n = static_cast<std::size_t>(k.n);
  const auto rec = record_rounds(k, seed, rounds, [&] {
    return compress::region_top_k<>(k.d, {.density = k.density, .chunk = k.chunk, .decay = k.decay});
  });
  const auto chunks = cost::top_k_chunks::of(k.d, k.chunk, k.density);
  for (int t = 0; t < rounds; ++t) {
    const auto& p = rec[static_cast<std::size_t>(t)].p;
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
    // Each chunk's cut: the k largest means, rounded to bf16; a rank sent its picks that the cut kept.
    std::vector<float> want(k.d, 0.0f);
    std::vector<std::uint8_t> cut(k.d, 0);
    for (std::uint64_t j = 0; j < chunks.count; ++j)
      for (auto i : reference_top(mean, static_cast<std::size_t>(chunks.first(j)),
                                  static_cast<std::size_t>(chunks.length(j)), k.density)) {
        cut[i] = 1;
        want[i] = bf16_round(mean[i]);
      }
    const auto why = check_round(
        rec[static_cast<std::size_t>(t)], want,
        [&](std::size_t r, std::size_t i) { return picked[r][i] && cut[i] ? bf16_round(p[r][i]) : 0.0f; },
        [&](int) { return cost::region_top_k_traffic(chunks, k.n).bytes_sent; });
    if (!why.empty()) return "round " + std::to_string(t) + ": " + why;
  }
  return {};
}

} // namespace

TEST_CASE("region_top_k is its definition: each rank's picks, the owners' sums over the senders cut to k") {
  check_every_shape(matches_reference);
}

TEST_CASE(
    "region_top_k with laplace_bisect warm and trimmed, or select::chunked, gives exact selection's bits") {
  warm_selectors_are_exact<regions>();
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
  const auto gathered = sync::diloco_code::parse("topk-0.01-c4096-2bit-senders");
  CHECK(gathered.round_traffic(120576, 8, 0, false).bytes_sent >
        2 * gathered.round_traffic(120576, 4, 0, false).bytes_sent);
}

TEST_CASE("region_top_k through a checkpoint: the residual comes back, other parameters are refused") {
  checkpoint_comes_back<compress::region_top_k<>>();
}

TEST_CASE("region_top_k refuses bad options, bad input on any rank and ranks built differently") {
  refuses_bad_input<regions>();
}

TEST_CASE("a cut index outside its chunk, or not above the one before, is corrupt_data on every rank") {
  corrupt_gather_is_refused<compress::region_top_k<>>();
}

TEST_CASE("the regions code's name, parts and sizes in cost/") {
  const auto code = sync::diloco_code::parse("topk-0.01-c4096-b0.95-regions");
  CHECK(code.regions);
  CHECK(code.name() == "topk-0.01-c4096-b0.95-regions");
  CHECK(code.unit() == 4096);
  CHECK_FALSE(code.gathered());
  CHECK(code.message_bytes(8192) == 2 * 82 + (12 * 82 + 7) / 8);
  for (const char* bad : {"topk-0.01-2bit-regions", "topk-0.01-regions-senders", "topk-0.01-regions-shared",
                          "topk-0.01-regions-regions"})
    CHECK_THROWS_AS(sync::diloco_code::parse(bad), invalid_argument);
  for (int n : {1, 2, 3, 8})
    for (int r = 0; r < n; ++r)
      CHECK(code.round_traffic(10000, n, r, r == 0) ==
            cost::region_top_k_traffic(cost::top_k_chunks::of(10000, 4096, 0.01), n));
}
