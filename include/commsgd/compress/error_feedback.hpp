// compress::error_feedback: the residual every compressor in compress/ may keep, and the saved-state frame
// they share.
//
// Per round, with the residual held as a pair (e, r) of floats whose exact sum is what was held back (both +0
// at start), and d the values this rank's message decodes to (the very bits every other rank adds for it):
//   p      = g + e (+ r when r is not zero)   float additions, as top-k forms p = g + e (top-k may first
//                                             scale e and r by a decay)
//   e', r' = p - d, split exactly             e' = fl(p - d) and r' the rounding error of that subtraction
//                                             (Knuth's two-sum: always a float, barring overflow)
// committed only after the round has succeeded. So d + e' + r' == p exactly, as real numbers, for every
// compressor: nothing a message does not carry is lost, bit for bit (the tests check it in 113-bit
// arithmetic). r' is +0 wherever the subtraction is exact, which it always is for random-k (d is p or +0)
// and for fp16 / bf16 without clamping (narrowing a float loses a float's worth); for sign and QSGD, whose d
// is a scale times a sign or a level, it carries what a single float residual would round away.
// A round that throws (bad input on any rank) leaves the residual untouched.
#pragma once

#include <commsgd/compress/difference.hpp>
#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/prefetch.hpp>
#include <commsgd/rounded.hpp>
#include <commsgd/select/validate.hpp>
#include <commsgd/state/stream.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace commsgd::inline v1::compress {

// One value of p = g + decay e + decay r, the low part added only where it is not zero (so that where every
// subtraction was exact p is g + decay e bit for bit, signed zeros included). decay = 1 gives g + e + r:
// 1 e is e exactly. Host and device code alike.
COMMSGD_HOST_DEVICE inline float accumulate_value(float g, float e, float r, float decay) {
  const float s = commsgd::detail::add_rn(g, commsgd::detail::mul_rn(decay, e));
  const float low = commsgd::detail::mul_rn(decay, r);
  return low == 0.0f ? s : commsgd::detail::add_rn(s, low);
}

// (e, r) <- p - d split exactly: the two-sum of p and -d, s the rounded difference and t its error, both
// floats (each operation evaluated as written). Host and device code alike.
COMMSGD_HOST_DEVICE inline void split_difference(float p, float d, float& e, float& r) {
  const float a = p, b = -d;
  const float s = commsgd::detail::add_rn(a, b);
  const float bb = commsgd::detail::sub_rn(s, a);
  const float t = commsgd::detail::add_rn(commsgd::detail::sub_rn(a, commsgd::detail::sub_rn(s, bb)),
                                          commsgd::detail::sub_rn(b, bb));
  e = s;
  r = t == 0.0f ? 0.0f : t;
}

namespace detail {
// 64 values of p = g + e, or of g + decay e, and how many of them are NaN or inf (restrict parameters and a
// known length: GCC vectorises the loop at -O2 only then).
inline std::uint32_t accumulate_group(const float* __restrict g, const float* __restrict e,
                                      float* __restrict p) noexcept {
  std::uint32_t bad = 0;
  for (std::size_t j = 0; j < 64; ++j) {
    p[j] = g[j] + e[j];
    bad += std::fabs(p[j]) <= std::numeric_limits<float>::max() ? 0u : 1u;
  }
  return bad;
}
inline std::uint32_t accumulate_group(const float* __restrict g, const float* __restrict e,
                                      float* __restrict p, float decay) noexcept {
  std::uint32_t bad = 0;
  for (std::size_t j = 0; j < 64; ++j) {
    p[j] = commsgd::detail::add_rn(g[j], commsgd::detail::mul_rn(decay, e[j]));
    bad += std::fabs(p[j]) <= std::numeric_limits<float>::max() ? 0u : 1u;
  }
  return bad;
}
// The same with g given as a - b (compress/difference.hpp), the difference taken in the same pass.
inline std::uint32_t accumulate_group(const float* __restrict a, const float* __restrict b,
                                      const float* __restrict e, float* __restrict p) noexcept {
  std::uint32_t bad = 0;
  for (std::size_t j = 0; j < 64; ++j) {
    p[j] = (a[j] - b[j]) + e[j];
    bad += std::fabs(p[j]) <= std::numeric_limits<float>::max() ? 0u : 1u;
  }
  return bad;
}
inline std::uint32_t accumulate_group(const float* __restrict a, const float* __restrict b,
                                      const float* __restrict e, float* __restrict p, float decay) noexcept {
  std::uint32_t bad = 0;
  for (std::size_t j = 0; j < 64; ++j) {
    p[j] = commsgd::detail::add_rn(commsgd::detail::sub_rn(a[j], b[j]), commsgd::detail::mul_rn(decay, e[j]));
    bad += std::fabs(p[j]) <= std::numeric_limits<float>::max() ? 0u : 1u;
  }
  return bad;
}
// 64 values of (e, r) <- p - d split exactly (split_difference), e over p and r into low; whether any r is
// not zero. Restrict parameters and a known length, so that GCC vectorises it at -O2.
inline std::uint32_t split_group(float* __restrict p, const float* __restrict d,
                                 float* __restrict low) noexcept {
  std::uint32_t any = 0;
  for (std::size_t j = 0; j < 64; ++j) {
    float e, r;
    split_difference(p[j], d[j], e, r);
    p[j] = e;
    low[j] = r;
    any |= r != 0.0f ? 1u : 0u;
  }
  return any;
}
// A compressor that splits p - d itself, a stretch at a time from cache, for error_feedback::commit_split:
// the stretch's decode (filled by the caller through stretch()), the low words of its split, and the round's
// nonzero low words with their positions (rising when the stretches are).
struct residual_split {
  std::vector<float> decoded, low;
  std::vector<std::size_t> low_at;
  std::vector<float> low_val;

  // Empties the round's low words: when a round starts.
  void clear_low() noexcept {
    low_at.clear();
    low_val.clear();
  }
  // Room for a stretch of m decoded values.
  float* stretch(std::size_t m) {
    if (decoded.size() < m) {
      decoded.resize(m);
      low.resize(m);
    }
    return decoded.data();
  }
  // (e, r) <- p - d for one value at position `at` of the residual, split exactly: e over p, a nonzero r kept.
  // For a sparse code's sent values, called in rising `at`.
  void split_one(float& p, float d, std::size_t at) {
    float r;
    split_difference(p, d, p, r);
    if (r != 0.0f) {
      low_at.push_back(at);
      low_val.push_back(r);
    }
  }
  // (e, r) <- p - d over the stretch's m values (d: stretch()'s), split exactly: e over p, a nonzero r kept
  // with its position, `first` being the stretch's first value in the residual.
  void split(float* p, std::size_t m, std::size_t first) {
    const float* const d = decoded.data();
    float* const r = low.data();
    std::uint32_t any = 0;
    std::size_t i = 0;
    for (; i + 64 <= m; i += 64)
      any |= split_group(p + i, d + i, r + i);
    for (; i < m; ++i) {
      float e, t;
      split_difference(p[i], d[i], e, t);
      p[i] = e;
      r[i] = t;
      any |= t != 0.0f ? 1u : 0u;
    }
    if (any != 0)
      for (i = 0; i < m; ++i)
        if (r[i] != 0.0f) {
          low_at.push_back(first + i);
          low_val.push_back(r[i]);
        }
  }
};
} // namespace detail

class error_feedback {
public:
  error_feedback() = default;
  // `on` false keeps no residual: accumulate copies g and commit does nothing.
  error_feedback(std::size_t length, bool on)
      : on_(on), e_(on ? length : 0, 0.0f), r_(on ? length : 0, 0.0f) {}

  bool on() const noexcept { return on_; }
  // e: the residual's leading part, fl(p - d) of the last round.
  std::span<const float> residual() const noexcept { return e_; }
  // r: the rounding error of that subtraction; e + r is exactly what was held back.
  std::span<const float> residual_low() const noexcept { return r_; }

  // p <- g + e + r (or g). The low part is added only where it is not zero, so that where every subtraction
  // was exact p is g + e bit for bit, signed zeros included. Sizes are the caller's to check.
  void accumulate(std::span<const float> g, std::span<float> p) const noexcept {
    if (!on_) {
      std::copy(g.begin(), g.end(), p.begin());
      return;
    }
    for (std::size_t i = 0; i < g.size(); ++i) {
      const float s = g[i] + e_[i];
      p[i] = r_[i] == 0.0f ? s : s + r_[i];
    }
  }

  // p <- g + decay e + decay r (or g): a residual that fades, for pseudo-gradients (compress/top_k_ef.hpp).
  // decay = 1 is accumulate(g, p) bit for bit.
  void accumulate(std::span<const float> g, std::span<float> p, float decay) const noexcept {
    if (!on_ || decay == 1.0f) {
      accumulate(g, p);
      return;
    }
    for (std::size_t i = 0; i < g.size(); ++i)
      p[i] = accumulate_value(g[i], e_[i], r_[i], decay);
  }

  // accumulate(g, p, decay), bit for bit, with p's NaN and infinities counted in the same pass (as
  // select::find_non_finite gives them: the count, and the first index, p.size() when there is none). Where
  // the low part is known to be zero but at a few indices (every commit since the last dense one was
  // commit_sparse), the pass reads g and e alone and those indices are mended after it.
  select::non_finite_scan accumulate_counted(std::span<const float> g, std::span<float> p,
                                             float decay = 1.0f) const noexcept {
    if (!on_ || !low_sparse_) {
      accumulate(g, p, decay);
      return select::find_non_finite(p);
    }
    const std::size_t n = g.size();
    const auto bad_of = [](float x) -> std::size_t {
      return std::fabs(x) <= std::numeric_limits<float>::max() ? 0u : 1u;
    };
    // With r zero, accumulate_value(g, e, 0, decay) is g + decay e: decay times +0 is +0, which it passes over.
    std::size_t bad = 0, i = 0;
    if (decay == 1.0f) {
      for (; i + 64 <= n; i += 64)
        bad += detail::accumulate_group(g.data() + i, e_.data() + i, p.data() + i);
      for (; i < n; ++i) {
        p[i] = g[i] + e_[i];
        bad += bad_of(p[i]);
      }
    } else {
      for (; i + 64 <= n; i += 64)
        bad += detail::accumulate_group(g.data() + i, e_.data() + i, p.data() + i, decay);
      for (; i < n; ++i) {
        p[i] = commsgd::detail::add_rn(g[i], commsgd::detail::mul_rn(decay, e_[i]));
        bad += bad_of(p[i]);
      }
    }
    // Where r may hold something, the full formula (with decay 1 it is accumulate's: 1 e is e, 1 r is r).
    for (const std::size_t at : low_at_) {
      const float v = accumulate_value(g[at], e_[at], r_[at], decay);
      bad = bad - bad_of(p[at]) + bad_of(v);
      p[at] = v;
    }
    if (bad == 0) return {0, n};
    return select::find_non_finite(p);
  }

  // accumulate_counted(g, p, decay) for the values [first, first + g.size()) alone (g and p that part),
  // returning how many of that part of p are NaN or inf: a compressor that takes its input a stretch at a
  // time. Parts in rising order with one `cursor`, as accumulate_part. g may be a difference a - b
  // (compress/difference.hpp), taken in the same pass.
  std::size_t accumulate_counted_part(difference g, std::span<float> p, std::size_t first,
                                      std::size_t& cursor, float decay = 1.0f) const noexcept {
    const std::size_t n = g.size();
    if (!on_ || !low_sparse_) {
      if (!on_)
        for (std::size_t i = 0; i < n; ++i)
          p[i] = g[i];
      else
        for (std::size_t i = 0; i < n; ++i)
          p[i] = accumulate_value(g[i], e_[first + i], r_[first + i], decay);
      return select::count_non_finite(std::span<const float>(p));
    }
    const auto bad_of = [](float x) -> std::size_t {
      return std::fabs(x) <= std::numeric_limits<float>::max() ? 0u : 1u;
    };
    const float* const e = e_.data() + first;
    const float* const a = g.a.data();
    std::size_t bad = 0, i = 0;
    if (g.b != nullptr) {
      for (; i + 64 <= n; i += 64) {
        commsgd::detail::prefetch_group(a + i);
        commsgd::detail::prefetch_group(g.b + i);
        commsgd::detail::prefetch_group(e + i);
        commsgd::detail::prefetch_group<true>(p.data() + i);
        bad += decay == 1.0f ? detail::accumulate_group(a + i, g.b + i, e + i, p.data() + i)
                             : detail::accumulate_group(a + i, g.b + i, e + i, p.data() + i, decay);
      }
    } else {
      for (; i + 64 <= n; i += 64) {
        commsgd::detail::prefetch_group(a + i);
        commsgd::detail::prefetch_group(e + i);
        bad += decay == 1.0f ? detail::accumulate_group(a + i, e + i, p.data() + i)
                             : detail::accumulate_group(a + i, e + i, p.data() + i, decay);
      }
    }
    for (; i < n; ++i) {
      p[i] = commsgd::detail::add_rn(g[i], decay == 1.0f ? e[i] : commsgd::detail::mul_rn(decay, e[i]));
      bad += bad_of(p[i]);
    }
    for (; cursor < low_at_.size() && low_at_[cursor] < first + n; ++cursor) {
      const std::size_t at = low_at_[cursor];
      if (at < first) continue;
      const float v = accumulate_value(g[at - first], e_[at], r_[at], decay);
      bad = bad - bad_of(p[at - first]) + bad_of(v);
      p[at - first] = v;
    }
    return bad;
  }

  // accumulate(g, p) for the values [first, first + g.size()) alone (g and p that part): a compressor that forms
  // p a stretch at a time, to code each stretch from cache. Parts taken in rising order with one `cursor`
  // (0 at the first) read the low words' positions once in all; they must be rising, as commit_split and
  // replace leave them. g may be a difference a - b, taken in the same pass.
  void accumulate_part(difference g, std::span<float> p, std::size_t first,
                       std::size_t& cursor) const noexcept {
    const std::size_t n = g.size();
    if (!on_) {
      for (std::size_t i = 0; i < n; ++i)
        p[i] = g[i];
      return;
    }
    const float* const e = e_.data() + first;
    if (!low_sparse_) {
      const float* const r = r_.data() + first;
      for (std::size_t i = 0; i < n; ++i) {
        const float s = g[i] + e[i];
        p[i] = r[i] == 0.0f ? s : s + r[i];
      }
      return;
    }
    const float* const a = g.a.data();
    std::size_t i = 0;
    if (g.b != nullptr) // in groups the compiler vectorises (their counts unused)
      for (; i + 64 <= n; i += 64) {
        commsgd::detail::prefetch_group(a + i);
        commsgd::detail::prefetch_group(g.b + i);
        commsgd::detail::prefetch_group(e + i);
        detail::accumulate_group(a + i, g.b + i, e + i, p.data() + i);
      }
    else
      for (; i + 64 <= n; i += 64) {
        commsgd::detail::prefetch_group(a + i);
        commsgd::detail::prefetch_group(e + i);
        detail::accumulate_group(a + i, e + i, p.data() + i);
      }
    for (; i < n; ++i)
      p[i] = g[i] + e[i];
    for (; cursor < low_at_.size() && low_at_[cursor] < first + n; ++cursor) {
      const std::size_t at = low_at_[cursor];
      if (at >= first) p[at - first] = accumulate_value(g[at - first], e_[at], r_[at], 1.0f);
    }
  }

  // (e, r) <- a residual split elsewhere with split_difference, once the round has succeeded: e_next (the
  // full length) is swapped in whole and gets the old e back as scratch; r is low_val at the rising positions
  // low_at and +0 everywhere else. What a compressor that splits p - d from cache as it codes commits. Throws
  // only std::bad_alloc, before anything has changed.
  void commit_split(std::vector<float>& e_next, std::span<const std::size_t> low_at,
                    std::span<const float> low_val) {
    if (!on_) return;
    low_at_.reserve(low_at.size());
    std::swap(e_, e_next);
    zero_low();
    low_at_.assign(low_at.begin(), low_at.end());
    for (std::size_t j = 0; j < low_at.size(); ++j)
      r_[low_at[j]] = low_val[j];
    low_sparse_ = true;
  }

  // (e, r) <- p - d split exactly, once the round has succeeded.
  void commit(std::span<const float> p, std::span<const float> d) noexcept {
    if (!on_) return;
    for (std::size_t i = 0; i < p.size(); ++i)
      split_difference(p[i], d[i], e_[i], r_[i]);
    low_sparse_ = false;
  }

  // commit(p, d), bit for bit, for a d that is +0 but at the indices `at` (each at most once), where it is
  // d_at: p - +0 splits into p and +0 (p is finite), so e takes p's buffer whole, p gets e's old one (its
  // contents are the caller's to overwrite), and only the indices `at` and those where r was not zero are
  // written after. A round that sends a few values so pays for no pass over the residual of its own. p must
  // have the residual's length. Throws only std::bad_alloc, before anything has changed.
  void commit_sparse(std::vector<float>& p, std::span<const std::size_t> at, std::span<const float> d_at) {
    if (!on_) return;
    low_next_.clear();
    low_next_.reserve(at.size());
    std::swap(e_, p);
    zero_low();
    for (std::size_t j = 0; j < at.size(); ++j) {
      const std::size_t i = at[j];
      split_difference(e_[i], d_at[j], e_[i], r_[i]);
      if (r_[i] != 0.0f) low_next_.push_back(i);
    }
    // Rising, as the parts' cursor reads them (a top-k code's indices already are).
    if (!std::is_sorted(low_next_.begin(), low_next_.end())) std::sort(low_next_.begin(), low_next_.end());
    std::swap(low_at_, low_next_);
    low_sparse_ = true;
  }

  // Replaces the residual (from a loaded state); both must have the residual's length.
  void replace(std::vector<float> e, std::vector<float> r) {
    std::vector<std::size_t> low;
    for (std::size_t i = 0; i < r.size(); ++i)
      if (r[i] != 0.0f) low.push_back(i);
    e_ = std::move(e);
    r_ = std::move(r);
    low_at_ = std::move(low);
    low_sparse_ = true;
  }

private:
  // r <- +0 everywhere, writing only where it may hold something.
  void zero_low() noexcept {
    if (low_sparse_) {
      for (const std::size_t i : low_at_)
        r_[i] = 0.0f;
    } else {
      std::fill(r_.begin(), r_.end(), 0.0f);
    }
  }

  bool on_ = false;
  std::vector<float> e_, r_;
  // The indices where r may not be zero, when low_sparse_; otherwise r may be anywhere (a dense commit).
  bool low_sparse_ = true;
  std::vector<std::size_t> low_at_, low_next_;
};

namespace detail {

// The body every compressor saves, inside the versioned, checksummed frame of state/stream.hpp:
//   u64 parameter count | u64 each parameter | u64 steps | u32 error feedback (1 on, 0 off) |
//   residual | its low part (both only when on)
// Parameters are what a state only loads into a compressor that agrees on (length, s, seed, ...).
inline void save_state(std::ostream& os, std::string_view kind, std::span<const std::uint64_t> params,
                       std::uint64_t steps, const error_feedback& ef) {
  state::writer w(kind);
  w.put<std::uint64_t>(params.size());
  for (auto v : params)
    w.put<std::uint64_t>(v);
  w.put<std::uint64_t>(steps);
  w.put<std::uint32_t>(ef.on() ? 1u : 0u);
  if (ef.on()) {
    w.put_array(ef.residual());
    w.put_array(ef.residual_low());
  }
  state::write_frame(os, std::move(w).finish());
}

// Reads and checks a whole state, then replaces `steps` and the residual of `ef`: nothing is assigned before
// the last byte has been checked, so a compressor keeps its own state on any corrupt_data. `names[i]` says
// what params[i] is in the message.
inline void load_state(std::istream& is, std::string_view kind, std::span<const std::uint64_t> params,
                       std::span<const char* const> names, std::size_t length, std::uint64_t& steps,
                       error_feedback& ef) {
  const auto blob = state::read_frame(is);
  state::reader r(blob, kind);
  state::expect_same(r.get<std::uint64_t>(), params.size(), "parameter count");
  for (std::size_t i = 0; i < params.size(); ++i)
    state::expect_same(r.get<std::uint64_t>(), params[i], names[i]);
  const auto saved_steps = r.get<std::uint64_t>();
  state::expect_same(r.get<std::uint32_t>(), ef.on() ? 1u : 0u, "error feedback (1 on, 0 off)");
  std::vector<float> residual, residual_low;
  if (ef.on()) {
    residual.resize(length);
    r.get_array(std::span<float>(residual), "residual");
    residual_low.resize(length);
    r.get_array(std::span<float>(residual_low), "residual low part");
  }
  r.expect_end();
  if (ef.on()) ef.replace(std::move(residual), std::move(residual_low));
  steps = saved_steps;
}

} // namespace detail
} // namespace commsgd::inline v1::compress
