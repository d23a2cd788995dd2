// CSSGD against its baselines: per-node bytes, coding work and modelled exchange time for n nodes.
//
//   coding_bench                       every exchange for n in {3, 4, 6, 8, 10}, r in 1..n-1
//   coding_bench --benchmark_filter=cssgd/10
//   mpiexec -n 3 coding_bench          every exchange for n = 3 (2..4 processes) over comm::mpi
//
// Figures are per node, for gradients of d = 2^20 floats. Bytes and simulated times come from the cost
// model (cost/), which the run checks against comm::metered and comm::simulated on comm::local threads
// (a mismatch aborts the program). Those threads run on whatever cores the machine has, so the exchange
// itself runs at d_run <= 2^20 where n * C(n-1, r) blocks of 2^20 floats would not fit in memory; wall_ms
// is that run's wall time and says little about a real network. Encode and decode times are estimated from
// the combiner throughput measured at start-up (one core) times the words each node combines and removes.
//
// Under mpiexec with 2..4 processes (builds with COMMSGD_BENCH_HAS_MPI) the same exchanges run instead over
// comm::mpi wrapped in metered and simulated, for n = the number of processes and the same r as the threads
// mode, at the full d = 2^20; the same exact check against the cost model applies (on any rank's mismatch
// every rank stops). mpi_wall_ms is the median, over a fixed number of iterations after one warm-up, of the
// slowest rank's wall time for one exchange (barrier to barrier); all ranks run the same fixed iteration
// counts so they stay in the same collectives, and only rank 0 reports. MPI is initialised only when the
// launcher says there is more than one process: started alone, the program is the threads benchmark above.
#include <commsgd/coding/coding.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/cost/coding_traffic.hpp>
#include <commsgd/cost/time.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#if COMMSGD_BENCH_HAS_MPI
#include <commsgd/comm/mpi.hpp>

#include <boost/mpi/environment.hpp>
#endif

namespace coding = commsgd::coding;
namespace comm = commsgd::comm;
namespace cost = commsgd::cost;
using kind = cost::exchange_kind;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t d_full = std::uint64_t{1} << 20;

// Seconds per word of combine (or remove) for a combiner, measured on one core over 2^20 words.
template <class K>
double seconds_per_word() {
  static const double value = [] {
    std::vector<float> v(d_full);
    for (std::size_t e = 0; e < v.size(); ++e)
      v[e] = static_cast<float>(e % 1000) * 1e-3f - 0.5f;
    std::vector<std::uint32_t> packet(d_full, 0);
    K::combine(packet, v); // warm-up
    const auto t0 = clock_type::now();
    constexpr int reps = 8;
    for (int i = 0; i < reps; ++i) {
      K::combine(packet, v);
      benchmark::DoNotOptimize(packet.data());
    }
    return std::chrono::duration<double>(clock_type::now() - t0).count() /
           (reps * static_cast<double>(d_full));
  }();
  return value;
}

std::uint64_t run_length(int n, int r, kind k) {
  std::uint64_t per_rank = 2;
  if (k == kind::cssgd || k == kind::uncoded_shuffle) per_rank += coding::binomial(n - 1, r) + 1;
  if (k == kind::all_gather || k == kind::unicast) per_rank += static_cast<std::uint64_t>(n);
  const std::uint64_t budget = std::uint64_t{1} << 28; // 1 GiB of floats over all ranks
  return std::min(d_full, std::bit_floor(std::max<std::uint64_t>(
                              1, budget / (static_cast<std::uint64_t>(n) * per_rank))));
}

template <class C>
double exchange_once(kind k, C& c, int r, std::size_t d) {
  auto go = [&](auto&& scheme) {
    // Every block's gradient is the same vector: holders agree by construction and no memory is spent on
    // C(n-1, r-1) copies.
    std::vector<float> g(d);
    for (std::size_t e = 0; e < d; ++e)
      g[e] = static_cast<float>((e * 2654435761u) % 2001) * 1e-3f - 1.0f;
    const std::vector<std::span<const float>> v(scheme.my_blocks().size(), std::span<const float>(g));
    std::vector<float> out(d);
    c.inner().reset();
    c.reset();
    c.barrier();
    c.inner().reset();
    c.reset();
    const auto t0 = clock_type::now();
    scheme.exchange(v, out);
    c.inner().barrier();
    return std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  switch (k) {
  case kind::ring_all_reduce:
    return go(coding::uncoded<C, coding::by_ring_all_reduce>(c));
  case kind::all_gather:
    return go(coding::uncoded<C, coding::by_all_gather>(c));
  case kind::unicast:
    return go(coding::uncoded<C, coding::by_unicast>(c));
  case kind::uncoded_shuffle:
    return go(coding::uncoded_shuffle<C>(c, r));
  case kind::cssgd:
    return go(coding::cssgd<coding::xor_bits, C>(c, r));
  }
  return 0;
}

// Per-node bytes (worst node, in units of d) and modelled times at the full d, from the cost model.
void model_counters(benchmark::State& state, kind k, int n, int r) {
  const auto net = comm::network_model::gigabit();
  comm::traffic worst{};
  for (int i = 0; i < n; ++i) {
    const auto t = cost::exchange_traffic(k, n, r, d_full, 4, i);
    worst.bytes_sent = std::max(worst.bytes_sent, t.bytes_sent);
    worst.bytes_received = std::max(worst.bytes_received, t.bytes_received);
  }
  const auto mc = comm::network_model::gigabit(comm::medium::multicast);
  std::uint64_t tx_mc = 0;
  for (int i = 0; i < n; ++i)
    tx_mc = std::max(tx_mc, cost::exchange_load(k, n, r, d_full, 4, i, mc).bytes_sent);
  const double d_values = static_cast<double>(d_full);
  state.counters["sent_d"] = static_cast<double>(worst.bytes_sent) / 4 / d_values;
  state.counters["recv_d"] = static_cast<double>(worst.bytes_received) / 4 / d_values;
  state.counters["tx_mcast_d"] = static_cast<double>(tx_mc) / 4 / d_values;
  state.counters["sim_switched_ms"] = 1e3 * cost::exchange_seconds_slowest(k, n, r, d_full, 4, net);
  state.counters["sim_mcast_ms"] = 1e3 * cost::exchange_seconds_slowest(k, n, r, d_full, 4, mc);
}

void exchange_bench(benchmark::State& state, kind k) {
  const int n = static_cast<int>(state.range(0));
  const int r = static_cast<int>(state.range(1));
  const auto net = comm::network_model::gigabit();
  const auto d_run = run_length(n, r, k);
  for (auto _ : state) {
    std::atomic<bool> mismatch{false};
    double wall = 0;
    comm::local_group(n).run([&](comm::local& c) {
      comm::simulated<comm::metered<comm::local>> s(comm::metered<comm::local>(c), net);
      const double t = exchange_once(k, s, r, d_run);
      if (cost::measured(s.inner().counters().total()) !=
              cost::exchange_traffic(k, n, r, d_run, 4, c.rank()) ||
          s.now() != cost::exchange_seconds(k, n, r, d_run, 4, c.rank(), net))
        mismatch = true;
      if (c.rank() == 0) wall = t;
    });
    if (mismatch) {
      std::fprintf(stderr, "cost model disagrees with the measured run: %s n=%d r=%d\n",
                   cost::exchange_name(k), n, r);
      std::abort();
    }
    state.SetIterationTime(wall);
  }
  model_counters(state, k, n, r);
  state.counters["d_run"] = static_cast<double>(d_run);
  if (k == kind::cssgd) {
    const double g = static_cast<double>(coding::binomial(n - 1, r));
    const double len = static_cast<double>(coding::cssgd_packet_length(d_full, r));
    // Per node: its own G packets combine r segments each; the r*G it receives each lose r-1 segments.
    state.counters["encode_ms"] = 1e3 * g * r * len * seconds_per_word<coding::xor_bits>();
    state.counters["decode_ms"] = 1e3 * g * r * (r - 1) * len * seconds_per_word<coding::xor_bits>();
    state.counters["decode_int32_ms"] = 1e3 * g * r * (r - 1) * len * seconds_per_word<coding::int32_sum>();
  }
}

void redundant_args(benchmark::internal::Benchmark* b) {
  for (int n : {3, 4, 6, 8, 10})
    for (int r = 1; r < n; ++r)
      b->Args({n, r});
}
void uncoded_args(benchmark::internal::Benchmark* b) {
  for (int n : {3, 4, 6, 8, 10})
    b->Args({n, 1});
}

// The order of the rows; the uncoded exchanges have no r and run once with r = 1.
constexpr std::pair<const char*, kind> exchanges[] = {{"cssgd", kind::cssgd},
                                                      {"uncoded_shuffle", kind::uncoded_shuffle},
                                                      {"all_gather", kind::all_gather},
                                                      {"unicast", kind::unicast},
                                                      {"ring_all_reduce", kind::ring_all_reduce}};

bool redundant(kind k) {
  return k == kind::cssgd || k == kind::uncoded_shuffle;
}

void register_threads() {
  for (auto [name, k] : exchanges)
    benchmark::RegisterBenchmark((std::string("exchange_bench/") + name).c_str(), exchange_bench, k)
        ->Apply(redundant(k) ? redundant_args : uncoded_args)
        ->ArgNames({"n", "r"})
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
}

#if COMMSGD_BENCH_HAS_MPI

constexpr int mpi_iterations = 9;

// One exchange over comm::mpi on every rank; the cost-model check and the slowest rank's time.
void mpi_exchange_bench(benchmark::State& state, kind k) {
  const int r = static_cast<int>(state.range(1));
  const auto net = comm::network_model::gigabit();
  using stack = comm::simulated<comm::metered<comm::mpi>>;
  stack s(comm::metered<comm::mpi>(comm::mpi::world()), net);
  const int n = s.size();
  const MPI_Comm raw = s.inner().inner().native();
  std::uint64_t sent = 0, received = 0;
  auto once = [&] {
    const double t = exchange_once(k, s, r, d_full);
    const auto got = cost::measured(s.inner().counters().total());
    int mismatch = got != cost::exchange_traffic(k, n, r, d_full, 4, s.rank()) ||
                   s.now() != cost::exchange_seconds(k, n, r, d_full, 4, s.rank(), net);
    MPI_Allreduce(MPI_IN_PLACE, &mismatch, 1, MPI_INT, MPI_LOR, raw);
    if (mismatch) {
      if (s.rank() == 0)
        std::fprintf(stderr, "cost model disagrees with the measured MPI run: %s n=%d r=%d\n",
                     cost::exchange_name(k), n, r);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    std::uint64_t bytes[2] = {got.bytes_sent, got.bytes_received};
    MPI_Allreduce(MPI_IN_PLACE, bytes, 2, MPI_UINT64_T, MPI_MAX, raw);
    sent = bytes[0];
    received = bytes[1];
    double slowest = t;
    MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, raw);
    return slowest;
  };
  once(); // warm-up: first touch of the buffers and of Open MPI's shared-memory segments
  std::vector<double> times;
  for (auto _ : state) {
    times.push_back(once());
    state.SetIterationTime(times.back());
  }
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  model_counters(state, k, n, r);
  const double d_values = static_cast<double>(d_full);
  state.counters["sent_d"] = static_cast<double>(sent) / 4 / d_values; // metered, worst rank
  state.counters["recv_d"] = static_cast<double>(received) / 4 / d_values;
  state.counters["mpi_wall_ms"] = 1e3 * times[times.size() / 2];
  state.counters["ranks"] = n;
}

void register_mpi(int n) {
  for (auto [name, k] : exchanges)
    for (int r = 1; r < (redundant(k) ? n : 2); ++r)
      benchmark::RegisterBenchmark((std::string("mpi_exchange/") + name).c_str(), mpi_exchange_bench, k)
          ->Args({n, r})
          ->ArgNames({"n", "r"})
          ->Iterations(mpi_iterations)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
}

// Output of the ranks other than 0 goes nowhere.
class silent_reporter : public benchmark::BenchmarkReporter {
public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// The process count the launcher announces (Open MPI, or a PMI launcher such as Hydra); 1 without one.
int launched_processes() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 1;
}

int mpi_main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2 || size > 4) {
    if (rank == 0)
      std::fprintf(stderr, "coding_bench: the MPI mode runs on 2 to 4 processes, not %d\n", size);
    return 2;
  }
  // Only rank 0 may write --benchmark_out: the others would truncate the same file.
  std::vector<char*> args(argv, argv + argc);
  if (rank != 0)
    args.erase(std::remove_if(args.begin() + 1, args.end(),
                              [](const char* a) { return std::string(a).starts_with("--benchmark_out"); }),
               args.end());
  int nargs = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&nargs, args.data());
  register_mpi(size);
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    silent_reporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  return 0;
}

#endif

} // namespace

int main(int argc, char** argv) {
#if COMMSGD_BENCH_HAS_MPI
  if (launched_processes() > 1) return mpi_main(argc, argv);
#endif
  benchmark::Initialize(&argc, argv);
  register_threads();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
