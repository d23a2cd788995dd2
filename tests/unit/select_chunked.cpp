// select::chunked's many-chunk call (whole, and in runs of chunks) against each chunk's sorted reference, over rounds of error-feedback
// accumulators whose thresholds drift, jump and collapse (so warm starts hit, miss and restart), chunk
// lengths that do and do not divide the input, ties, signed zeros, subnormals, and refusals; the AVX2 passes
// (where this CPU has them) and the portable loops alike.
#include "select_data.hpp"

#include <commsgd/select/chunked.hpp>
#include <commsgd/select/selector.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <vector>

namespace sel = commsgd::select;

namespace {

struct picks {
  std::vector<std::uint32_t> idx;
  std::vector<float> val;
  friend bool operator==(const picks&, const picks&) = default;
};

std::size_t k_for(std::size_t len, double density) {
  return len == 0 ? 0 : sel::k_for_density(len, density);
}

// Each chunk's k largest |x| (ties to the lowest index) by a full sort, indices relative to the chunk, rising.
picks reference(std::span<const float> x, std::size_t size, double density) {
  picks r;
  if (size == 0) size = std::max<std::size_t>(x.size(), 1);
  for (std::size_t b = 0; b < x.size(); b += size) {
    const std::size_t len = std::min(size, x.size() - b);
    std::vector<std::uint32_t> order(len);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t c) {
      return sel::magnitude_key(x[b + a]) > sel::magnitude_key(x[b + c]);
    });
    order.resize(k_for(len, density));
    std::sort(order.begin(), order.end());
    for (std::uint32_t i : order) {
      r.idx.push_back(i);
      r.val.push_back(x[b + i]);
    }
  }
  return r;
}

picks run(sel::chunked& s, std::span<const float> x, std::size_t size, double density) {
  const std::size_t chunk = size == 0 ? std::max<std::size_t>(x.size(), 1) : size;
  auto k_of = [&](std::size_t j) { return k_for(std::min(chunk, x.size() - j * chunk), density); };
  std::size_t total = 0;
  for (std::size_t j = 0; j * chunk < x.size(); ++j)
    total += k_of(j);
  picks p;
  p.idx.assign(total, 0xffffffffu);
  p.val.assign(total, std::numeric_limits<float>::quiet_NaN());
  CHECK(s.select_chunks(x, size, k_of, p.idx, p.val) == total);
  return p;
}

// run() in runs of chunks (select_chunk_range), of 1, 2 or 3 chunks by turns from `first_run`: what a code
// that selects each chunk as it is formed gets.
picks run_in_ranges(sel::chunked& s, std::span<const float> x, std::size_t size, double density,
                    std::size_t first_run) {
  const std::size_t chunk = size == 0 ? std::max<std::size_t>(x.size(), 1) : size;
  const std::size_t count = (x.size() + chunk - 1) / chunk;
  auto k_of = [&](std::size_t j) { return k_for(std::min(chunk, x.size() - j * chunk), density); };
  picks p;
  for (std::size_t j0 = 0, turn = first_run; j0 < count; ++turn) {
    const std::size_t j1 = std::min(count, j0 + 1 + turn % 3);
    std::size_t k = 0;
    for (std::size_t j = j0; j < j1; ++j)
      k += k_of(j);
    std::vector<std::uint32_t> idx(k, 0xffffffffu);
    std::vector<float> val(k, std::numeric_limits<float>::quiet_NaN());
    CHECK(s.select_chunk_range(x, size, k_of, j0, j1, idx, val) == k);
    p.idx.insert(p.idx.end(), idx.begin(), idx.end());
    p.val.insert(p.val.end(), val.begin(), val.end());
    j0 = j1;
  }
  return p;
}

bool same_bits(const picks& a, const picks& b) {
  if (a.idx != b.idx || a.val.size() != b.val.size()) return false;
  for (std::size_t i = 0; i < a.val.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a.val[i]) != std::bit_cast<std::uint32_t>(b.val[i])) return false;
  return true;
}

} // namespace

TEST_CASE(
    "chunked: every chunk's exact top-k over rounds of error feedback whose thresholds drift and jump") {
  std::uint64_t seed = 11;
  for (bool vector : {true, false}) // the AVX2 passes (where this CPU has them) and the portable loops
    for (std::size_t n : {0u, 1u, 16u, 17u, 1000u, 12289u})
      for (std::size_t size :
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{4096}})
        for (double density : {0.01, 0.3, 1.0})
          for (auto shape : select_data::shapes) {
            if (size < 64 && n > 1000) continue; // tiny chunks: the same path many times
            CAPTURE(n);
            CAPTURE(size);
            CAPTURE(density);
            CAPTURE(select_data::shape_name(shape));
            CAPTURE(vector);
            sel::chunked s(sel::chunked::options{.vector = vector});
            std::vector<float> residual(n, 0.0f);
            std::mt19937_64 rng(seed++);
            for (int round = 0; round < 8; ++round) {
              CAPTURE(round);
              // Steady drift, then a jump up (every floor too low) and a collapse (every floor too high).
              const float scale = round == 5   ? 30.0f
                                  : round == 6 ? 0.002f
                                               : 1.0f + 0.05f * static_cast<float>(round);
              std::vector<float> p = select_data::make(shape, n, rng(), scale * 1e-3f);
              for (std::size_t i = 0; i < n; ++i)
                p[i] += round == 6 ? 0.0f : residual[i];
              // Odd rounds in runs of chunks: the warm starts carry over from either way of calling.
              const picks got = round % 2 == 0
                                    ? run(s, p, size, density)
                                    : run_in_ranges(s, p, size, density, static_cast<std::size_t>(round));
              const picks want = reference(p, size, density);
              REQUIRE(same_bits(got, want));
              residual = p;
              const std::size_t chunk = size == 0 ? std::max<std::size_t>(n, 1) : size;
              std::size_t at = 0;
              for (std::size_t b = 0; b < n; b += chunk) {
                const std::size_t kj = k_for(std::min(chunk, n - b), density);
                for (std::size_t q = at; q < at + kj; ++q)
                  residual[b + got.idx[q]] = 0.0f;
                at += kj;
              }
            }
          }
}

TEST_CASE("chunked: ties, signed zeros and subnormals go to the lowest index in every chunk") {
  std::mt19937_64 rng(5);
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> few{0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 0.5f, tiny, -tiny, 3 * tiny};
  for (bool vector : {true, false})
    for (std::size_t n : {33u, 3001u, 9000u})
      for (std::size_t size : {std::size_t{16}, std::size_t{100}, std::size_t{4096}})
        for (double density : {0.01, 0.1, 0.5}) {
          CAPTURE(n);
          CAPTURE(size);
          CAPTURE(density);
          CAPTURE(vector);
          sel::chunked s(sel::chunked::options{.vector = vector});
          for (int round = 0; round < 3; ++round) {
            std::vector<float> x(n);
            for (auto& v : x)
              v = few[rng() % (round == 2 ? 3 : few.size())]; // the last round: zeros and ones only
            CHECK(same_bits(run(s, x, size, density), reference(x, size, density)));
          }
        }
}

TEST_CASE("chunked: chunks longer than options.small go to laplace_bisect and give the same set") {
  sel::chunked small(sel::chunked::options{.small = 100});
  sel::chunked wide;
  std::mt19937_64 rng(3);
  std::vector<float> residual(5000, 0.0f);
  for (int round = 0; round < 5; ++round)
    for (std::size_t size : {std::size_t{64}, std::size_t{1000}, std::size_t{0}}) {
      CAPTURE(round);
      CAPTURE(size);
      std::vector<float> x = select_data::make(select_data::shape::relu_like, 5000, rng());
      for (std::size_t i = 0; i < x.size(); ++i)
        x[i] += residual[i];
      const picks want = reference(x, size, 0.02);
      CHECK(same_bits(run(small, x, size, 0.02), want));
      CHECK(same_bits(run(wide, x, size, 0.02), want));
      residual = x;
    }
}

TEST_CASE(
    "chunked: a warm round reads each chunk about once and collects a few times k; a cold one collects all") {
  const std::size_t n = 40 * 4096 + 123, size = 4096;
  sel::chunked s;
  std::mt19937_64 rng(9);
  std::vector<float> residual(n, 0.0f);
  const std::size_t chunks = (n + size - 1) / size;
  std::size_t warm_passes = 0, warm_rounds = 0;
  for (int round = 0; round < 30; ++round) {
    CAPTURE(round);
    std::vector<float> p = select_data::make(select_data::shape::laplace, n, rng());
    for (std::size_t i = 0; i < n; ++i)
      p[i] += 0.9f * residual[i];
    const picks got = run(s, p, size, 0.01);
    CHECK(s.last_passes() >= chunks);
    if (round == 0) {
      CHECK(s.last_passes() == chunks);
      CHECK(s.last_held() == n);
    } else if (round >= 3) {
      // A miss reads its chunk again; the margins follow the prediction errors, so misses stay few.
      warm_passes += s.last_passes();
      ++warm_rounds;
      CHECK(s.last_held() <= n / 8); // a cold round holds all n
    }
    residual = p;
    std::size_t at = 0;
    for (std::size_t b = 0; b < n; b += size) {
      const std::size_t kj = k_for(std::min(size, n - b), 0.01);
      for (std::size_t q = at; q < at + kj; ++q)
        residual[b + got.idx[q]] = 0.0f;
      at += kj;
    }
  }
  CHECK(static_cast<double>(warm_passes) <= 1.25 * static_cast<double>(warm_rounds * chunks));
}

TEST_CASE("chunked: NaN and inf are refused, and the refused chunk's warm start is kept") {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    sel::chunked s;
    std::vector<float> x = select_data::make(select_data::shape::gaussian, 1000, 4);
    const picks before = run(s, x, 100, 0.05);
    std::vector<float> y = x;
    y[437] = bad;
    std::vector<std::uint32_t> idx(before.idx.size());
    std::vector<float> val(before.val.size());
    try {
      s.select_chunks(
          y, 100, [](std::size_t) { return std::size_t{5}; }, idx, val);
      FAIL("no exception");
    } catch (const commsgd::non_finite& e) {
      CHECK(e.count() == 1);
      CHECK(e.first_index() == 437); // in the whole input, not its chunk
    }
    CHECK(same_bits(run(s, x, 100, 0.05), before));
  }
}

TEST_CASE("chunked: bad arguments name themselves") {
  sel::chunked s;
  std::vector<float> x(10, 1.0f);
  std::vector<std::uint32_t> idx(4);
  std::vector<float> val(4);
  CHECK_THROWS_WITH_AS(s.select_chunks(
                           x, 4, [](std::size_t) { return std::size_t{5}; }, idx, val),
                       doctest::Contains("k_of(0) = 5 is outside the allowed range [0, 4]"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(s.select_chunks(
                           x, 4, [](std::size_t) { return std::size_t{1}; }, idx, val),
                       doctest::Contains("must both equal the chunks' total k 3"), commsgd::size_mismatch);
  CHECK_THROWS_WITH_AS(
      s.select_chunk_range(
          x, 4, [](std::size_t) { return std::size_t{1}; }, 2, 4, idx, val),
      doctest::Contains("the chunk range [2, 4) is outside the allowed range: within [0, 3]"),
      commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(s.select_chunk_range(
                           x, 4, [](std::size_t) { return std::size_t{1}; }, 2, 1, idx, val),
                       doctest::Contains("the chunk range [2, 1)"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(s.select_chunk_range(
                           x, 4, [](std::size_t) { return std::size_t{1}; }, 1, 3, idx, val),
                       doctest::Contains("must both equal the chunks' total k 2"), commsgd::size_mismatch);
  CHECK_THROWS_AS(sel::chunked(sel::chunked::options{.small = 0}), commsgd::invalid_argument);
  std::vector<std::uint32_t> none;
  std::vector<float> none_v;
  CHECK(s.select_chunks(
            std::span<const float>{}, 4, [](std::size_t) { return std::size_t{0}; }, none, none_v) == 0);
}
