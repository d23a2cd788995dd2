// compress::hook_momentum: momentum kept beside a compressor rather than in the optimizer.
//
// A compressor that drops or coarsens values (sign, random-k, top-k) diverges or lags when the optimizer
// applies momentum to the compressed average: the momentum amplifies what error feedback later releases in
// bursts. Keeping the momentum u <- m u + g on the sending side and compressing u instead makes what is applied,
// summed over steps, momentum SGD's updates; the optimizer then runs without momentum. This is the rule
// commsgd_torch's compressor hook follows, here so that a C++ trainer gets the same behaviour:
//
//   dense warm-up     warm_up(avg): u <- m u + avg, avg <- u (momentum SGD's update, the same on every
//                     rank, and compression later starts from that u instead of from zero)
//   compressed round  propose(g, next): next = m u + g, u untouched; compress `next`; when the round
//                     succeeded, commit(next); a round that failed leaves u as it was
//   chosen positions  restart(sent): u restarts from zero where values were sent (DGC's momentum factor
//                     masking), for the schemes that send a subset of positions
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

namespace commsgd::inline v1::compress {

class hook_momentum {
public:
  // factor in [0, 1); length: the values of the gradient it follows (0 for none yet: see resize()).
  explicit hook_momentum(float factor, std::size_t length = 0) : m_(factor), u_(length, 0.0f) {
    commsgd::check_range("momentum", factor, 0.0f, std::nextafter(1.0f, 0.0f), "[0, 1)");
  }

  float factor() const noexcept { return m_; }
  std::size_t length() const noexcept { return u_.size(); }
  std::span<const float> buffer() const noexcept { return u_; }

  // A momentum of another length starts again from zero: it belonged to other values.
  void resize(std::size_t length) {
    if (length != u_.size()) u_.assign(length, 0.0f);
  }

  // Replaces the momentum (a restored checkpoint, or the dense warm-up's): its length becomes `u`'s.
  void assign(std::span<const float> u) { u_.assign(u.begin(), u.end()); }

  void warm_up(std::span<float> avg) {
    check_length(avg.size(), "avg");
    for (std::size_t i = 0; i < avg.size(); ++i)
      avg[i] = u_[i] = m_ * u_[i] + avg[i];
  }

  void propose(std::span<const float> g, std::vector<float>& next) const {
    check_length(g.size(), "g");
    next.resize(g.size());
    for (std::size_t i = 0; i < g.size(); ++i)
      next[i] = m_ * u_[i] + g[i];
  }

  // Takes `next` as the momentum; `next` gets the old storage back, so one scratch vector serves every
  // bucket's proposal without a copy.
  void commit(std::vector<float>& next) {
    check_length(next.size(), "next");
    u_.swap(next);
  }

  template <std::integral I>
  void restart(std::span<const I> sent) {
    for (const I i : sent) {
      bool negative = false;
      if constexpr (std::signed_integral<I>) negative = i < 0;
      if (negative || static_cast<std::size_t>(i) >= u_.size())
        throw invalid_argument(
            commsgd::concat("argument 'sent' holds position ", i, ", outside [0, ", u_.size(), ")"));
      u_[static_cast<std::size_t>(i)] = 0.0f;
    }
  }

private:
  void check_length(std::size_t n, const char* what) const {
    if (n != u_.size())
      throw size_mismatch(
          commsgd::concat("argument '", what, "' has ", n, " values, the momentum follows ", u_.size()));
  }

  float m_;
  std::vector<float> u_;
};

} // namespace commsgd::inline v1::compress
