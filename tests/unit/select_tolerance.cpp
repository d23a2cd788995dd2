// The tolerance formula every approximate method shares (host and CUDA): count_limit(k, tol) is
// ceil((1 + tol) k) with tol read as the fraction it was written as, and one check of tol.
#include <commsgd/select/selector.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>

namespace sel = commsgd::select;

namespace {

constexpr std::uint64_t two40 = std::uint64_t{1} << 40;

// ceil(p k / q) + k in integers: the limit for a tolerance written as the fraction p / q.
std::uint64_t integer_limit(std::uint64_t k, std::uint64_t p, std::uint64_t q) {
  return k + (p * k + q - 1) / q;
}

} // namespace

TEST_CASE("count_limit pins: k = 0, 1, 100 and near 2^40, tol = 0, 0.01, 0.1, 1") {
  for (double tol : {0.0, 0.01, 0.1, 1.0}) {
    CAPTURE(tol);
    CHECK(sel::count_limit(0, tol) == 0);
  }
  CHECK(sel::count_limit(1, 0.0) == 1);
  CHECK(sel::count_limit(1, 0.01) == 2);
  CHECK(sel::count_limit(1, 0.1) == 2);
  CHECK(sel::count_limit(1, 1.0) == 2);
  CHECK(sel::count_limit(100, 0.0) == 100);
  CHECK(sel::count_limit(100, 0.01) == 101);
  // (1 + 0.1) * 100 in double is 110.00000000000001: a literal ceil gives 111.
  CHECK(sel::count_limit(100, 0.1) == 110);
  CHECK(sel::count_limit(100, 1.0) == 200);
  CHECK(sel::count_limit(two40, 0.0) == two40);
  CHECK(sel::count_limit(two40, 0.01) == two40 + 10995116278u); // 0.01 * 2^40 = 10995116277.76
  CHECK(sel::count_limit(two40, 0.1) == two40 + 109951162778u); // 109951162777.6
  CHECK(sel::count_limit(two40, 1.0) == 2 * two40);
  // k = 2^40 + 4: 0.1 k is the integer 109951162778 exactly; k = 2^40 + 5: 109951162778.1 must round up.
  CHECK(sel::count_limit(two40 + 4, 0.1) == two40 + 4 + 109951162778u);
  CHECK(sel::count_limit(two40 + 5, 0.1) == two40 + 5 + 109951162779u);
}

TEST_CASE("count_limit is k + ceil(p k / q) for a tolerance written as p / q, on random k up to 2^40") {
  struct fraction {
    std::uint64_t p, q;
  };
  const fraction fractions[] = {{0, 1},  {1, 100},  {1, 10},    {1, 1},     {5, 100}, {1, 4},
                                {1, 3},  {2, 3},    {3, 10},    {7, 100},   {1, 7},   {3, 2},
                                {25, 1}, {1, 1000}, {13, 1000}, {999, 1000}};
  std::mt19937_64 rng(2024);
  for (const fraction f : fractions) {
    const double tol = static_cast<double>(f.p) / static_cast<double>(f.q);
    for (int i = 0; i < 4000; ++i) {
      // Small k, k near a multiple of q, and k spread over [1, 2^40].
      std::uint64_t k;
      if (i < 1000)
        k = static_cast<std::uint64_t>(i);
      else if (i < 2000)
        k = (rng() % (two40 / f.q)) * f.q + (rng() % 3);
      else
        k = rng() % two40 + 1;
      CAPTURE(tol);
      CAPTURE(k);
      REQUIRE(sel::count_limit(k, tol) == integer_limit(k, f.p, f.q));
    }
  }
}

TEST_CASE("count_limit never goes below ceil((1 + tol) k) and saturates instead of wrapping") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 2.0);
  for (int i = 0; i < 20000; ++i) {
    const double tol = u(rng);
    const std::uint64_t k = rng() % (std::uint64_t{1} << 30);
    const std::uint64_t limit = sel::count_limit(k, tol);
    CAPTURE(tol);
    CAPTURE(k);
    // The exact real tol k lies within one of the double product; the limit covers it and is minimal.
    CHECK(static_cast<double>(limit - k) >= tol * static_cast<double>(k) - 1.0);
    CHECK(static_cast<double>(limit - k) <= tol * static_cast<double>(k) + 1.0);
    if (limit > k) CHECK(static_cast<double>(limit - k - 1) / static_cast<double>(k) < tol);
    CHECK(static_cast<double>(limit - k) / static_cast<double>(k == 0 ? 1 : k) >= (k == 0 ? 0.0 : tol));
  }
  const std::size_t most = std::numeric_limits<std::size_t>::max();
  CHECK(sel::count_limit(most, 0.0) == most);
  CHECK(sel::count_limit(most, 0.01) == most);
  CHECK(sel::count_limit(std::uint64_t{1} << 52, 1.0) == (std::uint64_t{1} << 53));
  CHECK(sel::count_limit(most / 2, 1.0) >= most - 1);
  CHECK(sel::count_limit(most / 2 + 1, 1.0) == most);
  CHECK(sel::count_limit(two40, 1e9) == most);
}

TEST_CASE("tol is checked once, with one message, by count_limit and check_tolerance alike") {
  for (double bad : {-0.5, -1e-300, 1.5e9, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    std::string a, b;
    try {
      sel::check_tolerance(bad);
    } catch (const commsgd::invalid_argument& e) {
      a = e.what();
    }
    try {
      (void)sel::count_limit(10, bad);
    } catch (const commsgd::invalid_argument& e) {
      b = e.what();
    }
    CHECK(!a.empty());
    CHECK(a == b);
    CHECK(a.find("'tol'") != std::string::npos);
    CHECK(a.find("[0, 1e9]") != std::string::npos);
  }
  CHECK_NOTHROW(sel::check_tolerance(0.0));
  CHECK_NOTHROW(sel::check_tolerance(1e9));
}
