// The approximate selection contract, shared by the tests of every approximate method: every |x_i| >= value
// is selected, `above` and `at` count exactly, and the count lies in [k, count_limit(k, tol)].
#pragma once

#include "select_data.hpp"

#include <commsgd/select/selector.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <span>

namespace select_data {

inline void check_contract(std::span<const float> x, std::size_t k, const commsgd::select::threshold& t,
                           double tol) {
  CAPTURE(k);
  CAPTURE(t.value);
  CHECK(t.above == count_above(x, t.value));
  CHECK(t.count() == count_at_least(x, t.value));
  CHECK(t.count() >= k);
  CHECK(t.count() <= commsgd::select::count_limit(k, tol));
}

} // namespace select_data
