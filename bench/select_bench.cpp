// Host threshold selection: every method against the anchors nth_element, partial_sort and floor (one
// vectorised read of x summing |x|), over N, density and distribution.
//
// Names: select/<method>/<distribution>/<N>/<density>, so that a regular expression picks a subset, e.g.
//   select_bench --benchmark_filter='select/(nth_element|floor|radix|laplace_bisect)/laplace/16777216/0.001'
// Data is generated lazily for the cases the filter keeps. COMMSGD_REAL_GRADIENT names a raw little-endian
// float32 file that adds the distribution `real`. Every method runs on one thread, like the anchors.
// Counters count_over_k: the achieved count / k (1 for the exact methods); passes_per_call (laplace_bisect).
//
// Sequence mode, --sequence=DIR (repeatable): DIR holds consecutive accumulators of a training run, as
// examples/fashion_mnist --dump-accumulators writes them (manifest.txt + raw float32 files). Each benchmark
// iteration is one sweep: every method is called once per step in order, so a warm start sees the true
// drift; the first step of a sweep only primes the method (untimed), the other calls are timed one by one.
// Counters: ms_per_call (median over sweeps of the mean per call, CPU time of the calling thread: for the
// *_t2 variants, which run on two threads, that is its own chunk plus the serial parts, the time the call
// takes when each thread has a core of its own), wall_ms_per_call (the same on the wall clock),
// passes_per_call (laplace_bisect), count_over_k (mean) and max_count_over_k. Names:
// sequence/<method>/<DIR's last component>/<N>/<density>; --sweeps=S sets the sweeps (default 5).
// --chunk=C cuts every step into chunks of C values, as the top-k pseudo-gradient codes do
// (compress::top_k_ef), each with its own method object (so its own warm start) and k = ceil(density C);
// names end in /c<C>, and the counters are per step (all chunks), passes_per_call per chunk call.
// The methods laplace_bisect_from_0.8x and _from_1.2x of the synthetic grid restore a state 0.8 or 1.2
// times the true threshold before every call: how the warm start copes with a threshold that moved by 20 %.
// laplace_bisect_trim and _trim_cold select exactly k (options.trim): what an exact code may use.
// Sequence mode also has what a chunked top-k code runs, the pairs written: laplace_bisect_trim_compact (a
// selector and select::compact a chunk) and chunked (select::chunked, one call over all the chunks a step;
// held_over_k: the candidates its warm start collected a step over the step's k).
#include "../tests/unit/select_data.hpp"

#include <commsgd/select/select.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
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

// Passes over x of the last laplace_bisect call made through a run_fn (0 for other methods).
unsigned last_passes = 0;

template <class S>
run_fn selector_run(S s) {
  auto p = std::make_shared<S>(std::move(s));
  return [p](std::span<const float> x, std::size_t k) {
    const sel::threshold t = p->select(x, k);
    benchmark::DoNotOptimize(t);
    if constexpr (std::is_same_v<S, sel::laplace_bisect>) last_passes = p->last_passes();
    return static_cast<double>(t.count()) / static_cast<double>(k);
  };
}

run_fn make_method(const std::string& m) {
  const sel::parallel_options two_threads{2, std::size_t{1} << 20};
  if (m == "exact") return selector_run(sel::exact{});
  if (m == "radix") return selector_run(sel::radix{sel::radix::options{one_thread}});
  if (m == "radix_t2") return selector_run(sel::radix{sel::radix::options{two_threads}});
  if (m == "laplace_bisect_t2" || m == "laplace_bisect_cold_t2") {
    sel::laplace_bisect::options o;
    o.parallel = two_threads;
    o.warm_start = m == "laplace_bisect_t2";
    return selector_run(sel::laplace_bisect{o});
  }
  if (m == "laplace_bisect_from_0.8x" || m == "laplace_bisect_from_1.2x") {
    // Finds the true threshold once, then restores a state off by the factor before every call.
    sel::laplace_bisect::options o;
    o.parallel = one_thread;
    auto p = std::make_shared<sel::laplace_bisect>(o);
    auto truth = std::make_shared<float>(0.0f);
    const float factor = m == "laplace_bisect_from_0.8x" ? 0.8f : 1.2f;
    return [p, truth, factor](std::span<const float> x, std::size_t k) {
      if (*truth == 0.0f) *truth = sel::radix{sel::radix::options{one_thread}}.select(x, k).value;
      p->restore(sel::laplace_bisect::state{*truth * factor});
      const sel::threshold t = p->select(x, k);
      benchmark::DoNotOptimize(t);
      last_passes = p->last_passes();
      return static_cast<double>(t.count()) / static_cast<double>(k);
    };
  }
  if (m == "hierarchical")
    return selector_run(sel::hierarchical{sel::hierarchical::options{1 << 15, 3.0, one_thread}});
  if (m == "sampled") {
    sel::sampled::options o;
    o.parallel = one_thread;
    return selector_run(sel::sampled{o});
  }
  if (m == "laplace_bisect" || m == "laplace_bisect_cold" || m == "laplace_bisect_trim" ||
      m == "laplace_bisect_trim_cold") {
    sel::laplace_bisect::options o;
    o.parallel = one_thread;
    o.warm_start = m == "laplace_bisect" || m == "laplace_bisect_trim";
    o.trim = m.find("_trim") != std::string::npos;
    return selector_run(sel::laplace_bisect{o});
  }
  if (m == "laplace_bisect_trim_compact") {
    // What a chunked top-k code did a chunk before select::chunked: the exact threshold, then the pairs.
    sel::laplace_bisect::options o;
    o.parallel = one_thread;
    o.trim = true;
    auto p = std::make_shared<sel::laplace_bisect>(o);
    auto idx = std::make_shared<std::vector<std::uint32_t>>();
    auto val = std::make_shared<std::vector<float>>();
    return [p, idx, val](std::span<const float> x, std::size_t k) {
      const sel::threshold t = p->select(x, k);
      idx->resize(k);
      val->resize(k);
      sel::compact<std::uint32_t>(x, t, std::span<std::uint32_t>(*idx), std::span<float>(*val));
      benchmark::DoNotOptimize(idx->data());
      last_passes = p->last_passes() + 1;
      return static_cast<double>(t.count()) / static_cast<double>(k);
    };
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
  last_passes = 0;
  double passes = 0;
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
    passes += last_passes;
    i = (i + 1) % bufs.size();
  }
  state.counters["count_over_k"] = sum / static_cast<double>(state.iterations());
  state.counters["passes_per_call"] = passes / static_cast<double>(state.iterations());
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

// --- sequence mode ---

struct sequence {
  std::string tag;
  double density = 0;
  std::vector<std::vector<float>> steps;
};

std::vector<sequence>& sequences() {
  static std::vector<sequence> all;
  return all;
}

std::size_t sequence_chunk = 0; // --chunk=C; 0: the whole step is one chunk

sequence load_sequence(const std::string& dir) {
  sequence s;
  s.tag = std::filesystem::path(dir).filename().string();
  if (s.tag.empty()) s.tag = std::filesystem::path(dir).parent_path().filename().string();
  std::ifstream m(std::filesystem::path(dir) / "manifest.txt");
  if (!m) throw std::runtime_error("select_bench: no manifest.txt in --sequence=" + dir);
  std::size_t n = 0;
  std::string line;
  while (std::getline(m, line)) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "n")
      in >> n;
    else if (key == "density")
      in >> s.density;
    else if (key == "file") {
      std::string name;
      in >> name;
      std::ifstream f(std::filesystem::path(dir) / name, std::ios::binary);
      std::vector<float> x(n);
      f.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(n * sizeof(float)));
      if (!f || n == 0) throw std::runtime_error("select_bench: cannot read " + name + " in " + dir);
      s.steps.push_back(std::move(x));
    }
  }
  if (s.steps.size() < 2 || !(s.density > 0))
    throw std::runtime_error("select_bench: --sequence=" + dir + " needs n, density and at least 2 files");
  return s;
}

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Candidates select::chunked collected in its last call (what its warm start kept it to).
std::size_t last_held = 0;

void run_sequence(benchmark::State& state, std::string method, std::size_t which) {
  const sequence& s = sequences()[which];
  const std::size_t n = s.steps[0].size();
  const std::size_t c = sequence_chunk == 0 ? n : std::min(sequence_chunk, n);
  std::vector<run_fn> runs; // one a chunk
  for (std::size_t at = 0; at < n && method != "chunked"; at += c)
    runs.push_back(make_method(method));
  std::size_t k = 0;
  for (std::size_t at = 0; at < n; at += c)
    k += sel::k_for_density(std::min(c, n - at), s.density);
  unsigned chunk_passes = 0;
  // chunked: one call a step over every chunk, its pairs written (as laplace_bisect_trim_compact's are).
  sel::chunked many;
  std::vector<std::uint32_t> many_idx(k);
  std::vector<float> many_val(k);
  auto run_many = [&](std::span<const float> x) {
    const std::size_t got = many.select_chunks(
        x, c, [&](std::size_t j) { return sel::k_for_density(std::min(c, n - j * c), s.density); }, many_idx,
        many_val);
    benchmark::DoNotOptimize(many_idx.data());
    last_passes = many.last_passes();
    last_held = many.last_held();
    return static_cast<double>(got) / static_cast<double>(k);
  };
  // One step: every chunk selected by its own object; the count over k of the whole step.
  auto run = [&](std::span<const float> x, std::size_t) {
    if (method == "chunked") return run_many(x);
    double count = 0;
    chunk_passes = 0;
    for (std::size_t j = 0, at = 0; at < n; ++j, at += c) {
      const std::size_t len = std::min(c, n - at), kj = sel::k_for_density(len, s.density);
      last_passes = 0;
      count += runs[j](x.subspan(at, len), kj) * static_cast<double>(kj);
      chunk_passes += last_passes;
    }
    last_passes = chunk_passes;
    return count / static_cast<double>(k);
  };
  std::vector<double> sweep_cpu, sweep_wall;
  double count_sum = 0, count_max = 0, passes = 0, calls = 0, held = 0;
  for (auto _ : state) {
    run(s.steps[0], k); // primes a warm start with the true previous step
    double cpu = 0, wall = 0;
    for (std::size_t i = 1; i < s.steps.size(); ++i) {
      last_passes = 0;
      const double w0 = wall_seconds(), c0 = thread_seconds();
      const double ratio = run(s.steps[i], k);
      cpu += thread_seconds() - c0;
      wall += wall_seconds() - w0;
      count_sum += ratio;
      count_max = std::max(count_max, ratio);
      passes += last_passes;
      held += static_cast<double>(last_held);
      calls += 1;
    }
    sweep_cpu.push_back(cpu / static_cast<double>(s.steps.size() - 1));
    sweep_wall.push_back(wall / static_cast<double>(s.steps.size() - 1));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t m = v.size();
    return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
  };
  state.counters["ms_per_call"] = 1e3 * median(sweep_cpu);
  state.counters["wall_ms_per_call"] = 1e3 * median(sweep_wall);
  state.counters["count_over_k"] = count_sum / calls;
  state.counters["max_count_over_k"] = count_max;
  state.counters["passes_per_call"] = passes / calls / static_cast<double>((n + c - 1) / c);
  if (method == "chunked") state.counters["held_over_k"] = held / calls / static_cast<double>(k);
  state.counters["n"] = static_cast<double>(n);
  state.counters["chunk"] = static_cast<double>(c);
  state.counters["k"] = static_cast<double>(k);
  state.counters["calls_per_sweep"] = static_cast<double>(s.steps.size() - 1);
}

void register_sequences(int sweeps) {
  const char* methods[] = {"floor",
                           "nth_element",
                           "radix",
                           "hierarchical",
                           "sampled",
                           "laplace_bisect",
                           "laplace_bisect_cold",
                           "radix_t2",
                           "laplace_bisect_t2",
                           "laplace_bisect_cold_t2",
                           "laplace_bisect_trim",
                           "laplace_bisect_trim_cold",
                           "laplace_bisect_trim_compact",
                           "chunked"};
  for (std::size_t i = 0; i < sequences().size(); ++i) {
    const sequence& s = sequences()[i];
    for (const char* m : methods) {
      const std::string name = "sequence/" + std::string(m) + "/" + s.tag + "/" +
                               std::to_string(s.steps[0].size()) + "/" + density_name(s.density) +
                               (sequence_chunk ? "/c" + std::to_string(sequence_chunk) : "");
      benchmark::RegisterBenchmark(name.c_str(), run_sequence, std::string(m), i)
          ->Iterations(sweeps)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

const int registered = [] {
  const char* methods[] = {"floor",
                           "nth_element",
                           "partial_sort",
                           "exact",
                           "radix",
                           "hierarchical",
                           "sampled",
                           "laplace_bisect",
                           "laplace_bisect_cold",
                           "laplace_bisect_from_0.8x",
                           "laplace_bisect_from_1.2x"};
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

int main(int argc, char** argv) {
  // Our own flags first: --sequence=DIR (repeatable), --sweeps=S (default 5) and --chunk=C; the rest is
  // Google Benchmark's.
  std::vector<char*> rest{argv[0]};
  int sweeps = 5;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a.rfind("--sequence=", 0) == 0)
        sequences().push_back(load_sequence(a.substr(11)));
      else if (a.rfind("--chunk=", 0) == 0)
        sequence_chunk = static_cast<std::size_t>(std::stoull(a.substr(8)));
      else if (a.rfind("--sweeps=", 0) == 0)
        sweeps = std::max(1, std::stoi(a.substr(9)));
      else
        rest.push_back(argv[i]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  register_sequences(sweeps);
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
