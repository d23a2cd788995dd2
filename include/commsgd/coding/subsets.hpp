// Subsets of the nodes {0, ..., n-1} as bit masks, and the binomial counts the coding schemes are built on.
//
// CSSGD names a data block by the r nodes that hold it and an exchange group by its r+1 members, so the
// natural key of both is a set of nodes. A 64-bit mask keeps those keys cheap to compare, hash and intersect;
// it limits n to 64, far beyond where C(n, r) blocks per step stay practical anyway.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

namespace commsgd::inline v1::coding {

using node_set = std::uint64_t;

inline constexpr int max_nodes = 64;

// C(n, k) exactly; saturates at the largest uint64 instead of wrapping, so a caller can reject it.
inline constexpr std::uint64_t binomial(int n, int k) noexcept {
  if (k < 0 || n < 0 || k > n) return 0;
  if (k > n - k) k = n - k;
  unsigned __int128 c = 1;
  for (int i = 1; i <= k; ++i) {
    c = c * static_cast<unsigned>(n - k + i) / static_cast<unsigned>(i);
    if (c > std::numeric_limits<std::uint64_t>::max()) return std::numeric_limits<std::uint64_t>::max();
  }
  return static_cast<std::uint64_t>(c);
}

inline constexpr node_set node_bit(int i) noexcept {
  return node_set{1} << i;
}
inline constexpr bool contains(node_set s, int i) noexcept {
  return (s >> i) & 1u;
}
inline constexpr int set_size(node_set s) noexcept {
  return std::popcount(s);
}

// Where node i stands in the ascending order of the members of s (i need not be a member).
inline constexpr int position_in(node_set s, int i) noexcept {
  return std::popcount(s & (node_bit(i) - 1));
}

// The members of s, ascending.
inline std::vector<int> members(node_set s) {
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(std::popcount(s)));
  while (s != 0) {
    out.push_back(std::countr_zero(s));
    s &= s - 1;
  }
  return out;
}

// All k-subsets of {0, ..., n-1} in lexicographic order of their ascending member lists: the order
// Algorithm 2 numbers blocks in, and the order every rank walks the exchange groups in (a shared total order
// is what keeps blocking group collectives free of deadlock).
inline std::vector<node_set> subsets_lex(int n, int k) {
  std::vector<node_set> out;
  if (k < 0 || k > n) return out;
  std::vector<int> c(static_cast<std::size_t>(k));
  for (int i = 0; i < k; ++i)
    c[static_cast<std::size_t>(i)] = i;
  for (;;) {
    node_set s = 0;
    for (int v : c)
      s |= node_bit(v);
    out.push_back(s);
    int i = k - 1;
    while (i >= 0 && c[static_cast<std::size_t>(i)] == n - k + i)
      --i;
    if (i < 0) break;
    ++c[static_cast<std::size_t>(i)];
    for (int j = i + 1; j < k; ++j)
      c[static_cast<std::size_t>(j)] = c[static_cast<std::size_t>(j - 1)] + 1;
  }
  return out;
}

} // namespace commsgd::inline v1::coding
