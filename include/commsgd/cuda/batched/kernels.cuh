// The kernels of the batched top-k step (top_k.cuh), in launch order:
//   begin      resets each tensor's search
//   fused      p = g + e (u' = m u + g, p = e + u'), written once; every |p| at or above the tensor's floor
//              (last step's threshold less a margin) goes, index and value, to the tensor's candidates;
//              NaN/inf counted in the same pass. This is the step's one full read of g and e.
//   decide     per tensor: the candidates hold its top k (at least k of them, none lost to the capacity),
//              or the search reads its values p instead
//   digit x6   radix select of the k-th largest (|p| key, ~index) composite: 3 digits of the key, then 3
//   settle x6  of the index, so ties go to the lowest indices as on the host; a tensor stops as soon as
//              one bin holds exactly what it still needs
//   emit       every entry at or above the composite found goes to the message (exactly k per tensor);
//              its position in p (and u') is set to +0
//   finalize   the next floor, statistics, and the commit: the state's two buffers swap on the device
//              (a refused step does not swap, so the state stays as before it)
// No kernel waits for the host, and the host reads nothing during a step: a step can be captured in a CUDA
// graph and replayed.
#pragma once

#include <commsgd/cuda/batched/gradient.cuh>
#include <commsgd/cuda/batched/layout.cuh>
#include <commsgd/cuda/result.cuh>
#include <commsgd/select/key.hpp>

#include <cstdint>

namespace commsgd::inline v1::cuda::detail::batched {

using u32 = std::uint32_t;
using u64 = unsigned long long;
using T = batched_tuning;

// Warm-start memory of a tensor, kept across steps.
struct warm_state {
  u32 floor_key;     // keys at or above it are candidates; no_floor: none (cold)
  u32 threshold_key; // last committed step's k-th key
  float margin;
  u32 has_threshold;
  u64 fast_steps; // steps whose search read only the candidates
  u64 full_steps; // steps whose search read the tensor again
};

inline constexpr u32 no_floor = 0xffffffffu;

// A tensor's search within one step.
struct search_state {
  u64 candidates; // appended this step (may exceed the capacity: then only the count is kept)
  u64 need;       // rank still to find inside the bins that match `prefix`
  u64 prefix;     // composite bits fixed so far (lower bits zero); once done, the least selected composite
  u64 sent;
  u32 done;
  u32 full; // 1: the search reads the values, not the candidates
};

// This step's non-finite values: in g (or u'), or in a finite g's sum (overflow); first_* is
// no_nonfinite_index when its count is 0.
struct step_status {
  u64 grad_count;
  u64 grad_first;
  u64 sum_count;
  u64 sum_first;
};

// Everything the host reads, in one block.
struct control {
  u32 phase;          // the state is buffer [phase]; a step writes [1 - phase]
  u32 full_segments;  // this step
  u32 broken;         // a count disagreed with the search: a fault of the step
  u32 searching;      // tensors whose search is still running: 0 lets the later digit passes return at once
  step_status status; // this step's
  u64 committed;      // steps committed since construction
  u64 refused;        // steps refused since construction
  step_status first_refusal;
  u64 first_refused_step; // committed steps before it
};

// The state buffers, ping-ponged by control::phase.
struct state_buffers {
  float* e[2];
  float* u[2]; // null without momentum
};

__device__ inline u64 composite(u32 key, u32 index) {
  return (static_cast<u64>(key) << 32) | static_cast<u32>(~index);
}

// Digit p covers composite bits [shift, shift + width).
__device__ inline int digit_shift(int p) {
  switch (p) {
  case 0:
    return 53;
  case 1:
    return 42;
  case 2:
    return 32;
  case 3:
    return 21;
  case 4:
    return 10;
  default:
    return 0;
  }
}
__device__ inline int digit_width(int p) {
  return p == 2 || p == 5 ? 10 : 11;
}

__device__ inline bool matches(u64 c, u64 prefix, int above) {
  return above >= 64 || (c >> above) == (prefix >> above);
}

__device__ inline u64 least(u64 a, u64 b) {
  return a < b ? a : b;
}

__device__ inline bool reads_candidates(const search_state& s) {
  return !s.full;
}

template <class = void>
__global__ void begin_kernel(const segment* segs, u32 count, search_state* search, control* ctl) {
  const u32 t = blockIdx.x * blockDim.x + threadIdx.x;
  // A tensor with k = 0 is done before it starts, with a least selected composite above every entry's.
  if (t < count) {
    const bool none = segs[t].k == 0;
    search[t] = search_state{0, segs[t].k, none ? ~0ull : 0ull, 0, none ? 1u : 0u, 0};
    if (!none) atomicAdd(&ctl->searching, 1u); // finalize left it at 0
  }
  if (t == 0) {
    ctl->full_segments = 0;
    ctl->status = step_status{0, no_nonfinite_index, 0, no_nonfinite_index};
  }
}

template <gradient_type Grad, bool Momentum>
__global__ void __launch_bounds__(T::block_threads)
    fused_kernel(const tile* tiles, u64 value_tiles, const segment* segs, const warm_state* warm,
                 search_state* search, const Grad* __restrict__ g, state_buffers buf, float m,
                 u32* __restrict__ cand_index, float* __restrict__ cand_value, control* ctl) {
  __shared__ u32 s_count;
  __shared__ u64 s_base;
  __shared__ u32 s_index[T::stage];
  __shared__ float s_value[T::stage];
  const u32 phase = ctl->phase;
  const float* __restrict__ e = buf.e[phase];
  float* __restrict__ p_out = buf.e[1 - phase];
  const float* __restrict__ u = buf.u[phase];
  float* __restrict__ u_out = buf.u[1 - phase];
  const int lane = threadIdx.x & 31;
  const u32 lanes_below = (1u << lane) - 1u;

  for (u64 ti = blockIdx.x; ti < value_tiles; ti += gridDim.x) {
    const tile tl = tiles[ti];
    const u32 floor = warm[tl.segment].floor_key;
    const segment sg = segs[tl.segment];
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();

    float gv[T::items_per_thread], ev[T::items_per_thread], uv[T::items_per_thread];
#pragma unroll
    for (int j = 0; j < T::items_per_thread; ++j) {
      const u64 i = tl.begin + threadIdx.x + static_cast<u64>(j) * T::block_threads;
      if (i < tl.end) {
        gv[j] = to_float(g[i]);
        ev[j] = e[i];
        if constexpr (Momentum) uv[j] = u[i];
      }
    }
#pragma unroll
    for (int j = 0; j < T::items_per_thread; ++j) {
      const u64 i = tl.begin + threadIdx.x + static_cast<u64>(j) * T::block_threads;
      const bool valid = i < tl.end;
      u32 key = 0;
      float p = 0.0f;
      if (valid) {
        bool sum_bad;
        // Rounded operations keep nvcc from contracting m u + g into an FMA: the host's float arithmetic,
        // bit for bit.
        if constexpr (Momentum) {
          const float un = __fadd_rn(__fmul_rn(m, uv[j]), gv[j]);
          u_out[i] = un;
          p = __fadd_rn(ev[j], un);
          sum_bad = select::magnitude_key(un) >= select::infinite_key;
        } else {
          p = __fadd_rn(gv[j], ev[j]);
          sum_bad = false;
        }
        p_out[i] = p;
        key = select::magnitude_key(p);
        sum_bad = sum_bad || key >= select::infinite_key;
        if (select::magnitude_key(gv[j]) >= select::infinite_key) [[unlikely]] {
          atomicAdd(&ctl->status.grad_count, 1ull);
          atomicMin(&ctl->status.grad_first, static_cast<u64>(i));
        } else if (sum_bad) [[unlikely]] {
          atomicAdd(&ctl->status.sum_count, 1ull);
          atomicMin(&ctl->status.sum_first, static_cast<u64>(i));
        }
      }
      const bool take = valid && key >= floor;
      const u32 ballot = __ballot_sync(0xffffffffu, take);
      if (ballot) {
        u32 base = 0;
        if (lane == __ffs(ballot) - 1) base = atomicAdd(&s_count, __popc(ballot));
        base = __shfl_sync(0xffffffffu, base, __ffs(ballot) - 1);
        if (take) {
          const u32 slot = base + __popc(ballot & lanes_below);
          if (slot < T::stage) {
            s_index[slot] = static_cast<u32>(i);
            s_value[slot] = p;
          } else {
            // A crowded tile: straight to global memory.
            const u64 at = atomicAdd(&search[tl.segment].candidates, 1ull);
            if (at < sg.candidate_capacity) {
              cand_index[sg.candidate_begin + at] = static_cast<u32>(i);
              cand_value[sg.candidate_begin + at] = p;
            }
          }
        }
      }
    }
    __syncthreads();
    const u32 staged = s_count < T::stage ? s_count : static_cast<u32>(T::stage);
    if (threadIdx.x == 0 && staged > 0)
      s_base = atomicAdd(&search[tl.segment].candidates, static_cast<u64>(staged));
    __syncthreads();
    for (u32 j = threadIdx.x; j < staged; j += T::block_threads) {
      const u64 at = s_base + j;
      if (at < sg.candidate_capacity) {
        cand_index[sg.candidate_begin + at] = s_index[j];
        cand_value[sg.candidate_begin + at] = s_value[j];
      }
    }
    __syncthreads();
  }
}

// The candidates serve when they hold at least k entries and none was lost to the capacity.
template <class = void>
__global__ void decide_kernel(const segment* segs, u32 count, search_state* search, control* ctl) {
  const u32 t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= count) return;
  search_state& s = search[t];
  if (s.done) return;
  const bool fast = s.candidates >= segs[t].k && s.candidates <= segs[t].candidate_capacity;
  s.full = fast ? 0u : 1u;
  if (!fast) atomicAdd(&ctl->full_segments, 1u);
}

// Calls f(index, value) for every entry of tile `tl` that the tensor's search reads this step.
template <class F>
__device__ inline void for_each_entry(const tile& tl, const segment& sg, const search_state& s,
                                      const float* __restrict__ p, const u32* __restrict__ cand_index,
                                      const float* __restrict__ cand_value, F&& f) {
  if (tl.over_candidates) {
    const u64 end = least(tl.end, least(s.candidates, sg.candidate_capacity));
    for (u64 j = tl.begin + threadIdx.x; j < end; j += T::block_threads)
      f(cand_index[sg.candidate_begin + j], cand_value[sg.candidate_begin + j]);
  } else {
    for (u64 i = tl.begin + threadIdx.x; i < tl.end; i += T::block_threads)
      f(static_cast<u32>(i), p[i]);
  }
}

// Whether tile `tl` is of the kind the tensor's search reads this step (values or candidates). Value tiles
// are skipped wholesale when no tensor reads its values (first_tile).
__device__ inline bool tile_read(const tile& tl, const search_state& s) {
  return (tl.over_candidates != 0) == reads_candidates(s);
}

// Whether a digit pass walks tile `tl`: its tensor is still searching and reads tiles of that kind.
__device__ inline bool tile_wanted(const tile& tl, const search_state& s) {
  return !s.done && tile_read(tl, s);
}

__device__ inline u64 first_tile(const control* ctl, u64 value_tiles) {
  return ctl->full_segments == 0 ? value_tiles : 0;
}

template <class = void>
__global__ void __launch_bounds__(T::block_threads)
    digit_kernel(int pass, const tile* tiles, u64 tile_count, u64 value_tiles, const segment* segs,
                 const search_state* search, state_buffers buf, const u32* __restrict__ cand_index,
                 const float* __restrict__ cand_value, u32* __restrict__ hist, const control* ctl) {
  if (ctl->searching == 0) return; // every search ended at an earlier digit
  __shared__ u32 s_hist[T::digit_bins];
  for (int b = threadIdx.x; b < T::digit_bins; b += T::block_threads)
    s_hist[b] = 0;
  __syncthreads();
  const float* p = buf.e[1 - ctl->phase];
  const int shift = digit_shift(pass);
  const int above = shift + digit_width(pass);
  const u32 mask = (1u << digit_width(pass)) - 1u;
  for (u64 ti = first_tile(ctl, value_tiles) + blockIdx.x; ti < tile_count; ti += gridDim.x) {
    const tile tl = tiles[ti];
    const search_state s = search[tl.segment];
    if (!tile_wanted(tl, s)) continue; // uniform across the block
    for_each_entry(tl, segs[tl.segment], s, p, cand_index, cand_value, [&](u32 index, float v) {
      const u64 c = composite(select::magnitude_key(v), index);
      if (matches(c, s.prefix, above)) atomicAdd(&s_hist[(c >> shift) & mask], 1u);
    });
    __syncthreads();
    u32* h = hist + static_cast<u64>(tl.segment) * T::digit_bins;
    for (int b = threadIdx.x; b < T::digit_bins; b += T::block_threads) {
      const u32 v = s_hist[b];
      if (v) {
        atomicAdd(&h[b], v);
        s_hist[b] = 0;
      }
    }
    __syncthreads();
  }
}

// One block per tensor: finds the bin holding the rank still needed, narrows the prefix, and clears the
// histogram for the next pass.
template <class = void>
__global__ void __launch_bounds__(T::block_threads)
    settle_kernel(int pass, search_state* search, u32* __restrict__ hist, control* ctl) {
  constexpr int per = T::digit_bins / T::block_threads;
  __shared__ u64 s_sum[T::block_threads];
  search_state& s = search[blockIdx.x];
  if (s.done) return; // uniform
  u32* h = hist + static_cast<u64>(blockIdx.x) * T::digit_bins;
  const int first = threadIdx.x * per;
  u32 mine[per];
  u64 total = 0;
#pragma unroll
  for (int j = 0; j < per; ++j) {
    mine[j] = h[first + j];
    total += mine[j];
    h[first + j] = 0;
  }
  s_sum[threadIdx.x] = total;
  __syncthreads();
  // Keys above this thread's bins: a suffix sum (256 entries, read by each thread; cheap at this size).
  u64 above = 0;
  for (int t = threadIdx.x + 1; t < T::block_threads; ++t)
    above += s_sum[t];
  const u64 need = s.need;
  __shared__ int s_found;
  if (threadIdx.x == 0) s_found = 0;
  __syncthreads();
  if (above < need && above + total >= need) {
    u64 acc = above;
    for (int j = per - 1; j >= 0; --j) {
      if (acc + mine[j] >= need) {
        const int shift = digit_shift(pass);
        s.prefix |= static_cast<u64>(first + j) << shift;
        s.need = need - acc;
        if (mine[j] == need - acc) {
          s.done = 1;
          atomicSub(&ctl->searching, 1u);
        }
        s_found = 1;
        break;
      }
      acc += mine[j];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && !s_found) {
    // The bins hold fewer entries than the search still needs: select nothing more and report.
    atomicOr(&ctl->broken, 1u);
    s.done = 1;
    s.prefix = ~0ull;
    atomicSub(&ctl->searching, 1u);
  }
}

// Every entry at or above the tensor's least selected composite goes to the message; its place in the next
// state is set to +0.
template <class = void>
__global__ void __launch_bounds__(T::block_threads)
    emit_kernel(const tile* tiles, u64 tile_count, u64 value_tiles, const segment* segs, search_state* search,
                state_buffers buf, bool mask_momentum, const u32* __restrict__ cand_index,
                const float* __restrict__ cand_value, u32* __restrict__ out_index,
                float* __restrict__ out_value, const control* ctl) {
  const u32 phase = ctl->phase;
  float* p = buf.e[1 - phase];
  float* u_out = mask_momentum ? buf.u[1 - phase] : nullptr;
  const bool refused = ctl->status.grad_count + ctl->status.sum_count > 0;
  const int lane = threadIdx.x & 31;
  for (u64 ti = first_tile(ctl, value_tiles) + blockIdx.x; ti < tile_count; ti += gridDim.x) {
    const tile tl = tiles[ti];
    const search_state s = search[tl.segment];
    if (!tile_read(tl, s)) continue; // uniform across the block
    const segment sg = segs[tl.segment];
    // Warp-uniform trip count, so that the ballot sees every lane.
    const u64 end = tl.over_candidates ? least(tl.end, least(s.candidates, sg.candidate_capacity)) : tl.end;
    for (u64 base = tl.begin; base < end; base += T::block_threads) {
      const u64 j = base + threadIdx.x;
      u32 index = 0;
      float v = 0.0f;
      bool take = false;
      if (j < end) {
        if (tl.over_candidates) {
          index = cand_index[sg.candidate_begin + j];
          v = cand_value[sg.candidate_begin + j];
        } else {
          index = static_cast<u32>(j);
          v = p[j];
        }
        take = composite(select::magnitude_key(v), index) >= s.prefix;
      }
      const u32 ballot = __ballot_sync(0xffffffffu, take);
      if (!ballot) continue;
      u64 slot = 0;
      if (lane == __ffs(ballot) - 1)
        slot = atomicAdd(&search[tl.segment].sent, static_cast<u64>(__popc(ballot)));
      slot = __shfl_sync(0xffffffffu, slot, __ffs(ballot) - 1) + __popc(ballot & ((1u << lane) - 1u));
      if (take && slot < sg.k) {
        out_index[sg.message_begin + slot] = index;
        out_value[sg.message_begin + slot] = refused ? __int_as_float(0x7fc00000) : v;
        p[index] = 0.0f;
        if (u_out) u_out[index] = 0.0f;
      }
    }
  }
}

// Next floors and statistics per tensor, then the commit (one block).
template <class = void>
__global__ void __launch_bounds__(T::block_threads)
    finalize_kernel(const segment* segs, u32 count, const search_state* search, warm_state* warm,
                    control* ctl) {
  const bool refused = ctl->status.grad_count + ctl->status.sum_count > 0;
  for (u32 t = threadIdx.x; t < count; t += blockDim.x) {
    const search_state& s = search[t];
    const segment& sg = segs[t];
    if (s.sent != sg.k) atomicOr(&ctl->broken, 2u);
    if (refused || sg.k == 0) continue;
    warm_state& w = warm[t];
    if (s.full) {
      ++w.full_steps;
      if (w.has_threshold) {
        w.margin = s.candidates < sg.k ? fminf(2.0f * w.margin, T::most_margin)
                                       : fmaxf(0.5f * w.margin, T::least_margin);
      }
    } else {
      ++w.fast_steps;
    }
    // The k-th key (a lower bound of it when the search stopped before its last key digit).
    const u32 key = static_cast<u32>(s.prefix >> 32);
    w.threshold_key = key;
    w.has_threshold = 1;
    w.floor_key = select::magnitude_key(__fmul_rn(__uint_as_float(key), 1.0f - w.margin));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ctl->searching = 0; // normally 0 already; a broken search may have left some
    if (refused) {
      if (ctl->refused == 0) {
        ctl->first_refusal = ctl->status;
        ctl->first_refused_step = ctl->committed;
      }
      ++ctl->refused;
    } else {
      ++ctl->committed;
      ctl->phase ^= 1u;
    }
  }
}

} // namespace commsgd::inline v1::cuda::detail::batched
