// Threshold formulas and key-window arithmetic shared by the host and device threshold searches.
//
// A key window splits the magnitude-key range [base, base + buckets << shift) into `buckets` equal buckets.
// Because the bits of a positive float grow roughly as its log2, equal key buckets are geometrically spaced
// in value: with shift s a bucket is 2^(s - 23) of an octave wide, whatever the scale of the data.
// Bucket indices: 0 holds keys below base, 1..buckets the window, buckets + 1 everything at or above its top.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/select/key.hpp>

#include <cmath>
#include <cstdint>

namespace commsgd::inline v1::select {

// Keys per octave of magnitude: the 23 mantissa bits.
inline constexpr std::uint32_t key_octave_shift = 23;

// The Laplace tail estimate. For Laplace(mu, b), P(|x| > t) = exp(-t / b) cosh(mu / b) when t >= |mu|, so
// the threshold leaving k of n above it is t0 = b (ln(n / k) + ln cosh(mu / b)). mu = 0 gives b ln(n / k).
COMMSGD_HOST_DEVICE inline float laplace_tail_threshold(float b, float mu, std::uint64_t n, std::uint64_t k) {
  if (!(b > 0.0f) || k == 0 || n == 0) return 0.0f;
  if (k >= n) return 0.0f;
  const double ratio = static_cast<double>(n) / static_cast<double>(k);
  const double m = std::fabs(static_cast<double>(mu)) / static_cast<double>(b);
  // ln cosh(m) written so that it cannot overflow for large m.
  const double log_cosh = m + std::log1p(std::exp(-2.0 * m)) - 0.69314718055994531;
  const double t = static_cast<double>(b) * (std::log(ratio) + log_cosh);
  return t > 0.0 ? static_cast<float>(t) : 0.0f;
}

struct key_window {
  std::uint32_t base = 0;
  std::uint32_t shift = 0;
  std::uint32_t buckets = 1;
};

// Bucket of `key` in `w`, in [0, w.buckets + 1]; branch-free so that it vectorises on both sides.
COMMSGD_HOST_DEVICE inline std::uint32_t window_bucket(std::uint32_t key, key_window w) {
  // Keys are below 2^31, so the difference fits a signed 32-bit integer; a negative one lands in bucket 0.
  const std::int32_t d = static_cast<std::int32_t>(key) - static_cast<std::int32_t>(w.base);
  std::int32_t i = (d >> static_cast<std::int32_t>(w.shift)) + 1;
  i = i < 0 ? 0 : i;
  const std::int32_t top = static_cast<std::int32_t>(w.buckets) + 1;
  return static_cast<std::uint32_t>(i > top ? top : i);
}

// Whether `key` is exactly the lower edge of its window bucket (meaningful for buckets 1..buckets).
COMMSGD_HOST_DEVICE inline bool on_bucket_edge(std::uint32_t key, key_window w) {
  return ((key - w.base) & ((std::uint32_t{1} << w.shift) - 1u)) == 0u;
}

// Lower key of bucket i (1 <= i <= buckets + 1); bucket buckets + 1 starts at the window's top.
COMMSGD_HOST_DEVICE inline std::uint32_t bucket_edge(key_window w, std::uint32_t i) {
  const std::uint64_t e =
      static_cast<std::uint64_t>(w.base) + (static_cast<std::uint64_t>(i - 1u) << w.shift);
  return e > 0x80000000ull ? 0x80000000u : static_cast<std::uint32_t>(e);
}

// A window of `buckets` buckets of 2^shift keys with `below` of them under `center` (clamped at key 0).
COMMSGD_HOST_DEVICE inline key_window window_around(std::uint32_t center, std::uint32_t shift,
                                                    std::uint32_t buckets, std::uint32_t below) {
  const std::uint64_t drop = static_cast<std::uint64_t>(below) << shift;
  key_window w;
  w.base = drop >= center ? 0u : static_cast<std::uint32_t>(center - drop);
  w.shift = shift;
  w.buckets = buckets;
  return w;
}

// The finest window of `buckets` buckets that covers the keys [lo, hi).
COMMSGD_HOST_DEVICE inline key_window window_spanning(std::uint32_t lo, std::uint32_t hi,
                                                      std::uint32_t buckets) {
  const std::uint64_t width = hi > lo ? static_cast<std::uint64_t>(hi - lo) : 1u;
  std::uint32_t shift = 0;
  while ((static_cast<std::uint64_t>(buckets) << shift) < width)
    ++shift;
  key_window w;
  w.base = lo;
  w.shift = shift;
  w.buckets = buckets;
  return w;
}

// First search of a cold start: one octave below t0 (a Gaussian's threshold sits near 0.6 t0) and
// buckets - 64 above it, because heavy-tailed gradients put the true threshold well above t0.
// 64 buckets per octave: each about 1.1 % wide in value.
inline constexpr std::uint32_t cold_window_shift = key_octave_shift - 6;
inline constexpr std::uint32_t cold_window_buckets = 512;
COMMSGD_HOST_DEVICE inline key_window cold_window(float t0) {
  return window_around(magnitude_key(t0), cold_window_shift, cold_window_buckets, 64);
}

// Warm start. In training the selector sees p = g + e, and the error-feedback residuals e grow until they
// cross the threshold, so it drifts by a few per cent per step, often steadily. Two predictors of the next
// threshold: no move (P0, the last threshold), and the last move repeated (P1). Each call scores both on what
// it found; the next one uses the predictor whose last two relative errors are smaller, and starts looking a
// margin below it: twice the larger of those errors plus 0.25 %, in [0.5 %, 25 %]. Until both have two
// errors, or after a restore (no history): no move, 5 %. The host and the device search keep one of these
// each and share every formula here, so that the rule has one home.
struct warm_tracker {
  float last = 0.0f, before = 0.0f;                  // the last two thresholds (0: unknown)
  double error[2][2] = {{-1.0, -1.0}, {-1.0, -1.0}}; // [predictor][age]: |found / predicted - 1|

  static constexpr double unknown_margin = 0.05;

  COMMSGD_HOST_DEVICE double predict(int which) const {
    if (which == 0 || before <= 0.0f) return last;
    const double ratio = static_cast<double>(last) / static_cast<double>(before);
    const double trend = ratio < 0.5 ? 0.5 : (2.0 < ratio ? 2.0 : ratio);
    return static_cast<double>(last) * trend;
  }
  COMMSGD_HOST_DEVICE double worst(int which) const {
    return error[which][0] < error[which][1] ? error[which][1] : error[which][0];
  }
  COMMSGD_HOST_DEVICE bool scored() const { return error[0][1] >= 0.0 && error[1][1] >= 0.0; }
  COMMSGD_HOST_DEVICE int best() const { return scored() && worst(1) < worst(0) ? 1 : 0; }
  COMMSGD_HOST_DEVICE double margin() const {
    if (!scored()) return unknown_margin;
    const double m = 2.0 * worst(best()) + 0.0025;
    return m < 0.005 ? 0.005 : (0.25 < m ? 0.25 : m);
  }

  // Where to look for the call after one that found `threshold`: the tracker's prediction when it saw that
  // threshold found, else (a restored state, no history) no move and the default margin.
  struct plan {
    double guess;
    double margin;
  };
  COMMSGD_HOST_DEVICE plan next(float threshold) const {
    if (last == threshold) return plan{predict(best()), margin()};
    return plan{static_cast<double>(threshold), unknown_margin};
  }

  // A call found `now` where the previous one had found `previous` (0: it started cold or was restored).
  COMMSGD_HOST_DEVICE void record(float previous, float now) {
    if (previous <= 0.0f || previous != last || now <= 0.0f) {
      *this = warm_tracker{};
      last = now;
      return;
    }
    for (int w = 0; w < 2; ++w) {
      error[w][1] = error[w][0];
      error[w][0] = std::fabs(static_cast<double>(now) / predict(w) - 1.0);
    }
    before = last;
    last = now;
  }
};

// The key a warm search starts collecting or counting from: `guess` lowered by `margin` (0 when that is not
// above 0).
COMMSGD_HOST_DEVICE inline std::uint32_t warm_floor_key(double guess, double margin) {
  const float v = static_cast<float>(guess * (1.0 - margin));
  if (!(v > 0.0f)) return 0u;
  const std::uint32_t key = magnitude_key(v);
  return key < infinite_key ? key : infinite_key;
}

// After a miss below the floor the band widens geometrically around the prediction: a margin eight times as
// wide and at least a half (an octave); after a second miss, everything below.
COMMSGD_HOST_DEVICE inline double warm_widened_margin(double margin) {
  const double m = 8.0 * margin;
  return m < 0.5 ? 0.5 : m;
}

} // namespace commsgd::inline v1::select
