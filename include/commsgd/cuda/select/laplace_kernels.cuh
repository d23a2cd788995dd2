// Kernels of laplace_bisect's warm start: the device form of the host's warm path (select/laplace_bisect.hpp)
// on a histogram engine.
//
// The host collects every key at or above a floor a margin below the predicted threshold; here a window pass
// counts 4096 buckets from that floor up (and one bucket for everything above them) while it appends the keys
// at or above the floor to a candidate buffer. A hit settles in the window's bucket and the digit passes that
// finish it read those candidates, not x: one pass over x. A threshold below the floor widens the window
// geometrically around the prediction, as the host does: from the widened floor up to the old one, then from
// 0, each window's top bucket counting what lies above it. A threshold above the window restarts the digit
// search from the top over the candidates, which hold every key above the floor. The prediction, the margin
// and the floors are the host's own functions (select/laplace_math.hpp), evaluated on the device from the
// tracker this object keeps in device memory, so nothing is read back to the host.
#pragma once

#include <commsgd/cuda/engine/block.cuh>
#include <commsgd/cuda/engine/state.cuh>
#include <commsgd/cuda/engine/tuning.cuh>
#include <commsgd/select/key.hpp>
#include <commsgd/select/laplace_math.hpp>

namespace commsgd::inline v1::cuda::detail {

// Window levels of a warm call: from the floor, from the widened floor, from 0; then none.
inline constexpr u32 warm_levels = 3;

// Highest base a window of `shift` may have and still end within the 31-bit key range (0 when it cannot).
COMMSGD_HOST_DEVICE inline u32 max_window_base(u32 shift) {
  const u32 bins = (1u << key_bits) >> shift;
  return bins > window_bins ? bins - window_bins : 0u;
}

// The window of warm-shift buckets whose first bucket holds `floor`.
COMMSGD_HOST_DEVICE inline window warm_window_from(u32 floor) {
  window w;
  w.shift = laplace_bisect_tuning::warm_shift;
  const u32 base = floor >> w.shift;
  const u32 top = max_window_base(w.shift);
  w.base = base < top ? base : top;
  return w;
}

// The finest window, buckets no finer than the warm ones, whose buckets cover the keys [lo, hi).
COMMSGD_HOST_DEVICE inline window warm_window_spanning(u32 lo, u32 hi) {
  if (hi <= lo) hi = lo + 1;
  window w;
  w.shift = laplace_bisect_tuning::warm_shift;
  // At shift 19 the 4096 buckets cover all 2^31 keys, so the loop ends there at the latest.
  while (w.shift < key_bits && ((hi - 1) >> w.shift) - (lo >> w.shift) >= window_bins)
    ++w.shift;
  const u32 base = lo >> w.shift;
  const u32 top = max_window_base(w.shift);
  w.base = base < top ? base : top;
  return w;
}

// One thread: where the first window starts, from the previous threshold and the tracker.
template <class = void>
__global__ void warm_plan_kernel(laplace_bisect_state* st, const float* previous,
                                 const select::warm_tracker* tracker) {
  if (st->done) return;
  const select::warm_tracker::plan p = tracker->next(*previous);
  st->level = 0;
  st->win = warm_window_from(select::warm_floor_key(p.guess, p.margin));
  st->floor_wide = select::warm_floor_key(p.guess, select::warm_widened_margin(p.margin));
  st->write_to = 0;
  st->cand_count[0] = 0;
  st->overflow = 0;
}

// Thread 0 of the last block of window level `level`: the bucket where the count crosses k was found.
__device__ inline void warm_window_done(laplace_bisect_state* st, const crossing& c, window w, u32 level,
                                        bool wrote) {
  st->level = warm_levels;
  if (c.bin == ~0u || (c.bin >= 1 && c.bin <= window_bins)) {
    // A hit (or counts that contradict each other, which settle reports).
    settle(st, c, (w.base + c.bin - 1) << w.shift, w.shift, wrote);
    return;
  }
  if (c.bin == 0 && level + 1 < warm_levels) {
    // Fewer than k keys at or above the window: widen below it. The keys above are counted again by the
    // next window's buckets and top bucket, so the search state needs no change.
    const u32 hi = w.base << w.shift;
    const u32 wide = st->floor_wide;
    const bool second = level == 0 && wide > 0 && wide < hi;
    st->level = second ? 1 : 2;
    st->win = warm_window_spanning(second ? wide : 0u, hi);
    st->cand_count[0] = 0;
    st->overflow = 0;
    return;
  }
  // At or above the window's top (a rise past it): the digit search from the top, over the candidates when
  // they hold every key at or above the window.
  st->source = wrote && !__ldcg(&st->overflow) ? 1u : 0u;
  st->cur = 0;
  st->overflow = 0;
  st->write_next = 0;
}

// A warm window pass of level `level` (runs only while the state names it): counts the keys in window_bins
// buckets of st->win, and, at levels below 2, appends those at or above the window's base to cand0.
template <class = void>
__global__ void __launch_bounds__(block_threads)
    warm_window_kernel(const float* __restrict__ x, laplace_bisect_state* st, u64* g_hist, u64* g_edge,
                       u32* cand0, u32 level) {
  __shared__ u32 s_hist[hist_bins];
  __shared__ u32 s_edge[hist_bins];
  // The previous kernel on the stream wrote the state, so every block reads the same values here.
  if (st->done || st->level != level) return;
  const window w = st->win;
  // Level 2 starts at key 0: its candidates would be all of x.
  const bool write = level < 2;
  // Level 0 reads x first; the later ones must not count a non-finite entry twice.
  const bool track_nonfinite = level == 0;
  const u64 cap = st->cap;
  u64* const count = &st->cand_count[0];
  count_window(x, st, w, track_nonfinite, s_hist, s_edge, [&](u32 key) {
    if (write) append_key(cand0, count, cap, key, &st->overflow);
  });
  crossing c;
  if (!last_block_crossing(s_hist, s_edge, hist_bins, g_hist, g_edge, st, c)) return;
  if (threadIdx.x == 0) {
    st->ticket = 0;
    warm_window_done(st, c, w, level, write);
  }
}

// One thread, before the finalize kernel overwrites *previous: scores the predictions on what this call
// found, as the host's record does. `had_previous`: the call was warm (else the tracker starts over).
template <class = void>
__global__ void warm_record_kernel(const laplace_bisect_state* st, const float* previous,
                                   select::warm_tracker* tracker, bool had_previous) {
  if (st->nonfinite != 0 || st->k == 0 || (st->flags & (ties_exceed_tolerance | internal_inconsistency)))
    return;
  tracker->record(had_previous ? *previous : 0.0f, st->value);
}

} // namespace commsgd::inline v1::cuda::detail
