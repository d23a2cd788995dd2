// The two small dense solvers the cyclic gradient code needs (coding/gradient_code.hpp): a square system
// when building its matrix, a least-squares fit when decoding. Kept apart so the code's header reads as the
// construction and nothing else; n is at most max_nodes, so plain O(n^3) in double is the right tool.
#pragma once

#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

namespace commsgd::inline v1::coding {

namespace detail {

// Solves the k x k system M x = b in place by Gaussian elimination with partial pivoting (row-major M).
// Returns false when a pivot vanishes.
inline bool solve_small(std::vector<double>& m, std::vector<double>& b, int k) {
  for (int c = 0; c < k; ++c) {
    int p = c;
    for (int i = c + 1; i < k; ++i)
      if (std::abs(m[static_cast<std::size_t>(i * k + c)]) > std::abs(m[static_cast<std::size_t>(p * k + c)]))
        p = i;
    const double pivot = m[static_cast<std::size_t>(p * k + c)];
    if (!(std::abs(pivot) > 1e-12)) return false;
    if (p != c) {
      for (int j = 0; j < k; ++j)
        std::swap(m[static_cast<std::size_t>(p * k + j)], m[static_cast<std::size_t>(c * k + j)]);
      std::swap(b[static_cast<std::size_t>(p)], b[static_cast<std::size_t>(c)]);
    }
    for (int i = c + 1; i < k; ++i) {
      const double f = m[static_cast<std::size_t>(i * k + c)] / m[static_cast<std::size_t>(c * k + c)];
      for (int j = c; j < k; ++j)
        m[static_cast<std::size_t>(i * k + j)] -= f * m[static_cast<std::size_t>(c * k + j)];
      b[static_cast<std::size_t>(i)] -= f * b[static_cast<std::size_t>(c)];
    }
  }
  for (int i = k - 1; i >= 0; --i) {
    double v = b[static_cast<std::size_t>(i)];
    for (int j = i + 1; j < k; ++j)
      v -= m[static_cast<std::size_t>(i * k + j)] * b[static_cast<std::size_t>(j)];
    b[static_cast<std::size_t>(i)] = v / m[static_cast<std::size_t>(i * k + i)];
  }
  return true;
}

// Least squares min |A x - y| for a column-major rows x cols A of full column rank (rows >= cols), by
// Householder QR. A and y are overwritten.
inline std::vector<double> least_squares(std::vector<double>& a, std::vector<double>& y, int rows, int cols) {
  auto at = [&](int i, int j) -> double& { return a[static_cast<std::size_t>(j * rows + i)]; };
  for (int c = 0; c < cols; ++c) {
    double norm = 0;
    for (int i = c; i < rows; ++i)
      norm += at(i, c) * at(i, c);
    norm = std::sqrt(norm);
    if (!(norm > 0)) continue;
    const double alpha = at(c, c) > 0 ? -norm : norm;
    std::vector<double> v(static_cast<std::size_t>(rows - c));
    for (int i = c; i < rows; ++i)
      v[static_cast<std::size_t>(i - c)] = at(i, c);
    v[0] -= alpha;
    double vv = 0;
    for (double x : v)
      vv += x * x;
    if (!(vv > 0)) continue;
    for (int j = c; j < cols; ++j) {
      double dot = 0;
      for (int i = c; i < rows; ++i)
        dot += v[static_cast<std::size_t>(i - c)] * at(i, j);
      const double f = 2 * dot / vv;
      for (int i = c; i < rows; ++i)
        at(i, j) -= f * v[static_cast<std::size_t>(i - c)];
    }
    double dot = 0;
    for (int i = c; i < rows; ++i)
      dot += v[static_cast<std::size_t>(i - c)] * y[static_cast<std::size_t>(i)];
    const double f = 2 * dot / vv;
    for (int i = c; i < rows; ++i)
      y[static_cast<std::size_t>(i)] -= f * v[static_cast<std::size_t>(i - c)];
  }
  std::vector<double> x(static_cast<std::size_t>(cols));
  for (int i = cols - 1; i >= 0; --i) {
    double v = y[static_cast<std::size_t>(i)];
    for (int j = i + 1; j < cols; ++j)
      v -= at(i, j) * x[static_cast<std::size_t>(j)];
    x[static_cast<std::size_t>(i)] = at(i, i) != 0 ? v / at(i, i) : 0.0;
  }
  return x;
}

} // namespace detail

} // namespace commsgd::inline v1::coding
