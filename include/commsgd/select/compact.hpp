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

// What for_each_selected did.
struct compaction {
  std::size_t taken = 0; // entries passed to the callback
  std::size_t ties = 0;  // of them, entries equal to the threshold
  bool more = false;     // a selected entry beyond t.count() was found (and not passed on)
};

// The one tie-aware compaction loop of the host: calls take(i) for every selected index (is_selected), in
// increasing order, and stops short of a (t.count() + 1)-th. take may overwrite x[i]: each entry's key is
// read before its call. Most blocks hold nothing selected; a vectorised test skips them. Public for a
// sparsifier that writes its pairs its own way (sparsify::top_k writes them as it updates the residual).
template <class F>
compaction for_each_selected(std::span<const float> x, const threshold& t, F&& take) {
  const std::size_t count = t.count();
  const std::uint32_t tk = magnitude_key(t.value);
  compaction r;
  auto one = [&](std::size_t i) {
    const std::uint32_t key = detail::key_at(x.data() + i);
    if (!is_selected(key, tk, r.ties, t.at)) return true;
    if (r.taken == count) {
      r.more = true;
      return false;
    }
    r.ties += key == tk;
    take(i);
    ++r.taken;
    return true;
  };
  const std::size_t n = x.size();
  std::size_t i = 0;
  for (; i + detail::block <= n; i += detail::block) {
    if (!detail::block_reaches(x.data() + i, tk)) continue;
    for (std::size_t j = 0; j < detail::block; ++j)
      if (!one(i + j)) return r;
  }
  for (; i < n; ++i)
    if (!one(i)) return r;
  return r;
}

// Writes every i with |x_i| > t.value and the first t.at indices with |x_i| == t.value, in increasing i.
// indices and values must hold exactly t.count() entries (commsgd::size_mismatch otherwise); a threshold
// that does not describe x (it selects more or fewer than t.count()) raises commsgd::invalid_argument.
template <compact_index Index>
std::size_t compact(std::span<const float> x, const threshold& t, std::span<Index> indices,
                    std::span<float> values) {
  const std::size_t count = t.count();
  if (indices.size() != count || values.size() != count)
    throw size_mismatch(commsgd::concat("compact: indices.size() = ", indices.size(), " and values.size() = ",
                                        values.size(), " must both equal the threshold's count ", count));
  if (x.size() > 0 && x.size() - 1 > std::numeric_limits<Index>::max())
    throw invalid_argument(commsgd::concat("compact: x.size() = ", x.size(),
                                           " does not fit the index type (max ",
                                           std::numeric_limits<Index>::max(), ")"));
  if (count == 0) return 0;
  std::size_t out = 0;
  const compaction r = for_each_selected(x, t, [&](std::size_t i) {
    indices[out] = static_cast<Index>(i);
    values[out] = x[i];
    ++out;
  });
  if (r.more)
    throw invalid_argument(commsgd::concat("compact: the threshold (value ", t.value, ", above ", t.above,
                                           ", at ", t.at, ") selects more than ", count, " entries of x"));
  if (r.taken != count || r.ties != t.at)
    throw invalid_argument(commsgd::concat("compact: the threshold (value ", t.value, ", above ", t.above,
                                           ", at ", t.at, ") selects only ", r.taken, " entries of x, ",
                                           r.ties, " of them at it"));
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
