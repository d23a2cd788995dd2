// Communicator throughput.
//
//   mpiexec -n 2 bench/comm_bench     comm::mpi all_reduce_sum<float> against a raw MPI_Allreduce, 4 KiB..64
//   MiB bench/comm_bench                  (one process) comm::local all_reduce_sum with 2 and 4 threads, 16M
//   floats,
//                                     against a memcpy of the same buffer
//
// Under MPI every rank runs the same benchmarks with fixed iteration counts (Google Benchmark would otherwise
// pick counts per rank from its own timings and the ranks would stop in different collectives); each
// iteration starts at a barrier and its time is the slowest rank's, and only rank 0 reports. The two
// communicator kinds run in separate invocations so that neither competes for the cores with the other.
//
// Buffers hold zeros: the sum of zeros stays zero, so neither overflow to infinity nor denormals can change
// the speed of the adds from one iteration to the next.
#include <commsgd/comm/local.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#if COMMSGD_BENCH_HAS_MPI
#include <commsgd/comm/mpi.hpp>

#include <boost/mpi/environment.hpp>
#endif

namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::size_t kib = 1024, mib = 1024 * kib;

// comm::local: bytes of one rank's buffer reduced per second (nccl-tests' "algorithm bandwidth").
void local_all_reduce(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const auto count = static_cast<std::size_t>(state.range(1));
  std::vector<std::vector<float>> buffers(static_cast<std::size_t>(n), std::vector<float>(count, 0.0f));
  for (auto _ : state) {
    double seconds = 0;
    commsgd::comm::local_group(n).run([&](commsgd::comm::local& c) {
      auto& buf = buffers[static_cast<std::size_t>(c.rank())];
      c.barrier();
      const auto t0 = clock_type::now();
      c.all_reduce_sum(std::span<float>(buf));
      c.barrier();
      if (c.rank() == 0) seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
    });
    state.SetIterationTime(seconds);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(count * sizeof(float)));
  state.counters["ranks"] = n;
}

// The floor an in-memory all-reduce is measured against: one copy of the same buffer.
void memcpy_floor(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  std::vector<float> src(count, 0.0f), dst(count, 1.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), count * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(count * sizeof(float)));
}

#if COMMSGD_BENCH_HAS_MPI

// Enough iterations for a stable median, few enough that the 64 MiB case stays within seconds.
std::int64_t iterations_for(std::size_t bytes) {
  return static_cast<std::int64_t>(std::clamp<std::size_t>(512 * mib / bytes, 24, 2000));
}

// Runs fn between barriers and returns the slowest rank's time.
template <class Fn>
double timed(MPI_Comm comm, Fn&& fn) {
  MPI_Barrier(comm);
  const auto t0 = clock_type::now();
  fn();
  double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
  return seconds;
}

enum class path { raw, commsgd, commsgd_unchecked };

void mpi_all_reduce(benchmark::State& state, path which) {
  const auto count = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  auto c = commsgd::comm::mpi::world();
  c.set_verify_sizes(which != path::commsgd_unchecked);
  std::vector<float> buf(count, 0.0f);
  for (auto _ : state)
    state.SetIterationTime(timed(c.native(), [&] {
      if (which == path::raw)
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, c.native());
      else
        c.all_reduce_sum(std::span<float>(buf));
    }));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(count * sizeof(float)));
}

// Both paths in the same iterations on the same buffer, alternating which goes first, so drift in machine
// load (this is a shared machine) touches both alike; the ratio is of medians.
void mpi_all_reduce_ratio(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  auto c = commsgd::comm::mpi::world();
  std::vector<float> buf(count, 0.0f);
  std::vector<double> raw_times, ours_times;
  auto raw = [&] {
    return timed(c.native(), [&] {
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, c.native());
    });
  };
  auto ours = [&] { return timed(c.native(), [&] { c.all_reduce_sum(std::span<float>(buf)); }); };
  bool raw_first = true;
  for (auto _ : state) {
    double tr, to;
    if (raw_first) {
      tr = raw();
      to = ours();
    } else {
      to = ours();
      tr = raw();
    }
    raw_first = !raw_first;
    raw_times.push_back(tr);
    ours_times.push_back(to);
    state.SetIterationTime(tr + to);
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const double mr = median(raw_times), mo = median(ours_times);
  state.counters["raw_us"] = mr * 1e6;
  state.counters["commsgd_us"] = mo * 1e6;
  state.counters["ratio"] = mo / mr;
}

#endif

// Output of the ranks other than 0 goes nowhere.
class silent_reporter : public benchmark::BenchmarkReporter {
public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

void register_local() {
  for (int n : {2, 4})
    benchmark::RegisterBenchmark("local_all_reduce_sum", local_all_reduce)
        ->Args({n, 16 << 20})
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("memcpy_floor", memcpy_floor)->Arg(16 << 20)->Unit(benchmark::kMillisecond);
}

} // namespace

int main(int argc, char** argv) {
#if COMMSGD_BENCH_HAS_MPI
  boost::mpi::environment env(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Only rank 0 may write --benchmark_out: the others would truncate the same file.
  std::vector<char*> args(argv, argv + argc);
  if (rank != 0)
    args.erase(std::remove_if(args.begin() + 1, args.end(),
                              [](const char* a) { return std::string(a).starts_with("--benchmark_out"); }),
               args.end());
  int nargs = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&nargs, args.data());
  if (size == 1) {
    register_local();
  } else {
    const std::vector<std::int64_t> sizes{4 * kib, 64 * kib, 1 * mib, 4 * mib, 16 * mib, 64 * mib};
    for (auto [name, which] :
         {std::pair{"mpi_raw_allreduce", path::raw}, std::pair{"mpi_commsgd_all_reduce_sum", path::commsgd},
          std::pair{"mpi_commsgd_all_reduce_sum_unchecked", path::commsgd_unchecked}})
      for (auto bytes : sizes)
        benchmark::RegisterBenchmark(name, mpi_all_reduce, which)
            ->Arg(bytes)
            ->Iterations(iterations_for(static_cast<std::size_t>(bytes)))
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
    for (auto bytes : sizes)
      benchmark::RegisterBenchmark("mpi_ratio_commsgd_over_raw", mpi_all_reduce_ratio)
          ->Arg(bytes)
          ->Iterations(iterations_for(static_cast<std::size_t>(bytes)))
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  }
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    silent_reporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
#else
  benchmark::Initialize(&argc, argv);
  register_local();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
#endif
  return 0;
}
