// Layer boundaries of the compressors that keep one scale per layer (sign, qsgd): empty offsets mean one
// layer, else 0 = o_0 <= o_1 <= ... <= o_L = length, as sparsify::top_k_options::layer_offsets.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <cstddef>
#include <vector>

namespace commsgd::inline v1::compress::detail {

inline std::vector<std::size_t> layer_bounds(std::size_t length, const std::vector<std::size_t>& offsets) {
  if (offsets.empty()) return {0, length};
  if (offsets.size() < 2 || offsets.front() != 0 || offsets.back() != length)
    throw invalid_argument(commsgd::concat("argument 'layer_offsets' must start at 0 and end at the "
                                           "length ",
                                           length, " with at least two entries; it has ", offsets.size(),
                                           " entries from ", offsets.front(), " to ", offsets.back()));
  for (std::size_t l = 1; l < offsets.size(); ++l)
    if (offsets[l] < offsets[l - 1])
      throw invalid_argument(commsgd::concat("argument 'layer_offsets' must not fall: entry ", l, " = ",
                                             offsets[l], " is below entry ", l - 1, " = ", offsets[l - 1]));
  return offsets;
}

} // namespace commsgd::inline v1::compress::detail
