// The parts of a round that the compressors in compress/ share, so that each model writes only what makes it
// a different scheme (its message and how it sums) and every model takes its input, sums gathered messages
// and closes a round the same way:
//   take_input      p = g + e, and the verdict on sizes and values that compress/agree.hpp gathers
//   gather_and_sum  every rank's message gathered, decoded and summed in rank order from +0
//   sum_bound       whether the sums surely stay finite, from each rank's largest value
//   finish_round    the residual committed, the step counted, the report (finish_split_round: a code that
//                   split its new residual itself as it coded, compress/error_feedback.hpp's residual_split)
// A round that throws before finish_round leaves the compressor's state as it was.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::compress::detail {

// What every compressor built on these parts keeps, and the accessors the concept and the tests read: p = g + e
// and this rank's decoded message d, the residual, the gathered verdicts, the step count and the bytes this
// rank sent in the last round. Each model adds its options and its message.
class round_state {
public:
  std::size_t length() const noexcept { return length_; }
  std::uint64_t steps() const noexcept { return steps_; }
  std::uint64_t wire_bytes() const noexcept { return wire_; }
  std::span<const float> residual() const noexcept { return ef_.residual(); }
  std::span<const float> residual_low() const noexcept { return ef_.residual_low(); }

protected:
  // `decoded`: whether the model keeps its own message decoded in d (a dense commit); one that splits its
  // residual as it codes (finish_split_round) does not.
  round_state(std::size_t length, bool error_feedback, bool decoded = true)
      : length_(length), ef_(length, error_feedback), p_(length), d_(decoded ? length : 0) {}

  std::size_t length_;
  error_feedback ef_;
  std::vector<float> p_, d_;
  std::vector<std::uint64_t> verdicts_;
  std::uint64_t steps_ = 0;
  std::uint64_t wire_ = 0;
};

// p <- g + decay e, checked: sizes first (nothing else can be read when they are wrong), then p's values. A
// bad verdict is not raised here but agreed on, so that every rank raises it.
inline input_verdict take_input(std::span<const float> g, std::size_t out_size, std::size_t length,
                                const error_feedback& ef, std::span<float> p, float decay = 1.0f) {
  auto v = check_sizes(g.size(), out_size, length);
  if (v.problem != input_problem::none) return v;
  ef.accumulate(g, p, decay);
  return check_finite(p);
}

// A reduce-scatter's verdict on sizes: the whole gradient first, then (where the length divides into the n
// ranks; otherwise every rank refuses that after agreeing on it, require_parts) this rank's part of the output.
inline input_verdict check_scatter_sizes(std::size_t g, std::size_t out, std::size_t length, std::size_t n) {
  if (g != length) return {input_problem::gradient_size, 0, g, 0};
  if (length % n == 0 && out != length / n)
    return {input_problem::part_size, 0, out, static_cast<double>(length / n)};
  return {};
}

// Refuses a reduce-scatter length that does not divide into the n ranks; called once the ranks have agreed on
// the length, so every rank refuses it alike.
inline void require_parts(const char* what, std::size_t length, std::size_t n) {
  if (length % n != 0)
    throw invalid_argument(commsgd::concat(what, ": argument 'length' = ", length,
                                           " does not divide into the ", n,
                                           " ranks; the allowed lengths are multiples of the ranks"));
}

// Gathers every rank's `msg` (the same size on every rank) into `all`, sums what each decodes to into `out`
// in rank order from +0, so every rank adds the same floats in the same order and ends with the same bits,
// and decodes this rank's own message into `d`, what the residual keeps the rest of.
// decode(message, sink) calls sink(i, x) for the value x at index i. With `senders` (zeroed, out's length),
// each gathered value also counts its rank there, in the same decoding pass.
template <comm::communicator C, class Decode>
void gather_and_sum(C& c, std::span<const std::byte> msg, std::vector<std::byte>& all, std::span<float> out,
                    std::span<float> d, Decode&& decode, std::span<std::uint32_t> senders = {}) {
  const auto n = static_cast<std::size_t>(c.size());
  all.resize(n * msg.size());
  c.all_gather(msg, std::span<std::byte>(all));
  std::fill(out.begin(), out.end(), 0.0f);
  for (std::size_t r = 0; r < n; ++r) {
    const auto m = std::span<const std::byte>(all).subspan(r * msg.size(), msg.size());
    if (senders.empty())
      decode(m, [&](std::size_t i, float x) { out[i] += x; });
    else
      decode(m, [&](std::size_t i, float x) {
        out[i] += x;
        ++senders[i];
      });
  }
  decode(msg, [&](std::size_t i, float x) { d[i] = x; });
}

// Whether sums over n ranks surely stay finite, known from a bound on each rank's values: a sum of n floats,
// each at most its rank's largest magnitude (times `scale`, where the sum is then scaled), rounds up by at
// most (1 + 2^-24)^n, so the ranks' largest magnitudes summed, times that, below the largest float leave no
// sum to overflow. A NaN or inf among the values fails it. False says only that the sums must be tested.
class sum_bound {
public:
  // One rank's `count` floats from p (any alignment: read through memcpy). In 16 lanes, each its own largest
  // magnitude and NaN/inf flag, so no value waits on the last one's maximum and the loop vectorises: the
  // maximum of the same values taken in another order is the same float (a NaN is passed over, and fails the
  // bound through its flag).
  void add(const std::byte* p, std::size_t count) noexcept {
    constexpr std::size_t lanes = 16;
    constexpr float largest = std::numeric_limits<float>::max();
    float top[lanes] = {};
    std::uint32_t bad[lanes] = {};
    std::size_t j = 0;
    for (; j + lanes <= count; j += lanes) {
      float v[lanes];
      std::memcpy(v, p + 4 * j, sizeof v);
      for (std::size_t l = 0; l < lanes; ++l) {
        const float a = std::fabs(v[l]);
        bad[l] |= a <= largest ? 0u : 1u;
        top[l] = top[l] < a ? a : top[l];
      }
    }
    float most = 0.0f;
    bool finite = true;
    for (; j < count; ++j) {
      float v;
      std::memcpy(&v, p + 4 * j, 4);
      const float a = std::fabs(v);
      finite &= a <= largest;
      most = most < a ? a : most;
    }
    for (std::size_t l = 0; l < lanes; ++l) {
      finite &= bad[l] == 0;
      most = most < top[l] ? top[l] : most;
    }
    finite_ = finite_ && finite;
    total_ += static_cast<double>(most);
  }
  bool holds(std::size_t n, double scale = 1.0) const noexcept {
    return finite_ && total_ * scale * std::exp(static_cast<double>(n) * 0x1p-24) <
                          static_cast<double>(std::numeric_limits<float>::max());
  }

private:
  double total_ = 0.0;
  bool finite_ = true;
};

// Closes a round that has succeeded on every rank: (e, r) <- p - d, one more step, and the comm::exchange_report of n
// ranks that each put `each` values on the wire (`dense`: summed by an all-reduce rather than gathered).
inline comm::exchange_report round_report(std::size_t n, std::uint64_t each, bool dense) {
  comm::exchange_report rep;
  rep.dense = dense;
  rep.total = each * n;
  rep.counts.assign(n, each);
  return rep;
}
inline comm::exchange_report finish_round(error_feedback& ef, std::span<const float> p,
                                          std::span<const float> d, std::uint64_t& steps, std::size_t n,
                                          std::uint64_t each, bool dense) {
  ef.commit(p, d);
  ++steps;
  return round_report(n, each, dense);
}

// The round of a compressor that split its new residual itself as it coded (residual_split): committed
// whole, e_next getting the old residual back as scratch. The report is built first, so that nothing after
// the commit can throw.
inline comm::exchange_report finish_split_round(error_feedback& ef, std::vector<float>& e_next,
                                                const residual_split& s, std::uint64_t& steps, std::size_t n,
                                                std::uint64_t each, bool dense) {
  auto rep = round_report(n, each, dense);
  ef.commit_split(e_next, s.low_at, s.low_val);
  ++steps;
  return rep;
}

} // namespace commsgd::inline v1::compress::detail
