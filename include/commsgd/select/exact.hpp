// exact: std::nth_element on the magnitude keys. The reference every other method is checked against, and
// the slow anchor of the benchmarks.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/select/validate.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace commsgd::inline v1::select {

class exact {
public:
  static constexpr bool is_exact = true;
  static constexpr const char* name = "exact";
  struct options {};

  exact() = default;
  explicit exact(options) {}

  threshold select(std::span<const float> x, std::size_t k) {
    check_k(k, x.size());
    keys_.resize(x.size());
    std::uint32_t top = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      keys_[i] = magnitude_key(x[i]);
      top = std::max(top, keys_[i]);
    }
    if (top >= infinite_key) check_finite(x);
    if (k == 0) return threshold{};
    const auto kth = keys_.begin() + static_cast<std::ptrdiff_t>(k - 1);
    std::nth_element(keys_.begin(), kth, keys_.end(), std::greater<>{});
    const std::uint32_t t = *kth;
    // Everything strictly above the k-th key sits before it after nth_element.
    std::size_t above = 0;
    for (auto it = keys_.begin(); it != kth; ++it)
      above += *it > t;
    return threshold{key_magnitude(t), above, k - above};
  }

private:
  std::vector<std::uint32_t> keys_; // reused across calls: the allocation is not what we measure
};

static_assert(selector<exact>);

} // namespace commsgd::inline v1::select
