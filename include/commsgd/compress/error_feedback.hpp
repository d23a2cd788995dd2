// compress::error_feedback: the residual every compressor in compress/ may keep, and the saved-state frame
// they share.
//
// Per round, with e the residual (+0 at start) and d the values this rank's message decodes to (the very
// bits every other rank adds for it):
//   p  = g + e      one float addition per value (p = g when error feedback is off)
//   e' = p - d      one float subtraction per value, committed only after the round has succeeded
// The invariant the tests check bit for bit is e' == fl(p - d) with d decoded from the message as it went
// on the wire. Whether nothing at all is lost (d + e' == p exactly, as real numbers) depends on the
// compressor, because a float can hold p - d only when the difference fits in 24 bits:
// - random-k: d is p or +0, so e' is +0 or p: exact always.
// - fp16 / bf16 without clamping: d is p rounded to a shorter significand over a narrower exponent range,
//   and the rounding error of such a narrowing is always a float: exact always.
// - sign and QSGD: d is a scale times a sign (or a level), unrelated to p's bits. The subtraction is exact
//   wherever Sterbenz's lemma applies (d/2 <= p <= 2d) or d = 0; elsewhere e' is p - d rounded to nearest,
//   so what is lost per value and round is at most half an ulp of e'.
// A round that throws (bad input on any rank) leaves the residual untouched.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sparsify/state_io.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace commsgd::inline v1::compress {

class error_feedback {
public:
  error_feedback() = default;
  // `on` false keeps no residual: accumulate copies g and commit does nothing.
  error_feedback(std::size_t length, bool on) : on_(on), e_(on ? length : 0, 0.0f) {}

  bool on() const noexcept { return on_; }
  std::span<const float> residual() const noexcept { return e_; }

  // p <- g + e (or g). Sizes are the caller's to check.
  void accumulate(std::span<const float> g, std::span<float> p) const noexcept {
    if (!on_) {
      std::copy(g.begin(), g.end(), p.begin());
      return;
    }
    for (std::size_t i = 0; i < g.size(); ++i)
      p[i] = g[i] + e_[i];
  }

  // e <- p - d, once the round has succeeded.
  void commit(std::span<const float> p, std::span<const float> d) noexcept {
    if (!on_) return;
    for (std::size_t i = 0; i < p.size(); ++i)
      e_[i] = p[i] - d[i];
  }

  // Replaces the residual (from a loaded state); `e` must have the residual's length.
  void replace(std::vector<float> e) noexcept { e_ = std::move(e); }

private:
  bool on_ = false;
  std::vector<float> e_;
};

namespace detail {

// The body every compressor saves, inside sparsify's versioned, checksummed frame:
//   u64 parameter count | u64 each parameter | u64 steps | u32 error feedback (1 on, 0 off) | residual
// Parameters are what a state only loads into a compressor that agrees on (length, s, seed, ...).
inline void save_state(std::ostream& os, std::string_view kind, std::span<const std::uint64_t> params,
                       std::uint64_t steps, const error_feedback& ef) {
  sparsify::detail::state_writer w(kind);
  w.put<std::uint64_t>(params.size());
  for (auto v : params)
    w.put<std::uint64_t>(v);
  w.put<std::uint64_t>(steps);
  w.put<std::uint32_t>(ef.on() ? 1u : 0u);
  if (ef.on()) w.put_array(ef.residual());
  sparsify::detail::write_blob(os, std::move(w).finish());
}

struct loaded_state {
  std::uint64_t steps = 0;
  std::vector<float> residual;
};

// Reads and checks a whole state before returning, so a caller that assigns only afterwards keeps its own
// state on any corrupt_data. `names[i]` says what params[i] is in the message.
inline loaded_state load_state(std::istream& is, std::string_view kind, std::span<const std::uint64_t> params,
                               std::span<const char* const> names, std::size_t length, bool ef_on) {
  const auto blob = sparsify::detail::read_blob(is);
  sparsify::detail::state_reader r(blob, kind);
  sparsify::detail::expect_saved(r.get<std::uint64_t>(), params.size(), "parameter count");
  for (std::size_t i = 0; i < params.size(); ++i)
    sparsify::detail::expect_saved(r.get<std::uint64_t>(), params[i], names[i]);
  loaded_state s;
  s.steps = r.get<std::uint64_t>();
  sparsify::detail::expect_saved(r.get<std::uint32_t>(), ef_on ? 1u : 0u, "error feedback (1 on, 0 off)");
  if (ef_on) {
    s.residual.resize(length);
    r.get_array(std::span<float>(s.residual), "residual");
  }
  r.expect_end();
  return s;
}

} // namespace detail
} // namespace commsgd::inline v1::compress
