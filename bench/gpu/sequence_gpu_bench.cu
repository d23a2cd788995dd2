// Times every CUDA selector on consecutive error-feedback accumulators, in step order, so that a warm-started
// selector sees what it sees in training: the previous step's threshold, then the next accumulator. Input is
// one or more dump folders (manifest.txt + raw float32 files: examples/fashion_mnist --dump-accumulators, or
// bench/gpu/sequence.py make). Every method runs `--sweeps` times over the whole sequence with a fresh object
// per sweep; a step's time is the median over sweeps (CUDA events around the enqueue). Anchors in the same
// run: a device-to-device copy (the memory floor), a CUB radix sort of the magnitude keys, and, where the CCCL
// on the include path has it (3.3 and later), cub::DeviceTopK::MaxPairs on the keys (read through a transform
// iterator so that it reads x once) with a counting iterator of int32 indices, plus a gather of the k signed
// values: the same outputs as radix_compact / trim_compact (selection + cuda::compact<uint32>). Also cuda::top_k's whole step (p = g + e, select, compact, residual
// update, pairs to pinned memory, one synchronisation) with the accumulators given as gradients.
//
//   gpu_bench sequence --out PREFIX [--sweeps S] [--only METHOD] DIR [DIR ...]
// (--only runs one method and the copy, for a profiler: bench/gpu/profile.sh)
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
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace sequence_bench {

namespace cu = commsgd::cuda;

namespace {

using namespace anchors;

struct sequence {
  std::string name;
  std::uint64_t n = 0, k = 0;
  double density = 0;
  std::vector<cu::device_buffer<float>> steps;
};

sequence load(const std::string& dir) {
  sequence s;
  s.name = std::filesystem::path(dir).filename().string();
  if (s.name.empty()) s.name = std::filesystem::path(dir).parent_path().filename().string();
  std::ifstream m(std::filesystem::path(dir) / "manifest.txt");
  if (!m) throw std::runtime_error("no manifest.txt in " + dir);
  std::vector<std::string> files;
  for (std::string line; std::getline(m, line);) {
    std::istringstream w(line);
    std::string key;
    w >> key;
    if (key == "n")
      w >> s.n;
    else if (key == "density")
      w >> s.density;
    else if (key == "file") {
      std::string f;
      w >> f;
      files.push_back((std::filesystem::path(dir) / f).string());
    }
  }
  s.k = commsgd::select::k_for_density(s.n, s.density);
  std::vector<float> host(s.n);
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    in.read(reinterpret_cast<char*>(host.data()), static_cast<std::streamsize>(s.n * sizeof(float)));
    if (!in) throw std::runtime_error("short file " + f);
    s.steps.emplace_back(s.n);
    cu::check(cudaMemcpy(s.steps.back().data(), host.data(), s.n * sizeof(float), cudaMemcpyHostToDevice),
              "cudaMemcpy");
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct row {
  std::string seq, method;
  std::vector<double> per_step; // median over sweeps
  bool ok = true;
  std::uint64_t max_count = 0;
};

} // namespace

int run(int argc, char** argv) {
  std::string out = "sequence_gpu";
  int sweeps = 11;
  std::vector<std::string> dirs;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc)
      out = argv[++i];
    else if (a == "--sweeps" && i + 1 < argc)
      sweeps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else if (!a.empty() && a[0] != '-')
      dirs.push_back(a);
    else {
      std::fprintf(stderr, "usage: %s --out PREFIX [--sweeps S] [--only METHOD] DIR [DIR ...]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  if (!bench::has_device(prop)) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  std::printf("device: %s\n", prop.name);
  const double tol = 0.01;
  std::vector<row> rows;
  bench::events ev;
  for (const auto& dir : dirs) {
    const sequence s = load(dir);
    const std::size_t steps = s.steps.size();
    const std::uint64_t n = s.n, k = s.k;
    std::printf("%s: n = %llu, k = %llu, %zu steps\n", s.name.c_str(), static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(k), steps);
    cu::device_buffer<cu::device_result> result(1);
    // Runs make() once per sweep and call(object, step) on every step in order.
    auto measure = [&](const char* method, auto make, auto call, auto check) {
      if (!only.empty() && only != method && std::string(method) != "copy") return;
      row r{s.name, method, std::vector<double>(steps), true, 0};
      std::vector<std::vector<double>> t(steps);
      { // warm-up sweep, untimed
        auto obj = make();
        for (std::size_t i = 0; i < steps; ++i)
          call(obj, i);
        cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      }
      for (int sw = 0; sw < sweeps; ++sw) {
        auto obj = make();
        for (std::size_t i = 0; i < steps; ++i) {
          t[i].push_back(ev.time(nullptr, [&] { call(obj, i); }));
          const std::uint64_t c = check(obj);
          r.max_count = std::max(r.max_count, c);
          const auto limit = static_cast<std::uint64_t>(std::ceil((1.0 + tol) * static_cast<double>(k)));
          if (c < k || c > limit) r.ok = false;
        }
      }
      for (std::size_t i = 0; i < steps; ++i)
        r.per_step[i] = median(t[i]);
      std::vector<double> later(r.per_step.begin() + (steps > 1 ? 1 : 0), r.per_step.end());
      std::printf("  %-16s first %.4f ms, later steps median %.4f ms, max count %llu %s\n", method,
                  r.per_step[0], median(later), static_cast<unsigned long long>(r.max_count),
                  r.ok ? "ok" : "OUT OF TOLERANCE");
      std::fflush(stdout);
      rows.push_back(std::move(r));
    };
    auto result_count = [&](auto&) { return cu::read_result(result.data(), nullptr).count(); };
    auto exact_k = [&](auto&) { return k; };

    cu::device_buffer<float> copy_target(n);
    measure(
        "copy", [] { return 0; },
        [&](int&, std::size_t i) {
          cu::check(cudaMemcpyAsync(copy_target.data(), s.steps[i].data(), n * sizeof(float),
                                    cudaMemcpyDeviceToDevice),
                    "cudaMemcpyAsync");
        },
        exact_k);
    {
      cu::device_buffer<std::uint32_t> keys(n), sorted(n);
      std::size_t bytes = 0;
      cu::check(cub::DeviceRadixSort::SortKeys(nullptr, bytes, keys.data(), sorted.data(), n, 0, 31),
                "SortKeys(size)");
      cu::device_buffer<char> ws(bytes);
      measure(
          "cub_sort", [] { return 0; },
          [&](int&, std::size_t i) {
            keys_kernel<<<1024, 256>>>(s.steps[i].data(), keys.data(), n);
            std::size_t b = bytes;
            cu::check(cub::DeviceRadixSort::SortKeys(ws.data(), b, keys.data(), sorted.data(), n, 0, 31),
                      "SortKeys");
          },
          exact_k);
    }
#ifdef COMMSGD_BENCH_HAS_DEVICE_TOPK
    {
      cu::device_buffer<std::uint32_t> top(k);
      cu::device_buffer<int> top_index(k);
      cu::device_buffer<float> top_value(k);
      const auto env = cuda::execution::require(cuda::execution::determinism::not_guaranteed,
                                                cuda::execution::output_ordering::unsorted);
      auto in = [&](std::size_t i) { return cuda::transform_iterator(s.steps[i].data(), magnitude{}); };
      const auto indices = cuda::counting_iterator<int>(0);
      std::size_t bytes = 0;
      cu::check(cub::DeviceTopK::MaxPairs(nullptr, bytes, in(0), top.data(), indices, top_index.data(),
                                          static_cast<int>(n), static_cast<int>(k), env),
                "MaxPairs(size)");
      cu::device_buffer<char> ws(bytes);
      const unsigned gather_blocks = static_cast<unsigned>(std::min<std::uint64_t>((k + 255) / 256, 4096));
      measure(
          "cub_device_topk", [] { return 0; },
          [&](int&, std::size_t i) {
            std::size_t b = bytes;
            cu::check(cub::DeviceTopK::MaxPairs(ws.data(), b, in(i), top.data(), indices, top_index.data(),
                                                static_cast<int>(n), static_cast<int>(k), env),
                      "MaxPairs");
            gather_kernel<<<gather_blocks, 256>>>(s.steps[i].data(), top_index.data(), top_value.data(), k);
          },
          exact_k);
    }
#endif
    // The selectors, workspace form allocated once per object, as a training loop uses them.
    auto selector = [&](const char* label, auto make) {
      using S = decltype(make());
      struct held {
        S sel;
        cu::device_buffer<char> ws;
        std::size_t bytes = 0;
      };
      measure(
          label,
          [&] {
            held h{make(), cu::device_buffer<char>(0), 0};
            h.sel.select(nullptr, h.bytes, s.steps[0].data(), n, k, nullptr);
            h.ws = cu::device_buffer<char>(h.bytes);
            return h;
          },
          [&](held& h, std::size_t i) {
            std::size_t b = h.bytes;
            h.sel.select(h.ws.data(), b, s.steps[i].data(), n, k, result.data());
          },
          result_count);
    };
    selector("exact", [] { return cu::exact{}; });
    selector("radix", [] { return cu::radix{}; });
    selector("hierarchical", [] { return cu::hierarchical{}; });
    selector("sampled", [] { return cu::sampled{}; });
    selector("laplace_cold",
             [&] { return cu::laplace_bisect({.tol = tol, .trim = false, .warm_start = false}); });
    selector("laplace_warm",
             [&] { return cu::laplace_bisect({.tol = tol, .trim = false, .warm_start = true}); });
    selector("laplace_trim",
             [&] { return cu::laplace_bisect({.tol = tol, .trim = true, .warm_start = true}); });
    // Selection + compaction into k (uint32 index, signed value) pairs: like for like with DeviceTopK's pairs
    // and torch.topk. trim_compact is warm (from the previous step's threshold), radix_compact cold.
    auto pairs = [&](const char* label, auto make) {
      using S = decltype(make());
      struct held {
        S sel;
        cu::device_buffer<char> ws;
        std::size_t bytes = 0, cbytes = 0;
        cu::device_buffer<std::uint32_t> idx;
        cu::device_buffer<float> val;
        cu::device_buffer<unsigned long long> count;
      };
      measure(
          label,
          [&] {
            held h{make(),
                   cu::device_buffer<char>(0),
                   0,
                   0,
                   cu::device_buffer<std::uint32_t>(k),
                   cu::device_buffer<float>(k),
                   cu::device_buffer<unsigned long long>(1)};
            h.sel.select(nullptr, h.bytes, s.steps[0].data(), n, k, nullptr);
            cu::compact<std::uint32_t>(nullptr, h.cbytes, s.steps[0].data(), n, result.data(), nullptr,
                                       nullptr, k, nullptr);
            h.ws = cu::device_buffer<char>(std::max(h.bytes, h.cbytes));
            return h;
          },
          [&](held& h, std::size_t i) {
            std::size_t b = h.bytes, c = h.cbytes;
            h.sel.select(h.ws.data(), b, s.steps[i].data(), n, k, result.data());
            cu::compact<std::uint32_t>(h.ws.data(), c, s.steps[i].data(), n, result.data(), h.idx.data(),
                                       h.val.data(), k, h.count.data());
          },
          [&](held& h) {
            unsigned long long c = 0;
            cu::check(cudaMemcpy(&c, h.count.data(), sizeof c, cudaMemcpyDeviceToHost), "cudaMemcpy");
            return static_cast<std::uint64_t>(c);
          });
    };
    pairs("radix_compact", [] { return cu::radix{}; });
    pairs("trim_compact", [&] { return cu::laplace_bisect({.tol = tol, .trim = true, .warm_start = true}); });
    // cuda::top_k's whole step, the accumulators given as gradients (their law is a gradient's plus a
    // residual's; the sparsifier adds its own residual on top).
    auto whole_step = [&](const char* label, auto make_selector) {
      using S = decltype(make_selector());
      measure(
          label, [&] { return cu::top_k<S>(n, {.density = s.density}, make_selector()); },
          [&](cu::top_k<S>& tk, std::size_t i) { tk.step(s.steps[i].data()); },
          [&](cu::top_k<S>& tk) { return static_cast<std::uint64_t>(tk.last().size()); });
    };
    whole_step("top_k_step_laplace",
               [&] { return cu::laplace_bisect({.tol = tol, .trim = false, .warm_start = true}); });
    whole_step("top_k_step_radix", [] { return cu::radix{}; });
  }

  const std::string json = out + ".json";
  std::vector<bench::json_object> results;
  for (const auto& r : rows) {
    auto& o = results.emplace_back();
    o.add("sequence", r.seq).add("method", r.method).add("ok", r.ok).add("max_count", r.max_count);
    o.add("per_step_ms", r.per_step, "%.6f");
  }
  bench::write_results(
      json, bench::json_object().add("device", prop.name).add("tolerance", tol, "%g").add("sweeps", sweeps),
      results);
  const bool all_ok = std::all_of(rows.begin(), rows.end(), [](const row& r) { return r.ok; });
  std::printf("wrote %s; %s\n", json.c_str(),
              all_ok ? "all counts within tolerance" : "SOME COUNTS OUT OF TOLERANCE");
  return all_ok ? 0 : 1;
}

} // namespace sequence_bench

#ifndef COMMSGD_GPU_BENCH_ONE_PROGRAM
int main(int argc, char** argv) {
  return sequence_bench::run(argc, argv);
}
#endif
