// Host threshold selection: every method against the anchors nth_element, partial_sort and floor (one
// vectorised read of x summing |x|), over N, density and distribution.
//
// Names: select/<method>/<distribution>/<N>/<density>, so that a regular expression picks a subset, e.g.
//   select_bench --benchmark_filter='select/(nth_element|floor|radix|laplace_bisect)/laplace/16777216/0.001'
// Data is generated lazily for the cases the filter keeps. COMMSGD_REAL_GRADIENT names a raw little-endian
// float32 file that adds the distribution `real`. Every method runs on one thread, like the anchors.
// Counter count_over_k: the achieved count / k (1 for the exact methods).
#include "../tests/unit/select_data.hpp"

#include <commsgd/select/select.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sel = commsgd::select;

namespace {

const sel::parallel_options one_thread{1, std::size_t{1} << 20};

std::vector<float> load_real() {
  const char* path = std::getenv("COMMSGD_REAL_GRADIENT");
  if (path == nullptr) return {};
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  const auto bytes = static_cast<std::size_t>(in.tellg());
  std::vector<float> x(bytes / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
  return x;
}

// Buffers for one (distribution, N) at a time: the largest cases do not fit in memory together.
// Several buffers where x fits in cache, so that a method does not read the same warm lines every time;
// `perturbed` copies imitate consecutive training steps for the warm-started laplace_bisect.
struct data_set {
  std::string dist;
  std::size_t n = 0;
  std::vector<std::vector<float>> fresh;
  std::vector<std::vector<float>> perturbed;
};

data_set& data_for(const std::string& dist, std::size_t n) {
  static data_set d;
  if (d.dist == dist && d.n == n) return d;
  d = data_set{};
  d.dist = dist;
  d.n = n;
  const std::size_t copies = n <= (std::size_t{1} << 20) ? 4 : 1;
  if (dist == "real") {
    d.fresh.push_back(load_real());
  } else {
    select_data::shape s = dist == "laplace"    ? select_data::shape::laplace
                           : dist == "gaussian" ? select_data::shape::gaussian
                                                : select_data::shape::relu_like;
    for (std::size_t c = 0; c < copies; ++c)
      d.fresh.push_back(select_data::make(s, n, 1000 + c));
  }
  const std::size_t steps = n <= (std::size_t{1} << 24) ? 4 : 2;
  for (std::size_t c = 0; c < steps; ++c) {
    d.perturbed.push_back(c == 0 ? d.fresh[0] : d.perturbed[c - 1]);
    select_data::perturb(d.perturbed.back(), 77 + c);
  }
  return d;
}

using run_fn = std::function<double(std::span<const float>, std::size_t)>; // returns count / k

template <class S>
run_fn selector_run(S s) {
  auto p = std::make_shared<S>(std::move(s));
  return [p](std::span<const float> x, std::size_t k) {
    const sel::threshold t = p->select(x, k);
    benchmark::DoNotOptimize(t);
    return static_cast<double>(t.count()) / static_cast<double>(k);
  };
}

run_fn make_method(const std::string& m) {
  if (m == "exact") return selector_run(sel::exact{});
  if (m == "radix") return selector_run(sel::radix{sel::radix::options{one_thread}});
  if (m == "hierarchical")
    return selector_run(sel::hierarchical{sel::hierarchical::options{1 << 15, 3.0, one_thread}});
  if (m == "sampled") {
    sel::sampled::options o;
    o.parallel = one_thread;
    return selector_run(sel::sampled{o});
  }
  if (m == "laplace_bisect" || m == "laplace_bisect_cold") {
    sel::laplace_bisect::options o;
    o.parallel = one_thread;
    o.warm_start = m == "laplace_bisect";
    return selector_run(sel::laplace_bisect{o});
  }
  if (m == "nth_element") {
    auto buf = std::make_shared<std::vector<float>>();
    return [buf](std::span<const float> x, std::size_t k) {
      buf->resize(x.size());
      std::transform(x.begin(), x.end(), buf->begin(), [](float v) { return std::fabs(v); });
      std::nth_element(buf->begin(), buf->begin() + static_cast<std::ptrdiff_t>(k - 1), buf->end(),
                       std::greater<>{});
      benchmark::DoNotOptimize((*buf)[k - 1]);
      return 1.0;
    };
  }
  if (m == "partial_sort") {
    auto buf = std::make_shared<std::vector<float>>();
    return [buf](std::span<const float> x, std::size_t k) {
      buf->resize(x.size());
      std::transform(x.begin(), x.end(), buf->begin(), [](float v) { return std::fabs(v); });
      std::partial_sort(buf->begin(), buf->begin() + static_cast<std::ptrdiff_t>(k), buf->end(),
                        std::greater<>{});
      benchmark::DoNotOptimize((*buf)[k - 1]);
      return 1.0;
    };
  }
  // floor: the least any method must do, read x once. 16 float lanes so the compiler vectorises it.
  return [](std::span<const float> x, std::size_t) {
    float acc[16] = {};
    std::size_t i = 0;
    for (; i + 16 <= x.size(); i += 16)
      for (std::size_t j = 0; j < 16; ++j)
        acc[j] += std::fabs(x[i + j]);
    float s = 0;
    for (; i < x.size(); ++i)
      s += std::fabs(x[i]);
    for (float a : acc)
      s += a;
    benchmark::DoNotOptimize(s);
    return 1.0;
  };
}

void run_case(benchmark::State& state, std::string method, std::string dist, std::size_t n, double density) {
  data_set& d = data_for(dist, n);
  const bool warm = method == "laplace_bisect";
  const auto& bufs = warm ? d.perturbed : d.fresh;
  const std::size_t size = bufs[0].size();
  const std::size_t k = sel::k_for_density(size, density);
  run_fn run = make_method(method);
  double ratio = run(bufs.back(), k); // warm-up; for the warm start, the state of a "previous step"
  std::size_t i = 0;
  double sum = 0;
  for (auto _ : state) {
    ratio = run(bufs[i], k);
    sum += ratio;
    i = (i + 1) % bufs.size();
  }
  state.counters["count_over_k"] = sum / static_cast<double>(state.iterations());
  state.counters["n"] = static_cast<double>(size);
  state.counters["k"] = static_cast<double>(k);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(size * 4));
}

std::string density_name(double d) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", d);
  return b;
}

const int registered = [] {
  const char* methods[] = {"floor",   "nth_element",    "partial_sort",
                           "exact",   "radix",          "hierarchical",
                           "sampled", "laplace_bisect", "laplace_bisect_cold"};
  const double densities[] = {1e-4, 1e-3, 1e-2};
  std::vector<std::pair<std::string, std::size_t>> cases;
  for (int p : {16, 20, 24, 26})
    for (const char* dist : {"laplace", "gaussian", "relu_like"})
      cases.emplace_back(dist, std::size_t{1} << p);
  if (const std::size_t real = load_real().size(); real > 0) cases.emplace_back("real", real);
  for (auto& [dist, n] : cases)
    for (double density : densities)
      for (const char* m : methods) {
        const std::string name =
            "select/" + std::string(m) + "/" + dist + "/" + std::to_string(n) + "/" + density_name(density);
        benchmark::RegisterBenchmark(name.c_str(), run_case, std::string(m), dist, n, density)
            ->Unit(benchmark::kMillisecond);
      }
  return 0;
}();

} // namespace

BENCHMARK_MAIN();
