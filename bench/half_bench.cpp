// fp16 and bf16 conversions and the fp16 compressor's round, on gradient-like values (normal(0, 1e-3)), N = 1M
// and 25M floats, every benchmark of one N on the same buffers:
//   encode/scalar      float_to_fp16_bits over the span, one value at a time (what every conversion was)
//   encode/best        the same call on the best path (AVX2/F16C where the CPU has them; same bits)
//   encode/cast        the reference a PyTorch user pays: a plain loop of _mm256_cvtps_ph (what tensor.to(half)
//                      runs on such a CPU), no NaN fix-up, no overflow check
//   decode/...         the same three back to float (cast: _mm256_cvtph_ps)
//   bf16_encode/...    scalar and best (no cast reference: PyTorch's bf16 cast is its own integer code)
//   ring_hop/...       the ring's fused hop, encode(decode(partial) + x), scalar and best
//   fp16_round/...     compress::fp16::reduce on one rank (comm::local): input check, encode, decode, the ring's
//                      own encode and decode, output check; scalar is the one-value path of every conversion
//                      (COMMSGD_FORCE_SCALAR_HALF has the same effect on the whole process)
// Buffers are filled once per N with a fixed seed. Ratios are read from one run: bench/results/half-cpu-*.md.
//
// With COMMSGD_HALF_BENCH_ROUND_ONLY defined only fp16_round is built, so the same file measures an older
// commsgd's round (the baseline in the results file).
//
//   bench/half_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/half.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <vector>

#if COMMSGD_HALF_X86
#include <immintrin.h>
#endif

namespace {

#ifndef COMMSGD_HALF_BENCH_ROUND_ONLY
using commsgd::compress::half_path;
#endif

struct buffers {
  std::vector<float> x, y;
  std::vector<std::uint16_t> h, h2;
};

buffers& data(std::size_t n) {
  static std::map<std::size_t, buffers> all;
  auto [it, fresh] = all.try_emplace(n);
  if (fresh) {
    auto& b = it->second;
    std::mt19937 rng(42);
    std::normal_distribution<float> g(0.0f, 1e-3f);
    b.x.resize(n);
    b.y.resize(n);
    for (auto& v : b.x)
      v = g(rng);
    for (auto& v : b.y)
      v = g(rng);
    b.h.resize(n);
    b.h2.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      b.h2[i] = commsgd::compress::float_to_fp16_bits(b.y[i]);
  }
  return it->second;
}

void bytes(benchmark::State& state, std::size_t n, std::size_t per_value) {
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n * per_value));
  state.counters["N"] = static_cast<double>(n);
}

#ifndef COMMSGD_HALF_BENCH_ROUND_ONLY
half_path path_of(benchmark::State& state) {
  return state.range(1) == 0 ? half_path::scalar : half_path::best;
}

void encode(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto& b = data(n);
  const auto p = path_of(state);
  for (auto _ : state) {
    benchmark::DoNotOptimize(commsgd::compress::float_to_fp16_bits(b.x, b.h, false, p));
    benchmark::ClobberMemory();
  }
  bytes(state, n, 6);
}

void decode(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto& b = data(n);
  const auto p = path_of(state);
  for (auto _ : state) {
    commsgd::compress::fp16_bits_to_float(b.h2, b.x, p);
    benchmark::ClobberMemory();
  }
  bytes(state, n, 6);
}

void bf16_encode(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto& b = data(n);
  const auto p = path_of(state);
  for (auto _ : state) {
    benchmark::DoNotOptimize(commsgd::compress::float_to_bf16_bits(b.y, b.h, false, p));
    benchmark::ClobberMemory();
  }
  bytes(state, n, 6);
}

void ring_hop(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto& b = data(n);
  const auto p = path_of(state);
  for (auto _ : state) {
    benchmark::DoNotOptimize(commsgd::compress::fp16_sum_bits(b.h2, b.y, b.h, false, p));
    benchmark::ClobberMemory();
  }
  bytes(state, n, 8);
}

#if COMMSGD_HALF_X86
__attribute__((target("avx2,f16c"))) void cast_encode(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i)
    out[i] = commsgd::compress::float_to_fp16_bits(in[i]);
}
__attribute__((target("avx2,f16c"))) void cast_decode(const std::uint16_t* in, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i)
    out[i] = commsgd::compress::fp16_bits_to_float(in[i]);
}

void encode_cast(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto& b = data(n);
  if (!commsgd::compress::half_vector_path()) state.SkipWithError("no AVX2/F16C here");
  for (auto _ : state) {
    cast_encode(b.x.data(), b.h.data(), n);
    benchmark::ClobberMemory();
  }
  bytes(state, n, 6);
}
void decode_cast(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto& b = data(n);
  if (!commsgd::compress::half_vector_path()) state.SkipWithError("no AVX2/F16C here");
  for (auto _ : state) {
    cast_decode(b.h2.data(), b.x.data(), n);
    benchmark::ClobberMemory();
  }
  bytes(state, n, 6);
}
#endif

#endif

// compress::fp16's round on one rank: what the PyTorch fp16 hook's bucket costs the CPU besides the network.
void fp16_round(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto& b = data(n);
  const bool scalar = state.range(1) == 0;
#ifdef COMMSGD_HALF_BENCH_ROUND_ONLY
  // Built against an older commsgd (the baseline): one path, reported as `best`.
  if (scalar) {
    state.SkipWithError("baseline: one path");
    return;
  }
#else
  if (scalar && commsgd::compress::half_vector_path()) {
    // The scalar path of the whole round needs the process-wide switch: run with COMMSGD_FORCE_SCALAR_HALF=1.
    state.SkipWithError("set COMMSGD_FORCE_SCALAR_HALF=1 for the scalar round");
    return;
  }
#endif
  commsgd::comm::local_group(1).run([&](commsgd::comm::local& c) {
    commsgd::compress::fp16 x(n);
    std::vector<float> out(n);
    for (auto _ : state) {
      x.reduce(c, std::span<const float>(b.y), std::span<float>(out));
      benchmark::ClobberMemory();
    }
  });
  bytes(state, n, 4);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {std::int64_t{1} << 20, std::int64_t{25} << 20})
    for (std::int64_t path : {0, 1})
      b->Args({n, path});
  b->ArgNames({"N", "best"})->Unit(benchmark::kMicrosecond);
}
#if COMMSGD_HALF_X86 && !defined(COMMSGD_HALF_BENCH_ROUND_ONLY)
void cast_sizes(benchmark::internal::Benchmark* b) {
  b->Arg(std::int64_t{1} << 20)->Arg(std::int64_t{25} << 20)->ArgName("N")->Unit(benchmark::kMicrosecond);
}
#endif

#ifndef COMMSGD_HALF_BENCH_ROUND_ONLY
BENCHMARK(encode)->Apply(sizes);
BENCHMARK(decode)->Apply(sizes);
BENCHMARK(bf16_encode)->Apply(sizes);
BENCHMARK(ring_hop)->Apply(sizes);
#if COMMSGD_HALF_X86
BENCHMARK(encode_cast)->Apply(cast_sizes);
BENCHMARK(decode_cast)->Apply(cast_sizes);
#endif
#endif
BENCHMARK(fp16_round)->Apply(sizes);

} // namespace

BENCHMARK_MAIN();
