// Input checks shared by every selector: k within [0, N], and no NaN or infinity in x. The finiteness scan is
// the one every part of commsgd that refuses NaN and inf uses (sparsify/, compress/, sync/), so that they all
// count the same values and name the same first index.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/prefetch.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/selector.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace commsgd::inline v1::select {

namespace detail {
// Non-finite entries among 64: a loop of known length, which GCC vectorises at -O2 (it does not vectorise a
// loop whose length is only known at run time there).
inline std::uint32_t count_non_finite_64(const float* x) noexcept {
  std::uint32_t c = 0;
  for (std::size_t j = 0; j < 64; ++j)
    c += magnitude_key(x[j]) >= infinite_key;
  return c;
}
} // namespace detail

// Number of non-finite entries; a branch-free count so that the common all-finite case costs one fast pass.
inline std::size_t count_non_finite(std::span<const float> x) noexcept {
  std::size_t total = 0;
  const std::size_t n = x.size();
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    commsgd::detail::prefetch_group(x.data() + i); // a long x streams from memory (commsgd/prefetch.hpp)
    total += detail::count_non_finite_64(x.data() + i);
  }
  for (; i < n; ++i)
    total += magnitude_key(x[i]) >= infinite_key;
  return total;
}

// The NaN and infinities in x: how many, and the index of the first (x.size() when there is none). The
// all-finite case costs the one fast pass of count_non_finite; only a bad x is read again.
struct non_finite_scan {
  std::size_t count = 0;
  std::size_t first = 0;
};
inline non_finite_scan find_non_finite(std::span<const float> x) noexcept {
  const std::size_t count = count_non_finite(x);
  if (count == 0) return {0, x.size()};
  std::size_t first = 0;
  while (magnitude_key(x[first]) < infinite_key)
    ++first;
  return {count, first};
}

// Throws commsgd::non_finite naming the count and the first index if x holds a NaN or an infinity.
inline void check_finite(std::span<const float> x, std::string_view what = "x") {
  const auto bad = find_non_finite(x);
  if (bad.count != 0) throw non_finite(what, bad.count, bad.first);
}

// The full precondition of selector::select; methods that fuse the finiteness test into their first pass
// call check_k and, when that pass saw a non-finite key, check_finite.
inline void validate(std::span<const float> x, std::size_t k) {
  check_k(k, x.size());
  check_finite(x);
}

} // namespace commsgd::inline v1::select
