// Where each tensor of a batched top-k step lives: its values in the flat gradient, its candidates, its
// pairs in the message, and the tiles the kernels walk. Plain host arithmetic, worked out once at
// construction, so the kernels never search for the tensor an index belongs to.
#pragma once

#include <commsgd/error.hpp>
#include <commsgd/select/selector.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::cuda {

// Speed choices of the batched step (none changes a result).
struct batched_tuning {
  static constexpr int block_threads = 256;
  static constexpr int items_per_thread = 16;
  // A tile is what one block handles at once; it never spans two tensors.
  static constexpr std::uint64_t tile = std::uint64_t{block_threads} * items_per_thread;
  static constexpr std::size_t blocks_per_sm = 4;
  // Candidates a block gathers in shared memory before one global append (more go straight to global).
  static constexpr int stage = 1024;
  // A tensor keeps room for candidate_factor * k + candidate_extra candidates: more means the floor was
  // set too low, and the step reads the tensor again. 4k rides out a threshold rising about 20 % in a step
  // on Laplace-like tails (as while the residual builds up), at 32 bytes per selected entry.
  static constexpr std::uint64_t candidate_factor = 4;
  static constexpr std::uint64_t candidate_extra = 256;
  // The floor sits margin under last step's threshold; a miss doubles the margin (up to the most), an
  // overflow halves it (down to the least).
  static constexpr float first_margin = 0.05f;
  static constexpr float most_margin = 0.5f;
  static constexpr float least_margin = 1.0f / 64;
  // Radix digits over the 64-bit (key, index) composite: 11 + 11 + 10 bits for the key, the same for the
  // index, so ties resolve by index within the same six passes.
  static constexpr int passes = 6;
  static constexpr int digit_bins = 2048;
};

namespace detail::batched {

// One block's piece of work: [begin, end) of tensor `segment`, over its values (flat indices) or over its
// candidates (slots of its candidate region).
struct tile {
  std::uint32_t segment;
  std::uint32_t over_candidates;
  std::uint64_t begin;
  std::uint64_t end;
};

// A tensor's fixed offsets.
struct segment {
  std::uint64_t begin; // first flat index
  std::uint64_t length;
  std::uint64_t k;
  std::uint64_t candidate_begin;
  std::uint64_t candidate_capacity;
  std::uint64_t message_begin; // its k pairs start here in the message
};

struct layout {
  std::vector<segment> segments;
  std::vector<tile> tiles; // every value tile first, then every candidate tile
  std::uint64_t value_tiles = 0;
  std::uint64_t length = 0;
  std::uint64_t total_k = 0;
  std::uint64_t candidates = 0;
};

// k per tensor: ks[t] where given, else ceil(density * length) (select::k_for_density).
inline layout make_layout(std::span<const std::size_t> lengths, double density,
                          std::span<const std::size_t> ks) {
  if (lengths.empty())
    throw invalid_argument("argument 'lengths' is empty: a batch holds at least one tensor");
  if (!ks.empty() && ks.size() != lengths.size())
    throw invalid_argument(commsgd::concat("argument 'k' has ", ks.size(),
                                           " entries; it must be empty or have one per tensor (",
                                           lengths.size(), ")"));
  if (lengths.size() > std::numeric_limits<std::uint32_t>::max())
    throw invalid_argument(commsgd::concat("argument 'lengths' has ", lengths.size(),
                                           " tensors, outside the allowed range [1, 2^32)"));
  layout l;
  using T = batched_tuning;
  for (std::size_t t = 0; t < lengths.size(); ++t) {
    segment s{};
    s.begin = l.length;
    s.length = lengths[t];
    if (ks.empty()) {
      s.k = select::k_for_density(lengths[t], density);
    } else {
      if (ks[t] > lengths[t])
        throw invalid_argument(commsgd::concat("argument 'k[", t, "]' = ", ks[t],
                                               " is outside the allowed range [0, ", lengths[t],
                                               "] (the tensor's length)"));
      s.k = ks[t];
    }
    s.candidate_begin = l.candidates;
    s.candidate_capacity =
        s.k == 0 ? 0 : std::min<std::uint64_t>(s.length, T::candidate_factor * s.k + T::candidate_extra);
    s.message_begin = l.total_k;
    l.length += s.length;
    l.total_k += s.k;
    l.candidates += s.candidate_capacity;
    l.segments.push_back(s);
  }
  // The composite key holds a 32-bit flat index.
  if (l.length > std::uint64_t{std::numeric_limits<std::uint32_t>::max()})
    throw invalid_argument(
        commsgd::concat("the tensors' total length ", l.length,
                        " is outside the allowed range [0, 2^32 - 1] of the batched step's 32-bit indices"));
  for (std::uint32_t t = 0; t < l.segments.size(); ++t)
    for (std::uint64_t b = 0; b < l.segments[t].length; b += T::tile)
      l.tiles.push_back(
          {t, 0, l.segments[t].begin + b, l.segments[t].begin + std::min(l.segments[t].length, b + T::tile)});
  l.value_tiles = l.tiles.size();
  for (std::uint32_t t = 0; t < l.segments.size(); ++t)
    for (std::uint64_t b = 0; b < l.segments[t].candidate_capacity; b += T::tile)
      l.tiles.push_back({t, 1, b, std::min(l.segments[t].candidate_capacity, b + T::tile)});
  return l;
}

} // namespace detail::batched
} // namespace commsgd::inline v1::cuda
