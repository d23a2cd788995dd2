// Passes over memory shared by the host selectors: counting, windowed histograms, candidate collection,
// the exact finish among candidates and the optional thread split. Speed is decided by how many times the
// input is read, so every pass here reads it once and touches little else.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/laplace_math.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/select/validate.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <thread>
#include <vector>

namespace commsgd::inline v1::select {

// Thread use of the host passes. Threads pay off only when a pass is long enough to amortise their start.
struct parallel_options {
  unsigned threads = 0;                              // 0: hardware_concurrency, capped at max_threads
  std::size_t min_parallel_n = std::size_t{1} << 20; // below this every pass runs on the calling thread
};

namespace detail {

inline constexpr unsigned max_threads = 8;
// One cache line of floats: the unit in which passes decide whether anything interesting is present.
inline constexpr std::size_t block = 16;

inline std::uint32_t key_at(const float* p) noexcept {
  return magnitude_key(*p);
}

// Whether some key of the block is >= lo. The OR of (lo - 1 - key) has its sign bit set exactly then, and
// the loop is plain integer arithmetic, so it vectorises without intrinsics.
inline bool block_reaches(const float* p, std::uint32_t lo) noexcept {
  std::uint32_t acc = 0;
  const std::uint32_t lim = lo - 1u;
  for (std::size_t j = 0; j < block; ++j)
    acc |= lim - key_at(p + j);
  return lo == 0 || (acc & 0x80000000u) != 0;
}

inline unsigned thread_count(std::size_t n, const parallel_options& opt) {
  if (n < opt.min_parallel_n) return 1;
  unsigned t = opt.threads;
  if (t == 0) {
    t = std::thread::hardware_concurrency();
    t = t == 0 ? 1 : std::min(t, max_threads);
  }
  const std::size_t most = std::max<std::size_t>(1, n / (std::size_t{1} << 16));
  return static_cast<unsigned>(std::min<std::size_t>(t, most));
}

// Calls f(begin, end, chunk) on `chunks` block-aligned pieces of [0, n), chunk 0 on the calling thread.
template <class F>
void for_chunks(std::size_t n, unsigned chunks, F&& f) {
  if (chunks <= 1) {
    f(std::size_t{0}, n, 0u);
    return;
  }
  const std::size_t per = ((n / chunks) + block - 1) / block * block;
  std::vector<std::exception_ptr> errors(chunks);
  std::vector<std::thread> pool;
  pool.reserve(chunks - 1);
  auto run = [&](unsigned c) {
    const std::size_t b = std::min(n, per * c);
    const std::size_t e = c + 1 == chunks ? n : std::min(n, per * (c + 1));
    try {
      f(b, e, c);
    } catch (...) {
      errors[c] = std::current_exception();
    }
  };
  for (unsigned c = 1; c < chunks; ++c)
    pool.emplace_back(run, c);
  run(0);
  for (auto& t : pool)
    t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

struct key_counts {
  std::size_t greater = 0;    // #{key > t}
  std::size_t equal = 0;      // #{key == t}
  std::size_t non_finite = 0; // #{key >= infinite_key}, counted on the way so nothing else reads x for it
};

// Counts keys above and at t in one vectorised pass.
inline key_counts count_keys(std::span<const float> x, std::uint32_t t, const parallel_options& opt) {
  const unsigned chunks = thread_count(x.size(), opt);
  std::vector<key_counts> part(chunks);
  for_chunks(x.size(), chunks, [&](std::size_t b, std::size_t e, unsigned c) {
    const float* p = x.data();
    key_counts r;
    std::size_t i = b;
    while (i < e) {
      const std::size_t end = e - i > 4096 ? i + 4096 : e;
      std::uint32_t gt = 0, eq = 0, bad = 0;
      for (; i < end; ++i) {
        const std::uint32_t key = key_at(p + i);
        gt += key > t;
        eq += key == t;
        bad += key >= infinite_key;
      }
      r.greater += gt;
      r.equal += eq;
      r.non_finite += bad;
    }
    part[c] = r;
  });
  key_counts r;
  for (auto& p : part) {
    r.greater += p.greater;
    r.equal += p.equal;
    r.non_finite += p.non_finite;
  }
  return r;
}

// Counts of a window histogram, as suffix counts at the bucket edges.
struct window_counts {
  key_window window;
  std::vector<std::size_t> at_least; // [i]: #{key >= bucket_edge(window, i)}, i in 1..buckets + 1
  std::vector<std::size_t> on_edge;  // [i]: #{key == bucket_edge(window, i)}, i in 1..buckets
  std::size_t non_finite = 0;
};

// One pass: histogram of the keys at or above the window base. Blocks whose keys all lie below the base are
// skipped after a vectorised test, so a window set near the answer costs little more than reading x.
inline window_counts histogram(std::span<const float> x, key_window w, const parallel_options& opt) {
  const std::uint32_t slots = w.buckets + 2;
  const unsigned chunks = thread_count(x.size(), opt);
  std::vector<std::size_t> hist(static_cast<std::size_t>(chunks) * slots * 2, 0u);
  std::vector<std::size_t> bad(chunks, 0);
  for_chunks(x.size(), chunks, [&](std::size_t b, std::size_t e, unsigned c) {
    std::size_t* h = hist.data() + static_cast<std::size_t>(c) * slots * 2;
    std::size_t* edge = h + slots;
    const float* p = x.data();
    const key_window win = w;
    const std::uint32_t base = win.base;
    std::size_t nb = 0;
    // Keeps the counters in registers: a lambda capturing them by reference made the compiler spill them.
    auto span_of = [h, edge, win, base](const float* q, std::size_t len, std::size_t& bad_count) {
      std::size_t local_bad = 0;
      for (std::size_t j = 0; j < len; ++j) {
        const std::uint32_t key = key_at(q + j);
        if (key < base) continue;
        const std::uint32_t i = window_bucket(key, win);
        ++h[i];
        edge[i] += on_bucket_edge(key, win);
        local_bad += key >= infinite_key;
      }
      bad_count += local_bad;
    };
    std::size_t i = b;
    for (; i + block <= e; i += block)
      if (block_reaches(p + i, base)) span_of(p + i, block, nb);
    span_of(p + i, e - i, nb);
    bad[c] = nb;
  });
  window_counts r;
  r.window = w;
  r.at_least.assign(slots, 0);
  r.on_edge.assign(slots, 0);
  for (unsigned c = 0; c < chunks; ++c) {
    const std::size_t* h = hist.data() + static_cast<std::size_t>(c) * slots * 2;
    for (std::uint32_t i = 1; i < slots; ++i) {
      r.at_least[i] += h[i];
      r.on_edge[i] += h[slots + i];
    }
    r.non_finite += bad[c];
  }
  for (std::uint32_t i = slots - 1; i-- > 1;)
    r.at_least[i] += r.at_least[i + 1];
  return r;
}

// One pass: the keys in [lo, hi), in no particular order (only their values matter to a threshold).
// A non-finite key is never collected (hi <= infinite_key) but is counted into *non_finite when given.
inline std::vector<std::uint32_t> collect_keys(std::span<const float> x, std::uint32_t lo, std::uint32_t hi,
                                               const parallel_options& opt, std::size_t expect = 0,
                                               std::size_t* non_finite = nullptr) {
  const unsigned chunks = thread_count(x.size(), opt);
  std::vector<std::vector<std::uint32_t>> part(chunks);
  std::vector<std::size_t> bad(chunks, 0);
  for_chunks(x.size(), chunks, [&](std::size_t b, std::size_t e, unsigned c) {
    auto& out = part[c];
    out.reserve(expect / chunks + 16);
    const float* p = x.data();
    std::size_t nb = 0;
    auto one = [&](std::uint32_t key) {
      if (key >= lo && key < hi) out.push_back(key);
      nb += key >= infinite_key;
    };
    std::size_t i = b;
    for (; i + block <= e; i += block) {
      if (!block_reaches(p + i, lo)) continue;
      for (std::size_t j = 0; j < block; ++j)
        one(key_at(p + i + j));
    }
    for (; i < e; ++i)
      one(key_at(p + i));
    bad[c] = nb;
  });
  if (non_finite != nullptr) {
    *non_finite = 0;
    for (std::size_t v : bad)
      *non_finite += v;
  }
  if (chunks == 1) return std::move(part[0]);
  std::size_t total = 0;
  for (auto& v : part)
    total += v.size();
  std::vector<std::uint32_t> all;
  all.reserve(total);
  for (auto& v : part)
    all.insert(all.end(), v.begin(), v.end());
  return all;
}

// Result of an exact finish: the r-th largest key and the exact split of the keys around it.
struct finish {
  std::uint32_t key = 0;
  std::size_t above = 0; // #{key > result}
  std::size_t equal = 0; // #{key == result}
};

// Digit-by-digit radix select on a candidate buffer (reordered and overwritten): the r-th largest key,
// 1 <= r <= keys.size(), with how many candidates lie above it and how many equal it.
inline finish radix_select_keys(std::span<std::uint32_t> keys, std::size_t r) {
  std::size_t n = keys.size();
  finish f;
  // 31-bit keys in digits of 11, 11 and 9 bits, most significant first.
  constexpr int shifts[3] = {20, 9, 0};
  constexpr std::uint32_t widths[3] = {11, 11, 9};
  std::vector<std::size_t> hist(2048);
  for (int d = 0; d < 3; ++d) {
    const int s = shifts[d];
    const std::uint32_t mask = (1u << widths[d]) - 1u;
    std::fill(hist.begin(), hist.end(), std::size_t{0});
    for (std::size_t i = 0; i < n; ++i)
      ++hist[(keys[i] >> s) & mask];
    std::uint32_t digit = mask;
    for (; hist[digit] < r; --digit) {
      r -= hist[digit];
      f.above += hist[digit];
    }
    f.key |= digit << s;
    if (d == 2) {
      f.equal = hist[digit];
      break;
    }
    // Keep only the keys whose digit matched, so the next digit reads fewer.
    std::size_t m = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t k = keys[i];
      keys[m] = k;
      m += ((k >> s) & mask) == digit;
    }
    n = m;
  }
  return f;
}

// Exact finish: `keys` holds every key in [lo, hi), `count_hi` keys are >= hi and fewer than k; gives the
// k-th largest key and the exact split above / at it over the whole input.
inline finish finish_among(std::vector<std::uint32_t>& keys, std::size_t count_hi, std::size_t k) {
  finish f = radix_select_keys(keys, k - count_hi);
  f.above += count_hi;
  return f;
}

inline threshold exact_result(std::uint32_t key, std::size_t above, std::size_t k) {
  return threshold{key_magnitude(key), above, k - above};
}

// The result for k == n: everything is selected, the threshold is the smallest magnitude.
inline threshold all_result(std::span<const float> x) {
  std::uint32_t lo = 0xffffffffu;
  for (const float v : x)
    lo = std::min(lo, magnitude_key(v));
  std::size_t at = 0;
  for (const float v : x)
    at += magnitude_key(v) == lo;
  return threshold{key_magnitude(lo), x.size() - at, at};
}

// The k == 0 and k == n answers shared by the methods that take them before any pass of their own: after
// checking x, nothing (threshold +inf) or everything (all_result). Empty otherwise.
inline std::optional<threshold> trivial_result(std::span<const float> x, std::size_t k) {
  if (k != 0 && k != x.size()) return std::nullopt;
  check_finite(x);
  return k == 0 ? threshold{} : all_result(x);
}

} // namespace detail
} // namespace commsgd::inline v1::select

namespace commsgd::inline v1::select::detail {

// One pass: every key in [lo, hi) that can be among the r largest keys of that range (r >= 1), in no
// particular order, into out. Each chunk starts with floor lo and, whenever it holds more than `cap` keys,
// raises its floor to the r-th largest key it holds and drops the keys below. A chunk's r-th largest is at
// most the r-th largest of the whole range, so nothing that the answer needs is dropped, and blocks below
// the raised floor are skipped by the vectorised test: the pass costs one read of x plus work in
// proportion to the keys that reach the floor. When the range holds fewer than r keys no floor rises and
// out holds all of them. Keys >= hi are skipped (hi = 0x80000000 takes every key, non-finite ones too).
// bufs is scratch reused across calls, one buffer per chunk.
inline void collect_top(std::span<const float> x, std::uint32_t lo, std::uint32_t hi, std::size_t r,
                        std::size_t cap, const parallel_options& opt,
                        std::vector<std::vector<std::uint32_t>>& bufs, std::vector<std::uint32_t>& out) {
  const unsigned chunks = thread_count(x.size(), opt);
  if (bufs.size() < chunks) bufs.resize(chunks);
  cap = std::max(cap, 2 * r + block);
  std::vector<std::size_t> held(chunks, 0);
  for_chunks(x.size(), chunks, [&](std::size_t b, std::size_t e, unsigned c) {
    std::vector<std::uint32_t>& buf = bufs[c];
    std::vector<std::uint32_t> pick;
    std::size_t limit = cap;
    if (buf.size() < std::min(limit, e - b) + block) buf.resize(std::min(limit, e - b) + block);
    std::uint32_t* q = buf.data();
    std::uint32_t floor = lo;
    std::size_t m = 0;
    const float* p = x.data();
    // Raises the floor to the r-th largest key held; ties at it are all kept.
    auto tighten = [&] {
      pick.assign(q, q + m);
      floor = std::max(floor, radix_select_keys(pick, r).key);
      std::size_t kept = 0;
      for (std::size_t j = 0; j < m; ++j) {
        q[kept] = q[j];
        kept += q[j] >= floor;
      }
      m = kept;
      // Many ties at the floor keep the buffer full: give it room rather than tighten every block.
      if (m > limit / 2) {
        limit *= 2;
        buf.resize(limit + block);
        q = buf.data();
      }
    };
    std::size_t i = b;
    for (; i + block <= e; i += block) {
      if (!block_reaches(p + i, floor)) continue;
      for (std::size_t j = 0; j < block; ++j) {
        const std::uint32_t key = key_at(p + i + j);
        q[m] = key;
        m += key >= floor && key < hi;
      }
      if (m > limit) tighten();
    }
    for (; i < e; ++i) {
      const std::uint32_t key = key_at(p + i);
      q[m] = key;
      m += key >= floor && key < hi;
    }
    held[c] = m;
  });
  out.clear();
  std::size_t total = 0;
  for (unsigned c = 0; c < chunks; ++c)
    total += held[c];
  out.reserve(total);
  for (unsigned c = 0; c < chunks; ++c)
    out.insert(out.end(), bufs[c].begin(), bufs[c].begin() + static_cast<std::ptrdiff_t>(held[c]));
}

} // namespace commsgd::inline v1::select::detail
