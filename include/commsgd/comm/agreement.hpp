// The errors a distributed communicator raises when the ranks' arguments to one collective disagree. Each
// transport finds the range of a value over all ranks with one small reduction of its own; these name the
// operation, the argument, this rank's value and that range, so every rank reports the same disagreement.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace commsgd::inline v1::comm::detail {

inline size_mismatch ranks_disagree(const char* op, const char* arg, std::size_t mine,
                                    std::pair<std::uint64_t, std::uint64_t> range) {
  return size_mismatch(commsgd::concat(op, ": ranks disagree on ", arg, " (this rank has ", mine,
                                       ", the ranks have values from ", range.first, " to ", range.second,
                                       ")"));
}

// all_gather's output must hold size() * mine.size() values; `where` says which rank's does not.
inline size_mismatch all_gather_size_mismatch(std::size_t mine, std::size_t all, int size,
                                              const char* where) {
  return size_mismatch(commsgd::concat(
      "all_gather: on ", where,
      " argument 'all' does not hold size() * mine.size() elements (this rank: all.size() = ", all,
      ", size() * mine.size() = ", size, " * ", mine, ")"));
}

inline void check_rank(const char* name, int value, int size) {
  if (value < 0 || value >= size)
    throw invalid_argument(
        commsgd::concat("argument '", name, "' = ", value, " is outside the allowed range [0, ", size, ")"));
}

// A rank's value as an unsigned key whose order is the ints' order (and back), so that one unsigned range
// reduction covers signed arguments such as a root.
inline constexpr std::uint64_t ordered_key(int v) noexcept {
  return static_cast<std::uint64_t>(static_cast<long long>(v) - static_cast<long long>(INT_MIN));
}
inline constexpr long long from_ordered_key(std::uint64_t v) noexcept {
  return static_cast<long long>(v) + static_cast<long long>(INT_MIN);
}

// The argument checks of all_gather and broadcast, the same on every transport. `ranges` is the transport's
// one small reduction to the smallest and largest of two values over all ranks; with `verify` off only
// this rank's own arguments are checked.
template <class Ranges>
void check_all_gather(std::size_t mine, std::size_t all, int size, bool verify, Ranges&& ranges) {
  const bool fits = all == mine * static_cast<std::size_t>(size);
  if (verify) {
    const auto mm = ranges(std::array<std::uint64_t, 2>{mine, fits ? 0u : 1u});
    if (mm[0].first != mm[0].second) throw ranks_disagree("all_gather", "mine.size()", mine, mm[0]);
    if (mm[1].second != 0)
      throw all_gather_size_mismatch(mine, all, size, fits ? "another rank" : "this rank");
  } else if (!fits) {
    throw all_gather_size_mismatch(mine, all, size, "this rank");
  }
}

template <class Ranges>
void check_broadcast(std::size_t count, int root, int size, bool verify, Ranges&& ranges) {
  if (verify && size > 1) {
    // Root and size travel together, so a rank with another root (even an invalid one) fails everywhere.
    const auto mm = ranges(std::array<std::uint64_t, 2>{count, ordered_key(root)});
    if (mm[1].first != mm[1].second)
      throw invalid_argument(commsgd::concat("broadcast: ranks disagree on 'root' (this rank passed ", root,
                                             ", others passed values from ", from_ordered_key(mm[1].first),
                                             " to ", from_ordered_key(mm[1].second), ")"));
    check_rank("root", root, size);
    if (mm[0].first != mm[0].second) throw ranks_disagree("broadcast", "data.size()", count, mm[0]);
  } else {
    check_rank("root", root, size);
  }
}

} // namespace commsgd::inline v1::comm::detail
