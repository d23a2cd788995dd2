// One DiLoCo outer round's local work on the CPU, per code, against its memory floor (issue 43, item 4).
//
// round/<code>      sync::coded_diloco<mirror>::advance() with sync_every = 1, fragments = 1, delay = 0, so each
//                   call is exactly one round: the pseudo-gradient (global - local), the code's encode (with
//                   the residual for top-k), the exchange, n ranks' messages decoded and summed, / n, the outer
//                   Nesterov step (lr 0.7, momentum 0.9) and the merge (local = global). Only advance() is
//                   timed (manual time); between rounds, untimed, the params take an inner SGD-like step
//                   x -= 1e-3 g with a fixed normal(0, 1) g, so every round's pseudo-gradient is non-zero and
//                   gradient-like (a zero one would take cheaper paths: int8/e3m0 blocks with scale 0 skip
//                   the per-value code, and the floor comparison would flatter the engine).
// The floor        In the same iteration (untimed for the benchmark, timed apart): std::memcpy moving the
//                  bytes a fused round must read and write (floor_bytes() below), src and dst of floor / 2
//                  bytes each, so the floor's buffers have the round's total size. Counters:
//                    round/floor   mean round time / mean floor time
//                    bytes_per_second  floor bytes / round time (the round's effective bandwidth)
//                    floor_GBps    memcpy's speed (bytes read + written a second)
// No network: `mirror` is rank 0 of n that pretends every other rank sent exactly what this one did
// (all_gather replicates this rank's contribution, all_reduce_sum multiplies by n, broadcast does nothing,
// point-to-point is a loopback: what this rank sends to its right neighbour is what it receives from its left,
// so comm::narrow_ring_sum, the fp16/bf16 ring, does its real n - 1 reduce-scatter and n - 1 all-gather hops
// with the real codec work per hop, the received chunk being this rank's own instead of a neighbour's).
// Args: d (values), n (ranks: 4, and 1 to compare with the extension's one-rank engine).
//
//   bench/diloco_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//                      --benchmark_out=diloco.json --benchmark_out_format=json
#include <commsgd/comm/communicator.hpp>
#include <commsgd/sync/coded_diloco.hpp>
#include <commsgd/sync/diloco_codes.hpp>

#include "mirror.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace commsgd;

using bench::mirror;

const char* const codes[] = {"dense",
                             "fp16",
                             "bf16",
                             "int8",
                             "e3m0",
                             "topk-0.01",
                             "topk-0.01-c4096",
                             "topk-0.01-c4096-2bit",
                             "topk-0.03-c4096-2bit"};

// Bytes a fused round must move for d values and n ranks, by code:
//   every code       read local, read global, read + write the momentum, write global, write local: 24 d
//   top-k            + read and write the residual e (one float a value): 8 d
//   dense            + the float message: written, read and written in place by the all-reduce, read by the
//                    outer step: 4 M, M = 4 d
//   fp16, bf16       the same for the 16-bit message: 4 M, M = 2 d
//   int8, e3m0, top-k  this rank's message written, n messages written by the gather and read to decode:
//                    (2 n + 1) M, M = sync::diloco_code::message_bytes(d)
double floor_bytes(const sync::diloco_code& code, std::uint64_t d, int n) {
  const double D = static_cast<double>(d);
  const double M = static_cast<double>(code.message_bytes(d));
  double b = 24.0 * D;
  if (code.format == sync::diloco_format::top_k) b += 8.0 * D;
  b += code.gathered() ? (2.0 * n + 1.0) * M : 4.0 * M;
  return b;
}

struct data {
  std::vector<float> x0, g; // the starting model, the inner step's direction
};

data& inputs(std::size_t d) {
  static std::map<std::size_t, data> all;
  auto [it, fresh] = all.try_emplace(d);
  if (fresh) {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    it->second.x0.resize(d);
    it->second.g.resize(d);
    for (auto& v : it->second.x0)
      v = 0.05f * normal(rng);
    for (auto& v : it->second.g)
      v = normal(rng);
  }
  return it->second;
}

// Floor buffers: the largest floor of any code at this d, halves src and dst, touched once.
std::pair<std::vector<std::byte>, std::vector<std::byte>>& floor_buffers(std::size_t half_bytes) {
  static std::pair<std::vector<std::byte>, std::vector<std::byte>> b;
  if (b.first.size() < half_bytes) {
    b.first.assign(half_bytes, std::byte{1});
    b.second.assign(half_bytes, std::byte{2});
  }
  return b;
}

void outer_round(benchmark::State& state, const char* name) {
  const auto d = static_cast<std::size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const auto code = sync::diloco_code::parse(name);
  auto& in = inputs(d);
  const double floor = floor_bytes(code, d, n);
  const auto half = static_cast<std::size_t>(floor / 2);
  auto& fb = floor_buffers(half);

  std::vector<float> x = in.x0;
  mirror c(n);
  sync::coded_diloco<mirror> s(c, {d}, {.sync_every = 1, .fragments = 1, .delay = 0}, code);
  s.start(x);
  auto inner_step = [&] {
    const float* g = in.g.data();
    for (std::size_t i = 0; i < d; ++i)
      x[i] -= 1e-3f * g[i];
  };
  // Warm-up: the first round allocates the momentum, fp16/bf16 agree on parameters once.
  inner_step();
  s.advance(x);

  using clock = std::chrono::steady_clock;
  double floor_s = 0, round_s = 0;
  for (auto _ : state) {
    const auto f0 = clock::now();
    std::memcpy(fb.second.data(), fb.first.data(), half);
    benchmark::ClobberMemory();
    floor_s += std::chrono::duration<double>(clock::now() - f0).count();
    inner_step();
    const auto t0 = clock::now();
    s.advance(x);
    benchmark::ClobberMemory();
    const double t = std::chrono::duration<double>(clock::now() - t0).count();
    round_s += t;
    state.SetIterationTime(t);
  }
  const double it = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(floor * it));
  state.counters["d"] = static_cast<double>(d);
  state.counters["n"] = n;
  state.counters["floor_bytes"] = floor;
  state.counters["message_bytes"] = static_cast<double>(code.message_bytes(d));
  state.counters["floor_ms"] = 1e3 * floor_s / it;
  state.counters["floor_GBps"] = 2.0 * static_cast<double>(half) * it / floor_s / 1e9;
  state.counters["round/floor"] = round_s / floor_s;
  state.counters["exchanges"] = static_cast<double>(s.exchanges_applied());
}

void args(benchmark::internal::Benchmark* b) {
  for (std::int64_t d : {std::int64_t{1} << 20, std::int64_t{1} << 24, std::int64_t{1} << 26})
    for (std::int64_t n : {4, 1})
      b->Args({d, n});
  b->ArgNames({"d", "n"})->UseManualTime()->Unit(benchmark::kMillisecond);
}

const bool registered = [] {
  for (const char* name : codes)
    benchmark::RegisterBenchmark((std::string("round/") + name).c_str(), [name](benchmark::State& st) {
      outer_round(st, name);
    })->Apply(args);
  return true;
}();

} // namespace

BENCHMARK_MAIN();
