// How PowerSGD lays a flat gradient out: which layers are compressed, at which rank, and where each one's
// slices of the three all-reduced buffers (dense values, P factors, Q factors) live. compress::powersgd and
// the byte model (cost/powersgd.hpp) both read this plan, so what is sent and what the model says agree by
// construction.
//
// A layer is a row-major rows x cols matrix; a vector (a bias) is rows x 1. The rule that leaves a layer
// dense is PyTorch's powerSGD_hook's (_should_compress), term for term:
//   r_l = min(rows, cols, rank)
//   compressed  iff  (rows + cols) * r_l * min_compression_rate < rows * cols
// evaluated in double, as Python evaluates int * float. With PyTorch's default min_compression_rate = 2 a
// layer must shrink at least twofold; a vector (cols = 1) never qualifies, since rows + 1 > rows.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::compress {

struct layer_shape {
  std::size_t rows = 0;
  std::size_t cols = 1;
  friend bool operator==(const layer_shape&, const layer_shape&) = default;
};

// PyTorch's rule, above.
inline bool powersgd_compresses(layer_shape s, std::size_t rank, double min_compression_rate) noexcept {
  const std::size_t r = std::min({s.rows, s.cols, rank});
  const double compressed = static_cast<double>(s.rows + s.cols) * static_cast<double>(r);
  return compressed * min_compression_rate < static_cast<double>(s.rows) * static_cast<double>(s.cols);
}

struct powersgd_plan {
  struct matrix {
    std::size_t layer = 0;  // index into the layer list
    std::size_t offset = 0; // first element in the gradient
    std::size_t rows = 0, cols = 0, rank = 0;
    std::size_t p_offset = 0; // rows * rank values in the P buffer
    std::size_t q_offset = 0; // cols * rank values in the Q buffer
  };
  struct vector {
    std::size_t offset = 0;       // first element in the gradient
    std::size_t size = 0;         // elements
    std::size_t dense_offset = 0; // first element in the dense buffer
  };

  std::size_t length = 0;
  std::vector<matrix> matrices; // the compressed layers, in gradient order
  std::vector<vector> vectors;  // the layers sent dense, in gradient order
  std::size_t dense_size = 0;   // elements of the dense all-reduce
  std::size_t p_size = 0;       // elements of the P all-reduce
  std::size_t q_size = 0;       // elements of the Q all-reduce
};

// Checks the arguments (rank >= 1, min_compression_rate > 0 and finite, shapes adding up to `length`)
// and lays the buffers out in gradient order.
inline powersgd_plan make_powersgd_plan(std::size_t length, std::span<const layer_shape> layers,
                                        std::size_t rank, double min_compression_rate) {
  if (rank == 0) throw invalid_argument("argument 'rank' = 0 is outside the allowed range [1, inf)");
  if (!(min_compression_rate > 0.0 && min_compression_rate < std::numeric_limits<double>::infinity()))
    throw invalid_argument(commsgd::concat("argument 'min_compression_rate' = ", min_compression_rate,
                                           " is outside the allowed range (0, inf)"));
  if (layers.empty() && length > 0)
    throw size_mismatch(commsgd::concat("argument 'layers' is empty, but the gradient has ", length,
                                        " elements; give every layer's rows x cols (a vector is rows x 1)"));
  powersgd_plan plan;
  plan.length = length;
  std::size_t off = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const layer_shape s = layers[l];
    if (s.cols != 0 && s.rows > (std::numeric_limits<std::size_t>::max() - off) / s.cols)
      throw size_mismatch(commsgd::concat("argument 'layers': layer ", l, " (", s.rows, " x ", s.cols,
                                          ") overflows the gradient length"));
    const std::size_t size = s.rows * s.cols;
    if (powersgd_compresses(s, rank, min_compression_rate)) {
      const std::size_t r = std::min({s.rows, s.cols, rank});
      plan.matrices.push_back({l, off, s.rows, s.cols, r, plan.p_size, plan.q_size});
      plan.p_size += s.rows * r;
      plan.q_size += s.cols * r;
    } else {
      plan.vectors.push_back({off, size, plan.dense_size});
      plan.dense_size += size;
    }
    off += size;
  }
  if (off != length)
    throw size_mismatch(
        commsgd::concat("argument 'layers' describes ", off, " elements, the gradient has ", length));
  return plan;
}

} // namespace commsgd::inline v1::compress
