// Kernels of the selection engine shared by radix, laplace_bisect, hierarchical and sampled.
//
// Every method narrows the same state machine, kept in device memory: the threshold key is found from its
// high bits down (`prefix`, bits >= `det_lo` known), with `above` entries known to lie above the prefix range
// and `k_rem` still to take inside it. A pass histograms the next digit of the keys that match the prefix;
// the last block of the pass to finish picks the digit where the count crosses k. Passes read the state left
// by the previous kernel and return at once when it says `done`, so the host enqueues the worst-case number
// of passes and never waits for a count: the selection runs with no host synchronisation at all.
//
// Keys are commsgd::select::magnitude_key values: 31 significant bits, order of |x|, -0 == +0.
// Kernels are templates (`template <class = void>`) only for their linkage: headers with kernels may be
// included by several translation units of one program.
#pragma once

#include <commsgd/cuda/error.cuh>
#include <commsgd/cuda/result.cuh>
#include <commsgd/select/key.hpp>

#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

namespace commsgd::inline v1::cuda::detail {

using u32 = std::uint32_t;
using u64 = unsigned long long;

inline constexpr int block_threads = 256;
inline constexpr u32 key_bits = 31;
// 11-bit digits: 31 bits in 3 passes, and a 2048-bin histogram (16 KiB of shared counters and edges).
inline constexpr u32 max_digit_bits = 11;
inline constexpr u32 digit_bins = 1u << max_digit_bits;
// The window pass of laplace_bisect and sampled: 4096 bins around an estimate, plus one bin below and
// one above it.
inline constexpr u32 window_bins = 4096;
inline constexpr u32 hist_bins = window_bins + 2;
inline constexpr int scan_items = (hist_bins + block_threads - 1) / block_threads;

enum class on_done : u32 {
  finish = 0, // the threshold is the result
  sample = 1, // the threshold of a sample: it centres the window pass over the whole input
  verify = 2, // the threshold among per-segment candidates: valid only if no segment left out a larger key
};

struct engine_state {
  u32 prefix;
  u32 det_lo;
  u64 k_rem;
  u64 above;
  u32 done;
  u32 approx; // stop as soon as #{key >= bucket start} <= limit
  u64 n;
  u64 k;
  u64 limit;
  // Candidates: keys matching an earlier prefix, so that later passes read far less than n.
  u32 source; // 0: read x; 1: read cand[cur]
  u32 cur;
  u32 write_next; // the next pass writes the keys matching the current prefix into cand[write_to]
  u32 write_to;
  u64 cand_count[2];
  u64 cap;
  u32 ticket;
  u32 stage; // on_done
  // What a later stage restarts with (sampled and hierarchical select among other keys first).
  u64 main_k;
  u64 main_limit;
  u32 main_approx;
  float center; // estimate that centres a window pass
  double abs_sum;
  u32 overflow;
  u32 max_cut; // hierarchical: every key left out of the candidates is below this
  u64 nonfinite;
  u64 first_nonfinite;
  float value;
  u32 flags;
  u64 res_above;
  u64 res_at;
};

struct engine_params {
  u64 n;
  u64 k;
  u64 limit;
  u32 approx;
  u64 cap;
  u32 stage;
  u64 main_k;
  u64 main_limit;
  u32 main_approx;
  u64 initial_candidates; // > 0: cand[0] already holds this many keys (set by the first kernel otherwise)
};

__device__ inline void note_nonfinite(engine_state* st, u64 index) {
  atomicAdd(&st->nonfinite, 1ull);
  atomicMin(&st->first_nonfinite, index);
}

// Grid-stride visit of every key of x (with its index), in float4 loads when x is 16-byte aligned.
template <class F>
__device__ void for_each_input(const float* __restrict__ x, u64 n, F&& f) {
  const u64 tid = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x;
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  u64 head = 0;
  if ((reinterpret_cast<std::uintptr_t>(x) & 15u) == 0) {
    const u64 n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (u64 i = tid; i < n4; i += stride) {
      const float4 v = x4[i];
      f(select::magnitude_key(v.x), 4 * i);
      f(select::magnitude_key(v.y), 4 * i + 1);
      f(select::magnitude_key(v.z), 4 * i + 2);
      f(select::magnitude_key(v.w), 4 * i + 3);
    }
    head = 4 * n4;
  }
  for (u64 i = head + tid; i < n; i += stride)
    f(select::magnitude_key(x[i]), i);
}

// Candidate buffers are carved at 256-byte boundaries, so uint4 loads are always aligned.
template <class F>
__device__ void for_each_key(const u32* __restrict__ keys, u64 n, F&& f) {
  const u64 tid = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x;
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  const u64 n4 = n / 4;
  const uint4* k4 = reinterpret_cast<const uint4*>(keys);
  for (u64 i = tid; i < n4; i += stride) {
    const uint4 v = k4[i];
    f(v.x);
    f(v.y);
    f(v.z);
    f(v.w);
  }
  for (u64 i = 4 * n4 + tid; i < n; i += stride)
    f(keys[i]);
}

// One atomic per group of threads that reach the append together, instead of one per key.
__device__ inline void append_key(u32* buf, u64* count, u64 cap, u32 key, u32* overflow) {
  namespace cg = cooperative_groups;
  cg::coalesced_group g = cg::coalesced_threads();
  u64 base = 0;
  if (g.thread_rank() == 0) base = atomicAdd(count, static_cast<u64>(g.size()));
  base = g.shfl(base, 0);
  const u64 slot = base + g.thread_rank();
  if (slot < cap)
    buf[slot] = key;
  else
    atomicOr(overflow, 1u);
}

// The classic threadfence reduction handshake: true in the one block that finishes last, which then sees
// every other block's global atomics.
__device__ inline bool arrive_last(u32* ticket) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  return last;
}

struct crossing {
  u32 bin;    // the bin holding the k_rem-th largest key; ~0u if the bins hold fewer than k_rem
  u64 before; // keys in higher bins
  u64 count;  // keys in this bin
  u64 edge;   // keys equal to the bin's lowest key
};

// Block-wide: with the bins read from the top, the bin where the running count reaches k_rem. Clears the
// global bins for the next pass.
__device__ inline crossing find_crossing(u64* g_hist, u64* g_edge, u32 bins, u64 k_rem) {
  using scan_t = cub::BlockScan<u64, block_threads>;
  __shared__ typename scan_t::TempStorage scan_storage;
  __shared__ crossing found;
  u64 local[scan_items];
  u64 sum = 0;
  for (int i = 0; i < scan_items; ++i) {
    const u32 rank = threadIdx.x * scan_items + i;
    local[i] = rank < bins ? __ldcg(&g_hist[bins - 1 - rank]) : 0;
    sum += local[i];
  }
  if (threadIdx.x == 0) found = crossing{~0u, 0, 0, 0};
  u64 before = 0;
  scan_t(scan_storage).ExclusiveSum(sum, before);
  __syncthreads();
  for (int i = 0; i < scan_items; ++i) {
    const u32 rank = threadIdx.x * scan_items + i;
    if (before < k_rem && k_rem <= before + local[i])
      found = crossing{bins - 1 - rank, before, local[i], __ldcg(&g_edge[bins - 1 - rank])};
    before += local[i];
  }
  __syncthreads();
  for (u32 b = threadIdx.x; b < bins; b += blockDim.x) {
    g_hist[b] = 0;
    g_edge[b] = 0;
  }
  return found;
}

__device__ inline void restart(engine_state* st, u64 k, u64 limit, u32 approx, on_done stage) {
  st->prefix = 0;
  st->det_lo = key_bits;
  st->above = 0;
  st->k = k;
  st->k_rem = k;
  st->limit = limit;
  st->approx = approx;
  st->source = 0;
  st->write_next = 0;
  st->done = 0;
  st->stage = static_cast<u32>(stage);
}

// The threshold of the current stage is known: record it, or move to the next stage.
__device__ inline void stage_done(engine_state* st, float value, u64 above, u64 at) {
  switch (static_cast<on_done>(st->stage)) {
  case on_done::sample:
    st->center = value;
    restart(st, st->main_k, st->main_limit, st->main_approx, on_done::finish);
    return;
  case on_done::verify:
    if (st->max_cut > select::magnitude_key(value)) {
      // A segment left out keys that may belong to the top k: select again over the whole input.
      restart(st, st->main_k, st->main_limit, st->main_approx, on_done::finish);
      return;
    }
    break;
  case on_done::finish:
    break;
  }
  st->value = value;
  st->res_above = above;
  st->res_at = at;
  st->done = 1;
}

// Thread 0 of the last block: bin `c` of a digit starting at bit `lo` was chosen.
__device__ inline void settle(engine_state* st, const crossing& c, u32 new_prefix, u32 lo, bool wrote) {
  if (c.bin == ~0u) { // cannot happen with consistent counts; stop rather than loop on garbage
    st->flags |= ties_exceed_tolerance;
    stage_done(st, 0.0f, 0, 0);
    st->done = 1;
    return;
  }
  if (wrote && !__ldcg(&st->overflow)) {
    st->source = 1;
    st->cur = st->write_to;
  }
  st->overflow = 0;
  st->above += c.before;
  st->k_rem -= c.before;
  st->prefix = new_prefix;
  st->det_lo = lo;
  // Other blocks counted candidates with atomics; this block may hold a stale L1 copy of the counter.
  const u64 source_count = st->source ? __ldcg(&st->cand_count[st->cur]) : st->n;
  st->write_next = 0;
  if (lo > 0 && c.count <= st->cap && c.count < source_count) {
    st->write_next = 1;
    st->write_to = st->source ? 1 - st->cur : 0;
    st->cand_count[st->write_to] = 0;
  }
  const u64 at_or_above = st->above + c.count;
  if (st->approx && at_or_above <= st->limit) {
    stage_done(st, select::key_magnitude(new_prefix), at_or_above - c.edge, c.edge);
  } else if (lo == 0) {
    const float value = select::key_magnitude(new_prefix);
    if (st->approx) {
      // Every tie must be selected and there are too many: the contract says raise.
      if (st->stage == static_cast<u32>(on_done::finish)) st->flags |= ties_exceed_tolerance;
      stage_done(st, value, st->above, c.count);
    } else {
      stage_done(st, value, st->above, st->k_rem);
    }
  }
}

template <class = void>
__global__ void __launch_bounds__(256)
    engine_init_kernel(engine_state* st, engine_params p, u64* g_hist, u64* g_edge) {
  for (u32 b = threadIdx.x; b < hist_bins; b += blockDim.x) {
    g_hist[b] = 0;
    g_edge[b] = 0;
  }
  if (threadIdx.x != 0) return;
  *st = engine_state{};
  st->n = p.n;
  st->cap = p.cap;
  st->main_k = p.main_k;
  st->main_limit = p.main_limit;
  st->main_approx = p.main_approx;
  st->first_nonfinite = ~0ull;
  st->value = __int_as_float(0x7f800000);
  restart(st, p.k, p.limit, p.approx, static_cast<on_done>(p.stage));
  if (p.initial_candidates > 0) {
    st->source = 1;
    st->cur = 0;
    st->cand_count[0] = p.initial_candidates;
  }
  if (p.k == 0) st->done = 1;
}

// One digit of the radix search (see the file comment).
template <class = void>
__global__ void __launch_bounds__(block_threads)
    digit_pass_kernel(const float* __restrict__ x, engine_state* st, u64* g_hist, u64* g_edge, u32* cand0,
                      u32* cand1, bool track_nonfinite) {
  __shared__ u32 s_hist[digit_bins];
  __shared__ u32 s_edge[digit_bins];
  // The previous kernel on the stream wrote the state, so every block reads the same values here.
  if (st->done || st->det_lo == 0) return;
  const u32 det_lo = st->det_lo;
  const u32 prefix = st->prefix;
  const u32 bits = det_lo < max_digit_bits ? det_lo : max_digit_bits;
  const u32 lo = det_lo - bits;
  const u32 digit_mask = (1u << bits) - 1;
  const u32 low_mask = (1u << lo) - 1;
  for (u32 b = threadIdx.x; b < (1u << bits); b += blockDim.x) {
    s_hist[b] = 0;
    s_edge[b] = 0;
  }
  __syncthreads();
  const bool write = st->write_next != 0;
  u32* const write_buf = st->write_to ? cand1 : cand0;
  u64* const write_count = &st->cand_count[st->write_to];
  const u64 cap = st->cap;
  auto visit = [&](u32 key) {
    if ((key >> det_lo) != (prefix >> det_lo)) return;
    const u32 d = (key >> lo) & digit_mask;
    atomicAdd(&s_hist[d], 1u);
    if ((key & low_mask) == 0) atomicAdd(&s_edge[d], 1u);
    if (write) append_key(write_buf, write_count, cap, key, &st->overflow);
  };
  if (st->source) {
    for_each_key(st->cur ? cand1 : cand0, st->cand_count[st->cur], visit);
  } else {
    for_each_input(x, st->n, [&](u32 key, u64 i) {
      if (track_nonfinite && key >= select::infinite_key) note_nonfinite(st, i);
      visit(key);
    });
  }
  __syncthreads();
  for (u32 b = threadIdx.x; b < (1u << bits); b += blockDim.x) {
    if (s_hist[b]) atomicAdd(&g_hist[b], static_cast<u64>(s_hist[b]));
    if (s_edge[b]) atomicAdd(&g_edge[b], static_cast<u64>(s_edge[b]));
  }
  if (!arrive_last(&st->ticket)) return;
  const crossing c = find_crossing(g_hist, g_edge, 1u << bits, st->k_rem);
  if (threadIdx.x == 0) {
    st->ticket = 0;
    settle(st, c, prefix | (c.bin << lo), lo, write);
  }
}

// The window of `window_bins` buckets of 2^shift keys around st->center, `span_log2` binary orders of
// magnitude wide each side.
struct window {
  u32 base;
  u32 shift;
};

__device__ inline window window_around(float center, u32 span_log2) {
  window w;
  // 2 * 2^span_log2 binades of 2^23 keys each, spread over 2^12 bins.
  w.shift = 12 + span_log2;
  u32 ck = select::magnitude_key(center);
  if (ck >= select::infinite_key) ck = select::infinite_key - 1; // a NaN estimate still gives a window
  const u32 centre_bin = ck >> w.shift;
  const u32 max_base = ((1u << key_bits) >> w.shift) - window_bins;
  w.base = centre_bin > window_bins / 2 ? centre_bin - window_bins / 2 : 0;
  if (w.base > max_base) w.base = max_base;
  return w;
}

// Counts, in one pass, the keys above each of 4096 candidate thresholds bracketing an estimate: the
// correction of laplace_bisect and sampled costs one pass, not one pass per bisection step.
template <class = void>
__global__ void __launch_bounds__(block_threads)
    window_pass_kernel(const float* __restrict__ x, engine_state* st, u64* g_hist, u64* g_edge, u32 span_log2,
                       bool track_nonfinite) {
  __shared__ u32 s_hist[hist_bins];
  __shared__ u32 s_edge[hist_bins];
  if (st->done) return;
  const window w = window_around(st->center, span_log2);
  const u32 low_mask = (1u << w.shift) - 1;
  for (u32 b = threadIdx.x; b < hist_bins; b += blockDim.x) {
    s_hist[b] = 0;
    s_edge[b] = 0;
  }
  __syncthreads();
  for_each_input(x, st->n, [&](u32 key, u64 i) {
    if (track_nonfinite && key >= select::infinite_key) note_nonfinite(st, i);
    const u32 hi = key >> w.shift;
    const u32 b = hi < w.base ? 0 : (hi - w.base >= window_bins ? hist_bins - 1 : hi - w.base + 1);
    atomicAdd(&s_hist[b], 1u);
    if ((key & low_mask) == 0) atomicAdd(&s_edge[b], 1u);
  });
  __syncthreads();
  for (u32 b = threadIdx.x; b < hist_bins; b += blockDim.x) {
    if (s_hist[b]) atomicAdd(&g_hist[b], static_cast<u64>(s_hist[b]));
    if (s_edge[b]) atomicAdd(&g_edge[b], static_cast<u64>(s_edge[b]));
  }
  if (!arrive_last(&st->ticket)) return;
  const crossing c = find_crossing(g_hist, g_edge, hist_bins, st->k_rem);
  if (threadIdx.x == 0) {
    st->ticket = 0;
    if (c.bin == 0 || c.bin == hist_bins - 1) {
      // The estimate was off by more than the window: nothing learned, the refine passes start from the top.
      st->write_next = 0;
    } else {
      settle(st, c, (w.base + c.bin - 1) << w.shift, w.shift, false);
    }
  }
}

// Laplace fit with mu = 0: b = mean |x|, and t0 = b ln(N / k) has tail area k / N.
template <class = void>
__global__ void __launch_bounds__(block_threads)
    abs_sum_kernel(const float* __restrict__ x, engine_state* st) {
  using reduce_t = cub::BlockReduce<float, block_threads>;
  __shared__ typename reduce_t::TempStorage storage;
  if (st->done) return;
  float sum = 0.0f;
  for_each_input(x, st->n, [&](u32 key, u64 i) {
    if (key >= select::infinite_key) note_nonfinite(st, i);
    sum += select::key_magnitude(key);
  });
  const float block_sum = reduce_t(storage).Sum(sum);
  if (threadIdx.x == 0) atomicAdd(&st->abs_sum, static_cast<double>(block_sum));
  if (!arrive_last(&st->ticket)) return;
  if (threadIdx.x == 0) {
    st->ticket = 0;
    const double n = static_cast<double>(st->n);
    const double b = __ldcg(&st->abs_sum) / n;
    st->center = static_cast<float>(b * log(n / static_cast<double>(st->main_k)));
  }
}

// DGC's strided sample: cand[0][j] = key of x[j * stride].
template <class = void>
__global__ void __launch_bounds__(block_threads)
    sample_kernel(const float* __restrict__ x, u64 stride, u64 m, u32* cand0) {
  const u64 step = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 j = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; j < m; j += step)
    cand0[j] = select::magnitude_key(x[j * stride]);
}

inline constexpr int segment_items = 16;
inline constexpr u32 segment_size = block_threads * segment_items;
inline constexpr u32 segment_digit_lo = key_bits - max_digit_bits;

// hierarchical: each segment of `segment_size` keys keeps every key in the top-digit buckets that hold its
// `k_segment` largest, so the candidates are a superset of the segment's share of the top k, with slack.
template <class = void>
__global__ void __launch_bounds__(block_threads)
    segment_candidates_kernel(const float* __restrict__ x, engine_state* st, u32 k_segment, u32* cand0) {
  __shared__ u32 s_hist[digit_bins];
  __shared__ u32 s_cut;
  __shared__ u32 s_excluded;
  using scan_t = cub::BlockScan<u32, block_threads>;
  __shared__ typename scan_t::TempStorage scan_storage;
  constexpr int per_thread = digit_bins / block_threads;
  const u64 n = st->n;
  const u64 segments = (n + segment_size - 1) / segment_size;
  for (u64 seg = blockIdx.x; seg < segments; seg += gridDim.x) {
    for (u32 b = threadIdx.x; b < digit_bins; b += blockDim.x)
      s_hist[b] = 0;
    if (threadIdx.x == 0) {
      s_cut = 0;
      s_excluded = 0;
    }
    __syncthreads();
    u32 keys[segment_items];
    const u64 start = seg * segment_size;
    for (int i = 0; i < segment_items; ++i) {
      const u64 idx = start + static_cast<u64>(i) * block_threads + threadIdx.x;
      keys[i] = 0;
      if (idx < n) {
        keys[i] = select::magnitude_key(x[idx]);
        if (keys[i] >= select::infinite_key) note_nonfinite(st, idx);
        atomicAdd(&s_hist[keys[i] >> segment_digit_lo], 1u);
      }
    }
    __syncthreads();
    // Counts from the top bucket down; the cut is the bucket where they reach k_segment.
    u32 local[per_thread];
    u32 sum = 0;
    for (int i = 0; i < per_thread; ++i) {
      local[i] = s_hist[digit_bins - 1 - (threadIdx.x * per_thread + i)];
      sum += local[i];
    }
    u32 before = 0;
    scan_t(scan_storage).ExclusiveSum(sum, before);
    for (int i = 0; i < per_thread; ++i) {
      if (before < k_segment && k_segment <= before + local[i])
        s_cut = digit_bins - 1 - (threadIdx.x * per_thread + i);
      before += local[i];
    }
    __syncthreads();
    const u32 cut = s_cut; // 0 when the segment holds at most k_segment keys: keep them all
    for (int i = 0; i < segment_items; ++i) {
      const u64 idx = start + static_cast<u64>(i) * block_threads + threadIdx.x;
      if (idx >= n) continue;
      if ((keys[i] >> segment_digit_lo) >= cut)
        append_key(cand0, &st->cand_count[0], st->cap, keys[i], &st->overflow);
      else
        s_excluded = 1;
    }
    __syncthreads();
    if (threadIdx.x == 0 && s_excluded) atomicMax(&st->max_cut, cut << segment_digit_lo);
    __syncthreads();
  }
  if (!arrive_last(&st->ticket)) return;
  if (threadIdx.x == 0) {
    st->ticket = 0;
    if (__ldcg(&st->overflow)) {
      // Too many candidates (heavy ties): select over the whole input instead.
      restart(st, st->main_k, st->main_limit, st->main_approx, on_done::finish);
    } else {
      st->source = 1;
      st->cur = 0;
    }
    st->overflow = 0;
  }
}

// A pass over x only to count NaN and inf, for k == 0 where no selection pass reads the input.
template <class = void>
__global__ void __launch_bounds__(block_threads)
    nonfinite_kernel(const float* __restrict__ x, engine_state* st) {
  for_each_input(x, st->n, [&](u32 key, u64 i) {
    if (key >= select::infinite_key) note_nonfinite(st, i);
  });
}

template <class = void>
__global__ void engine_finalize_kernel(const engine_state* st, device_result* out, float* previous) {
  device_result r;
  r.value = st->value;
  r.flags = st->flags;
  r.above = st->res_above;
  r.at = st->res_at;
  r.nonfinite_count = st->nonfinite;
  r.first_nonfinite = st->nonfinite ? st->first_nonfinite : 0;
  *out = r;
  if (previous && st->nonfinite == 0 && st->k > 0) *previous = st->value;
}

} // namespace commsgd::inline v1::cuda::detail
