// Times every CUDA selector against two anchors measured in the same run: a CUB radix sort of the magnitude
// keys (the exact, slow anchor) and a device-to-device copy of the input (the memory floor). CUDA events,
// warm-up first, median of many repetitions, rotating over several buffers of fresh random data generated on
// the device. Writes JSON and CSV.
//
// Like-for-like rows, exact top-k with the same outputs (signed values and 4-byte indices, k of each):
//   radix_compact       cuda::radix + cuda::compact<uint32>                               (cold)
//   trim_cold_compact   cuda::laplace_bisect{trim, no warm start} + cuda::compact<uint32>  (cold)
//   trim_warm_compact   the same warm-started from the previous buffer's threshold         (warm)
//   cub_topk_pairs      cub::DeviceTopK::MaxPairs on the magnitude keys (a transform iterator over x, so x is
//                       read as is) with a counting iterator of int32 indices, then the signed values gathered
//                       by index (k reads): only where the CCCL on the include path has DeviceTopK (>= 3.3)
// The DeviceTopK result is checked once per case: k distinct indices, each returned key equal to its input's
// key, the least returned key equal to the exact k-th key (from cuda::radix on the same buffer), and as many
// keys above it as the exact selection has.
//
//   gpu_bench select [--out PREFIX] [--reps R] [--buffers B] [--sizes 20,24,26,28] [--quick]
#include <commsgd/cuda.cuh>

#include <cub/device/device_radix_sort.cuh>
#if __has_include(<cub/device/device_topk.cuh>)
#include <cub/device/device_topk.cuh>
#include <cuda/iterator>
#define COMMSGD_BENCH_HAS_DEVICE_TOPK 1
#endif
#include "anchor_kernels.cuh"
#include "bench_common.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace select_bench {

namespace cu = commsgd::cuda;

namespace {

using namespace anchors;

// A counter-based hash (splitmix64) so that every element is drawn independently on the device, with no
// generator state and the same numbers on any GPU.
__device__ inline std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ inline float unit(std::uint64_t h) { // (0, 1)
  return (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

enum class distribution { laplace, gaussian, relu_like };
const char* name_of(distribution d) {
  switch (d) {
  case distribution::laplace:
    return "laplace";
  case distribution::gaussian:
    return "gaussian";
  case distribution::relu_like:
    return "relu_like";
  }
  return "?";
}

// relu_like stands for real ReLU-network gradients: 13 % exact zeros and a product of two exponentials,
// whose tail is far heavier than Laplace (design section 1).
__global__ void generate_kernel(float* x, std::uint64_t n, distribution d, std::uint64_t seed) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const std::uint64_t h1 = mix(seed ^ (2 * i));
    const std::uint64_t h2 = mix(seed ^ (2 * i + 1));
    const float sign = (h1 & 1) ? 1.0f : -1.0f;
    float v = 0.0f;
    switch (d) {
    case distribution::laplace:
      v = sign * -logf(unit(h1)) * 1e-3f;
      break;
    case distribution::gaussian:
      v = sqrtf(-2.0f * logf(unit(h1))) * cospif(2.0f * unit(h2)) * 1e-3f;
      break;
    case distribution::relu_like:
      v = unit(h2) < 0.13f ? 0.0f : sign * logf(unit(h1)) * logf(unit(mix(h2))) * 1e-3f;
      break;
    }
    x[i] = v;
  }
}

struct record {
  std::string distribution, method;
  std::uint64_t n, k;
  double density, median_ms, min_ms, max_ms;
  std::uint64_t count;
  bool ok;
};

} // namespace

int run(int argc, char** argv) {
  std::string out = "select_gpu";
  int reps = 30;
  int buffers = 4;
  std::vector<int> log_sizes{20, 24, 26, 28};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc)
      out = argv[++i];
    else if (a == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (a == "--buffers" && i + 1 < argc)
      buffers = std::max(1, std::atoi(argv[++i]));
    else if (a == "--quick") {
      reps = 5;
      log_sizes = {20, 24};
    } else if (a == "--sizes" && i + 1 < argc) {
      log_sizes.clear();
      for (char* s = argv[++i]; *s;) {
        log_sizes.push_back(static_cast<int>(std::strtol(s, &s, 10)));
        if (*s == ',') ++s;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--out PREFIX] [--reps R] [--buffers B] [--sizes 20,24] [--quick]\n",
                   argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  if (!bench::has_device(prop)) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  std::printf("device: %s\n", prop.name);

  const double densities[] = {1e-4, 1e-3, 1e-2};
  const distribution dists[] = {distribution::laplace, distribution::gaussian, distribution::relu_like};
  const double tol = 0.01;
  std::vector<record> records;
  bench::events tm;

  for (int lg : log_sizes) {
    const std::uint64_t n = std::uint64_t{1} << lg;
    std::vector<cu::device_buffer<float>> x;
    for (int b = 0; b < buffers; ++b)
      x.emplace_back(n);
    cu::device_buffer<float> copy_target(n);
    cu::device_buffer<std::uint32_t> keys(n), sorted(n);
    cu::device_buffer<cu::device_result> result(1);
    std::size_t sort_bytes = 0;
    cu::check(cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, keys.data(), sorted.data(), n, 0, 31),
              "SortKeys(size)");
    cu::device_buffer<char> sort_ws(sort_bytes);
    for (distribution d : dists) {
      for (int b = 0; b < buffers; ++b) {
        generate_kernel<<<1024, 256>>>(x[b].data(), n, d,
                                       0x5eed0000ull + 1000 * lg + 10 * b + static_cast<int>(d));
        cu::check_launch("generate_kernel");
      }
      cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      for (double density : densities) {
        const std::uint64_t k = commsgd::select::k_for_density(n, density);
        auto add = [&](const char* method, const std::vector<double>& ms, std::uint64_t count, bool ok) {
          records.push_back(record{name_of(d), method, n, k, density, bench::median(ms),
                                   *std::min_element(ms.begin(), ms.end()),
                                   *std::max_element(ms.begin(), ms.end()), count, ok});
          std::printf("%-9s n=2^%d density=%g %-15s median %.4f ms  count %llu %s\n", name_of(d), lg, density,
                      method, records.back().median_ms, static_cast<unsigned long long>(count),
                      ok ? "ok" : "OUT OF TOLERANCE");
          std::fflush(stdout);
        };
        // Anchors.
        add("copy",
            tm.repeat(3, reps, buffers,
                      [&](int b) {
                        cu::check(cudaMemcpyAsync(copy_target.data(), x[b].data(), n * sizeof(float),
                                                  cudaMemcpyDeviceToDevice),
                                  "cudaMemcpyAsync");
                      }),
            n, true);
        add("cub_sort",
            tm.repeat(3, reps, buffers,
                      [&](int b) {
                        keys_kernel<<<1024, 256>>>(x[b].data(), keys.data(), n);
                        std::size_t bytes = sort_bytes;
                        cu::check(cub::DeviceRadixSort::SortKeys(sort_ws.data(), bytes, keys.data(),
                                                                 sorted.data(), n, 0, 31),
                                  "SortKeys");
                      }),
            k, true);
        // Selectors: the workspace form, allocated once, as a training loop would.
        auto time_method = [&](const char* label, auto& method, bool exact) {
          std::size_t bytes = 0;
          method.select(nullptr, bytes, x[0].data(), n, k, nullptr);
          cu::device_buffer<char> ws(bytes);
          const auto ms = tm.repeat(3, reps, buffers, [&](int b) {
            std::size_t bytes_now = bytes;
            method.select(ws.data(), bytes_now, x[b].data(), n, k, result.data());
          });
          const commsgd::select::threshold t = cu::read_result(result.data(), nullptr);
          const auto limit = static_cast<std::uint64_t>(std::ceil((1.0 + tol) * static_cast<double>(k)));
          const bool ok = exact ? t.count() == k : (t.count() >= k && t.count() <= limit);
          add(label, ms, t.count(), ok);
        };
        cu::exact ex;
        time_method("exact", ex, true);
        cu::radix rx;
        time_method("radix", rx, true);
        cu::hierarchical hi;
        time_method("hierarchical", hi, true);
        cu::sampled sa;
        time_method("sampled", sa, false);
        // Cold: every call starts from the Laplace estimate; warm: from the previous buffer's threshold.
        cu::laplace_bisect cold({.tol = tol, .trim = false, .warm_start = false});
        time_method("laplace_cold", cold, false);
        cu::laplace_bisect warm({.tol = tol, .trim = false, .warm_start = true});
        time_method("laplace_warm", warm, false);
        cu::laplace_bisect trim({.tol = tol, .trim = true, .warm_start = true});
        time_method("laplace_trim", trim, true);
        // Selection + compaction into k (uint32 index, signed value) pairs, timed together: the outputs of
        // cub::DeviceTopK's pairs and of torch.topk.
        auto time_pairs = [&](const char* label, auto& method) {
          std::size_t bytes = 0;
          method.select(nullptr, bytes, x[0].data(), n, k, nullptr);
          std::size_t cbytes = 0;
          cu::compact<std::uint32_t>(nullptr, cbytes, x[0].data(), n, result.data(), nullptr, nullptr, k,
                                     nullptr);
          cu::device_buffer<char> ws(std::max(bytes, cbytes));
          cu::device_buffer<std::uint32_t> idx(k);
          cu::device_buffer<float> val(k);
          cu::device_buffer<unsigned long long> count(1);
          const auto ms = tm.repeat(3, reps, buffers, [&](int b) {
            std::size_t s = bytes, c = cbytes;
            method.select(ws.data(), s, x[b].data(), n, k, result.data());
            cu::compact<std::uint32_t>(ws.data(), c, x[b].data(), n, result.data(), idx.data(), val.data(), k,
                                       count.data());
          });
          unsigned long long c = 0;
          cu::check(cudaMemcpy(&c, count.data(), sizeof c, cudaMemcpyDeviceToHost), "cudaMemcpy");
          add(label, ms, c, c == k);
        };
        {
          cu::radix r;
          time_pairs("radix_compact", r);
          cu::laplace_bisect tc({.tol = tol, .trim = true, .warm_start = false});
          time_pairs("trim_cold_compact", tc);
          cu::laplace_bisect tw({.tol = tol, .trim = true, .warm_start = true});
          time_pairs("trim_warm_compact", tw);
        }
#ifdef COMMSGD_BENCH_HAS_DEVICE_TOPK
        {
          cu::device_buffer<std::uint32_t> top_keys(k);
          cu::device_buffer<int> top_index(k);
          cu::device_buffer<float> top_value(k);
          const auto env = cuda::execution::require(cuda::execution::determinism::not_guaranteed,
                                                    cuda::execution::output_ordering::unsorted);
          auto in = [&](int b) { return cuda::transform_iterator(x[b].data(), magnitude{}); };
          const auto indices = cuda::counting_iterator<int>(0);
          std::size_t bytes = 0;
          cu::check(cub::DeviceTopK::MaxPairs(nullptr, bytes, in(0), top_keys.data(), indices,
                                              top_index.data(), static_cast<int>(n), static_cast<int>(k),
                                              env),
                    "DeviceTopK::MaxPairs(size)");
          cu::device_buffer<char> ws(bytes);
          const unsigned gather_blocks =
              static_cast<unsigned>(std::min<std::uint64_t>((k + 255) / 256, 4096));
          auto one = [&](int b) {
            std::size_t s = bytes;
            cu::check(cub::DeviceTopK::MaxPairs(ws.data(), s, in(b), top_keys.data(), indices,
                                                top_index.data(), static_cast<int>(n), static_cast<int>(k),
                                                env),
                      "DeviceTopK::MaxPairs");
            gather_kernel<<<gather_blocks, 256>>>(x[b].data(), top_index.data(), top_value.data(), k);
          };
          const auto ms = tm.repeat(3, reps, buffers, one);
          // The check, on buffer 0 against the exact threshold of cuda::radix.
          one(0);
          std::size_t rbytes = 0;
          cu::radix r;
          r.select(nullptr, rbytes, x[0].data(), n, k, nullptr);
          cu::device_buffer<char> rws(rbytes);
          r.select(rws.data(), rbytes, x[0].data(), n, k, result.data());
          const commsgd::select::threshold t = cu::read_result(result.data(), nullptr);
          cu::device_buffer<std::uint32_t> seen(n / 32 + 1);
          cu::device_buffer<unsigned long long> counts(3);
          cu::check(cudaMemset(seen.data(), 0, seen.size() * sizeof(std::uint32_t)), "cudaMemset");
          cu::check(cudaMemset(counts.data(), 0, 3 * sizeof(unsigned long long)), "cudaMemset");
          check_topk_kernel<<<gather_blocks, 256>>>(
              x[0].data(), n, top_keys.data(), top_index.data(), top_value.data(), k,
              commsgd::select::magnitude_key(t.value), seen.data(), counts.data());
          unsigned long long h[3] = {};
          cu::check(cudaMemcpy(h, counts.data(), sizeof h, cudaMemcpyDeviceToHost), "cudaMemcpy");
          const bool ok = h[0] == 0 && h[1] == t.above && h[2] == 0 && t.count() == k;
          if (!ok)
            std::printf("  cub_topk_pairs check: %llu bad entries, %llu above the k-th key (exact: %zu), "
                        "%llu below\n",
                        h[0], h[1], t.above, h[2]);
          add("cub_topk_pairs", ms, k, ok);
        }
#endif
        // Compaction of radix's threshold into (uint32 index, value) pairs.
        {
          std::size_t bytes = 0;
          rx.select(nullptr, bytes, x[0].data(), n, k, nullptr);
          cu::device_buffer<char> ws(bytes);
          cu::device_buffer<std::uint32_t> idx(k);
          cu::device_buffer<float> val(k);
          cu::device_buffer<unsigned long long> count(1);
          std::size_t cbytes = 0;
          cu::compact<std::uint32_t>(nullptr, cbytes, x[0].data(), n, result.data(), idx.data(), val.data(),
                                     k, count.data());
          cu::device_buffer<char> cws(cbytes);
          std::vector<double> ms;
          for (int b = 0; b < buffers; ++b) {
            std::size_t bytes_now = bytes;
            rx.select(ws.data(), bytes_now, x[b].data(), n, k, result.data());
            const auto one = tm.repeat(1, std::max(1, reps / buffers), 1, [&](int) {
              std::size_t c = cbytes;
              cu::compact<std::uint32_t>(cws.data(), c, x[b].data(), n, result.data(), idx.data(), val.data(),
                                         k, count.data());
            });
            ms.insert(ms.end(), one.begin(), one.end());
          }
          unsigned long long c = 0;
          cu::check(cudaMemcpy(&c, count.data(), sizeof c, cudaMemcpyDeviceToHost), "cudaMemcpy");
          add("compact", ms, c, c == k);
        }
      }
    }
  }

  const std::string json = out + ".json", csv = out + ".csv";
  std::vector<bench::json_object> results;
  for (const auto& r : records)
    results.emplace_back()
        .add("distribution", r.distribution)
        .add("method", r.method)
        .add("n", r.n)
        .add("density", r.density, "%g")
        .add("k", r.k)
        .add("median_ms", r.median_ms, "%.6f")
        .add("min_ms", r.min_ms, "%.6f")
        .add("max_ms", r.max_ms, "%.6f")
        .add("count", r.count)
        .add("ok", r.ok);
  bench::write_results(json,
                       bench::json_object()
                           .add("device", prop.name)
                           .add("tolerance", tol, "%g")
                           .add("reps", reps)
                           .add("buffers", buffers),
                       results);
  if (FILE* f = std::fopen(csv.c_str(), "w")) {
    std::fprintf(f, "distribution,method,n,density,k,median_ms,min_ms,max_ms,count,ok\n");
    for (const auto& r : records)
      std::fprintf(f, "%s,%s,%llu,%g,%llu,%.6f,%.6f,%.6f,%llu,%d\n", r.distribution.c_str(), r.method.c_str(),
                   static_cast<unsigned long long>(r.n), r.density, static_cast<unsigned long long>(r.k),
                   r.median_ms, r.min_ms, r.max_ms, static_cast<unsigned long long>(r.count), r.ok ? 1 : 0);
    std::fclose(f);
  }
  const bool all_ok = std::all_of(records.begin(), records.end(), [](const record& r) { return r.ok; });
  std::printf("wrote %s and %s; %s\n", json.c_str(), csv.c_str(),
              all_ok ? "all counts within tolerance" : "SOME COUNTS OUT OF TOLERANCE");
  return all_ok ? 0 : 1;
}

} // namespace select_bench

#ifndef COMMSGD_GPU_BENCH_ONE_PROGRAM
int main(int argc, char** argv) {
  return select_bench::run(argc, argv);
}
#endif
