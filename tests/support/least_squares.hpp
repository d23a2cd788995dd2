// toy::least_squares: a deterministic least-squares problem with a known optimum, for tests and examples.
//
//   toy::least_squares prob({.samples = 512, .dim = 16, .seed = 7});
//   auto mine = prob.shard(rank, ranks);                 // this rank's rows
//   auto rows = prob.batch(rank, ranks, step, 8);        // step's mini-batch inside the shard
//   prob.gradient(x, rows, grad);                        // exact gradient of the batch loss at x
//   prob.loss(x)                                         // full loss; 0 exactly at prob.optimum()
//
// Rows a_i are uniform in [-1, 1]^dim, the optimum x* uniform in [-1, 1]^dim, and b = A x* exactly (computed
// in double, stored as float), so x* minimises every batch loss f_B(x) = 1/(2|B|) sum_{i in B} (a_i.x -
// b_i)^2 up to float rounding of b. The generator is splitmix64, defined here bit by bit, so a seed gives the
// same problem on every platform and standard library (std::*_distribution would not).
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::toy {

struct least_squares_options {
  std::size_t samples = 512; // rows of A: [1, inf)
  std::size_t dim = 16;      // columns of A: [1, inf)
  std::uint64_t seed = 1;
};

// A contiguous run of rows.
struct rows {
  std::size_t first = 0;
  std::size_t count = 0;
};

class least_squares {
public:
  explicit least_squares(least_squares_options o = {}) : opt_(o) {
    commsgd::check_range("samples", opt_.samples, std::size_t{1}, std::numeric_limits<std::size_t>::max(),
                         "[1, inf)");
    commsgd::check_range("dim", opt_.dim, std::size_t{1}, std::numeric_limits<std::size_t>::max(),
                         "[1, inf)");
    std::uint64_t state = opt_.seed;
    optimum_.resize(opt_.dim);
    for (auto& v : optimum_)
      v = uniform(state);
    a_.resize(opt_.samples * opt_.dim);
    for (auto& v : a_)
      v = uniform(state);
    b_.resize(opt_.samples);
    for (std::size_t i = 0; i < opt_.samples; ++i) {
      double acc = 0.0;
      for (std::size_t j = 0; j < opt_.dim; ++j)
        acc += static_cast<double>(a_[i * opt_.dim + j]) * optimum_[j];
      b_[i] = static_cast<float>(acc);
    }
  }

  std::size_t dim() const { return opt_.dim; }
  std::size_t samples() const { return opt_.samples; }
  std::span<const float> optimum() const { return optimum_; }
  std::span<const float> row(std::size_t i) const {
    return std::span<const float>(a_).subspan(i * opt_.dim, opt_.dim);
  }
  float target(std::size_t i) const { return b_[i]; }

  // Rank `rank` of `ranks` gets samples / ranks rows (the first samples % ranks ranks one more).
  rows shard(int rank, int ranks) const {
    commsgd::check_range("ranks", ranks, 1, std::numeric_limits<int>::max(), "[1, inf)");
    commsgd::check_range("rank", rank, 0, ranks - 1, commsgd::concat("[0, ranks = ", ranks, ")"));
    const auto n = static_cast<std::size_t>(ranks), r = static_cast<std::size_t>(rank);
    return {opt_.samples * r / n, opt_.samples * (r + 1) / n - opt_.samples * r / n};
  }

  // Mini-batch `step` of a shard: batches tile the shard in order and start over; a tail shorter than a batch
  // is never used, so every batch of every rank has exactly batch_size rows.
  rows batch(int rank, int ranks, std::int64_t step, std::size_t batch_size) const {
    const rows s = shard(rank, ranks);
    commsgd::check_range("batch_size", batch_size, std::size_t{1}, s.count,
                         commsgd::concat("[1, shard size = ", s.count, "]"));
    commsgd::check_range("step", step, std::int64_t{0}, std::numeric_limits<std::int64_t>::max(), "[0, inf)");
    const std::size_t per_epoch = s.count / batch_size;
    return {s.first + (static_cast<std::size_t>(step) % per_epoch) * batch_size, batch_size};
  }

  // Gradient of f_B at x: (1/|B|) sum a_i (a_i.x - b_i), accumulated in double, rounded once to float.
  void gradient(std::span<const float> x, rows r, std::span<float> out) const {
    check(x, r);
    if (out.size() != opt_.dim)
      throw size_mismatch(
          commsgd::concat("argument 'out' has ", out.size(), " elements, expected ", opt_.dim));
    // Local, not a member: ranks of a thread group share one problem and call this at the same time.
    std::vector<double> acc(opt_.dim, 0.0);
    for (std::size_t i = r.first; i < r.first + r.count; ++i) {
      const double res = residual(x, i);
      for (std::size_t j = 0; j < opt_.dim; ++j)
        acc[j] += static_cast<double>(a_[i * opt_.dim + j]) * res;
    }
    for (std::size_t j = 0; j < opt_.dim; ++j)
      out[j] = static_cast<float>(acc[j] / static_cast<double>(r.count));
  }

  double loss(std::span<const float> x, rows r) const {
    check(x, r);
    double acc = 0.0;
    for (std::size_t i = r.first; i < r.first + r.count; ++i) {
      const double res = residual(x, i);
      acc += res * res;
    }
    return acc / (2.0 * static_cast<double>(r.count));
  }

  double loss(std::span<const float> x) const { return loss(x, rows{0, opt_.samples}); }

private:
  // splitmix64 -> 53-bit fraction -> [-1, 1).
  static float uniform(std::uint64_t& state) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }

  double residual(std::span<const float> x, std::size_t i) const {
    double acc = 0.0;
    for (std::size_t j = 0; j < opt_.dim; ++j)
      acc += static_cast<double>(a_[i * opt_.dim + j]) * x[j];
    return acc - b_[i];
  }

  void check(std::span<const float> x, rows r) const {
    if (x.size() != opt_.dim)
      throw size_mismatch(commsgd::concat("argument 'x' has ", x.size(), " elements, expected ", opt_.dim));
    if (r.first > opt_.samples || r.count > opt_.samples - r.first || r.count == 0)
      throw invalid_argument(commsgd::concat("argument 'rows' = [", r.first, ", ", r.first + r.count,
                                             ") is outside the allowed range: non-empty within [0, ",
                                             opt_.samples, ")"));
  }

  least_squares_options opt_;
  std::vector<float> optimum_;
  std::vector<float> a_;
  std::vector<float> b_;
};

} // namespace commsgd::inline v1::toy
