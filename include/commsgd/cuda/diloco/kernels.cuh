// The device round's kernels (cuda/diloco/fragment.cuh drives them). Every value's arithmetic is
// sync/diloco_math.hpp's and compress/block_quant.hpp's codes, the host engine's own functions, so a
// device round gives the host engine's bits.
#pragma once

#include <commsgd/compress/block_quant.hpp>
#include <commsgd/sync/diloco_math.hpp>

#include <cfloat>
#include <cstddef>
#include <cstdint>

namespace commsgd::inline v1::cuda::detail::diloco {

// A fragment's values lie in runs of the flat model: run j holds fragment values [begin[j], begin[j + 1])
// at flat offsets offset[j], .... Fragments have a few runs (one per layer at most), so a binary search per
// value reads a handful of cached words.
struct run_table {
  const std::uint64_t* begin = nullptr;  // runs + 1 entries, begin[0] = 0, begin[runs] = the length
  const std::uint64_t* offset = nullptr; // runs entries
  int runs = 0;
};

__device__ inline std::uint64_t flat_index(const run_table& t, std::uint64_t i) {
  int lo = 0, hi = t.runs - 1; // the last run whose begin <= i
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.begin[mid] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return t.offset[lo] + (i - t.begin[lo]);
}

// What a kernel found wrong: the count of non-finite values and the lowest index among them.
struct device_verdict {
  unsigned long long count;
  unsigned long long first;
};

__device__ inline void note_non_finite(device_verdict* v, std::uint64_t i) {
  atomicAdd(&v->count, 1ull);
  atomicMin(&v->first, static_cast<unsigned long long>(i));
}

// A template, so that every .cu including this header may hold it (as an inline function).
template <class = void>
__global__ void gather_kernel(run_table t, std::uint64_t length, const float* params, float* out) {
  const std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i < length) out[i] = params[flat_index(t, i)];
}

// Dense: the message is the pseudo-gradient itself.
template <class = void>
__global__ void dense_encode_kernel(run_table t, std::uint64_t length, const float* global,
                                    const float* params, float weight, float* out, device_verdict* v) {
  const std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= length) return;
  const float d = sync::math::pseudo_gradient(global[i], params[flat_index(t, i)], weight);
  if (!isfinite(d)) note_non_finite(v, i);
  out[i] = d;
}

__device__ inline float block_max(float x, float* shared) {
  for (int o = 16; o > 0; o >>= 1)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1)
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    if (lane == 0) shared[0] = x;
  }
  __syncthreads();
  return shared[0];
}

// One CUDA block per code block (blockDim = block_size, a multiple of 32, at most 1024): the block's scale
// max |p|, then each value's code, packed as compress/bit_pack.hpp lays it out. Message: the scales (4 bytes
// each), then the codes.
template <class Code>
__global__ void block_encode_kernel(run_table t, std::uint64_t length, const float* global,
                                    const float* params, float weight, std::uint64_t blocks, std::byte* msg,
                                    device_verdict* v) {
  __shared__ float shared[32];
  const std::uint64_t k = blockIdx.x;
  const std::uint64_t i = k * blockDim.x + threadIdx.x;
  const bool here = i < length;
  const float p = here ? sync::math::pseudo_gradient(global[i], params[flat_index(t, i)], weight) : 0.0f;
  if (here && !isfinite(p)) note_non_finite(v, i);
  const float s = block_max(here ? fabsf(p) : 0.0f, shared);
  if (threadIdx.x == 0) reinterpret_cast<float*>(msg)[k] = s;
  // A non-finite value refuses the round on every rank, so its message is never read; its codes are 0.
  const std::uint32_t code = here && isfinite(p) && isfinite(s) ? compress::block_code<Code>(p, s) : 0u;
  std::byte* codes = msg + 4 * blocks;
  if constexpr (Code::bits == 8) {
    if (here) codes[i] = static_cast<std::byte>(code);
  } else {
    static_assert(Code::bits == 4, "the device round packs 8- and 4-bit codes");
    // Value i is the low nibble of byte i / 2 when i is even; block_size is even, so each byte's two values
    // are neighbours in one warp.
    const std::uint32_t high = __shfl_down_sync(0xffffffffu, code, 1);
    if (here && i % 2 == 0) codes[i / 2] = static_cast<std::byte>(code | (high << 4));
  }
}

// Block k's scale in a message. A message is 4 blocks + the codes' bytes long, so in the gathered messages
// rank r's starts at r times that, which need not be a multiple of 4: then the scale is read byte by byte.
__device__ inline float load_scale(const std::byte* msg, std::uint64_t k) {
  const std::byte* p = msg + 4 * k;
  if ((reinterpret_cast<std::uintptr_t>(p) & 3u) == 0) return *reinterpret_cast<const float*>(p);
  std::uint32_t u = 0;
  for (int j = 0; j < 4; ++j)
    u |= static_cast<std::uint32_t>(p[j]) << (8 * j); // the host's byte order: little-endian, as the device's
  return __uint_as_float(u);
}

template <class Code>
__device__ inline float decode_value(const std::byte* msg, std::uint64_t blocks, std::uint64_t k,
                                     std::uint64_t i) {
  const float s = load_scale(msg, k);
  const std::byte* codes = msg + 4 * blocks;
  std::uint32_t code;
  if constexpr (Code::bits == 8)
    code = static_cast<std::uint32_t>(codes[i]);
  else
    code = (static_cast<std::uint32_t>(codes[i / 2]) >> (4 * (i % 2))) & 15u;
  return Code::decode(code, s);
}

// Whether some sum of a code block may not be finite: decoded values are at most the block's scale, so a
// block whose scales add up (in double, exactly enough) well below FLT_MAX sums finitely in float. Only the
// other blocks (none, but for pseudo-gradients near FLT_MAX) are summed here, as the step kernel would, and
// their non-finite sums counted: the step runs only when there are none, as the host engine refuses a sum
// before it changes anything. One thread a code block: the scales are all it reads in the usual case, and a
// CUDA block a code block would launch a quarter of a million blocks at 2^26 values that do nothing else.
template <class Code>
__global__ void block_check_kernel(std::uint64_t length, std::uint64_t block_size, std::uint64_t blocks,
                                   const std::byte* all, std::uint64_t bytes, int n, device_verdict* v) {
  const std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (k >= blocks) return;
  double bound = 0.0;
  for (int r = 0; r < n; ++r)
    bound += fabs(static_cast<double>(load_scale(all + r * bytes, k))); // a corrupt peer's negative scale too
  if (bound <= 0.5 * FLT_MAX) return;
  for (std::uint64_t i = k * block_size; i < min(length, (k + 1) * block_size); ++i) {
    float sum = 0.0f;
    for (int r = 0; r < n; ++r)
      sum = sync::math::add_rn(sum, decode_value<Code>(all + r * bytes, blocks, k, i));
    if (!isfinite(sum)) note_non_finite(v, i);
  }
}

template <class = void>
__global__ void dense_check_kernel(std::uint64_t length, const float* sum, device_verdict* v) {
  const std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i < length && !isfinite(sum[i])) note_non_finite(v, i);
}

struct step_args {
  run_table runs;
  std::uint64_t length;
  float ranks, lr, momentum, alpha;
  float* global;
  float* velocity; // unused without momentum
  float* params;
  device_verdict* verdict;   // the check kernel's count: the step is skipped when it counted anything
  const device_verdict* own; // encode's count: a rank whose own values are not finite never steps
};

__device__ inline void step_value(const step_args& a, std::uint64_t i, float sum) {
  float v = a.momentum == 0.0f ? 0.0f : a.velocity[i];
  const float g = sync::math::outer_step(a.global[i], sum, a.ranks, a.lr, a.momentum, &v);
  a.global[i] = g;
  if (a.momentum != 0.0f) a.velocity[i] = v;
  float& x = a.params[flat_index(a.runs, i)];
  if (a.alpha == 0.0f)
    x = g; // the parameters are not read
  else
    x = sync::math::merge(g, x, a.alpha);
}

template <class = void>
__global__ void dense_step_kernel(step_args a, const float* sum) {
  if (a.verdict->count != 0 || a.own->count != 0) return;
  const std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i < a.length) step_value(a, i, sum[i]);
}

// Decode the n messages and sum them in rank order from +0 (the host's gather-and-sum), then the outer
// step and the merge: one pass over the model.
template <class Code>
__global__ void block_step_kernel(step_args a, std::uint64_t block_size, std::uint64_t blocks,
                                  const std::byte* all, std::uint64_t bytes, int n) {
  if (a.verdict->count != 0 || a.own->count != 0) return;
  const std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= a.length) return;
  const std::uint64_t k = i / block_size;
  float sum = 0.0f;
  for (int r = 0; r < n; ++r)
    sum = sync::math::add_rn(sum, decode_value<Code>(all + r * bytes, blocks, k, i));
  step_value(a, i, sum);
}

} // namespace commsgd::inline v1::cuda::detail::diloco
