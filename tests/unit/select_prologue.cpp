// The k = 0 / k = N prologue the host selectors share.
#include "select_data.hpp"

#include <commsgd/select/select.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace sel = commsgd::select;

TEST_CASE("trivial_result answers k = 0 and k = N after checking x, and nothing else") {
  for (std::size_t n : {0u, 1u, 5u, 1000u})
    for (auto shape : select_data::shapes) {
      const std::vector<float> x = select_data::make(shape, n, n + 2);
      CAPTURE(n);
      const auto none = sel::detail::trivial_result(x, 0);
      REQUIRE(none.has_value());
      CHECK(*none == sel::threshold{});
      const auto all = sel::detail::trivial_result(x, n);
      REQUIRE(all.has_value());
      if (n > 0) CHECK(*all == sel::detail::all_result(x)); // n = 0: k = 0 = n, nothing
      CHECK(all->count() == n);
      if (n > 2) CHECK_FALSE(sel::detail::trivial_result(x, n / 2).has_value());
    }
  std::vector<float> bad{1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  CHECK_THROWS_AS(sel::detail::trivial_result(bad, 0), commsgd::non_finite);
  CHECK_THROWS_AS(sel::detail::trivial_result(bad, 3), commsgd::non_finite);
  CHECK_FALSE(sel::detail::trivial_result(bad, 1).has_value()); // the method's own pass checks then
}
