// CSSGD against its baselines: per-node bytes, coding work and modelled exchange time for n nodes.
//
//   coding_bench                       every exchange for n in {3, 4, 6, 8, 10}, r in 1..n-1
//   coding_bench --benchmark_filter=cssgd/10
//
// Figures are per node, for gradients of d = 2^20 floats. Bytes and simulated times come from the cost
// model (cost/), which the run checks against comm::metered and comm::simulated on comm::local threads
// (a mismatch aborts the program). Those threads run on whatever cores the machine has, so the exchange
// itself runs at d_run <= 2^20 where n * C(n-1, r) blocks of 2^20 floats would not fit in memory; wall_ms
// is that run's wall time and says little about a real network. Encode and decode times are estimated from
// the combiner throughput measured at start-up (one core) times the words each node combines and removes.
#include <commsgd/coding/coding.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/cost/time.hpp>
#include <commsgd/cost/traffic.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

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

cost::node_traffic model_traffic(kind k, int n, int r, std::uint64_t d, int rank) {
  switch (k) {
  case kind::ring_all_reduce:
    return cost::ring_all_reduce(n, d, 4, rank);
  case kind::all_gather:
    return cost::all_gather(n, d, 4);
  case kind::unicast:
    return cost::unicast(n, d, 4);
  case kind::uncoded_shuffle:
    return cost::uncoded_shuffle(n, r, d, 4, rank);
  case kind::cssgd:
    return cost::cssgd(n, r, d, 4);
  }
  return {};
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
      if (cost::measured(s.inner().counters().total()) != model_traffic(k, n, r, d_run, c.rank()) ||
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
  cost::node_traffic worst{};
  for (int i = 0; i < n; ++i) {
    const auto t = model_traffic(k, n, r, d_full, i);
    worst.bytes_sent = std::max(worst.bytes_sent, t.bytes_sent);
    worst.bytes_received = std::max(worst.bytes_received, t.bytes_received);
  }
  const auto mc = comm::network_model::gigabit(comm::medium::multicast);
  std::uint64_t tx_mc = 0;
  for (int i = 0; i < n; ++i)
    tx_mc = std::max(tx_mc, cost::exchange_load(k, n, r, d_full, 4, i, mc).tx_bytes);
  const double d_values = static_cast<double>(d_full);
  state.counters["sent_d"] = static_cast<double>(worst.bytes_sent) / 4 / d_values;
  state.counters["recv_d"] = static_cast<double>(worst.bytes_received) / 4 / d_values;
  state.counters["tx_mcast_d"] = static_cast<double>(tx_mc) / 4 / d_values;
  state.counters["sim_switched_ms"] = 1e3 * cost::exchange_seconds_slowest(k, n, r, d_full, 4, net);
  state.counters["sim_mcast_ms"] = 1e3 * cost::exchange_seconds_slowest(k, n, r, d_full, 4, mc);
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

} // namespace

BENCHMARK_CAPTURE(exchange_bench, cssgd, kind::cssgd)
    ->Apply(redundant_args)
    ->ArgNames({"n", "r"})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(exchange_bench, uncoded_shuffle, kind::uncoded_shuffle)
    ->Apply(redundant_args)
    ->ArgNames({"n", "r"})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(exchange_bench, all_gather, kind::all_gather)
    ->Apply(uncoded_args)
    ->ArgNames({"n", "r"})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(exchange_bench, unicast, kind::unicast)
    ->Apply(uncoded_args)
    ->ArgNames({"n", "r"})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(exchange_bench, ring_all_reduce, kind::ring_all_reduce)
    ->Apply(uncoded_args)
    ->ArgNames({"n", "r"})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
