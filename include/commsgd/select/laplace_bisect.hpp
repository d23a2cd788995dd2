// laplace_bisect: estimate the threshold from a Laplace fit, then correct it on the true counts.
//
// Cold start: t0 = b ln(N / k) with b = mean |x - mu| (mu = 0, or a median estimate). Real gradients are
// heavier-tailed than Laplace, so instead of bisecting one threshold per pass, each pass counts 512
// candidate thresholds at once (a histogram of magnitude keys in a window that brackets t0 wide) and keeps
// the tightest bracket [L, H) around the k-th largest key. Usually one histogram pass either lands within
// tolerance or leaves a bracket small enough to collect and finish exactly in a second pass.
//
// Warm start (the previous call's threshold t is known): in training the selector sees p = g + e, and the
// error-feedback residuals e grow until they cross t, so mass piles up just below it and the threshold
// drifts by a few per cent per step, often steadily. The next threshold is predicted (no move, or the
// last move repeated, whichever erred less lately) and one pass collects every key at or above a floor a
// margin below the prediction, the margin sized from the recent prediction errors; the floor rises on the
// way whenever the held keys pass about 2k (detail::collect_top), and the exact k-th largest of what it
// holds finishes the call. On a large x the cold call's scale sample is counted above the floor first;
// where it says the floor is far off either way, the cold call's bound replaces it, so a state that no
// longer fits costs what a cold call costs. A threshold above the floor never misses. One below it widens the
// band geometrically: a margin eight times as wide and at least a half, then everything below, each pass
// collecting only the new band while the keys already held count as above it; so at most 3 passes, and
// 2 for a fall of up to a half.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/laplace_math.hpp>
#include <commsgd/select/scan.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/select/validate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace commsgd::inline v1::select {

class laplace_bisect {
public:
  static constexpr bool is_exact = false; // not for every options: see exact()
  static constexpr const char* name = "laplace_bisect";

  enum class location {
    zero,          // mu = 0: the usual choice for gradients, and free
    sample_median, // mu = median of the scale sample
  };

  struct options {
    double tol = 0.01; // count lands in [k, ceil((1 + tol) k)]
    bool trim = false; // select exactly k (ties at the threshold to the lowest indices)
    location center = location::zero;
    bool warm_start = true;
    // b from this many entries, taken as 64 evenly spread contiguous pieces (gradients are laid out layer by
    // layer, so pieces from everywhere see every scale); 0 or a small x: b from a full pass.
    std::size_t scale_sample = std::size_t{1} << 16;
    // A bracket holding at most max(collect_limit, k) keys is finished by collecting it rather than by
    // another histogram pass.
    std::size_t collect_limit = std::size_t{1} << 16;
    parallel_options parallel{};
  };

  // What a warm start carries from one call to the next; save and restore it with the training state.
  struct state {
    float threshold = 0.0f; // 0: no previous threshold, the next call starts cold
    friend bool operator==(const state&, const state&) = default;
  };

  laplace_bisect() = default;
  explicit laplace_bisect(options opt) : opt_(opt) { check_tolerance(opt.tol); }

  // With trim every call selects exactly k.
  bool exact() const noexcept { return opt_.trim; }

  // A call that raised (non-finite input, ties beyond the tolerance) left it as it was.
  state saved_state() const noexcept { return state_; }
  void restore(state s) {
    if (!(s.threshold >= 0.0f) || magnitude_key(s.threshold) >= infinite_key)
      throw invalid_argument(commsgd::concat("laplace_bisect state threshold = ", s.threshold,
                                             " is outside the allowed range [0, +inf)"));
    state_ = s;
    track_ = tracker{};
  }
  void reset() noexcept {
    state_ = state{};
    track_ = tracker{};
  }

  // Passes over x made by the last call (the scale sample counts as none): what warm start saves.
  unsigned last_passes() const noexcept { return passes_; }
  // The Laplace estimate t0 of the last cold call (0 after a warm one).
  float last_estimate() const noexcept { return estimate_; }

  threshold select(std::span<const float> x, std::size_t k) {
    check_k(k, x.size());
    passes_ = 0;
    estimate_ = 0.0f;
    if (const auto trivial = detail::trivial_result(x, k)) {
      passes_ = 1;
      return *trivial;
    }
    const threshold r = search(x, k);
    if (opt_.warm_start) {
      track_.record(state_.threshold, r.value);
      state_.threshold = r.value;
    }
    return r;
  }

private:
  static constexpr std::uint32_t buckets = 512;

  double scale(std::span<const float> x, float mu) {
    const std::size_t n = x.size();
    const std::size_t want = opt_.scale_sample;
    double sum = 0.0;
    std::size_t used = 0;
    const std::size_t pieces = 64;
    const std::size_t len = std::max<std::size_t>(want / pieces, detail::block);
    // Sampling needs 64 pieces of `len` values that fit inside x; smaller inputs are summed whole.
    if (want == 0 || n <= 4 * want || n < pieces * len) {
      const unsigned chunks = detail::thread_count(n, opt_.parallel);
      std::vector<double> part(chunks, 0.0);
      detail::for_chunks(n, chunks,
                         [&](std::size_t b, std::size_t e, unsigned c) { part[c] = abs_sum(x, b, e, mu); });
      for (double p : part)
        sum += p;
      used = n;
      scaled_whole_ = true;
    } else {
      scaled_whole_ = false;
      sample_.clear();
      for (std::size_t p = 0; p < pieces; ++p) {
        const std::size_t b = (n - len) / (pieces - 1) * p;
        sum += abs_sum(x, b, b + len, mu);
        used += len;
        for (std::size_t i = b; i < b + len; ++i)
          sample_.push_back(magnitude_key(x[i]));
      }
    }
    return sum / static_cast<double>(used);
  }

  // Sum of |x_i - mu| over [b, e): float partial sums in 16 lanes (vectorised), folded into a double every
  // 4096 entries so that round-off stays far below what a threshold estimate needs.
  static double abs_sum(std::span<const float> x, std::size_t b, std::size_t e, float mu) {
    const float* p = x.data();
    double total = 0.0;
    std::size_t i = b;
    while (e - i >= 16) {
      const std::size_t end = i + std::min<std::size_t>((e - i) / 16 * 16, 4096);
      float acc[16] = {};
      for (; i < end; i += 16)
        for (std::size_t j = 0; j < 16; ++j)
          acc[j] += std::fabs(p[i + j] - mu);
      for (float a : acc)
        total += a;
    }
    for (; i < e; ++i)
      total += std::fabs(p[i] - mu);
    return total;
  }

  float median_estimate(std::span<const float> x) const {
    const std::size_t n = x.size();
    const std::size_t want = std::max<std::size_t>(opt_.scale_sample, 1024);
    std::vector<float> s;
    if (n <= want) {
      s.assign(x.begin(), x.end());
    } else {
      const std::size_t stride = n / want;
      s.reserve(want + 1);
      for (std::size_t i = 0; i < n; i += stride)
        s.push_back(x[i]);
    }
    const auto mid = s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2);
    std::nth_element(s.begin(), mid, s.end());
    return *mid;
  }

  // The next window for a bracket [lo, hi) that the last one did not settle.
  static key_window next_window(std::uint32_t lo, std::uint32_t hi) {
    const std::uint64_t wide = std::uint64_t{buckets} << cold_window_shift;
    if (hi - lo <= wide) return window_spanning(lo, hi, buckets);
    if (hi >= infinite_key) return window_around(lo, cold_window_shift, buckets, 0);
    if (lo == 0) return window_around(hi, cold_window_shift, buckets, buckets);
    return window_spanning(lo, hi, buckets);
  }

  [[noreturn]] void refuse_ties(std::uint32_t key, std::size_t above, std::size_t equal, std::size_t k,
                                std::size_t limit) const {
    throw unsupported(commsgd::concat("laplace_bisect cannot land in [k, ceil((1 + tol) k)] = [", k, ", ",
                                      limit, "] with tol = ", opt_.tol, ": ", equal,
                                      " entries tie at |x| = ", key_magnitude(key), " with ", above,
                                      " above it; use options.trim to select exactly k, or a larger tol"));
  }

  threshold settle(std::uint32_t key, std::size_t above, std::size_t equal, std::size_t k,
                   std::size_t limit) const {
    if (opt_.trim) return detail::exact_result(key, above, k);
    if (above + equal > limit) refuse_ties(key, above, equal, k, limit);
    return threshold{key_magnitude(key), above, equal};
  }

  // The warm start's predictor and margin (select/laplace_math.hpp), kept out of the saved state: a restore
  // starts from no move and the default margin.
  using tracker = warm_tracker;

  // The scale sample of a cold call (64 pieces, a few per mille of a large x) read to check a warm floor:
  // when it puts the floor far above the threshold (a miss: a second pass) or far below it (many times the
  // keys to collect), the floor becomes the cold call's bound, the sample key with about twice the
  // expected share of k above it. So a warm call whose state is off costs what a cold call costs, and the
  // check costs a count over the sample. Inputs too small to sample, or k too small for the sample to
  // tell, keep the floor.
  std::uint32_t sample_check(std::span<const float> x, std::size_t k, std::uint32_t floor) {
    const std::size_t n = x.size();
    const std::size_t want = opt_.scale_sample, pieces = 64;
    const std::size_t len = std::max<std::size_t>(want / pieces, detail::block);
    if (want == 0 || n <= 4 * want || n < pieces * len) return floor;
    const double share = static_cast<double>(k) * static_cast<double>(pieces * len) / static_cast<double>(n);
    if (share < 16.0) return floor;
    auto start = [&](std::size_t p) { return (n - len) / (pieces - 1) * p; };
    std::size_t reach = 0;
    for (std::size_t p = 0; p < pieces; ++p) {
      const float* q = x.data() + start(p);
      std::uint32_t c = 0; // a plain count, so that it vectorises
      for (std::size_t i = 0; i < len; ++i)
        c += detail::key_at(q + i) >= floor;
      reach += c;
    }
    const std::size_t m = std::min(
        pieces * len, static_cast<std::size_t>(std::ceil(2.0 * share + 4.0 * std::sqrt(share) + 8.0)));
    const double c = static_cast<double>(reach);
    if (c >= share - 3.0 * std::sqrt(share) && c <= 1.5 * static_cast<double>(m)) return floor;
    sample_.clear();
    for (std::size_t p = 0; p < pieces; ++p)
      for (std::size_t i = start(p); i < start(p) + len; ++i)
        sample_.push_back(magnitude_key(x[i]));
    const std::uint32_t bound = detail::radix_select_keys(sample_, m).key;
    sample_.clear();
    return std::min(bound, infinite_key);
  }

  threshold warm_search(std::span<const float> x, std::size_t k, std::size_t limit) {
    // A restored state has no history: predict no move from it.
    const tracker::plan p = track_.next(state_.threshold);
    const double guess = p.guess, margin = p.margin;
    auto floor_at = [&](double m) { return warm_floor_key(guess, m); };
    std::uint32_t lo = sample_check(x, k, floor_at(margin));
    std::uint32_t hi = 0x80000000u; // every key, non-finite ones included
    std::size_t above = 0;          // keys >= hi, all above the answer
    for (unsigned miss = 0;; ++miss) {
      // Room for twice the keys still wanted: the floor rises early when far more reach it (a wide band
      // after a miss), and rarely at the usual margin.
      const std::size_t r = k - above;
      detail::collect_top(x, lo, hi, r, 2 * r + 1024, opt_.parallel, bufs_, cand_);
      ++passes_;
      if (hi == 0x80000000u && !cand_.empty() &&
          *std::max_element(cand_.begin(), cand_.end()) >= infinite_key)
        check_finite(x);
      if (cand_.size() >= r) {
        const detail::finish f = detail::finish_among(cand_, above, k);
        return settle(f.key, f.above, f.equal, k, limit);
      }
      // The answer lies below lo, and what was held is all of [lo, hi). Widen geometrically: a margin
      // eight times as wide and at least a half (an octave), then everything below; straight to everything
      // when the sample's bound already lay below that.
      above += cand_.size();
      hi = lo;
      const std::uint32_t wider = floor_at(warm_widened_margin(margin));
      lo = miss == 0 && wider < hi ? wider : 0u;
    }
  }

  threshold search(std::span<const float> x, std::size_t k) {
    const std::size_t n = x.size();
    const std::size_t limit = opt_.trim ? k : count_limit(k, opt_.tol);

    key_window w;
    if (opt_.warm_start && state_.threshold > 0.0f) {
      return warm_search(x, k, limit);
    } else {
      const float mu = opt_.center == location::sample_median ? median_estimate(x) : 0.0f;
      const double b = scale(x, mu);
      if (scaled_whole_) ++passes_;
      estimate_ = laplace_tail_threshold(static_cast<float>(b), mu, n, k);
      // b is 0 for all-zero pieces and NaN when x holds a NaN: the histogram pass sorts out both.
      w = estimate_ > 0.0f && magnitude_key(estimate_) < infinite_key
              ? cold_window(estimate_)
              : window_spanning(0, infinite_key, buckets);
      // The histogram pass costs in proportion to the entries at or above the window base. The scale sample
      // already in hand bounds the answer from below: its key with about twice the expected share of k
      // above it lies under the true threshold with near certainty, and is usually far above t0 / 2.
      if (!sample_.empty()) {
        const double share =
            static_cast<double>(k) * static_cast<double>(sample_.size()) / static_cast<double>(n);
        const std::size_t m = std::min(
            sample_.size(), static_cast<std::size_t>(std::ceil(2.0 * share + 4.0 * std::sqrt(share) + 8.0)));
        const std::uint32_t bound = detail::radix_select_keys(sample_, m).key;
        if (bound > w.base && bound < infinite_key) w = window_around(bound, cold_window_shift, buckets, 0);
        sample_.clear();
      }
    }

    // Bracket: lo is the largest key known to have at least k keys at or above it, hi the smallest known to
    // have fewer. lo_equal is #{key == lo} when a histogram edge has told us.
    std::uint32_t lo = 0, hi = infinite_key;
    std::size_t lo_count = n, hi_count = 0, lo_equal = 0;
    bool lo_equal_known = false;

    for (;;) {
      if (hi - lo == 1) return settle(lo, hi_count, lo_count - hi_count, k, limit);
      if (lo_count - hi_count <= std::max(opt_.collect_limit, k)) {
        std::size_t bad = 0;
        std::vector<std::uint32_t> cand =
            detail::collect_keys(x, lo, hi, opt_.parallel, lo_count - hi_count, &bad);
        ++passes_;
        if (bad != 0) check_finite(x);
        const detail::finish f = detail::finish_among(cand, hi_count, k);
        return settle(f.key, f.above, f.equal, k, limit);
      }

      const detail::window_counts wc = detail::histogram(x, w, opt_.parallel);
      ++passes_;
      if (wc.non_finite != 0) check_finite(x);
      for (std::uint32_t i = 1; i <= buckets + 1; ++i) {
        const std::uint32_t edge = bucket_edge(w, i);
        const std::size_t c = wc.at_least[i];
        if (c >= k) {
          if (edge >= lo) {
            lo = edge;
            lo_count = c;
            lo_equal_known = i <= buckets;
            lo_equal = lo_equal_known ? wc.on_edge[i] : 0;
          }
        } else if (edge < hi) {
          hi = edge;
          hi_count = c;
        }
      }
      if (lo_equal_known) {
        const std::size_t above = lo_count - lo_equal;
        if (!opt_.trim && lo_count <= limit) return threshold{key_magnitude(lo), above, lo_equal};
        // lo is itself the k-th largest key.
        if (above < k) return settle(lo, above, lo_equal, k, limit);
      }
      // The first miss gets a wide window beside the one that missed; after that plain narrowing, which
      // divides the bracket by the bucket count every pass.
      w = passes_ <= 1 ? next_window(lo, hi) : window_spanning(lo, hi, buckets);
    }
  }

  options opt_{};
  state state_{};
  std::vector<std::uint32_t> sample_; // keys of the scale sample, reused across calls
  bool scaled_whole_ = false;         // the last scale() read all of x (one full pass)
  unsigned passes_ = 0;
  float estimate_ = 0.0f;
  tracker track_{};
  std::vector<std::vector<std::uint32_t>> bufs_; // warm pass scratch, one per chunk
  std::vector<std::uint32_t> cand_;              // warm pass candidates
};

static_assert(selector<laplace_bisect>);

} // namespace commsgd::inline v1::select
