// The device round's kernels for the top-k codes (compress/top_k_ef.hpp's arithmetic and message, bit for
// bit): one CUDA block a chunk forms p = g + decay e (the weighted pseudo-gradient and the residual), selects
// the chunk's k largest |p| exactly (a radix select over the magnitude keys in shared memory, ties to the
// lowest index), writes the values (floats, or the chunk's scale and 2-bit codes) and the chunk-relative
// indices into the message, and the new residual beside the old one (kept until the round succeeds).
// Applying sums each chunk's pairs from the n messages in shared memory, in rank order, counting the senders
// of each value, and steps; the model is read and written once, the messages twice.
#pragma once

#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/cost/top_k_plan.hpp>
#include <commsgd/cuda/diloco/kernels.cuh>
#include <commsgd/select/key.hpp>

#include <cstddef>
#include <cstdint>

namespace commsgd::inline v1::cuda::detail::diloco {

// The largest chunk the encode kernel holds in shared memory.
inline constexpr std::uint64_t top_k_max_chunk = 4096;
inline constexpr unsigned top_k_threads = 256;

// ORs `width` bits of v at bit `bit` of a zeroed, 4-aligned message (the stream order of
// compress/bit_pack.hpp: bit j is bit j % 8 of byte j / 8, which is bit j % 32 of little-endian word j / 32).
__device__ inline void or_bits(std::uint32_t* words, std::uint64_t bit, std::uint32_t v, unsigned width) {
  const std::uint64_t w = bit / 32;
  const unsigned shift = static_cast<unsigned>(bit % 32);
  atomicOr(words + w, v << shift);
  if (shift + width > 32) atomicOr(words + w + 1, v >> (32 - shift));
}

// `width` bits (at most 25) at bit `bit` of message m, read byte by byte (m need not be aligned, and no byte
// past the field is read).
__device__ inline std::uint32_t read_bits(const std::byte* m, std::uint64_t bit, unsigned width) {
  const std::uint64_t first = bit / 8, last = (bit + width - 1) / 8;
  std::uint64_t acc = 0;
  for (std::uint64_t b = first; b <= last; ++b)
    acc |= static_cast<std::uint64_t>(static_cast<std::uint32_t>(m[b])) << (8 * (b - first));
  return static_cast<std::uint32_t>((acc >> (bit % 8)) & ((std::uint64_t{1} << width) - 1));
}

struct top_k_encode_args {
  run_table runs;
  cost::top_k_plan c;
  const float* global;
  const float* params;
  float weight, decay;
  const float* e; // the residual, its low part
  const float* r;
  float* e_next; // the residual after this round, should it succeed
  float* r_next;
  std::uint32_t* sel_index; // k scratch: each chunk's selection, chunk-relative, in index order
  float* sel_value;
  std::byte* msg; // zeroed, 4-aligned, padded to whole words
  device_verdict* verdict;
};

// Inclusive block-wide prefix sum of one value a thread (top_k_threads threads).
__device__ inline std::uint32_t block_inclusive_scan(std::uint32_t x, std::uint32_t* shared) {
  const unsigned t = threadIdx.x;
  shared[t] = x;
  __syncthreads();
  for (unsigned o = 1; o < top_k_threads; o <<= 1) {
    const std::uint32_t y = t >= o ? shared[t - o] : 0u;
    __syncthreads();
    shared[t] += y;
    __syncthreads();
  }
  const std::uint32_t out = shared[t];
  __syncthreads();
  return out;
}

template <class = void>
__global__ void __launch_bounds__(top_k_threads) top_k_encode_kernel(top_k_encode_args a) {
  __shared__ float p[top_k_max_chunk];
  __shared__ std::uint32_t hist[256];
  __shared__ std::uint32_t scan[top_k_threads];
  __shared__ std::uint32_t pick[2]; // the threshold key, the ties to take
  __shared__ float scale;
  const unsigned t = threadIdx.x;
  const std::uint64_t j = blockIdx.x;
  const std::uint64_t first = j * a.c.size, len = a.c.length(j), kj = a.c.k_of(j), at = j * a.c.k_full;

  // p, and the residual as it stays where nothing is sent (p - 0: e = p, r = +0).
  for (std::uint64_t i = t; i < len; i += top_k_threads) {
    const std::uint64_t gi = first + i;
    const float g = sync::math::pseudo_gradient(a.global[gi], a.params[flat_index(a.runs, gi)], a.weight);
    const float v = compress::accumulate_value(g, a.e[gi], a.r[gi], a.decay);
    if (!isfinite(v)) note_non_finite(a.verdict, gi);
    p[i] = v;
    compress::split_difference(v, 0.0f, a.e_next[gi], a.r_next[gi]);
  }
  __syncthreads();

  // The kj-th largest key, a byte at a time from the top: prefix holds the bytes found so far.
  std::uint32_t prefix = 0, mask = 0, remaining = static_cast<std::uint32_t>(kj);
  for (int shift = 24; shift >= 0 && kj > 0; shift -= 8) {
    hist[t] = 0; // top_k_threads == 256 buckets
    __syncthreads();
    for (std::uint64_t i = t; i < len; i += top_k_threads) {
      const std::uint32_t key = select::magnitude_key(p[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (t == 0) {
      std::uint32_t above = 0, b = 255;
      for (;; --b) {
        if (above + hist[b] >= remaining || b == 0) break;
        above += hist[b];
      }
      pick[0] = prefix | (b << shift);
      pick[1] = remaining - above;
    }
    __syncthreads();
    prefix = pick[0];
    remaining = pick[1];
    mask |= 255u << shift;
    __syncthreads();
  }
  const std::uint32_t key_t = prefix, ties_wanted = remaining; // after the last byte: keys equal to key_t

  // Compaction in index order: thread t holds the contiguous run [t per, (t + 1) per) of the chunk.
  const std::uint64_t per = (len + top_k_threads - 1) / top_k_threads;
  const std::uint64_t lo = t * per < len ? t * per : len, hi = lo + per < len ? lo + per : len;
  std::uint32_t above = 0, ties = 0;
  if (kj > 0)
    for (std::uint64_t i = lo; i < hi; ++i) {
      const std::uint32_t key = select::magnitude_key(p[i]);
      above += key > key_t ? 1u : 0u;
      ties += key == key_t ? 1u : 0u;
    }
  const std::uint32_t ties_before = block_inclusive_scan(ties, scan) - ties;
  const std::uint32_t tie_take =
      ties_before >= ties_wanted ? 0u : (ties_wanted - ties_before < ties ? ties_wanted - ties_before : ties);
  const std::uint32_t take = above + tie_take;
  std::uint64_t out = at + (block_inclusive_scan(take, scan) - take);
  if (kj > 0) {
    std::uint32_t tie_seen = 0;
    for (std::uint64_t i = lo; i < hi; ++i) {
      const std::uint32_t key = select::magnitude_key(p[i]);
      if (key > key_t || (key == key_t && tie_seen++ < tie_take)) {
        a.sel_index[out] = static_cast<std::uint32_t>(i);
        a.sel_value[out] = p[i];
        ++out;
      }
    }
  }
  __syncthreads(); // the selection (global memory) is complete for the block

  // The chunk's scale: the mean |value| of its selection, summed in double in index order as the host does.
  if (a.c.two_bit && t == 0) {
    double sum = 0.0;
    for (std::uint64_t q = at; q < at + kj; ++q)
      sum += fabs(static_cast<double>(a.sel_value[q]));
    scale = kj == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(kj));
    std::uint32_t u = __float_as_uint(scale);
    or_bits(reinterpret_cast<std::uint32_t*>(a.msg), 32 * j, u, 32);
  }
  __syncthreads();

  // Values, indices, and the residual of the values sent: p - what the message decodes to.
  auto* words = reinterpret_cast<std::uint32_t*>(a.msg);
  for (std::uint64_t q = at + t; q < at + kj; q += top_k_threads) {
    const std::uint32_t rel = a.sel_index[q];
    const float v = a.sel_value[q];
    float sent = v;
    if (a.c.two_bit) {
      const std::uint32_t code = compress::two_bit_code::encode(v, scale);
      or_bits(words, 8 * a.c.code_offset + 2 * q, code, 2);
      sent = compress::two_bit_code::decode(code, scale);
    } else {
      or_bits(words, 32 * q, __float_as_uint(v), 32);
    }
    or_bits(words, 8 * a.c.index_offset + static_cast<std::uint64_t>(a.c.index_bits) * q, rel,
            a.c.index_bits);
    compress::split_difference(v, sent, a.e_next[first + rel], a.r_next[first + rel]);
  }
}

// The chunk-relative index of pair q of message m.
__device__ inline std::uint32_t rel_at(const cost::top_k_plan& c, const std::byte* m, std::uint64_t q) {
  return read_bits(m, 8 * c.index_offset + static_cast<std::uint64_t>(c.index_bits) * q, c.index_bits);
}

// Pair q of message m (q counted over all chunks; chunk j holds pairs [j k_full, j k_full + k_of(j))): its
// index relative to chunk j and its decoded value; false for an index outside the chunk (a corrupt peer).
__device__ inline bool top_k_pair(const cost::top_k_plan& c, const std::byte* m, std::uint64_t j,
                                  std::uint64_t q, std::uint32_t& rel, float& value) {
  rel = rel_at(c, m, q);
  if (rel >= c.length(j)) return false;
  if (c.two_bit)
    value = compress::two_bit_code::decode(read_bits(m, 8 * c.code_offset + 2 * q, 2), load_scale(m, j));
  else
    value = load_scale(m, q); // the float at byte 4 q
  return true;
}

// Chunk j's sum over the n gathered messages into shared memory, as the host adds them: from +0, rank by
// rank (a barrier between ranks keeps the order; a message's indices are distinct, so no two threads of one
// rank touch one value), with the count of senders of each value. Returns the sums' scale: n / senders
// applied by top_k_value. Every thread of the block must call it.
__device__ inline void top_k_chunk_sum(const cost::top_k_plan& c, std::uint64_t j, const std::byte* all,
                                       std::uint64_t bytes, int n, float* acc, std::uint16_t* senders,
                                       device_verdict* corrupt) {
  const std::uint64_t len = c.length(j), kj = c.k_of(j), at = j * c.k_full;
  for (std::uint64_t i = threadIdx.x; i < len; i += blockDim.x) {
    acc[i] = 0.0f;
    senders[i] = 0;
  }
  __syncthreads();
  for (int r = 0; r < n; ++r) {
    const std::byte* m = all + static_cast<std::uint64_t>(r) * bytes;
    for (std::uint64_t q = at + threadIdx.x; q < at + kj; q += blockDim.x) {
      std::uint32_t rel;
      float x;
      // A message's indices rise within a chunk (the encoder writes them in index order); one that does not
      // is a corrupt peer's, and two equal ones would race on one value.
      const bool rises = q == at || rel_at(c, m, q - 1) < rel_at(c, m, q);
      if (!rises || !top_k_pair(c, m, j, q, rel, x)) {
        if (corrupt) note_non_finite(corrupt, q);
        continue;
      }
      acc[rel] = sync::math::add_rn(acc[rel], x);
      senders[rel] = static_cast<std::uint16_t>(senders[rel] + 1);
    }
    __syncthreads();
  }
}

__device__ inline float top_k_value(const float* acc, const std::uint16_t* senders, bool sender_mean, int n,
                                    std::uint64_t i) {
  return sender_mean ? compress::over_senders_value(acc[i], senders[i], static_cast<std::uint32_t>(n))
                     : acc[i];
}

// Pass 1 of applying: every chunk's sums, counted where they are not finite (each value once) and where a
// message holds an index outside its chunk. Reads only the messages.
template <class = void>
__global__ void __launch_bounds__(top_k_threads)
    top_k_check_kernel(cost::top_k_plan c, const std::byte* all, std::uint64_t bytes, int n, bool sender_mean,
                       device_verdict* sum_verdict, device_verdict* corrupt) {
  __shared__ float acc[top_k_max_chunk];
  __shared__ std::uint16_t senders[top_k_max_chunk];
  const std::uint64_t j = blockIdx.x;
  top_k_chunk_sum(c, j, all, bytes, n, acc, senders, corrupt);
  for (std::uint64_t i = threadIdx.x; i < c.length(j); i += blockDim.x)
    if (!isfinite(top_k_value(acc, senders, sender_mean, n, i))) note_non_finite(sum_verdict, j * c.size + i);
}

// Pass 2, when pass 1 counted nothing: the sums again (from the messages, a small fraction of the model's
// bytes), the outer step and the merge, chunk by chunk.
template <class = void>
__global__ void __launch_bounds__(top_k_threads)
    top_k_step_kernel(step_args a, cost::top_k_plan c, const std::byte* all, std::uint64_t bytes, int n,
                      bool sender_mean, const device_verdict* corrupt) {
  __shared__ float acc[top_k_max_chunk];
  __shared__ std::uint16_t senders[top_k_max_chunk];
  if (a.verdict->count != 0 || a.own->count != 0 || corrupt->count != 0) return;
  const std::uint64_t j = blockIdx.x;
  top_k_chunk_sum(c, j, all, bytes, n, acc, senders, nullptr);
  for (std::uint64_t i = threadIdx.x; i < c.length(j); i += blockDim.x)
    step_value(a, j * c.size + i, top_k_value(acc, senders, sender_mean, n, i));
}

} // namespace commsgd::inline v1::cuda::detail::diloco
