// select::chunked: the exact top-k of every chunk of a vector in one call, for the top-k codes that cut a
// pseudo-gradient into many small chunks (SparseLoCo's shape: chunks of 4,096, tens of values each).
//
// Why: a chunk of 4,096 floats is 16 KB, one read of it about a microsecond. A general selector pays more than
// that in fixed work on every call (its prediction, its scratch buffers, a radix finish over 2,048 buckets),
// and the caller then reads the chunk again to compact the selection. Here one pass over a chunk does both:
//   floor     the chunk's own warm start (select/laplace_math.hpp's warm_tracker, the rule laplace_bisect
//             uses): its last threshold, or the last move repeated, lowered by a margin from the recent errors
//   collect   one pass writes (key, index) of every entry whose |x| reaches the floor, in index order: with
//             AVX2 (select/collect_x86.hpp, chosen at run time) 8 compares and a table-driven compaction at a
//             time; else a mask of 64 entries from vectorised compares (SSE2's movemask on x86-64, a plain
//             loop elsewhere), then one write a set bit. The pass is a read of the chunk plus work for the
//             few entries near the top
//   finish    the k-th largest key among those (AVX2: a bisection over counts of the held keys, 8 a probe,
//             until at most 8 remain in its bracket; else a histogram of 256 buckets over their range, then
//             nth_element in the one bucket that holds it), and the selection written from the candidates in
//             index order, branch-free: every key above it and the first ties, lowest index first
//   miss      fewer than k reached the floor (the threshold fell past the margin): the floor is lowered to 4,
//             16, then 64 margins below the guess, then to 0, and the chunk (in cache) read again; a cold chunk
//             (no threshold yet, or 0 last time) collects everything once
// The result is the exact set (ties to the lowest index), the same as select::exact gives, whatever the
// warm start predicted: a prediction only decides how many entries are collected.
//
// A chunk longer than options.small (default 65,536) goes to its own laplace_bisect, trimmed and
// warm-started: its sampling and threads pay there, and a whole-vector candidate buffer would not.
// As a `selector`, select(x, k) treats x as one chunk (chunk 0's warm start).
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/collect_x86.hpp>
#include <commsgd/select/compact.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/select/laplace_math.hpp>
#include <commsgd/select/scan.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/select/validate.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace commsgd::inline v1::select {

class chunked {
public:
  static constexpr bool is_exact = true;
  static constexpr const char* name = "chunked";

  struct options {
    // Chunks of at most this many values are selected here; longer ones by laplace_bisect (trim, warm).
    std::size_t small = std::size_t{1} << 16;
    bool warm_start = true;
    // The AVX2 passes where the CPU has them (the same result; false: the portable loops, which tests compare).
    bool vector = true;
  };

  chunked() = default;
  explicit chunked(options o) : opt_(o), avx2_(takes_avx2(o)) {
    check_range("options.small", static_cast<double>(o.small), 1.0,
                static_cast<double>(std::numeric_limits<std::uint32_t>::max()), "[1, 2^32 - 1]");
  }

  // Chunk j of x is x[j size, min((j + 1) size, x.size())), and k_of(j) <= its length values are taken from
  // it: their indices relative to the chunk, rising, into idx and x at them into val, chunk after chunk.
  // idx and val must hold the sum of every k_of(j). size 0 means one chunk of all x. x must be finite
  // (commsgd::non_finite otherwise; a chunk's warm start moves only with its own successful selection, and
  // what was written before the refusal is not a result). Returns the values written.
  template <class K>
  std::size_t select_chunks(std::span<const float> x, std::size_t size, K&& k_of,
                            std::span<std::uint32_t> idx, std::span<float> val) {
    const std::size_t count = chunk_count(x.size(), size);
    return select_chunk_range(x, size, std::forward<K>(k_of), 0, count, idx, val);
  }

  // select_chunks for chunks [j0, j1) of x alone, their selections into idx and val (which hold those chunks'
  // k). A caller that forms x a stretch at a time selects each chunk once it is whole, while it is still in
  // cache, and gets select_chunks' result over its calls. last_passes() and last_held() count from the last
  // call that started at chunk 0.
  template <class K>
  std::size_t select_chunk_range(std::span<const float> x, std::size_t size, K&& k_of, std::size_t j0,
                                 std::size_t j1, std::span<std::uint32_t> idx, std::span<float> val) {
    const std::size_t count = chunk_count(x.size(), size);
    if (size == 0) size = std::max<std::size_t>(x.size(), 1);
    if (j0 > j1 || j1 > count)
      throw invalid_argument(commsgd::concat("chunked: the chunk range [", j0, ", ", j1,
                                             ") is outside the allowed range: within [0, ", count, "]"));
    std::size_t total = 0;
    for (std::size_t j = j0; j < j1; ++j)
      total += checked_k(std::invoke(k_of, j), std::min(size, x.size() - j * size), j);
    if (idx.size() != total || val.size() != total)
      throw size_mismatch(commsgd::concat("chunked: idx.size() = ", idx.size(), " and val.size() = ",
                                          val.size(), " must both equal the chunks' total k ", total));
    if (chunks_.size() < count) chunks_.resize(count);
    if (j0 == 0) {
      passes_ = 0;
      held_total_ = 0;
    }
    std::size_t at = 0;
    for (std::size_t j = j0; j < j1; ++j) {
      const std::size_t b = j * size, len = std::min(size, x.size() - b);
      const std::size_t k = std::invoke(k_of, j);
      one(x.subspan(b, len), k, chunks_[j], idx.data() + at, val.data() + at, x);
      at += k;
    }
    return total;
  }

  threshold select(std::span<const float> x, std::size_t k) {
    check_k(k, x.size());
    if (chunks_.empty()) chunks_.resize(1);
    passes_ = 0;
    held_total_ = 0;
    return one(x, k, chunks_[0], nullptr, nullptr, x);
  }

  // Passes over the chunks made by the last call, summed over its chunks (a miss costs one more).
  unsigned last_passes() const noexcept { return passes_; }
  // Candidates the last call's passes collected, summed over its chunks (what a warm start saves: a cold
  // chunk collects all of its values).
  std::size_t last_held() const noexcept { return held_total_; }
  // Forget every chunk's warm start (a warm start never changes the set, so it is not saved with a model).
  void reset() noexcept { chunks_.clear(); }

private:
  struct chunk_state {
    float threshold = 0.0f; // 0: no previous threshold, the next call collects the whole chunk
    warm_tracker track{};
    std::optional<laplace_bisect> large; // a chunk longer than options.small
  };

  // Chunks of `size` values (0: one chunk of all) in a vector of n; refuses a size an index cannot hold.
  static std::size_t chunk_count(std::size_t n, std::size_t size) {
    if (size == 0) size = std::max<std::size_t>(n, 1);
    if (size > std::numeric_limits<std::uint32_t>::max())
      throw invalid_argument(commsgd::concat("chunked: argument 'size' = ", size,
                                             " is outside the allowed range [0, 2^32 - 1]"));
    return (n + size - 1) / size;
  }

  static std::size_t checked_k(std::size_t k, std::size_t len, std::size_t j) {
    if (k > len)
      throw invalid_argument(commsgd::concat("chunked: k_of(", j, ") = ", k,
                                             " is outside the allowed range [0, ", len,
                                             "] (the chunk's length)"));
    return k;
  }

  // The (index, value) pairs of a result, from a threshold that describes x (laplace_bisect's).
  static void write(std::span<const float> x, const threshold& t, std::uint32_t* idx, float* val) {
    if (idx == nullptr) return;
    const auto k = t.count();
    compact<std::uint32_t>(x, t, std::span<std::uint32_t>(idx, k), std::span<float>(val, k));
  }

  // One chunk x of `all`; a non-finite value is reported with its index in `all`.
  threshold one(std::span<const float> x, std::size_t k, chunk_state& s, std::uint32_t* idx, float* val,
                std::span<const float> all) {
    if (x.size() > opt_.small) {
      if (!s.large) {
        laplace_bisect::options o;
        o.trim = true;
        o.warm_start = opt_.warm_start;
        s.large.emplace(o);
      }
      threshold t;
      try {
        t = s.large->select(x, k);
      } catch (const non_finite&) {
        check_finite(all);
        throw;
      }
      passes_ += s.large->last_passes();
      write(x, t, idx, val);
      return t;
    }
    if (k == 0 || k == x.size()) {
      // The chunk is read for NaN and inf (the whole input only to name a bad one), then taken whole or not at
      // all: detail::trivial_result would read the chunk a second time.
      if (count_non_finite(x) != 0) check_finite(all);
      ++passes_;
      const threshold t = k == 0 ? threshold{} : detail::all_result(x);
      write(x, t, idx, val);
      return t;
    }
    const bool warm = opt_.warm_start && s.threshold > 0.0f;
    const warm_tracker::plan p = warm ? s.track.next(s.threshold) : warm_tracker::plan{0.0, 0.0};
    // laplace_bisect's margins, measured best here too (half or twice them cost more on DiLoCo's rounds).
    const double margin = p.margin;
    std::uint32_t lo = warm ? warm_floor_key(p.guess, margin) : 0u;
    for (unsigned miss = 0;; ++miss) {
      const std::size_t c = collect(x, lo);
      ++passes_;
      if (c > 0 && top_ >= infinite_key) check_finite(all); // NaN and inf reach every floor
      if (c >= k) break;
      // Lower the floor 4, then 16, then 64 times the margin below the guess (a re-read of a chunk in cache is
      // cheap, a floor far too low fills the candidates), then to 0.
      lo = miss < 3 && warm
               ? std::min(lo - 1u, warm_floor_key(p.guess, std::min(0.9, margin * (4 << (2 * miss)))))
               : 0u;
    }
    const threshold t = finish(k, idx, val, x.data());
    if (opt_.warm_start) {
      s.track.record(s.threshold, t.value);
      s.threshold = t.value;
    }
    return t;
  }

  // Bit j set when the key of p[j] reaches lo, for a block of 16. With SSE2 (every x86-64) four compares whose
  // lanes are packed to bytes for one movemask: the portable loop below does not vectorise, and at 4 ops a value
  // it cost half the call; a movemask a compare cost a third more than the packs.
  static std::uint32_t reach_mask(const float* p, std::uint32_t lo) noexcept {
#if defined(__SSE2__)
    // Keys are below 2^31, so a signed compare with lo - 1 (-1 when lo is 0) is key >= lo; its all-ones or
    // zero lanes stay so through the saturating packs.
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
    const __m128i below = _mm_set1_epi32(static_cast<std::int32_t>(lo - 1u));
    const auto hit = [&](unsigned q) {
      const __m128i key =
          _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * q)), magnitude);
      return _mm_cmpgt_epi32(key, below);
    };
    const __m128i bytes = _mm_packs_epi16(_mm_packs_epi32(hit(0), hit(1)), _mm_packs_epi32(hit(2), hit(3)));
    return static_cast<std::uint32_t>(_mm_movemask_epi8(bytes));
#else
    std::uint32_t m = 0;
    for (unsigned j = 0; j < detail::block; ++j)
      m |= static_cast<std::uint32_t>(detail::key_at(p + j) >= lo) << j;
    return m;
#endif
  }

  // Every (key, index) with key >= lo, rising, into key_ and at_; returns how many.
  std::size_t collect(std::span<const float> x, std::uint32_t lo) {
    const std::size_t n = x.size();
    if (key_.size() < n + detail::block) {
      key_.resize(n + detail::block);
      at_.resize(n + detail::block);
    }
    std::uint32_t* kq = key_.data();
    std::uint32_t* iq = at_.data();
    std::size_t c = 0;
    std::uint32_t top = lo;
#if COMMSGD_X86_DISPATCH
    if (avx2_) {
      const std::size_t whole = n / 8 * 8;
      c = detail::collect_avx2(x.data(), whole, lo, kq, iq, top);
      return collect_tail(x, lo, whole, c, top);
    }
#endif
    // First a mask of the entries of each 64 that reach lo, for the whole chunk: a streaming read with no
    // branch, which the hardware keeps ahead of; then, from cache, one write a set bit. Done in one loop, each
    // group's mispredicted exit stalled the read.
    constexpr std::size_t group = 4 * detail::block;
    const std::size_t blocks = n / detail::block, groups = (blocks + 3) / 4;
    masks_.resize(groups);
    for (std::size_t g = 0; g < groups; ++g) {
      std::uint64_t m = 0;
      const std::size_t here = std::min<std::size_t>(4, blocks - 4 * g); // the last group may hold fewer
      for (unsigned q = 0; q < here; ++q)
        m |= static_cast<std::uint64_t>(reach_mask(x.data() + g * group + q * detail::block, lo))
             << (q * detail::block);
      masks_[g] = m;
    }
    for (std::size_t g = 0; g < groups; ++g) {
      std::uint64_t m = masks_[g];
      while (m != 0) {
        const std::size_t j = g * group + static_cast<unsigned>(std::countr_zero(m));
        m &= m - 1;
        const std::uint32_t key = detail::key_at(x.data() + j);
        top = std::max(top, key);
        kq[c] = key;
        iq[c] = static_cast<std::uint32_t>(j);
        ++c;
      }
    }
    return collect_tail(x, lo, blocks * detail::block, c, top);
  }

  // collect's last values from i, after c candidates with the largest key top.
  std::size_t collect_tail(std::span<const float> x, std::uint32_t lo, std::size_t i, std::size_t c,
                           std::uint32_t top) {
    const std::size_t n = x.size();
    std::uint32_t* kq = key_.data();
    std::uint32_t* iq = at_.data();
    for (; i < n; ++i) {
      const std::uint32_t key = detail::key_at(x.data() + i);
      kq[c] = key;
      iq[c] = static_cast<std::uint32_t>(i);
      if (key < lo) continue;
      top = std::max(top, key);
      ++c;
    }
    held_ = c;
    floor_ = lo;
    top_ = top;
    held_total_ += c;
    return c;
  }

  // The k-th largest of the held keys (k <= held), and the selection written from them in index order.
  threshold finish(std::size_t k, std::uint32_t* idx, float* val, const float* x) {
    const auto [tk, above, tied] = kth_largest(k);
    const threshold t{key_magnitude(tk), above, k - above};
#if COMMSGD_X86_DISPATCH
    // Every held tie taken (the usual case: one): the selection is every held key >= tk.
    if (idx != nullptr && tied == t.at && avx2_) {
      detail::keep_from_avx2(key_.data(), at_.data(), held_, tk);
      for (std::size_t q = 0; q < k; ++q) {
        idx[q] = at_[q];
        val[q] = x[at_[q]];
      }
      return t;
    }
#endif
    if (idx != nullptr) {
      // Branch-free (which held key is taken is data, not a pattern): each one written over the next slot, the
      // count moved only for those taken; at_ is overwritten in place, never ahead of what it reads.
      std::size_t out = 0, ties = 0;
      for (std::size_t i = 0; i < held_; ++i) {
        const std::uint32_t key = key_[i];
        const std::size_t tie = key == tk;
        const std::size_t take =
            static_cast<std::size_t>(key > tk) | (tie & static_cast<std::size_t>(ties < t.at));
        ties += tie;
        at_[out] = at_[i];
        out += take;
      }
      for (std::size_t q = 0; q < k; ++q) {
        idx[q] = at_[q];
        val[q] = x[at_[q]];
      }
    }
    return t;
  }

  // The k-th largest held key, 1 <= k <= held, how many held keys lie above it and how many equal it. The
  // portable loops: a histogram of 256 buckets over [floor_, top_] finds the bucket it lies in, and
  // nth_element the key among that bucket's few (a sort's branches, mispredicted about half the time, cost
  // more than two plain passes over the hundreds of keys a chunk holds). Counting the buckets while
  // collecting was slower: the increments wait on each other.
  struct kth {
    std::uint32_t key;
    std::size_t above, tied;
  };
  kth kth_largest(std::size_t k) {
    const std::size_t c = held_;
#if COMMSGD_X86_DISPATCH
    if (avx2_) {
      // The largest t in [floor_, top_] that k held keys reach, by bisection: each probe a count of the
      // held keys in 8 lanes, no scatter into a histogram whose increments wait on each other. It stops
      // once at most 8 held keys lie in [a, b] (ca of them reach a, cb reach b + 1): those are then taken
      // out and the k-th found among them.
      std::fill_n(key_.data() + c, 16, 0u);
      std::uint32_t a = floor_, b = top_;
      std::size_t ca = c, cb = 0;
      while (a < b && ca - cb > 8) {
        const std::uint32_t mid = a + (b - a + 1) / 2;
        const std::size_t cm = detail::count_from_avx2(key_.data(), c, mid); // mid > a >= 0
        if (cm >= k) {
          a = mid;
          ca = cm;
        } else {
          b = mid - 1;
          cb = cm;
        }
      }
      if (a == b) return {a, cb, ca - cb};
      std::uint32_t few[9];
      std::size_t m = 0;
      for (std::size_t i = 0; i < c; ++i) { // branch-free: at most 8 are kept, each over the next slot
        few[m] = key_[i];
        m += key_[i] - a <= b - a;
      }
      std::sort(few, few + m, std::greater<>());
      const std::uint32_t tk = few[k - cb - 1];
      std::size_t above = cb, tied = 0;
      for (std::size_t q = 0; q < m; ++q) {
        above += few[q] > tk;
        tied += few[q] == tk;
      }
      return {tk, above, tied};
    }
#endif
    const std::uint32_t lo = floor_, span = top_ - floor_;
    unsigned shift = 0;
    while ((span >> shift) >= 256u)
      ++shift;
    std::uint32_t hist[256] = {};
    for (std::size_t i = 0; i < c; ++i)
      ++hist[(key_[i] - lo) >> shift];
    std::size_t b = span >> shift, above = 0;
    while (above + hist[b] < k)
      above += hist[b--];
    if (shift == 0) return {lo + static_cast<std::uint32_t>(b), above, hist[b]};
    sort_.resize(hist[b] + 1);
    std::size_t m = 0;
    for (std::size_t i = 0; i < c; ++i) {
      sort_[m] = key_[i];
      m += ((key_[i] - lo) >> shift) == b;
    }
    const auto nth = sort_.begin() + static_cast<std::ptrdiff_t>(k - above - 1);
    std::nth_element(sort_.begin(), nth, sort_.begin() + static_cast<std::ptrdiff_t>(m), std::greater<>());
    const std::uint32_t tk = *nth;
    std::size_t tied = 0;
    for (std::size_t q = 0; q < m; ++q) {
      above += sort_[q] > tk; // only those nth_element left before nth can be
      tied += sort_[q] == tk;
    }
    return {tk, above, tied};
  }

  // Whether this object takes the AVX2 passes: asked once, not on every chunk.
  static bool takes_avx2(const options& o) noexcept {
    return o.vector && cpu().avx2 && cpu().popcnt;
  }

  options opt_{};
  bool avx2_ = takes_avx2(opt_);
  std::vector<chunk_state> chunks_;
  std::vector<std::uint32_t> key_, at_, sort_; // the held candidates of one chunk
  std::vector<std::uint64_t> masks_;           // which of each 64 values of a chunk reach the floor
  std::size_t held_ = 0, held_total_ = 0;
  std::uint32_t floor_ = 0, top_ = 0; // the held keys lie in [floor_, top_]
  unsigned passes_ = 0;
};

static_assert(selector<chunked>);

} // namespace commsgd::inline v1::select
