// The soak test (label soak, dev suite only): every sync strategy (and synchronous also with a coded scheme
// and with a sparsifier) for many steps on comm::local, 4 ranks, each rank sleeping a seeded random number of
// microseconds before its steps, so that ranks arrive at every exchange in ever different orders.
//
// Checked for each strategy, driven through data_parallel with the replica guard on (every 50 steps):
//   - replicas identical wherever the strategy promises it (the guard, plus a bit-for-bit comparison of the
//     final models of every rank);
//   - async_ps: no update lost or doubled: with apply_after = 1 and lr a power of two, worker w's gradient
//     adds exactly 1 to a counter slot of its own, so the final model holds -lr * pushes exactly;
//   - resident memory (/proc/self/statm) flat after warm-up: at the end of the run within 5 % of what it was
//     after the first tenth of the steps;
//   - no thread left behind (/proc/self/task) once the group has returned.
//
// COMMSGD_SOAK_STEPS overrides the steps per strategy (default 20000). The figures of each run are printed.
#include <commsgd/comm/local.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/exact.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

constexpr int ranks = 4;
constexpr std::size_t dim = 64;
constexpr float lr = 1.0f / 1024.0f; // a power of two: async_ps's counters stay exact

int steps_per_strategy() {
  const char* v = std::getenv("COMMSGD_SOAK_STEPS");
  return v && *v ? std::max(100, std::atoi(v)) : 20000;
}

long resident_kib() {
  std::ifstream in("/proc/self/statm");
  long size = 0, resident = 0;
  in >> size >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int thread_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

// Seeded per rank: sleeps 0 to 60 us before about a third of the steps, so the ranks' order changes.
struct jitter {
  explicit jitter(int rank, std::uint64_t seed) : rng(seed * 1000003u + static_cast<std::uint64_t>(rank)) {}
  void operator()() {
    const auto r = rng();
    if (r % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(r / 3 % 61));
  }
  std::mt19937_64 rng;
};

struct figures {
  std::string name;
  int steps = 0;
  long rss_start = 0, rss_warm = 0, rss_end = 0;
  int threads_before = 0, threads_after = 0;
  double seconds = 0;
  std::int64_t checks = 0;
};

void print(const figures& f) {
  std::cout << "soak " << f.name << ": " << f.steps << " steps x " << ranks << " ranks in " << f.seconds
            << " s; resident KiB start " << f.rss_start << ", after warm-up " << f.rss_warm << ", end "
            << f.rss_end << "; guard checks " << f.checks << "; threads before " << f.threads_before
            << ", after " << f.threads_after << std::endl;
}

// Runs one composition; grad(rank, step, x, g) fills the gradient. Returns every rank's final model.
// `reader` is the rank that reads the memory figure after warm-up: one that steps.
template <class Dp, class Grad>
std::vector<std::vector<float>> soak(figures& f, typename Dp::options o, Grad grad, int reader = 0,
                                     std::vector<std::int64_t>* pushes = nullptr) {
  f.steps = steps_per_strategy();
  o.lr = lr;
  o.replica_check_every = 50;
  std::vector<std::vector<float>> finals(ranks);
  f.threads_before = thread_count();
  f.rss_start = resident_kib();
  const auto t0 = std::chrono::steady_clock::now();
  local_group(ranks).run([&](local& c) {
    const int me = c.rank();
    Dp dp(c, dim, o);
    std::vector<float> x(dim);
    // One gradient per block this rank computes (one block, the rank's own, unless the scheme is coded).
    std::vector<std::vector<float>> grads(dp.my_blocks().size(), std::vector<float>(dim));
    const std::vector<std::span<const float>> views(grads.begin(), grads.end());
    for (std::size_t i = 0; i < dim; ++i)
      x[i] = 0.5f - static_cast<float>(i % 7) * 0.125f;
    jitter wait(me, 20260);
    dp.start(x);
    std::int64_t done = 0;
    if (dp.computes_gradients())
      for (int t = 0; t < f.steps; ++t) {
        wait();
        for (std::size_t j = 0; j < grads.size(); ++j)
          grad(static_cast<int>(dp.my_blocks()[j]), t, x, grads[j]);
        // A falling loss moves the adaptive interval.
        dp.step(x, coding::block_gradients(views), {.loss = 1.0 / (1.0 + 0.001 * t)});
        ++done;
        if (me == reader && t == f.steps / 10) f.rss_warm = resident_kib();
      }
    dp.finish(x);
    if (me == 0) f.rss_end = resident_kib();
    if (pushes) (*pushes)[static_cast<std::size_t>(me)] = done;
    finals[static_cast<std::size_t>(me)] = x;
    if (me == 0) f.checks = dp.replica_guard().checks();
  });
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  f.threads_after = thread_count();
  print(f);
  CHECK(f.threads_after == f.threads_before);
  CHECK(f.rss_warm > 0);
  CHECK(static_cast<double>(f.rss_end) <= 1.05 * static_cast<double>(f.rss_warm));
  return finals;
}

// A bounded, rank-dependent gradient: a pull toward zero plus a small per-rank offset.
void smooth_gradient(int rank, int t, std::span<const float> x, std::span<float> g) {
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = 0.25f * x[i] + 0.001f * static_cast<float>((static_cast<int>(i) + rank + t) % 9 - 4);
}

void identical(const std::vector<std::vector<float>>& finals) {
  for (std::size_t r = 1; r < finals.size(); ++r) {
    CAPTURE(r);
    REQUIRE(finals[r].size() == finals[0].size());
    CHECK(std::memcmp(finals[r].data(), finals[0].data(), finals[0].size() * sizeof(float)) == 0);
  }
}

} // namespace

TEST_CASE("soak: synchronous") {
  figures f{.name = "synchronous"};
  const auto finals =
      soak<data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>>(f, {}, smooth_gradient);
  identical(finals);
  CHECK(f.checks == f.steps / 50 + 1);
}

TEST_CASE("soak: synchronous with CSSGD (r = 2, int32 sums)") {
  figures f{.name = "synchronous, cssgd r = 2"};
  data_parallel<policy::cssgd<coding::int32_sum>, policy::dense, policy::synchronous>::options o;
  o.coding.redundancy = 2;
  const auto finals =
      soak<data_parallel<policy::cssgd<coding::int32_sum>, policy::dense, policy::synchronous>>(
          f, o, smooth_gradient);
  identical(finals);
  CHECK(f.checks == f.steps / 50 + 1);
}

TEST_CASE("soak: synchronous with top-k and error feedback") {
  figures f{.name = "synchronous, top_k 10 %"};
  data_parallel<policy::uncoded<>, policy::top_k<select::exact>, policy::synchronous>::options o;
  o.compression.top_k.density = 0.1;
  const auto finals =
      soak<data_parallel<policy::uncoded<>, policy::top_k<select::exact>, policy::synchronous>>(
          f, o, smooth_gradient);
  identical(finals);
  CHECK(f.checks == f.steps / 50 + 1);
}

TEST_CASE("soak: partitioned") {
  figures f{.name = "partitioned"};
  data_parallel<policy::uncoded<>, policy::dense, policy::partitioned>::options o;
  o.sync.layer_sizes = {24, 8, 32};
  o.sync.partitioned = {.partition_elements = 8, .credit_bytes = 64};
  const auto finals =
      soak<data_parallel<policy::uncoded<>, policy::dense, policy::partitioned>>(f, o, smooth_gradient);
  identical(finals);
  CHECK(f.checks == f.steps / 50 + 1);
}

TEST_CASE("soak: local_sgd") {
  figures f{.name = "local_sgd"};
  data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd>::options o;
  o.sync = {.period = 8, .warmup_steps = 100};
  const auto finals =
      soak<data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd>>(f, o, smooth_gradient);
  identical(finals);
  CHECK(f.checks > f.steps / 100);
}

TEST_CASE("soak: local_sgd, adaptive interval") {
  figures f{.name = "local_sgd adaptive"};
  data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd>::options o;
  o.sync = {.period = 4, .warmup_steps = 10, .adaptive = true, .max_period = 16};
  const auto finals =
      soak<data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd>>(f, o, smooth_gradient);
  identical(finals);
}

TEST_CASE("soak: async_ps, every update applied exactly once") {
  figures f{.name = "async_ps"};
  data_parallel<policy::uncoded<>, policy::dense, policy::async_ps>::options o;
  o.sync = {.apply_after = 1, .staleness_bound = 4, .keep_log = false};
  std::vector<std::int64_t> pushes(ranks, 0);
  // Slot w counts worker w's gradients; the rest of the model moves as in the other runs.
  auto grad = [](int rank, int t, std::span<const float> x, std::span<float> g) {
    smooth_gradient(rank, t, x, g);
    for (int w = 0; w < ranks; ++w)
      g[static_cast<std::size_t>(w)] = w == rank ? 1.0f : 0.0f;
  };
  const auto finals = soak<data_parallel<policy::uncoded<>, policy::dense, policy::async_ps>>(
      f, o, [&](int rank, int t, std::span<const float> x, std::span<float> g) { grad(rank, t, x, g); }, 1,
      &pushes);
  identical(finals); // after finish every rank holds the server's final model
  CHECK(pushes[0] == 0);
  for (int w = 1; w < ranks; ++w) {
    CAPTURE(w);
    CHECK(pushes[static_cast<std::size_t>(w)] == f.steps);
    // Starts at 0.5 (x[i] = 0.5 - (i % 7) / 8), so the counter is 0.5 - lr * applied, exact in float.
    const float start = 0.5f - static_cast<float>(w % 7) * 0.125f;
    const double applied =
        (static_cast<double>(start) - static_cast<double>(finals[0][static_cast<std::size_t>(w)])) / lr;
    CHECK(applied == static_cast<double>(f.steps));
  }
  CHECK(f.checks == 1);
}
