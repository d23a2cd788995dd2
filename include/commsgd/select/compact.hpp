// Compaction: write the (index, value) pairs a threshold selects, in index order.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/scan.hpp>
#include <commsgd/select/selector.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::select {

template <class Index>
concept compact_index = std::same_as<Index, std::uint32_t> || std::same_as<Index, std::uint64_t>;

// Writes every i with |x_i| > t.value and the first t.at indices with |x_i| == t.value, in increasing i.
// indices and values must hold exactly t.count() entries (commsgd::size_mismatch otherwise); a threshold
// that does not describe x (it selects more or fewer than t.count()) raises commsgd::invalid_argument.
template <compact_index Index>
std::size_t compact(std::span<const float> x, const threshold& t, std::span<Index> indices,
                    std::span<float> values) {
  const std::size_t count = t.count();
  if (indices.size() != count || values.size() != count)
    throw size_mismatch(commsgd::detail::concat("compact: indices.size() = ", indices.size(),
                                                " and values.size() = ", values.size(),
                                                " must both equal the threshold's count ", count));
  if (x.size() > 0 && x.size() - 1 > std::numeric_limits<Index>::max())
    throw invalid_argument(commsgd::detail::concat("compact: x.size() = ", x.size(),
                                                   " does not fit the index type (max ",
                                                   std::numeric_limits<Index>::max(), ")"));
  if (count == 0) return 0;
  const std::uint32_t tk = magnitude_key(t.value);
  std::size_t out = 0, ties = 0;
  auto overflow = [&] {
    throw invalid_argument(commsgd::detail::concat("compact: the threshold (value ", t.value, ", above ",
                                                   t.above, ", at ", t.at, ") selects more than ", count,
                                                   " entries of x"));
  };
  auto one = [&](std::size_t i) {
    const std::uint32_t key = detail::key_at(x.data() + i);
    const bool take = key > tk || (key == tk && ties < t.at);
    if (!take) return;
    ties += key == tk;
    if (out == count) overflow();
    indices[out] = static_cast<Index>(i);
    values[out] = x[i];
    ++out;
  };
  // Most blocks hold nothing selected; a vectorised test skips them.
  const std::size_t n = x.size();
  std::size_t i = 0;
  for (; i + detail::block <= n; i += detail::block) {
    if (!detail::block_reaches(x.data() + i, tk)) continue;
    for (std::size_t j = 0; j < detail::block; ++j)
      one(i + j);
  }
  for (; i < n; ++i)
    one(i);
  if (out != count || ties != t.at)
    throw invalid_argument(commsgd::detail::concat("compact: the threshold (value ", t.value, ", above ",
                                                   t.above, ", at ", t.at, ") selects only ", out,
                                                   " entries of x, ", ties, " of them at it"));
  return out;
}

template <compact_index Index>
struct selection {
  std::vector<Index> indices;
  std::vector<float> values;
};

// Allocating form of compact.
template <compact_index Index = std::uint32_t>
selection<Index> compact(std::span<const float> x, const threshold& t) {
  selection<Index> s;
  s.indices.resize(t.count());
  s.values.resize(t.count());
  compact<Index>(x, t, std::span<Index>(s.indices), std::span<float>(s.values));
  return s;
}

} // namespace commsgd::inline v1::select
