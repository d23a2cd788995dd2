// Compaction writes exactly the selected set, in index order: the selection rule (is_selected, shared with
// the device), the one host compaction loop (for_each_selected) and select::compact on top of it.
#include "select_data.hpp"

#include <commsgd/select/select.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace sel = commsgd::select;

namespace {

// The selection the contract describes, built the obvious way.
std::vector<std::uint64_t> expected_indices(std::span<const float> x, const sel::threshold& t) {
  std::vector<std::uint64_t> out;
  std::size_t ties = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float m = std::fabs(x[i]);
    if (m > t.value || (m == t.value && ties++ < t.at)) out.push_back(i);
  }
  return out;
}

// Small integers (many ties, -0 and +0) or heavy-tailed values.
std::vector<float> ties_or_tails(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  const bool ties = seed % 2 == 0;
  for (auto& v : x)
    v = ties ? static_cast<float>(static_cast<int>(rng() % 7) - 3) * 0.25f
             : std::ldexp(static_cast<float>(rng() % 1000) + 1.0f, -static_cast<int>(rng() % 20));
  return x;
}

} // namespace

TEST_CASE_TEMPLATE("compact writes the selected (index, value) pairs in index order", Index, std::uint32_t,
                   std::uint64_t) {
  std::uint64_t seed = 40;
  for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 1000u, 65539u})
    for (auto s : select_data::shapes) {
      std::vector<float> x = select_data::make(s, n, seed++);
      if (n > 20) x[7] = x[19] = x[3]; // a tie somewhere
      for (std::size_t k : {std::size_t{0}, std::size_t{1}, n / 100, n / 3, n}) {
        if (k > n) continue;
        CAPTURE(n);
        CAPTURE(k);
        const sel::threshold t = sel::exact{}.select(x, k);
        const auto got = sel::compact<Index>(x, t);
        const auto want = expected_indices(x, t);
        REQUIRE(got.indices.size() == want.size());
        CHECK(got.indices.size() == k);
        for (std::size_t i = 0; i < want.size(); ++i) {
          CHECK(got.indices[i] == want[i]);
          CHECK(got.values[i] == x[want[i]]);
        }
      }
    }
}

TEST_CASE("compact checks its output sizes and that the threshold describes x") {
  std::vector<float> x{1, -5, 3, 3, 0, -3};
  const sel::threshold t = sel::exact{}.select(x, 2); // 5 and the first 3
  std::vector<std::uint32_t> idx(2);
  std::vector<float> val(2);
  CHECK(sel::compact<std::uint32_t>(x, t, idx, val) == 2);
  CHECK(idx == std::vector<std::uint32_t>{1, 2});
  CHECK(val == std::vector<float>{-5, 3});
  std::vector<std::uint32_t> small(1);
  CHECK_THROWS_AS(sel::compact<std::uint32_t>(x, t, small, val), commsgd::size_mismatch);
  std::vector<float> big(3);
  CHECK_THROWS_AS(sel::compact<std::uint32_t>(x, t, idx, big), commsgd::size_mismatch);
  // Thresholds that do not match x: too many above, or fewer ties than claimed.
  CHECK_THROWS_AS(sel::compact<std::uint32_t>(x, sel::threshold{2.0f, 1, 1}, idx, val),
                  commsgd::invalid_argument);
  std::vector<std::uint32_t> i3(3);
  std::vector<float> v3(3);
  CHECK_THROWS_AS(sel::compact<std::uint32_t>(x, sel::threshold{5.0f, 0, 3}, i3, v3),
                  commsgd::invalid_argument);
  // The approximate contract (every tie taken) compacts the same way.
  const sel::threshold all_ties{3.0f, 1, 3};
  const auto s = sel::compact<std::uint64_t>(x, all_ties);
  CHECK(s.indices == std::vector<std::uint64_t>{1, 2, 3, 5});
}

TEST_CASE("is_selected: everything above, the first `at` ties, nothing below") {
  CHECK(sel::is_selected(5, 4, 0, 0));
  CHECK(sel::is_selected(5, 4, 99, 0));
  CHECK_FALSE(sel::is_selected(3, 4, 0, 10));
  CHECK(sel::is_selected(4, 4, 0, 1));
  CHECK_FALSE(sel::is_selected(4, 4, 1, 1));
  CHECK(sel::is_selected(4, 4, 6, 7));
  CHECK_FALSE(sel::is_selected(4, 4, 0, 0));
  static_assert(sel::is_selected(1, 0, 0, 0), "usable in constant expressions, as on the device");
}

TEST_CASE("for_each_selected visits exactly the contract's set, in index order, on random inputs") {
  for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 33u, 1000u, 65537u})
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
      const std::vector<float> x = ties_or_tails(n, seed * 31 + n);
      for (std::size_t k : {std::size_t{0}, std::size_t{1}, n / 7, n / 2, n}) {
        if (k > n) continue;
        CAPTURE(n);
        CAPTURE(seed);
        CAPTURE(k);
        const sel::threshold t = sel::exact{}.select(x, k);
        std::vector<std::size_t> got;
        const auto r = sel::for_each_selected(x, t, [&](std::size_t i) { got.push_back(i); });
        const auto want = expected_indices(x, t);
        CHECK(std::equal(got.begin(), got.end(), want.begin(), want.end()));
        CHECK(r.taken == k);
        CHECK(r.ties == t.at);
        CHECK_FALSE(r.more);
      }
    }
}

TEST_CASE("for_each_selected stops short of an entry beyond the count, and may overwrite what it visited") {
  std::vector<float> x{1, -5, 3, 3, 0, -3, 7, 3};
  // Claims one entry above 3 and one at it; there are two above.
  const sel::threshold under{3.0f, 1, 1};
  std::vector<std::size_t> got;
  auto r = sel::for_each_selected(x, under, [&](std::size_t i) { got.push_back(i); });
  CHECK(r.more);
  CHECK(r.taken == 2);
  CHECK(got == std::vector<std::size_t>{1, 2});
  // Claims more than there are: the loop runs to the end and reports what it found.
  const sel::threshold over{3.0f, 2, 9};
  r = sel::for_each_selected(x, over, [&](std::size_t i) { x[i] = 0.0f; });
  CHECK_FALSE(r.more);
  CHECK(r.taken == 6);
  CHECK(r.ties == 4);
  CHECK(x == std::vector<float>{1, 0, 0, 0, 0, 0, 0, 0});
}
