// Sparse exchange against dense all-reduce, d = 2^24 floats over n = 4 ranks of comm::local (threads).
//
//   dense_all_reduce          the ring baseline every ratio refers to
//   sparse_exchange/<1e-6 d>  the exchange alone (header all_gather + all_gather_v + scatter-add) of
//                             messages made once by top_k
//   topk_step_exchange/...    a whole step of top_k (error feedback, selection, compaction) plus the exchange
//
// Counters: bytes_per_node (sent + received at rank 0, from comm::metered), and, for the sparse cases,
// time_ratio and byte_ratio against dense_all_reduce measured earlier in the same run. Run it whole (no
// filter that drops dense_all_reduce), or the ratios read 0.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/cost/sparse.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sparsify/sparse_exchange.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

namespace {

namespace sp = commsgd::sparsify;
namespace sel = commsgd::select;
namespace cm = commsgd::comm;

constexpr std::size_t d = std::size_t{1} << 24;
constexpr int ranks = 4;

struct baseline {
  double seconds = 0;
  double bytes = 0;
};
baseline dense_baseline;

// Laplace-like with heavy tails and 12 % exact zeros, as the design notes real gradients are.
std::vector<float> gradient(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<float> mag(1.0f);
  std::vector<float> g(d);
  for (auto& x : g) {
    const auto r = rng();
    x = (r & 0xff) < 31 ? 0.0f : ((r >> 8) & 1 ? -1.0f : 1.0f) * mag(rng) * mag(rng) * 1e-3f;
  }
  return g;
}

// Rank 0 runs the benchmark loop; the other ranks follow it through a one-int all-reduce per iteration, so
// every rank makes the same collective calls. Only `op` is timed.
template <class Setup, class Op>
void drive(benchmark::State& state, Setup setup, Op op) {
  double bytes = 0;
  cm::local_group{ranks}.run([&](cm::local& raw) {
    cm::metered<cm::local> c(raw);
    auto ctx = setup(c);
    std::int32_t go = 1;
    auto step = [&] {
      c.barrier();
      c.reset();
      const auto t0 = std::chrono::steady_clock::now();
      op(c, ctx);
      const auto t1 = std::chrono::steady_clock::now();
      if (c.rank() == 0) {
        state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
        const auto t = c.counters().total();
        bytes = static_cast<double>(t.bytes_sent + t.bytes_received);
      }
    };
    if (c.rank() == 0) {
      for (auto _ : state) {
        go = 1;
        raw.all_reduce_sum(std::span<std::int32_t>(&go, 1));
        step();
      }
      go = 0;
      raw.all_reduce_sum(std::span<std::int32_t>(&go, 1));
    } else {
      for (;;) {
        go = 0;
        raw.all_reduce_sum(std::span<std::int32_t>(&go, 1));
        if (go == 0) break;
        step();
      }
    }
  });
  state.counters["bytes_per_node"] = bytes;
  state.counters["n"] = ranks;
  state.counters["d"] = static_cast<double>(d);
  if (dense_baseline.seconds > 0 && dense_baseline.bytes > 0) {
    state.counters["byte_ratio"] = bytes / dense_baseline.bytes;
  }
}

void report_time_ratio(benchmark::State& state, double seconds_per_iter) {
  if (dense_baseline.seconds > 0) state.counters["time_ratio"] = seconds_per_iter / dense_baseline.seconds;
}

struct dense_ctx {
  std::vector<float> g, out;
};

void dense_all_reduce(benchmark::State& state) {
  double total = 0;
  std::int64_t iters = 0;
  drive(
      state,
      [](auto& c) {
        return dense_ctx{gradient(static_cast<std::uint64_t>(c.rank())), std::vector<float>(d)};
      },
      [&](auto& c, dense_ctx& x) {
        const auto t0 = std::chrono::steady_clock::now();
        std::copy(x.g.begin(), x.g.end(), x.out.begin());
        c.all_reduce_sum(std::span<float>(x.out));
        if (c.rank() == 0) {
          total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          ++iters;
        }
      });
  dense_baseline.seconds = total / static_cast<double>(iters);
  dense_baseline.bytes = state.counters["bytes_per_node"];
}

template <class Selector>
struct sparse_ctx {
  sp::top_k<Selector> s;
  std::vector<float> g, out;
  sp::exchanger<> ex;
  sp::sparse_vector msg;
};

template <class Selector>
sparse_ctx<Selector> make_sparse(int rank, double density) {
  sparse_ctx<Selector> x{sp::top_k<Selector>(d, {.density = density}),
                         gradient(static_cast<std::uint64_t>(rank)), std::vector<float>(d), sp::exchanger<>{},
                         sp::sparse_vector(d)};
  const auto v = x.s.step(x.g);
  for (std::size_t j = 0; j < v.size(); ++j)
    x.msg.push_back_unchecked(v.indices[j], v.values[j]);
  return x;
}

void sparse_exchange(benchmark::State& state) {
  const double density = static_cast<double>(state.range(0)) * 1e-6;
  double total = 0;
  std::int64_t iters = 0;
  drive(
      state, [&](auto& c) { return make_sparse<sel::laplace_bisect>(c.rank(), density); },
      [&](auto& c, sparse_ctx<sel::laplace_bisect>& x) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto rep = x.ex.sum(c, x.msg.view(), x.out);
        if (c.rank() == 0) {
          total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          ++iters;
          state.counters["dense_path"] = rep.dense;
        }
      });
  state.counters["density"] = density;
  report_time_ratio(state, total / static_cast<double>(iters));
}

template <class Selector>
void topk_step_exchange(benchmark::State& state) {
  const double density = static_cast<double>(state.range(0)) * 1e-6;
  double total = 0;
  std::int64_t iters = 0;
  drive(
      state, [&](auto& c) { return make_sparse<Selector>(c.rank(), density); },
      [&](auto& c, sparse_ctx<Selector>& x) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto msg = x.s.step(x.g);
        x.ex.sum(c, msg, x.out);
        if (c.rank() == 0) {
          total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          ++iters;
        }
      });
  state.counters["density"] = density;
  report_time_ratio(state, total / static_cast<double>(iters));
}

// Densities in millionths: 1e-3 and 1e-2.
BENCHMARK(dense_all_reduce)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
BENCHMARK(sparse_exchange)
    ->Arg(1000)
    ->Arg(10000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10);
BENCHMARK(topk_step_exchange<sel::laplace_bisect>)
    ->Arg(1000)
    ->Arg(10000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10);
BENCHMARK(topk_step_exchange<sel::exact>)
    ->Arg(1000)
    ->Arg(10000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

} // namespace

BENCHMARK_MAIN();
