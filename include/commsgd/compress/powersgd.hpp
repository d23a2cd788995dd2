// compress::powersgd: rank-r PowerSGD with error feedback and warm start (its tag for data_parallel,
// policy::powersgd, is in policy/powersgd.hpp).
//
// One round on each rank, per compressed layer M (rows x cols, row-major, see powersgd_plan.hpp):
//   M = g + e                        error feedback (e = 0 at start)
//   orthogonalise Q                  Q (cols x r) is last round's, or the seeded initial draw
//   P = M Q;          all-reduce P   (sum)
//   orthogonalise P;  Q = M^T P;     all-reduce Q (sum)
//   A = P (Q / n)^T                  the mean of the ranks' low-rank approximations
//   out = n A,  e = M - A,  Q kept as Q / n for the next round
// and the layers left dense go in one flat all-reduce ahead of P, so a round is three all-reduces whatever
// the number of layers (every P in one buffer, every Q in another: the batched form; PyTorch's
// batch_tensors_with_same_shape only stacks same-shaped layers for its bmm calls). out is the SUM over
// ranks (the compressor contract); PyTorch's powerSGD_hook returns the mean, i.e. out / n, and keeps the same
// Q / n and the same residual on compressed layers.
//
// Orthogonalisation is PyTorch's Gram-Schmidt (_orthogonalize_gram_schmidt): values in float, columns in
// order, each column divided by its norm (plus epsilon when epsilon > 0), then its projection removed from
// every later column (norms and dot products accumulated in double, then rounded to float). PyTorch switches
// to a Householder QR for r > 2; that basis differs from Gram-Schmidt's only in column signs, which cancel in
// P Q^T, so the round's result agrees within rounding for every r.
//
// Where this differs from PyTorch, on purpose:
// - epsilon = 0 and a zero column: PyTorch divides 0 by 0 and sends NaN; here the column stays zero (what
//   PyTorch's own except branch intends).
// - A Q that is all zeros at the start of a round (the layer summed to zero over every rank last round) is
//   drawn afresh, identically on every rank, instead of staying zero for ever.
// - Layers sent dense keep no residual: they travel exactly. (PyTorch's residual there is the rank's value
//   minus the mean, which sums to zero over ranks, so the aggregate is the same up to rounding.)
//
// The initial Q is seeded (options.seed), drawn from a portable generator (splitmix64 and Box-Muller), so
// every rank and every standard library draws the same; options.initial_q takes a draw from elsewhere
// instead (PyTorch's own, to compare with its hook). Without warm start, every round draws afresh.
//
// Errors: sizes, non-finite gradients and overflow raise on every rank. A rank whose input is bad still takes
// part in the first two all-reduces with NaN, so every rank sees a non-finite sum and raises together; that
// rank raises its own, more precise error. The state (residual, Q, step count) changes only when a round
// succeeds, and so does `out`, which may be `g` itself: a round reads g only before it writes out.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/compressed_reducer.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/powersgd_plan.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/powersgd.hpp>
#include <commsgd/error.hpp>
#include <commsgd/mix.hpp>
#include <commsgd/select/validate.hpp>
#include <commsgd/state/stream.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace commsgd::inline v1::compress {

struct powersgd_options {
  std::size_t rank = 1;                   // r: [1, inf); a layer uses min(rows, cols, r)
  std::vector<layer_shape> layers;        // in gradient order; rows * cols add up to the length
  double min_compression_rate = 2.0;      // (0, inf): PyTorch's rule and default (powersgd_plan.hpp)
  float orthogonalization_epsilon = 0.0f; // [0, inf)
  std::uint64_t seed = 0;                 // the initial Q (and every Q without warm start)
  bool error_feedback = true;
  bool warm_start = true;
  // Empty, or every compressed layer's initial Q before orthogonalisation, in gradient order, each a
  // cols x r row-major matrix (the layout of PyTorch's Q).
  std::vector<float> initial_q;
};

namespace detail {

// Standard normal draws for the stream (seed, a, b): the same values on every machine.
inline void standard_normals(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::span<float> out) {
  using commsgd::splitmix64;
  std::uint64_t s = seed;
  s = splitmix64(s) ^ a;
  s = splitmix64(s) ^ b;
  auto uniform = [&] { return (static_cast<double>(splitmix64(s) >> 11) + 0.5) * 0x1.0p-53; };
  for (std::size_t i = 0; i < out.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform())), t = 6.283185307179586 * uniform();
    out[i] = static_cast<float>(r * std::cos(t));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(r * std::sin(t));
  }
}

// Eight independent partial sums, so the loop vectorises without reassociating anything.
inline float dot(const float* a, const float* b, std::size_t n) noexcept {
  float acc[8] = {};
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (std::size_t l = 0; l < 8; ++l)
      acc[l] += a[j + l] * b[j + l];
  for (; j < n; ++j)
    acc[j % 8] += a[j] * b[j];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

inline void axpy(float* y, float a, const float* x, std::size_t n) noexcept {
  for (std::size_t j = 0; j < n; ++j)
    y[j] += a * x[j];
}

// Gram-Schmidt on `rank` columns of `rows` values stored one after another (column k at k * rows), as
// PyTorch's _orthogonalize_gram_schmidt: see the header comment.
inline void orthogonalise(float* cols, std::size_t rows, std::size_t rank, float epsilon) noexcept {
  for (std::size_t i = 0; i < rank; ++i) {
    float* c = cols + i * rows;
    double ss = 0.0;
    for (std::size_t j = 0; j < rows; ++j)
      ss += static_cast<double>(c[j]) * c[j];
    const float norm = static_cast<float>(std::sqrt(ss));
    if (epsilon == 0.0f && norm == 0.0f) {
      std::fill(c, c + rows, 0.0f);
    } else {
      const float d = epsilon == 0.0f ? norm : norm + epsilon;
      for (std::size_t j = 0; j < rows; ++j)
        c[j] /= d;
    }
    for (std::size_t k = i + 1; k < rank; ++k) {
      float* r = cols + k * rows;
      double s = 0.0;
      for (std::size_t j = 0; j < rows; ++j)
        s += static_cast<double>(c[j]) * r[j];
      const float proj = static_cast<float>(s);
      for (std::size_t j = 0; j < rows; ++j)
        r[j] -= proj * c[j];
    }
  }
}

} // namespace detail

class powersgd {
public:
  static constexpr const char* name = "powersgd";

  powersgd(std::size_t length, powersgd_options o)
      : opt_(std::move(o)),
        plan_(make_powersgd_plan(length, opt_.layers, opt_.rank, opt_.min_compression_rate)),
        e_(opt_.error_feedback ? length : 0), m_(opt_.error_feedback ? length : 0), q_(plan_.q_size),
        qo_(plan_.q_size), qn_(plan_.q_size), p_(plan_.p_size), dense_(plan_.dense_size) {
    if (!(opt_.orthogonalization_epsilon >= 0.0f &&
          opt_.orthogonalization_epsilon < std::numeric_limits<float>::infinity()))
      throw invalid_argument(
          commsgd::concat("argument 'orthogonalization_epsilon' = ", opt_.orthogonalization_epsilon,
                          " is outside the allowed range [0, inf)"));
    if (!opt_.initial_q.empty()) {
      if (opt_.initial_q.size() != plan_.q_size)
        throw size_mismatch(commsgd::concat("argument 'initial_q' has ", opt_.initial_q.size(),
                                            " values, the compressed layers' Q hold ", plan_.q_size,
                                            " (cols x rank each, in gradient order)"));
      select::check_finite(opt_.initial_q, "argument 'initial_q'");
      for (const auto& mx : plan_.matrices)
        for (std::size_t j = 0; j < mx.cols; ++j)
          for (std::size_t k = 0; k < mx.rank; ++k)
            q_[mx.q_offset + k * mx.cols + j] = opt_.initial_q[mx.q_offset + j * mx.rank + k];
      opt_.initial_q = {};
    } else {
      detail::standard_normals(opt_.seed, 0, 0, q_);
    }
  }

  std::size_t length() const noexcept { return plan_.length; }
  std::uint64_t steps() const noexcept { return steps_; }
  // Bytes this rank sent in the last round, as comm::metered counts them (cost::powersgd_traffic).
  std::uint64_t wire_bytes() const noexcept { return wire_bytes_; }
  const powersgd_plan& plan() const noexcept { return plan_; }
  const powersgd_options& options() const noexcept { return opt_; }

  // e: zero on dense layers; empty without error feedback.
  std::span<const float> residual() const noexcept { return e_; }
  // The Q the next round starts from (before its orthogonalisation): column k of compressed layer i at
  // plan().matrices[i].q_offset + k * cols.
  std::span<const float> q() const noexcept { return q_; }
  // The last successful round's orthogonalised P, laid out like q() (column k at p_offset + k * rows).
  std::span<const float> p() const noexcept { return p_; }

  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    std::exception_ptr local;
    try {
      if (g.size() != length())
        throw size_mismatch(commsgd::concat("argument 'g' has ", g.size(),
                                            " elements, the compressor's length is ", length()));
      if (out.size() != length())
        throw size_mismatch(commsgd::concat("argument 'out' has ", out.size(),
                                            " elements, the compressor's length is ", length()));
      compress_locally(g);
    } catch (const commsgd::error&) {
      local = std::current_exception();
      std::fill(dense_.begin(), dense_.end(), std::numeric_limits<float>::quiet_NaN());
      std::fill(p_.begin(), p_.end(), std::numeric_limits<float>::quiet_NaN());
    }
    try {
      if (!dense_.empty()) c.all_reduce_sum(std::span<float>(dense_));
      if (!p_.empty()) c.all_reduce_sum(std::span<float>(p_));
    } catch (const commsgd::error&) {
      if (!local) throw;
    }
    if (local) std::rethrow_exception(local);
    check_sum(dense_, "the all-reduced dense layers");
    check_sum(p_, "the all-reduced P factors");

    const float* mbase = opt_.error_feedback ? m_.data() : g.data();
    std::fill(qn_.begin(), qn_.end(), 0.0f);
    for (const auto& mx : plan_.matrices) {
      float* p = p_.data() + mx.p_offset;
      float* qn = qn_.data() + mx.q_offset;
      detail::orthogonalise(p, mx.rows, mx.rank, opt_.orthogonalization_epsilon);
      const float* m = mbase + mx.offset;
      for (std::size_t i = 0; i < mx.rows; ++i)
        for (std::size_t k = 0; k < mx.rank; ++k)
          detail::axpy(qn + k * mx.cols, p[k * mx.rows + i], m + i * mx.cols, mx.cols);
    }
    if (!qn_.empty()) c.all_reduce_sum(std::span<float>(qn_));
    check_sum(qn_, "the all-reduced Q factors");

    // Nothing can fail from here on: commit.
    const int n = c.size();
    const float nf = static_cast<float>(n);
    for (float& x : qn_)
      x /= nf;
    for (const auto& v : plan_.vectors)
      std::copy_n(dense_.data() + v.dense_offset, v.size, out.data() + v.offset);
    row_.resize(std::max<std::size_t>(row_.size(), max_cols()));
    for (const auto& mx : plan_.matrices) {
      const float* p = p_.data() + mx.p_offset;
      const float* q = qn_.data() + mx.q_offset;
      const float* m = mbase + mx.offset;
      float* o = out.data() + mx.offset;
      float* e = opt_.error_feedback ? e_.data() + mx.offset : nullptr;
      for (std::size_t i = 0; i < mx.rows; ++i) {
        float* a = row_.data();
        if (mx.rank == 1) {
          const float pi = p[i];
          for (std::size_t j = 0; j < mx.cols; ++j)
            a[j] = pi * q[j];
        } else {
          std::fill(a, a + mx.cols, 0.0f);
          for (std::size_t k = 0; k < mx.rank; ++k)
            detail::axpy(a, p[k * mx.rows + i], q + k * mx.cols, mx.cols);
        }
        const float* mi = m + i * mx.cols;
        float* oi = o + i * mx.cols;
        if (e) {
          float* ei = e + i * mx.cols;
          for (std::size_t j = 0; j < mx.cols; ++j) {
            ei[j] = mi[j] - a[j];
            oi[j] = a[j] * nf;
          }
        } else {
          for (std::size_t j = 0; j < mx.cols; ++j)
            oi[j] = a[j] * nf;
        }
      }
    }
    q_.swap(qn_);
    ++steps_;
    wire_bytes_ = cost::powersgd_traffic(plan_, n, c.rank()).bytes_sent;
    comm::exchange_report r;
    r.dense = true;
    r.total = (static_cast<std::uint64_t>(plan_.dense_size) + plan_.p_size + plan_.q_size) *
              static_cast<std::uint64_t>(n);
    return r;
  }

  // Body: u64 length | u64 rank | f64 min_compression_rate | f32 epsilon | u64 seed | u32 error feedback |
  // u32 warm start | layers as an array of (rows, cols) u64 pairs | u64 steps | residual | Q.
  void save(std::ostream& os) const {
    state::writer w(name);
    put_layout(w);
    w.put<std::uint64_t>(steps_);
    w.put_array(std::span<const float>(e_));
    w.put_array(std::span<const float>(q_));
    state::write_frame(os, std::move(w).finish());
  }

  // A stream from a PowerSGD of another layout raises corrupt_data and changes nothing.
  void load(std::istream& is) {
    const auto blob = state::read_frame(is);
    state::reader r(blob, name);
    // The layout is the writer's fields after the frame's kind: compare them byte for byte.
    state::writer mine(name);
    const std::size_t head = mine.size();
    put_layout(mine);
    const std::size_t layout_bytes = mine.size() - head;
    const auto expect = std::move(mine).finish();
    std::vector<std::byte> saved(layout_bytes);
    for (auto& b : saved)
      b = r.get<std::byte>();
    if (!std::equal(saved.begin(), saved.end(), expect.begin() + static_cast<std::ptrdiff_t>(head)))
      throw corrupt_data("saved state: a PowerSGD state of another layout (length, rank, compression rate, "
                         "epsilon, seed, error feedback, warm start or layer shapes differ)");
    const auto steps = r.get<std::uint64_t>();
    std::vector<float> e(e_.size()), q(q_.size());
    r.get_array(std::span<float>(e), "residual");
    r.get_array(std::span<float>(q), "Q");
    r.expect_end();
    steps_ = steps;
    e_ = std::move(e);
    q_ = std::move(q);
  }

private:
  void put_layout(state::writer& w) const {
    w.put<std::uint64_t>(plan_.length);
    w.put<std::uint64_t>(opt_.rank);
    w.put<double>(opt_.min_compression_rate);
    w.put<float>(opt_.orthogonalization_epsilon);
    w.put<std::uint64_t>(opt_.seed);
    w.put<std::uint32_t>(opt_.error_feedback ? 1u : 0u);
    w.put<std::uint32_t>(opt_.warm_start ? 1u : 0u);
    std::vector<std::uint64_t> shapes;
    for (const auto& s : opt_.layers) {
      shapes.push_back(s.rows);
      shapes.push_back(s.cols);
    }
    w.put_array(std::span<const std::uint64_t>(shapes));
  }

  std::size_t max_cols() const noexcept {
    std::size_t c = 0;
    for (const auto& mx : plan_.matrices)
      c = std::max(c, mx.cols);
    return c;
  }

  // M = g + e, the dense buffer, this round's orthogonalised Q and P = M Q; throws on a non-finite input.
  void compress_locally(std::span<const float> g) {
    if (opt_.warm_start) {
      std::copy(q_.begin(), q_.end(), qo_.begin());
    } else {
      detail::standard_normals(opt_.seed, steps_, 0, qo_); // round 0 draws the initial Q
    }
    for (std::size_t i = 0; i < plan_.matrices.size(); ++i) {
      const auto& mx = plan_.matrices[i];
      const std::span<float> q(qo_.data() + mx.q_offset, mx.cols * mx.rank);
      if (std::all_of(q.begin(), q.end(), [](float x) { return x == 0.0f; }))
        detail::standard_normals(opt_.seed, steps_ + 1, i + 1, q);
      detail::orthogonalise(q.data(), mx.cols, mx.rank, opt_.orthogonalization_epsilon);
    }
    const bool ef = opt_.error_feedback;
    for (const auto& v : plan_.vectors) {
      float* d = dense_.data() + v.dense_offset;
      const float* gv = g.data() + v.offset;
      if (ef) {
        const float* ev = e_.data() + v.offset;
        for (std::size_t j = 0; j < v.size; ++j)
          d[j] = gv[j] + ev[j];
      } else {
        std::copy_n(gv, v.size, d);
      }
    }
    for (const auto& mx : plan_.matrices) {
      const float* q = qo_.data() + mx.q_offset;
      float* p = p_.data() + mx.p_offset;
      for (std::size_t i = 0; i < mx.rows; ++i) {
        const std::size_t at = mx.offset + i * mx.cols;
        const float* mi = g.data() + at;
        if (ef) {
          float* row = m_.data() + at;
          const float* ei = e_.data() + at;
          for (std::size_t j = 0; j < mx.cols; ++j)
            row[j] = mi[j] + ei[j];
          mi = row;
        }
        for (std::size_t k = 0; k < mx.rank; ++k)
          p[k * mx.rows + i] = detail::dot(mi, q + k * mx.cols, mx.cols);
      }
    }
    // A non-finite M shows up in P or in the dense buffer (x * inf and x + inf are never finite), so the
    // full checks run only when one of them is not finite.
    if (select::count_non_finite(dense_) == 0 && select::count_non_finite(p_) == 0) return;
    select::check_finite(g, "argument 'g' (the gradient)");
    if (ef) {
      select::check_finite(m_, "the gradient plus the PowerSGD residual");
      for (const auto& v : plan_.vectors)
        select::check_finite(std::span<const float>(dense_.data() + v.dense_offset, v.size),
                             "the gradient plus the PowerSGD residual (a dense layer)");
    }
    throw non_finite("P = M Q (it overflows)", 1, select::find_non_finite(p_).first);
  }

  static void check_sum(std::span<const float> x, const char* what) {
    const auto bad = select::find_non_finite(x);
    if (bad.count == 0) return;
    throw non_finite(commsgd::concat(what, " (some rank's gradient is non-finite, or the sum overflows)"),
                     bad.count, bad.first);
  }

  powersgd_options opt_;
  powersgd_plan plan_;
  std::vector<float> e_;     // residual
  std::vector<float> m_;     // scratch: M = g + e
  std::vector<float> q_;     // the next round's Q
  std::vector<float> qo_;    // scratch: this round's orthogonalised Q
  std::vector<float> qn_;    // scratch: M^T P, then its sum / n
  std::vector<float> p_;     // P
  std::vector<float> dense_; // the dense layers
  std::vector<float> row_;   // one row of P Q^T
  std::uint64_t steps_ = 0;
  std::uint64_t wire_bytes_ = 0;
};

static_assert(compressor<powersgd, comm::archetype>);

} // namespace commsgd::inline v1::compress
