// Pieces shared by the GPU benchmarks: timing with CUDA events, order statistics and the results file
// (bench_json.hpp) for all of them; for the steady-state ones (step_gpu_bench.cu, batched_gpu_bench.cu,
// diloco_round_gpu_bench.cu) raw gradients drawn on the device every step, the memory-floor kernel, and the
// end-of-run checks of an error-feedback step (conservation of the sum, exactness of the sent set).
#pragma once

#include "bench_json.hpp"

#include <commsgd/cuda.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace bench {

namespace cu = commsgd::cuda;
using u64 = std::uint64_t;

// A counter-based hash (splitmix64): every element drawn independently, no generator state, the same
// numbers on any GPU.
__host__ __device__ inline u64 mix(u64 z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ inline float unit(u64 h) {
  return (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

__device__ inline void store(float* g, u64 i, float v) {
  g[i] = v;
}
__device__ inline void store(__nv_bfloat16* g, u64 i, float v) {
  g[i] = __float2bfloat16_rn(v);
}
__device__ inline float load(const float* g, u64 i) {
  return g[i];
}
__device__ inline float load(const __nv_bfloat16* g, u64 i) {
  return __bfloat162float(g[i]);
}

// The gradient law of the steady-state benchmarks, as training makes it, with consecutive steps correlated:
//   g_i(t) = s(t) * c_i * r_i(t)
// r_i(t): fresh every step, the relu_like law of select_gpu_bench (13 % exact zeros, else a product of two
//         exponentials with a random sign);
// c_i:    fixed per coordinate: exp(0.5 z_i), z_i standard normal (parameters of different layers and roles
//         have different scales), times 8 on a fixed sparse set of 0.2 % of the coordinates (the coordinates
//         that stay large from step to step);
// s(t):   1e-3 * (1 + 0.25 sin(2 pi t / 64)): a slow drift of the overall scale.
struct gradient_law {
  u64 seed = 0x5eed5eedull;
  float hot_fraction = 0.002f;
  float hot_factor = 8.0f;
};

__host__ __device__ inline float drift_scale(u64 step) {
  return 1e-3f * (1.0f + 0.25f * sinf(6.2831853f * static_cast<float>(step % 64) / 64.0f));
}

template <class G>
__global__ void raw_gradient_kernel(G* __restrict__ g, u64 n, u64 step, gradient_law law) {
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  const float s = drift_scale(step);
  const u64 fixed_seed = mix(law.seed);
  const u64 step_seed = mix(law.seed ^ mix(step + 1));
  for (u64 i = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    // Fixed per coordinate.
    const u64 f1 = mix(fixed_seed ^ (2 * i));
    const u64 f2 = mix(fixed_seed ^ (2 * i + 1));
    const float z = sqrtf(-2.0f * logf(unit(f1))) * cospif(2.0f * unit(f2));
    float c = expf(0.5f * z);
    if (unit(mix(f1 ^ f2)) < law.hot_fraction) c *= law.hot_factor;
    // Fresh every step.
    const u64 h1 = mix(step_seed ^ (2 * i));
    const u64 h2 = mix(step_seed ^ (2 * i + 1));
    const float sign = (h1 & 1) ? 1.0f : -1.0f;
    const float r = unit(h2) < 0.13f ? 0.0f : sign * logf(unit(h1)) * logf(unit(mix(h2)));
    store(g, i, s * c * r);
  }
}

template <class G>
void draw_gradient(G* g, u64 n, u64 step, cudaStream_t stream = nullptr, gradient_law law = {}) {
  const u64 blocks = std::min<u64>((n + 255) / 256, 132ull * 16);
  raw_gradient_kernel<G>
      <<<static_cast<unsigned>(std::max<u64>(blocks, 1)), 256, 0, stream>>>(g, n, step, law);
  cu::check_launch("raw_gradient_kernel");
}

// The memory floor of one error-feedback step: read g, read e, write e (12 N bytes for float gradients,
// 10 N for bf16). The arithmetic keeps e bounded and cannot be optimised away.
template <class G>
__global__ void floor_kernel(const G* __restrict__ g, float* __restrict__ e, u64 n) {
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 i = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; i < n; i += stride)
    e[i] = 0.5f * e[i] + load(g, i);
}

template <class G>
void floor_step(const G* g, float* e, u64 n, cudaStream_t stream = nullptr) {
  const u64 blocks = std::min<u64>((n + 255) / 256, 132ull * 16);
  floor_kernel<G><<<static_cast<unsigned>(std::max<u64>(blocks, 1)), 256, 0, stream>>>(g, e, n);
  cu::check_launch("floor_kernel");
}

// sum and sum of |x| in double, on the device (atomics over block partial sums).
template <class G>
__global__ void sum_kernel(const G* __restrict__ x, u64 n, double* out) {
  __shared__ double s_sum[256], s_abs[256];
  double sum = 0, abs_sum = 0;
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 i = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const double v = load(x, i);
    sum += v;
    abs_sum += fabs(v);
  }
  s_sum[threadIdx.x] = sum;
  s_abs[threadIdx.x] = abs_sum;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) {
      s_sum[threadIdx.x] += s_sum[threadIdx.x + w];
      s_abs[threadIdx.x] += s_abs[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(&out[0], s_sum[0]);
    atomicAdd(&out[1], s_abs[0]);
  }
}

struct sums {
  double sum = 0, abs_sum = 0;
};

template <class G>
sums device_sums(const G* x, u64 n, cudaStream_t stream = nullptr) {
  cu::device_buffer<double> out(2);
  cu::check(cudaMemsetAsync(out.data(), 0, 2 * sizeof(double), stream), "cudaMemsetAsync");
  if (n > 0) {
    sum_kernel<G>
        <<<static_cast<unsigned>(std::min<u64>((n + 255) / 256, 1024)), 256, 0, stream>>>(x, n, out.data());
    cu::check_launch("sum_kernel");
  }
  double h[2];
  cu::check(cudaMemcpyAsync(h, out.data(), sizeof h, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  cu::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return {h[0], h[1]};
}

inline sums host_sums(const float* x, std::size_t n) {
  sums s;
  for (std::size_t i = 0; i < n; ++i) {
    s.sum += x[i];
    s.abs_sum += std::fabs(static_cast<double>(x[i]));
  }
  return s;
}

// Conservation of one error-feedback step: sent + new residual == old residual + gradient, element by
// element up to the one rounding of p = g + e (|fl(a + b) - (a + b)| <= 2^-24 |a + b|), so the sums agree
// within 2^-24 (sum|g| + sum|e_old|) plus the double sums' own error.
struct conservation {
  double lhs = 0, rhs = 0, bound = 0;
  bool ok() const { return std::fabs(lhs - rhs) <= bound; }
};

inline conservation check_conservation(sums old_residual, sums gradient, sums sent, sums new_residual,
                                       std::size_t n) {
  conservation c;
  c.lhs = sent.sum + new_residual.sum;
  c.rhs = old_residual.sum + gradient.sum;
  const double mass = old_residual.abs_sum + gradient.abs_sum;
  c.bound = mass * (std::ldexp(1.0, -24) + 4.0 * static_cast<double>(n) * std::ldexp(1.0, -53)) + 1e-30;
  return c;
}

// The conservation and top-set checks' fields of a results row, when the row ran them.
inline void add_checks(json_object& o, const std::optional<bool>& conservation_ok, const conservation& c,
                       const std::optional<bool>& top_ok) {
  if (!conservation_ok) return;
  o.add("conservation_ok", *conservation_ok)
      .add("conservation_diff", std::fabs(c.lhs - c.rhs), "%.6g")
      .add("conservation_bound", c.bound, "%.6g")
      .add("top_ok", top_ok.value_or(false));
}

// The sent set of an exact (or threshold) top-k holds the largest |p|: every sent |value| is at least every
// entry left in the new residual, and the residual is +0 where an entry was sent.
inline bool sent_set_is_top(const std::vector<float>& sent_value,
                            const std::vector<std::uint32_t>& sent_index,
                            const std::vector<float>& new_residual) {
  float least_sent = INFINITY;
  for (float v : sent_value)
    least_sent = std::min(least_sent, std::fabs(v));
  float most_left = 0.0f;
  for (float v : new_residual)
    most_left = std::max(most_left, std::fabs(v));
  if (!sent_value.empty() && !(least_sent >= most_left)) return false;
  for (std::uint32_t i : sent_index)
    if (i >= new_residual.size() || new_residual[i] != 0.0f) return false;
  return true;
}

struct events {
  cudaEvent_t a{}, b{};
  events() {
    cu::check(cudaEventCreate(&a), "cudaEventCreate");
    cu::check(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  events(const events&) = delete;
  events& operator=(const events&) = delete;
  template <class F>
  double time(cudaStream_t stream, F&& fn) {
    cu::check(cudaEventRecord(a, stream), "cudaEventRecord");
    fn();
    cu::check(cudaEventRecord(b, stream), "cudaEventRecord");
    cu::check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    cu::check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    return ms;
  }
  // fn(buffer) timed `reps` times on the default stream after `warmup` untimed runs, rotating over the
  // buffers so that no run finds its input in the cache its previous one left.
  template <class F>
  std::vector<double> repeat(int warmup, int reps, int buffers, F&& fn) {
    for (int i = 0; i < warmup; ++i)
      fn(i % buffers);
    cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i)
      ms.push_back(time(nullptr, [&] { fn((warmup + i) % buffers); }));
    return ms;
  }
};

// Nearest-rank quantile of the timed steps (q = 0.5: the median; 0.9: the p90).
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto r = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, r == 0 ? 0 : r - 1)];
}
inline double median(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  return s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
}

inline bool has_device(cudaDeviceProp& prop) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return false;
  cu::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  return true;
}

} // namespace bench
