// Exact selectors (and the approximate ones with trim) against the sorted reference.
#include "select_data.hpp"

#include <commsgd/select/select.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace sel = commsgd::select;
using select_data::reference;

namespace {

// The approximate methods with trim must give the same answer as exact.
struct laplace_trimmed {
  sel::laplace_bisect s{[] {
    sel::laplace_bisect::options o;
    o.trim = true;
    o.warm_start = false;
    return o;
  }()};
  sel::threshold select(std::span<const float> x, std::size_t k) { return s.select(x, k); }
};
struct sampled_trimmed {
  sel::sampled s{[] {
    sel::sampled::options o;
    o.trim = true;
    return o;
  }()};
  sel::threshold select(std::span<const float> x, std::size_t k) { return s.select(x, k); }
};
// Small segments so that hierarchical truncates even on small inputs.
struct hierarchical_small {
  sel::hierarchical s{sel::hierarchical::options{64, 1.0, {}}};
  sel::threshold select(std::span<const float> x, std::size_t k) { return s.select(x, k); }
};
// Threads forced on small inputs, so the split and the merge are tested.
struct radix_threads {
  sel::radix s{sel::radix::options{sel::parallel_options{3, 1}}};
  sel::threshold select(std::span<const float> x, std::size_t k) { return s.select(x, k); }
};
struct laplace_threads {
  sel::laplace_bisect s{[] {
    sel::laplace_bisect::options o;
    o.trim = true;
    o.warm_start = false;
    o.scale_sample = 0;
    o.parallel = sel::parallel_options{3, 1};
    return o;
  }()};
  sel::threshold select(std::span<const float> x, std::size_t k) { return s.select(x, k); }
};

// The many-chunk selector's long-chunk path (laplace_bisect, trimmed) taken from 64 values on.
struct chunked_small {
  sel::chunked s{sel::chunked::options{.small = 64}};
  sel::threshold select(std::span<const float> x, std::size_t k) { return s.select(x, k); }
};

// The many-chunk selector's portable loops, where the CPU would take its AVX2 passes.
struct chunked_portable {
  sel::chunked s{sel::chunked::options{.vector = false}};
  sel::threshold select(std::span<const float> x, std::size_t k) { return s.select(x, k); }
};

template <class S>
void check_all_k(S& s, const std::vector<float>& x) {
  const std::size_t n = x.size();
  std::vector<std::size_t> ks{0, 1, n / 2, n};
  if (n > 0) ks.push_back(n - 1);
  for (double d : {1e-3, 1e-2, 0.1})
    ks.push_back(static_cast<std::size_t>(d * static_cast<double>(n)));
  for (std::size_t k : ks) {
    if (k > n) continue;
    CAPTURE(n);
    CAPTURE(k);
    CHECK(s.select(x, k) == reference(x, k));
  }
}

} // namespace

TEST_CASE_TEMPLATE("exact-answer selectors equal the sorted reference", S, sel::exact, sel::radix,
                   sel::hierarchical, hierarchical_small, radix_threads, laplace_trimmed, laplace_threads,
                   sampled_trimmed, sel::chunked, chunked_small, chunked_portable) {
  S s;
  SUBCASE("random inputs over many seeds and odd sizes") {
    std::uint64_t seed = 1;
    for (std::size_t n : {0u, 1u, 2u, 3u, 17u, 100u, 1001u, 4097u, 65537u})
      for (auto shape : select_data::shapes)
        for (int rep = 0; rep < (n < 5000 ? 4 : 1); ++rep) {
          CAPTURE(select_data::shape_name(shape));
          check_all_k(s, select_data::make(shape, n, seed++));
        }
  }
  SUBCASE("ties, zeros and signed zeros") {
    std::mt19937_64 rng(7);
    std::vector<float> few{0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 0.5f};
    std::vector<float> x(3001);
    for (auto& v : x)
      v = few[rng() % few.size()];
    check_all_k(s, x);
    std::vector<float> zeros(1000, 0.0f);
    for (std::size_t i = 0; i < zeros.size(); i += 3)
      zeros[i] = -0.0f;
    check_all_k(s, zeros);
    std::vector<float> same(777, -3.25f);
    check_all_k(s, same);
    // A tie straddling k: the lowest indices of the tie are selected.
    std::vector<float> t{5, 1, 3, -3, 3, 0, -3, 2};
    CHECK(s.select(t, 3) == sel::threshold{3.0f, 1, 2});
    // Denormals order like everything else.
    std::vector<float> tiny{std::numeric_limits<float>::denorm_min(), 0.0f,
                            -2 * std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()};
    check_all_k(s, tiny);
  }
  SUBCASE("large values concentrated in one place") {
    std::vector<float> x = select_data::make(select_data::shape::laplace, 20000, 99);
    for (std::size_t i = 5000; i < 5400; ++i)
      x[i] *= 1000.0f;
    check_all_k(s, x);
  }
}

TEST_CASE_TEMPLATE("every selector refuses NaN and inf with count and first index", S, sel::exact, sel::radix,
                   sel::hierarchical, sel::laplace_bisect, sel::sampled, sel::chunked) {
  for (std::size_t n : {1u, 33u, 5000u, 70000u}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x = select_data::make(select_data::shape::laplace, n, n);
      const std::size_t first = n / 3;
      x[first] = bad;
      std::size_t count = 1;
      if (n > 10) {
        x[n - 1] = -bad;
        ++count;
      }
      for (std::size_t k : {std::size_t{0}, std::size_t{1}, n / 2, n}) {
        S s;
        CAPTURE(n);
        CAPTURE(k);
        try {
          s.select(x, k);
          FAIL("no exception");
        } catch (const commsgd::non_finite& e) {
          CHECK(e.count() == count);
          CHECK(e.first_index() == first);
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("k above N is refused", S, sel::exact, sel::radix, sel::hierarchical, sel::laplace_bisect,
                   sel::sampled, sel::chunked) {
  S s;
  std::vector<float> x(10, 1.0f);
  CHECK_THROWS_AS(s.select(x, 11), commsgd::invalid_argument);
  CHECK_THROWS_AS(s.select(std::span<const float>{}, 1), commsgd::invalid_argument);
  CHECK(s.select(std::span<const float>{}, 0) == sel::threshold{});
}

TEST_CASE("hierarchical falls back when one segment holds the largest entries, and stays exact") {
  std::vector<float> x = select_data::make(select_data::shape::gaussian, 1 << 16, 3);
  for (std::size_t i = 0; i < 2000; ++i)
    x[i] = 100.0f + static_cast<float>(i % 7);
  sel::hierarchical h(sel::hierarchical::options{1024, 3.0, {}});
  CHECK(h.select(x, 1500) == reference(x, 1500));
  CHECK(h.last_fell_back());
  std::vector<float> y = select_data::make(select_data::shape::gaussian, 1 << 16, 4);
  CHECK(h.select(y, 100) == reference(y, 100));
  CHECK_FALSE(h.last_fell_back());
}

TEST_CASE("one large input: 2^24 entries, density 1e-3") {
  const std::size_t n = std::size_t{1} << 24;
  const std::vector<float> x = select_data::make(select_data::shape::relu_like, n, 2024);
  const std::size_t k = sel::k_for_density(n, 1e-3);
  const sel::threshold want = reference(x, k);
  CHECK(sel::exact{}.select(x, k) == want);
  CHECK(sel::radix{}.select(x, k) == want);
  CHECK(sel::hierarchical{}.select(x, k) == want);
  laplace_trimmed l;
  CHECK(l.select(x, k) == want);
}
