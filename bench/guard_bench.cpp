// The replica guard's cost per check against one all-reduce of the same model, in the same run.
//
//   bench/guard_bench            comm::local, 4 ranks (threads), d = 2^20 and 2^24 floats
//
// guard_check       sync::replica_guard::check: model_hash of the rank's model, an all_gather of one
//                   16-byte report per rank, the verdict.
// model_hash        the hash alone, on one thread (no collective): the part that grows with d.
// all_reduce_sum    comm::local's all_reduce_sum of the same model: what a synchronous step pays anyway.
// guard_vs_all_reduce  both in alternation within one benchmark; the counter `ratio` is the guard's time
//                   over the all-reduce's, which is the figure to quote.
//
// Each timed call starts at a barrier and ends at one, so its time is the slowest rank's; threads start once
// per benchmark iteration and `reps` calls are timed inside it. Models hold zeros (the hash reads bits, its
// speed does not depend on them, and the sum of zeros stays zero).
#include <commsgd/comm/local.hpp>
#include <commsgd/sync/replica_guard.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
constexpr int reps = 5;

enum class op { guard, all_reduce, both };

struct timings {
  double guard = 0, all_reduce = 0;
};

timings run_group(int n, std::size_t d, op which) {
  static std::vector<std::vector<float>> models;
  models.resize(static_cast<std::size_t>(n));
  for (auto& m : models)
    m.assign(d, 0.0f);
  timings t;
  commsgd::comm::local_group(n).run([&](commsgd::comm::local& c) {
    auto& x = models[static_cast<std::size_t>(c.rank())];
    commsgd::sync::replica_guard<commsgd::comm::local> guard(c, 1);
    auto timed = [&](auto&& fn) {
      c.barrier();
      const auto t0 = clock_type::now();
      fn();
      c.barrier();
      return std::chrono::duration<double>(clock_type::now() - t0).count();
    };
    for (int r = 0; r < reps; ++r) {
      double g = 0, a = 0;
      if (which != op::all_reduce) g = timed([&] { guard.check(x); });
      if (which != op::guard) a = timed([&] { c.all_reduce_sum(std::span<float>(x)); });
      if (c.rank() == 0) {
        t.guard += g;
        t.all_reduce += a;
      }
    }
  });
  return t;
}

void guard_check(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const auto d = static_cast<std::size_t>(state.range(1));
  for (auto _ : state)
    state.SetIterationTime(run_group(n, d, op::guard).guard / reps);
  state.counters["ranks"] = n;
}

void all_reduce_sum(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const auto d = static_cast<std::size_t>(state.range(1));
  for (auto _ : state)
    state.SetIterationTime(run_group(n, d, op::all_reduce).all_reduce / reps);
  state.counters["ranks"] = n;
}

void guard_vs_all_reduce(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const auto d = static_cast<std::size_t>(state.range(1));
  double g = 0, a = 0;
  for (auto _ : state) {
    const auto t = run_group(n, d, op::both);
    g += t.guard;
    a += t.all_reduce;
    state.SetIterationTime((t.guard + t.all_reduce) / reps);
  }
  state.counters["ratio"] = a > 0 ? g / a : 0.0;
  state.counters["ranks"] = n;
}

void model_hash(benchmark::State& state) {
  const auto d = static_cast<std::size_t>(state.range(0));
  std::vector<float> x(d, 0.0f);
  for (auto _ : state)
    benchmark::DoNotOptimize(commsgd::sync::model_hash(x));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(d * sizeof(float)));
}

} // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (std::int64_t d : {std::int64_t{1} << 20, std::int64_t{1} << 24}) {
    benchmark::RegisterBenchmark("guard_check", guard_check)
        ->Args({4, d})
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("all_reduce_sum", all_reduce_sum)
        ->Args({4, d})
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("guard_vs_all_reduce", guard_vs_all_reduce)
        ->Args({4, d})
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("model_hash", model_hash)->Arg(d)->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
