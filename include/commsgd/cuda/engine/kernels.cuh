// Kernels of the selection engine (the agent layer, in CUB's terms): the passes that radix, laplace_bisect,
// hierarchical and sampled string together, each a template over the method's state (state.cuh)
// where several methods share it. The dispatch (dispatch.cuh) enqueues them; block-level pieces are
// in block.cuh, sizes in tuning.cuh.
//
// Kernels that take no state type are templates (`template <class = void>`) only for their linkage: headers
// with kernels may be included by several translation units of one program.
#pragma once

#include <commsgd/cuda/engine/block.cuh>
#include <commsgd/cuda/engine/state.cuh>
#include <commsgd/cuda/error.cuh>
#include <commsgd/cuda/result.cuh>
#include <commsgd/select/key.hpp>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

namespace commsgd::inline v1::cuda::detail {

// Copies in the state the host built (initial_state) and clears the global histograms.
template <class State>
__global__ void __launch_bounds__(block_threads)
    engine_init_kernel(State* st, State init, u64* g_hist, u64* g_edge) {
  for (u32 b = threadIdx.x; b < hist_bins; b += blockDim.x) {
    g_hist[b] = 0;
    g_edge[b] = 0;
  }
  if (threadIdx.x != 0) return;
  *st = init;
}

// One digit of the radix search (see state.cuh).
template <class State>
__global__ void __launch_bounds__(block_threads)
    digit_pass_kernel(const float* __restrict__ x, State* st, u64* g_hist, u64* g_edge, u32* cand0,
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
  clear_histograms(s_hist, s_edge, 1u << bits);
  __syncthreads();
  const bool write = st->write_next != 0;
  u32* const write_buf = st->write_to ? cand1 : cand0;
  u64* const write_count = &st->cand_count[st->write_to];
  const u64 cap = st->cap;
  auto visit = [&](u32 key) {
    if ((key >> det_lo) != (prefix >> det_lo)) return;
    count_key(s_hist, s_edge, (key >> lo) & digit_mask, key, low_mask);
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
  crossing c;
  if (!last_block_crossing(s_hist, s_edge, 1u << bits, g_hist, g_edge, st, c)) return;
  if (threadIdx.x == 0) {
    st->ticket = 0;
    settle(st, c, prefix | (c.bin << lo), lo, write);
  }
}

// The window of `window_bins` buckets of 2^shift keys around st->center, `span_log2` binary orders of
// magnitude wide each side.
__device__ inline window window_around(float center, u32 span_log2) {
  window w;
  // 2 * 2^span_log2 binades of 2^23 keys each, spread over 2^window_bits bins.
  w.shift = 24 - window_bits + span_log2;
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
template <class State>
__global__ void __launch_bounds__(block_threads)
    window_pass_kernel(const float* __restrict__ x, State* st, u64* g_hist, u64* g_edge, u32 span_log2,
                       bool track_nonfinite) {
  __shared__ u32 s_hist[hist_bins];
  __shared__ u32 s_edge[hist_bins];
  if (st->done) return;
  const window w = window_around(st->center, span_log2);
  count_window(x, st, w, track_nonfinite, s_hist, s_edge, [](u32) {});
  crossing c;
  if (!last_block_crossing(s_hist, s_edge, hist_bins, g_hist, g_edge, st, c)) return;
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
    abs_sum_kernel(const float* __restrict__ x, laplace_bisect_state* st) {
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
    st->center = static_cast<float>(b * log(n / static_cast<double>(st->k)));
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

inline constexpr int segment_items = hierarchical_tuning::segment_items;
inline constexpr u32 segment_size = block_threads * segment_items;
inline constexpr u32 segment_digit_lo = key_bits - max_digit_bits;

// hierarchical: each segment of `segment_size` keys keeps every key in the top-digit buckets that hold its
// `k_segment` largest, so the candidates are a superset of the segment's share of the top k, with slack.
template <class = void>
__global__ void __launch_bounds__(block_threads)
    segment_candidates_kernel(const float* __restrict__ x, hierarchical_state* st, u32 k_segment,
                              u32* cand0) {
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
      restart_main(st);
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
    nonfinite_kernel(const float* __restrict__ x, result_state* st) {
  for_each_input(x, st->n, [&](u32 key, u64 i) {
    if (key >= select::infinite_key) note_nonfinite(st, i);
  });
}

template <class = void>
__global__ void engine_finalize_kernel(const result_state* st, device_result* out, float* previous) {
  device_result r;
  r.value = st->value;
  r.flags = st->flags;
  r.above = st->res_above;
  r.at = st->res_at;
  r.nonfinite_count = st->nonfinite;
  r.first_nonfinite = st->nonfinite ? st->first_nonfinite : no_nonfinite_index;
  *out = r;
  // A refused call (non-finite input, ties beyond the tolerance, an engine fault) is no warm start.
  if (previous && st->nonfinite == 0 && st->k > 0 &&
      !(st->flags & (ties_exceed_tolerance | internal_inconsistency)))
    *previous = st->value;
}

} // namespace commsgd::inline v1::cuda::detail
