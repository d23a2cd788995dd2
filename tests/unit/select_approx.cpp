// Approximate selectors: the tolerance contract, ties, warm start and its saved state.
#include "select_contract.hpp"
#include "select_data.hpp"

#include <commsgd/select/select.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

namespace sel = commsgd::select;
using select_data::check_contract;
using select_data::shape;

namespace {

sel::laplace_bisect::options laplace_opts(double tol, bool warm, sel::laplace_bisect::location c) {
  sel::laplace_bisect::options o;
  o.tol = tol;
  o.warm_start = warm;
  o.center = c;
  return o;
}

} // namespace

TEST_CASE("count_limit is ceil((1 + tol) k) without round-off surprises") {
  CHECK(sel::count_limit(100, 0.01) == 101);
  CHECK(sel::count_limit(1000, 0.01) == 1010);
  CHECK(sel::count_limit(1, 0.01) == 2);
  CHECK(sel::count_limit(150, 0.01) == 152);
  CHECK(sel::count_limit(0, 0.01) == 0);
  CHECK(sel::count_limit(7, 0.0) == 7);
  CHECK_THROWS_AS(sel::count_limit(7, -0.5), commsgd::invalid_argument);
}

TEST_CASE(
    "laplace_bisect and sampled land in [k, ceil((1 + tol) k)] on laplace, gaussian and relu_like data") {
  std::uint64_t seed = 11;
  for (std::size_t n : {1u, 5u, 999u, 20011u, 300007u})
    for (auto s : select_data::shapes)
      for (double density : {1e-4, 1e-3, 1e-2, 0.3})
        for (double tol : {0.0, 0.01, 0.1}) {
          CAPTURE(n);
          CAPTURE(select_data::shape_name(s));
          CAPTURE(density);
          CAPTURE(tol);
          const std::vector<float> x = select_data::make(s, n, seed++);
          const std::size_t k = sel::k_for_density(n, density);
          for (auto c : {sel::laplace_bisect::location::zero, sel::laplace_bisect::location::sample_median}) {
            sel::laplace_bisect l(laplace_opts(tol, false, c));
            check_contract(x, k, l.select(x, k), tol);
          }
          sel::sampled::options so;
          so.tol = tol;
          sel::sampled sm(so);
          check_contract(x, k, sm.select(x, k), tol);
        }
}

TEST_CASE("a shifted distribution: the median location still lands in tolerance") {
  std::vector<float> x = select_data::make(shape::laplace, 100000, 5);
  for (auto& v : x)
    v += 0.004f;
  const std::size_t k = 100;
  sel::laplace_bisect l(laplace_opts(0.01, false, sel::laplace_bisect::location::sample_median));
  check_contract(x, k, l.select(x, k), 0.01);
  CHECK(l.last_estimate() > 0.0f);
}

TEST_CASE("ties wider than the tolerance are refused without trim and resolved with it") {
  // 1000 entries of 2, 100 of 3, the rest small: k = 500 falls inside the tie.
  std::vector<float> x = select_data::make(shape::gaussian, 20000, 9, 1e-3f);
  for (std::size_t i = 0; i < 1000; ++i)
    x[i * 13] = (i % 2) ? 2.0f : -2.0f;
  for (std::size_t i = 0; i < 100; ++i)
    x[i * 17 + 1] = 3.0f;
  const std::size_t k = 500;
  SUBCASE("laplace_bisect") {
    sel::laplace_bisect l(laplace_opts(0.01, false, sel::laplace_bisect::location::zero));
    CHECK_THROWS_AS(l.select(x, k), commsgd::unsupported);
    auto o = laplace_opts(0.01, false, sel::laplace_bisect::location::zero);
    o.trim = true;
    sel::laplace_bisect t(o);
    CHECK(t.select(x, k) == select_data::reference(x, k));
    // A tolerance wide enough to take the whole tie is fine.
    sel::laplace_bisect wide(laplace_opts(2.0, false, sel::laplace_bisect::location::zero));
    check_contract(x, k, wide.select(x, k), 2.0);
  }
  SUBCASE("sampled") {
    sel::sampled s;
    CHECK_THROWS_AS(s.select(x, k), commsgd::unsupported);
    sel::sampled::options o;
    o.trim = true;
    sel::sampled t(o);
    CHECK(t.select(x, k) == select_data::reference(x, k));
  }
}

TEST_CASE("warm start follows a slowly changing sequence in about one pass per call") {
  for (auto s : select_data::shapes) {
    CAPTURE(select_data::shape_name(s));
    std::vector<float> x = select_data::make(s, 1 << 18, 21);
    const std::size_t k = sel::k_for_density(x.size(), 1e-3);
    sel::laplace_bisect warm(laplace_opts(0.01, true, sel::laplace_bisect::location::zero));
    sel::laplace_bisect cold(laplace_opts(0.01, false, sel::laplace_bisect::location::zero));
    unsigned warm_passes = 0, cold_passes = 0;
    const int steps = 30;
    for (int step = 0; step < steps; ++step) {
      select_data::perturb(x, 100 + static_cast<std::uint64_t>(step));
      const sel::threshold w = warm.select(x, k);
      check_contract(x, k, w, 0.01);
      CHECK(warm.saved_state().threshold == w.value);
      if (step > 0) warm_passes += warm.last_passes();
      check_contract(x, k, cold.select(x, k), 0.01);
      if (step > 0) cold_passes += cold.last_passes();
    }
    CHECK(cold.saved_state().threshold == 0.0f);
    // Most warm calls settle in a single pass, and never worse than a cold call on average.
    CHECK(warm_passes <= static_cast<unsigned>(1.3 * (steps - 1)));
    CHECK(warm_passes <= cold_passes);
  }
}

TEST_CASE("warm state saves, restores and is validated") {
  std::vector<float> x = select_data::make(shape::laplace, 50000, 31);
  const std::size_t k = 50;
  sel::laplace_bisect a;
  const sel::threshold first = a.select(x, k);
  const auto saved = a.saved_state();
  CHECK(saved.threshold == first.value);
  sel::laplace_bisect b;
  b.restore(saved);
  CHECK(b.saved_state() == saved);
  CHECK(b.select(x, k) == a.select(x, k));
  CHECK(b.last_passes() == 1); // the restored threshold is exactly right: one histogram settles it
  // A far-off saved threshold is only a slower start, never a wrong answer.
  sel::laplace_bisect c;
  c.restore({1e6f});
  check_contract(x, k, c.select(x, k), 0.01);
  c.restore({1e-30f});
  check_contract(x, k, c.select(x, k), 0.01);
  CHECK_THROWS_AS(c.restore({-1.0f}), commsgd::invalid_argument);
  CHECK_THROWS_AS(c.restore({std::numeric_limits<float>::quiet_NaN()}), commsgd::invalid_argument);
  c.reset();
  CHECK(c.saved_state().threshold == 0.0f);
}

TEST_CASE("all zeros and mostly zeros") {
  std::vector<float> z(5000, 0.0f);
  for (std::size_t i = 0; i < z.size(); i += 2)
    z[i] = -0.0f;
  sel::laplace_bisect l;
  CHECK_THROWS_AS(l.select(z, 10), commsgd::unsupported);
  auto o = laplace_opts(0.01, true, sel::laplace_bisect::location::zero);
  o.trim = true;
  sel::laplace_bisect t(o);
  CHECK(t.select(z, 10) == sel::threshold{0.0f, 0, 10});
  // Fewer nonzeros than k: the answer is a tie at zero, which trim resolves to the lowest indices.
  std::vector<float> y(5000, 0.0f);
  for (std::size_t i = 0; i < 20; ++i)
    y[i * 97] = static_cast<float>(i + 1);
  CHECK(t.select(y, 30) == select_data::reference(y, 30));
  sel::sampled::options so;
  so.trim = true;
  sel::sampled s(so);
  CHECK(s.select(y, 30) == select_data::reference(y, 30));
}
