// PowerSGD's maths: PyTorch's rule for which layers stay dense, Gram-Schmidt, warm start, error feedback,
// and a whole multi-rank round against a plain double-precision reference of the algorithm.
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/powersgd.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

using namespace commsgd;
using compress::layer_shape;
using compress::powersgd;
using compress::powersgd_options;

namespace {

std::vector<float> normals(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  compress::detail::standard_normals(seed, 7, 7, v);
  return v;
}

std::size_t total(const std::vector<layer_shape>& ls) {
  std::size_t t = 0;
  for (auto s : ls)
    t += s.rows * s.cols;
  return t;
}

// Column k of a rows x rank block stored column after column.
double col_dot(const std::vector<float>& a, std::size_t rows, std::size_t i, std::size_t k) {
  double s = 0.0;
  for (std::size_t j = 0; j < rows; ++j)
    s += static_cast<double>(a[i * rows + j]) * a[k * rows + j];
  return s;
}

} // namespace

TEST_CASE("layers stay dense exactly where PyTorch's _should_compress says so") {
  // (rows + cols) * min(rows, cols, r) * rate < rows * cols
  CHECK_FALSE(compress::powersgd_compresses({100, 1}, 1, 2.0)); // a bias
  CHECK_FALSE(compress::powersgd_compresses({1, 100}, 1, 2.0));
  CHECK(compress::powersgd_compresses({4, 5}, 1, 2.0));       // 18 < 20
  CHECK_FALSE(compress::powersgd_compresses({4, 4}, 1, 2.0)); // 16 < 16 fails
  CHECK(compress::powersgd_compresses({4, 4}, 1, 1.0));       // 8 < 16
  CHECK_FALSE(compress::powersgd_compresses({3, 3}, 4, 0.5)); // r = 3: 9 < 9 fails
  CHECK(compress::powersgd_compresses({784, 256}, 4, 2.0));
  CHECK_FALSE(compress::powersgd_compresses({0, 5}, 1, 2.0));
  // Exhaustively against the formula written out in Python's terms.
  for (std::size_t a = 0; a < 12; ++a)
    for (std::size_t b = 1; b < 12; ++b)
      for (std::size_t r = 1; r < 5; ++r)
        for (double rate : {0.5, 1.0, 2.0, 2.5}) {
          const auto rr = std::min({a, b, r});
          CHECK(compress::powersgd_compresses({a, b}, r, rate) ==
                (static_cast<double>((a + b) * rr) * rate < static_cast<double>(a * b)));
        }
  const std::vector<layer_shape> ls{{20, 10}, {10, 1}, {4, 4}, {30, 8}};
  const auto plan = compress::make_powersgd_plan(total(ls), ls, 2, 2.0);
  REQUIRE(plan.matrices.size() == 2);
  CHECK(plan.matrices[0].offset == 0);
  CHECK(plan.matrices[1].offset == 200 + 10 + 16);
  CHECK(plan.matrices[1].p_offset == 40);
  CHECK(plan.matrices[1].q_offset == 20);
  CHECK(plan.dense_size == 26);
  CHECK(plan.p_size == 40 + 60);
  CHECK(plan.q_size == 20 + 16);
}

TEST_CASE("Gram-Schmidt leaves orthonormal columns, deterministically, and zero columns zero") {
  for (std::size_t rows : {1u, 2u, 7u, 64u, 1001u})
    for (std::size_t rank = 1; rank <= std::min<std::size_t>(rows, 5); ++rank)
      for (std::uint64_t seed = 0; seed < 5; ++seed) {
        CAPTURE(rows);
        CAPTURE(rank);
        auto a = normals(rows * rank, seed);
        auto b = a;
        compress::detail::orthogonalise(a.data(), rows, rank, 0.0f);
        compress::detail::orthogonalise(b.data(), rows, rank, 0.0f);
        CHECK(a == b);
        for (std::size_t i = 0; i < rank; ++i)
          for (std::size_t k = 0; k < rank; ++k)
            CHECK(std::abs(col_dot(a, rows, i, k) - (i == k ? 1.0 : 0.0)) < 1e-5);
      }
  // A zero column: PyTorch would divide 0 by 0; here it stays zero and the others are still normalised.
  std::vector<float> z = normals(30, 3);
  std::fill(z.begin(), z.begin() + 10, 0.0f);
  compress::detail::orthogonalise(z.data(), 10, 3, 0.0f);
  for (std::size_t j = 0; j < 10; ++j)
    CHECK(z[j] == 0.0f);
  CHECK(std::abs(col_dot(z, 10, 1, 1) - 1.0) < 1e-5);
  CHECK(std::abs(col_dot(z, 10, 1, 2)) < 1e-5);
  // With epsilon, every column is divided by its norm plus epsilon: norms fall just short of 1.
  std::vector<float> e = {3.0f, 4.0f};
  compress::detail::orthogonalise(e.data(), 2, 1, 1.0f);
  CHECK(e[0] == 3.0f / 6.0f);
  CHECK(e[1] == 4.0f / 6.0f);
  std::vector<float> ez(4, 0.0f);
  compress::detail::orthogonalise(ez.data(), 4, 1, 1e-8f);
  for (float x : ez)
    CHECK(x == 0.0f);
}

namespace {

// The algorithm written out plainly in double for n ranks, to compare with: every rank's M, the initial Q
// (row-major cols x r per compressed layer), and the plan. Returns the sums and the new residuals.
struct reference_round {
  std::vector<double> out;
  std::vector<std::vector<double>> e;
  std::vector<double> q_next; // row-major cols x r per layer, Q / n
};

void gram_schmidt(std::vector<double>& m, std::size_t rows, std::size_t r) { // row-major rows x r
  for (std::size_t i = 0; i < r; ++i) {
    double nn = 0;
    for (std::size_t j = 0; j < rows; ++j)
      nn += m[j * r + i] * m[j * r + i];
    nn = std::sqrt(nn);
    for (std::size_t j = 0; j < rows; ++j)
      m[j * r + i] /= nn;
    for (std::size_t k = i + 1; k < r; ++k) {
      double s = 0;
      for (std::size_t j = 0; j < rows; ++j)
        s += m[j * r + i] * m[j * r + k];
      for (std::size_t j = 0; j < rows; ++j)
        m[j * r + k] -= s * m[j * r + i];
    }
  }
}

reference_round reference(const compress::powersgd_plan& plan, const std::vector<std::vector<double>>& ms,
                          std::vector<double> q) {
  const std::size_t n = ms.size();
  reference_round res;
  res.out.assign(plan.length, 0.0);
  res.e.assign(n, std::vector<double>(plan.length, 0.0));
  for (const auto& v : plan.vectors)
    for (std::size_t j = 0; j < v.size; ++j)
      for (std::size_t i = 0; i < n; ++i)
        res.out[v.offset + j] += ms[i][v.offset + j];
  res.q_next.assign(plan.q_size, 0.0);
  for (const auto& mx : plan.matrices) {
    const std::size_t a = mx.rows, b = mx.cols, r = mx.rank;
    std::vector<double> qq(q.begin() + static_cast<std::ptrdiff_t>(mx.q_offset),
                           q.begin() + static_cast<std::ptrdiff_t>(mx.q_offset + b * r));
    gram_schmidt(qq, b, r);
    std::vector<double> p(a * r, 0.0);
    for (std::size_t w = 0; w < n; ++w)
      for (std::size_t i = 0; i < a; ++i)
        for (std::size_t k = 0; k < r; ++k)
          for (std::size_t j = 0; j < b; ++j)
            p[i * r + k] += ms[w][mx.offset + i * b + j] * qq[j * r + k];
    gram_schmidt(p, a, r);
    std::vector<double> qs(b * r, 0.0);
    for (std::size_t w = 0; w < n; ++w)
      for (std::size_t i = 0; i < a; ++i)
        for (std::size_t k = 0; k < r; ++k)
          for (std::size_t j = 0; j < b; ++j)
            qs[j * r + k] += ms[w][mx.offset + i * b + j] * p[i * r + k];
    for (std::size_t x = 0; x < b * r; ++x)
      res.q_next[mx.q_offset + x] = qs[x] / static_cast<double>(n);
    for (std::size_t i = 0; i < a; ++i)
      for (std::size_t j = 0; j < b; ++j) {
        double s = 0;
        for (std::size_t k = 0; k < r; ++k)
          s += p[i * r + k] * qs[j * r + k];
        res.out[mx.offset + i * b + j] = s;
        for (std::size_t w = 0; w < n; ++w)
          res.e[w][mx.offset + i * b + j] = ms[w][mx.offset + i * b + j] - s / static_cast<double>(n);
      }
  }
  return res;
}

// Relative to the largest magnitude of the reference: float rounding over sums of a few hundred products.
void check_close(std::span<const float> got, std::span<const double> want, double tol) {
  REQUIRE(got.size() == want.size());
  double scale = 1e-30;
  for (double w : want)
    scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::abs(got[i] - want[i]) > tol * scale) {
      CAPTURE(i);
      CHECK(got[i] == doctest::Approx(want[i]));
      return;
    }
}

} // namespace

TEST_CASE("rounds on 1 to 4 ranks follow the double-precision reference, identical on every rank") {
  const std::vector<layer_shape> ls{{24, 16}, {16, 1}, {3, 3}, {40, 9}, {1, 1}, {9, 40}};
  const std::size_t d = total(ls);
  for (int n = 1; n <= 4; ++n)
    for (std::size_t rank : {1u, 2u, 4u}) {
      CAPTURE(n);
      CAPTURE(rank);
      powersgd_options o;
      o.rank = rank;
      o.layers = ls;
      o.seed = 11;
      const auto plan = compress::make_powersgd_plan(d, ls, rank, 2.0);
      // The initial Q the compressor draws, in PyTorch's row-major layout, for the reference.
      std::vector<float> drawn(plan.q_size);
      compress::detail::standard_normals(11, 0, 0, drawn);
      std::vector<double> q(plan.q_size);
      for (const auto& mx : plan.matrices)
        for (std::size_t j = 0; j < mx.cols; ++j)
          for (std::size_t k = 0; k < mx.rank; ++k)
            q[mx.q_offset + j * mx.rank + k] = drawn[mx.q_offset + k * mx.cols + j];
      std::vector<std::vector<double>> e(static_cast<std::size_t>(n), std::vector<double>(d, 0.0));
      std::vector<std::vector<std::vector<float>>> outs(3, std::vector<std::vector<float>>(n));
      std::vector<std::vector<std::vector<float>>> res(3, std::vector<std::vector<float>>(n));
      std::vector<std::vector<float>> qs(3);
      auto grad = [&](int w, int t) { return normals(d, static_cast<std::uint64_t>(100 * t + w)); };
      comm::local_group(n).run([&](comm::local& c) {
        powersgd x(d, o);
        std::vector<float> out(d);
        for (int t = 0; t < 3; ++t) {
          x.reduce(c, grad(c.rank(), t), out);
          outs[t][static_cast<std::size_t>(c.rank())] = out;
          res[t][static_cast<std::size_t>(c.rank())].assign(x.residual().begin(), x.residual().end());
          if (c.rank() == 0) qs[t].assign(x.q().begin(), x.q().end());
        }
      });
      for (int t = 0; t < 3; ++t) {
        CAPTURE(t);
        for (int w = 1; w < n; ++w)
          CHECK(outs[t][static_cast<std::size_t>(w)] == outs[t][0]);
        std::vector<std::vector<double>> ms(static_cast<std::size_t>(n));
        for (int w = 0; w < n; ++w) {
          const auto g = grad(w, t);
          ms[w].resize(d);
          for (std::size_t i = 0; i < d; ++i)
            ms[w][i] = g[i] + e[w][i];
        }
        auto ref = reference(plan, ms, q);
        check_close(outs[t][0], ref.out, 2e-4);
        for (int w = 0; w < n; ++w) {
          // dense layers keep no residual
          for (const auto& v : plan.vectors)
            for (std::size_t j = 0; j < v.size; ++j)
              ref.e[w][v.offset + j] = 0.0;
          check_close(res[t][static_cast<std::size_t>(w)], ref.e[w], 2e-4);
        }
        // Q is carried over as (sum of M^T P) / n.
        std::vector<double> qn(plan.q_size);
        for (const auto& mx : plan.matrices)
          for (std::size_t j = 0; j < mx.cols; ++j)
            for (std::size_t k = 0; k < mx.rank; ++k)
              qn[mx.q_offset + k * mx.cols + j] = ref.q_next[mx.q_offset + j * mx.rank + k];
        check_close(qs[t], qn, 2e-4);
        // The reference continues from its own state, so errors do not compound.
        e = ref.e;
        q = ref.q_next;
      }
    }
}

TEST_CASE("a rank-r sum is reproduced after one round, and the residual is M minus the approximation") {
  for (int n = 1; n <= 4; ++n)
    for (std::size_t r : {1u, 2u, 3u}) {
      CAPTURE(n);
      CAPTURE(r);
      const std::size_t a = 37, b = 29;
      // Every rank's M = U_w V^T with one shared V, so the sum over ranks has rank r.
      const auto v = normals(b * r, 5);
      powersgd_options o;
      o.rank = r;
      o.layers = {{a, b}};
      std::vector<float> out0;
      comm::local_group(n).run([&](comm::local& c) {
        const auto u = normals(a * r, 50 + static_cast<std::uint64_t>(c.rank()));
        std::vector<float> g(a * b, 0.0f);
        for (std::size_t i = 0; i < a; ++i)
          for (std::size_t j = 0; j < b; ++j)
            for (std::size_t k = 0; k < r; ++k)
              g[i * b + j] += u[i * r + k] * v[j * r + k];
        powersgd x(a * b, o);
        std::vector<float> out(a * b);
        x.reduce(c, g, out);
        std::vector<float> sum = g;
        c.all_reduce_sum(std::span<float>(sum));
        double scale = 0;
        for (float s : sum)
          scale = std::max(scale, std::abs(static_cast<double>(s)));
        for (std::size_t i = 0; i < a * b; ++i)
          CHECK(std::abs(out[i] - sum[i]) <= 1e-4 * scale);
        // Error feedback, bit for bit: e = M - A with A = P (Q / n)^T computed in float in this order.
        const auto p = x.p();
        const auto q = x.q();
        const auto e = x.residual();
        std::size_t mismatches = 0;
        for (std::size_t i = 0; i < a; ++i)
          for (std::size_t j = 0; j < b; ++j) {
            float s;
            if (r == 1) {
              s = p[i] * q[j];
            } else {
              s = 0.0f;
              for (std::size_t k = 0; k < r; ++k)
                s += p[k * a + i] * q[k * b + j];
            }
            mismatches += e[i * b + j] == g[i * b + j] - s ? 0 : 1;
            mismatches += out[i * b + j] == s * static_cast<float>(n) ? 0 : 1;
          }
        CHECK(mismatches == 0);
        if (c.rank() == 0) out0 = out;
      });
    }
}

TEST_CASE("warm start: the next round starts from the kept Q, a cold start from a fresh draw") {
  const std::vector<layer_shape> ls{{30, 20}};
  auto run = [&](bool warm, std::vector<float>* q_after) {
    powersgd_options o;
    o.rank = 2;
    o.layers = ls;
    o.warm_start = warm;
    o.error_feedback = false;
    std::vector<std::vector<float>> outs;
    comm::local_group(1).run([&](comm::local& c) {
      powersgd x(600, o);
      std::vector<float> out(600);
      const auto g = normals(600, 9); // the same gradient every round
      for (int t = 0; t < 4; ++t) {
        if (q_after && t == 1) *q_after = std::vector<float>(x.q().begin(), x.q().end());
        x.reduce(c, g, out);
        outs.push_back(out);
      }
    });
    return outs;
  };
  std::vector<float> q1;
  const auto warm = run(true, &q1);
  const auto cold = run(false, nullptr);
  // Power iteration on a fixed matrix: each warm round is one more iteration, so the approximation error
  // shrinks (or stays) round after round; a cold start does not improve.
  const auto g = normals(600, 9);
  auto err = [&](const std::vector<float>& o) {
    double s = 0;
    for (std::size_t i = 0; i < o.size(); ++i)
      s += (o[i] - g[i]) * static_cast<double>(o[i] - g[i]);
    return s;
  };
  CHECK(err(warm[3]) < err(warm[0]));
  CHECK(warm[0] == cold[0]);
  CHECK(warm[1] != cold[1]);
  // And the kept Q is exactly what a compressor given it as its initial Q starts from.
  powersgd_options o;
  o.rank = 2;
  o.layers = ls;
  o.error_feedback = false;
  o.initial_q.resize(q1.size());
  for (std::size_t j = 0; j < 20; ++j)
    for (std::size_t k = 0; k < 2; ++k)
      o.initial_q[j * 2 + k] = q1[k * 20 + j];
  comm::local_group(1).run([&](comm::local& c) {
    powersgd x(600, o);
    std::vector<float> out(600);
    x.reduce(c, g, out);
    CHECK(out == warm[1]);
  });
}
