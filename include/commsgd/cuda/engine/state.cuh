// The state machine of the selection engine, kept in device memory, one struct per method.
//
// Every method narrows the same search: the threshold key is found from its high bits down (`prefix`, bits
// >= `det_lo` known), with `above` entries known to lie above the prefix range and `k_rem` still to take
// inside it. A pass histograms the next digit of the keys that match the prefix; the last block of the pass
// to finish picks the digit where the count crosses k (settle). Passes read the state left by the previous
// kernel and return at once when it says `done`, so the host enqueues the worst-case number of passes and
// never waits for a count: the selection runs with no host synchronisation at all.
//
// What each method keeps: exact only the result (result_state); radix the search (search_state);
// laplace_bisect also the window centre and the |x| sum of its Laplace fit; sampled and hierarchical run a
// first stage (the sample's threshold, or the threshold among per-segment candidates) before the main
// search, and keep what that restarts with.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/cuda/engine/block.cuh>
#include <commsgd/cuda/result.cuh>
#include <commsgd/select/key.hpp>

#include <type_traits>

namespace commsgd::inline v1::cuda::detail {

// The input, the target, the non-finite count and the result: what every method reports.
struct result_state {
  u64 n;
  u64 k;
  u32 done;
  u64 nonfinite;
  u64 first_nonfinite;
  float value;
  u32 flags;
  u64 res_above;
  u64 res_at;
};

// The digit-by-digit search of radix (and of every method built on it).
struct search_state : result_state {
  u32 prefix;
  u32 det_lo;
  u64 k_rem;
  u64 above;
  u32 approx; // stop as soon as #{key >= bucket start} <= limit
  u64 limit;
  // Candidates: keys matching an earlier prefix, so that later passes read far less than n.
  u32 source; // 0: read x; 1: read cand[cur]
  u32 cur;
  u32 write_next; // the next pass writes the keys matching the current prefix into cand[write_to]
  u32 write_to;
  u64 cand_count[2];
  u64 cap;
  u32 overflow;
  u32 ticket;
};

// Bins of a window pass: window_bins buckets of 2^shift keys from key base << shift (see window_pass_kernel).
struct window {
  u32 base;
  u32 shift;
};

// The bin of `key`: 0 below the window, hist_bins - 1 above it, else 1 + its bucket.
__device__ inline u32 window_bin(u32 key, window w) {
  const u32 hi = key >> w.shift;
  return hi < w.base ? 0 : (hi - w.base >= window_bins ? hist_bins - 1 : hi - w.base + 1);
}

struct laplace_bisect_state : search_state {
  float center; // estimate that centres the cold window pass
  double abs_sum;
  // Warm start (select/laplace_kernels.cuh): up to three window passes, each of which runs only while `level`
  // names it; `win` is the next one's window, `floor_wide` the widened floor a first miss falls back to.
  u32 level;
  window win;
  u32 floor_wide;
};

enum class on_done : u32 {
  finish = 0, // the threshold is the result
  sample = 1, // the threshold of a sample: it centres the window pass over the whole input
  verify = 2, // the threshold among per-segment candidates: valid only if no segment left out a larger key
};

// What a method with a first stage restarts with for its main search.
struct main_search {
  u64 k;
  u64 limit;
  u32 approx;
};

struct sampled_state : search_state {
  u32 stage; // on_done
  main_search main;
  float center; // the sample's threshold, which centres the window pass
};

struct hierarchical_state : search_state {
  u32 stage; // on_done
  main_search main;
  u32 max_cut; // every key left out of the candidates is below this
};

using exact_state = result_state;
using radix_state = search_state;

__device__ inline void note_nonfinite(result_state* st, u64 index) {
  atomicAdd(&st->nonfinite, 1ull);
  atomicMin(&st->first_nonfinite, index);
}

// One block's share of a window pass over x: each key counted in the bin window_bin gives it (those below the
// window, nearly all of x, through below_window), non-finite entries noted when `track_nonfinite`, and
// `at_or_above(key)` called for each key from the window's base up. Ends with the block's counts in shared
// memory, ready for last_block_crossing.
template <class AtOrAbove>
__device__ void count_window(const float* __restrict__ x, result_state* st, window w, bool track_nonfinite,
                             u32* s_hist, u32* s_edge, AtOrAbove&& at_or_above) {
  const u32 low_mask = (1u << w.shift) - 1;
  clear_histograms(s_hist, s_edge, hist_bins);
  __syncthreads();
  below_window below;
  for_each_input(x, st->n, [&](u32 key, u64 i) {
    if (track_nonfinite && key >= select::infinite_key) note_nonfinite(st, i);
    const u32 b = window_bin(key, w);
    if (b == 0) {
      below.add(key, low_mask);
      return;
    }
    count_key(s_hist, s_edge, b, key, low_mask);
    at_or_above(key);
  });
  below.flush(s_hist, s_edge);
}

COMMSGD_HOST_DEVICE inline void restart(search_state* st, u64 k, u64 limit, u32 approx) {
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
}

template <class State>
COMMSGD_HOST_DEVICE void restart_main(State* st) {
  restart(st, st->main.k, st->main.limit, st->main.approx);
  st->stage = static_cast<u32>(on_done::finish);
}

// The state a selection starts from, built on the host and copied in by the init kernel. With k == 0 it
// is done at once (nothing to select; the passes only count non-finite input).
template <class State>
COMMSGD_HOST_DEVICE State initial_state(u64 n, u64 k, u64 limit = 0, u32 approx = 0, u64 cap = 0) {
  State st{};
  st.n = n;
  st.k = k;
  st.first_nonfinite = no_nonfinite_index;
  st.value = select::key_magnitude(select::infinite_key);
  if constexpr (std::is_base_of_v<search_state, State>) {
    st.cap = cap;
    restart(&st, k, limit, approx);
  }
  if (k == 0) st.done = 1;
  return st;
}

// A stage's threshold is known. Methods without stages record it as the result; the others may start
// their main search instead (returning true).
__device__ inline bool leave_stage(search_state*, float) {
  return false;
}
__device__ inline bool leave_stage(sampled_state* st, float value) {
  if (st->stage != static_cast<u32>(on_done::sample)) return false;
  st->center = value;
  restart_main(st);
  return true;
}
__device__ inline bool leave_stage(hierarchical_state* st, float value) {
  // A segment left out keys that may belong to the top k: select again over the whole input.
  if (st->stage != static_cast<u32>(on_done::verify) || !(st->max_cut > select::magnitude_key(value)))
    return false;
  restart_main(st);
  return true;
}

// Whether the search under way gives the result (and not a first stage's threshold).
__device__ inline bool in_final_stage(const search_state*) {
  return true;
}
__device__ inline bool in_final_stage(const sampled_state* st) {
  return st->stage == static_cast<u32>(on_done::finish);
}
__device__ inline bool in_final_stage(const hierarchical_state* st) {
  return st->stage == static_cast<u32>(on_done::finish);
}

// The threshold of the current stage is known: record it, or move to the next stage.
template <class State>
__device__ void stage_done(State* st, float value, u64 above, u64 at) {
  if (leave_stage(st, value)) return;
  st->value = value;
  st->res_above = above;
  st->res_at = at;
  st->done = 1;
}

// Thread 0 of the last block: bin `c` of a digit starting at bit `lo` was chosen.
template <class State>
__device__ void settle(State* st, const crossing& c, u32 new_prefix, u32 lo, bool wrote) {
  if (c.bin == ~0u) {
    // The bins hold fewer keys than the search still needs: counts that disagree with each other, which
    // consistent passes never produce. Stop rather than loop on garbage, and say it is an internal fault.
    st->flags |= internal_inconsistency;
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
      if (in_final_stage(st)) st->flags |= ties_exceed_tolerance;
      stage_done(st, value, st->above, c.count);
    } else {
      stage_done(st, value, st->above, st->k_rem);
    }
  }
}

} // namespace commsgd::inline v1::cuda::detail
