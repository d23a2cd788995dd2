// One rank's work in a compressed reduce-scatter (FSDP2's gradient reduce-scatter through commsgd_torch.fsdp),
// per code, against its memory floor timed in the same iteration.
//
// rs/<code>     compress::<code>_reduce_scatter::reduce_scatter() on bench::mirror (rank 0 of n, every peer
//               sending what this rank does): p = g + e (error feedback on, as commsgd_torch.fsdp's default),
//               the n parts coded, the all-to-all (this rank's blocks looped back), the n parts decoded and
//               summed, the residual kept. Only the call is timed (manual time). g is a fixed gradient-like
//               normal(0, 1) vector, so every block takes the per-value code.
// The floor     std::memcpy moving the bytes such a round must read and write (floor_bytes() below), src and
//               dst of floor / 2 bytes each. Counters: rs/floor (mean call time / mean floor time),
//               floor_GBps (memcpy's bytes read + written a second), floor_bytes, message_bytes (all n parts).
// Args: d (the module's padded gradient, values), n (ranks sharing it).
//
//   bench/reduce_scatter_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <commsgd/compress/block_reduce_scatter.hpp>
#include <commsgd/compress/half_reduce_scatter.hpp>
#include <commsgd/cost/compress.hpp>

#include "mirror.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace commsgd;
using bench::mirror;

// Bytes a fused round must move for d values over n ranks with `message` bytes of codes in all n parts:
//   read g, read and write the residual (one float a value)    12 d
//   write the n parts' codes, read the n received parts         2 message
//   write this rank's part of the sum                           4 d / n
double floor_bytes(std::uint64_t d, int n, std::uint64_t message) {
  const double D = static_cast<double>(d);
  return 12.0 * D + 2.0 * static_cast<double>(message) + 4.0 * D / n;
}

template <class X>
std::uint64_t message_bytes(std::uint64_t d, int n) {
  if constexpr (requires { X::format::name; })
    return 2 * d;
  else
    return static_cast<std::uint64_t>(n) *
           cost::block_reduce_scatter_part_bytes(d, n, 256, X::name[0] == 'i' ? 8 : 4);
}

template <class X>
void round(benchmark::State& state) {
  const auto d = static_cast<std::size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  std::vector<float> g(d), out(d / static_cast<std::size_t>(n));
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : g)
    v = normal(rng);
  const auto message = message_bytes<X>(d, n);
  const double floor = floor_bytes(d, n, message);
  const auto half = static_cast<std::size_t>(floor / 2);
  std::vector<std::byte> src(half, std::byte{1}), dst(half, std::byte{2});

  mirror c(n);
  X x(d, {.error_feedback = true});
  x.reduce_scatter(c, g, out); // warm-up: buffers allocated
  using clock = std::chrono::steady_clock;
  double floor_s = 0, round_s = 0;
  for (auto _ : state) {
    const auto f0 = clock::now();
    std::memcpy(dst.data(), src.data(), half);
    benchmark::ClobberMemory();
    floor_s += std::chrono::duration<double>(clock::now() - f0).count();
    const auto t0 = clock::now();
    x.reduce_scatter(c, g, out);
    benchmark::ClobberMemory();
    const double t = std::chrono::duration<double>(clock::now() - t0).count();
    round_s += t;
    state.SetIterationTime(t);
  }
  const double it = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(floor * it));
  state.counters["floor_bytes"] = floor;
  state.counters["message_bytes"] = static_cast<double>(message);
  state.counters["floor_GBps"] = 2.0 * static_cast<double>(half) * it / floor_s / 1e9;
  state.counters["rs/floor"] = round_s / floor_s;
}

void args(benchmark::internal::Benchmark* b) {
  for (std::int64_t d : {std::int64_t{1} << 20, std::int64_t{1} << 24})
    b->Args({d, 4});
  b->ArgNames({"d", "n"})->UseManualTime()->Unit(benchmark::kMillisecond);
}

const bool registered = [] {
  benchmark::RegisterBenchmark("rs/int8", round<compress::int8_reduce_scatter>)->Apply(args);
  benchmark::RegisterBenchmark("rs/e3m0", round<compress::e3m0_reduce_scatter>)->Apply(args);
  benchmark::RegisterBenchmark("rs/fp16", round<compress::fp16_reduce_scatter>)->Apply(args);
  benchmark::RegisterBenchmark("rs/bf16", round<compress::bf16_reduce_scatter>)->Apply(args);
  return true;
}();

} // namespace

BENCHMARK_MAIN();
