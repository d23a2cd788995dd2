// Every composition data_parallel supports, side by side on one problem.
//
// The toy least-squares problem (4,096 samples, 64 unknowns, seed 11, known optimum) is trained by 4 ranks,
// threads of this process on comm::local, each rank's communicator wrapped in comm::metered so that every
// byte it sends is counted. All compositions use the same learning rate and the same step budget; the program
// prints one markdown row per composition:
//   steps to 1e-3   first step after which the watched model's full-data loss is <= 1e-3 x the initial loss
//   final loss      full-data loss of rank 0's final model (for async_ps, rank 0 is the server)
//   bytes sent      metered bytes_sent per rank after finish(): the mean over ranks and the largest
//   |x - x*|        Euclidean distance of that final model to the optimum
// The watched model is rank 0's after each step. async_ps has no common step: each of the 3 workers takes the
// whole budget of pushes and pulls, and how far one worker gets before another starts is up to the thread
// scheduler. So for async_ps every worker checks each model it pulls, and the cell gives the server version
// (updates applied, each the mean of j gradients of 64 samples) of the first pulled model at the threshold;
// a synchronous step takes 4 x 64 samples.
//
//   toy_strategies            print the table
//   toy_strategies --check    also exit 1 unless every composition ends below 1e-2 x the initial loss
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <support/least_squares.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <vector>

using namespace commsgd;
using metered_local = comm::metered<comm::local>;

namespace {

constexpr int ranks = 4;
constexpr int steps = 400;
constexpr float lr = 0.3f;
constexpr std::size_t global_batch = 256; // per step, over all ranks (64 per rank)
constexpr double reach_factor = 1e-3;     // the "steps to" column
constexpr double check_factor = 1e-2;     // what --check demands of the final loss

const toy::least_squares problem({.samples = 4096, .dim = 64, .seed = 11});
const std::vector<float> zeros(problem.dim(), 0.0f);
const double initial_loss = problem.loss(zeros);

struct result {
  std::string name;
  int reached = -1; // steps (async_ps: server updates) to reach_factor x initial loss; -1: not reached
  bool in_updates = false;
  double final_loss = 0.0;
  double bytes_mean = 0.0;
  std::uint64_t bytes_max = 0;
  double distance = 0.0;
  double seconds = 0.0;
};

double distance_to_optimum(std::span<const float> x) {
  double acc = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(x[i]) - problem.optimum()[i];
    acc += d * d;
  }
  return std::sqrt(acc);
}

// What the rank threads hand back; each slot is written by one rank only.
struct shared_state {
  std::vector<float> final_model;
  int reached = -1;
  bool in_updates = false;
  std::mutex mu; // async_ps: the workers share `reached`
  std::vector<std::uint64_t> bytes = std::vector<std::uint64_t>(ranks, 0);
};

result summarise(std::string name, const shared_state& s, double seconds) {
  result r{.name = std::move(name), .reached = s.reached, .in_updates = s.in_updates, .seconds = seconds};
  r.final_loss = problem.loss(s.final_model);
  r.distance = distance_to_optimum(s.final_model);
  r.bytes_mean = static_cast<double>(std::accumulate(s.bytes.begin(), s.bytes.end(), std::uint64_t{0})) /
                 static_cast<double>(s.bytes.size());
  r.bytes_max = *std::max_element(s.bytes.begin(), s.bytes.end());
  return r;
}

// Rows of block q in the batch of step t: the global batch is a window of the data set that block_sizes cuts
// into the scheme's blocks (with redundancy r a rank computes the gradients of r blocks).
toy::rows block_rows(const std::vector<std::size_t>& sizes, std::size_t q, std::int64_t t) {
  std::size_t first = (static_cast<std::size_t>(t) * global_batch) % problem.samples();
  for (std::size_t j = 0; j < q; ++j)
    first += sizes[j];
  return {first, sizes[q]};
}

// Synchronous compositions: every step sums block gradients (coded, uncoded or sparsified).
template <class Dp>
result train_synchronous(std::string name, const typename Dp::options& o) {
  shared_state s;
  const auto t0 = std::chrono::steady_clock::now();
  comm::local_group(ranks).run([&](comm::local& base) {
    metered_local c(base);
    Dp dp(c, problem.dim(), o);
    std::vector<float> x = zeros;
    dp.start(x);
    const auto sizes = dp.block_sizes(global_batch);
    std::vector<std::vector<float>> grads(dp.my_blocks().size(), std::vector<float>(problem.dim()));
    const std::vector<std::span<const float>> views(grads.begin(), grads.end());
    for (int t = 0; t < steps; ++t) {
      for (std::size_t j = 0; j < grads.size(); ++j)
        problem.gradient(x, block_rows(sizes, dp.my_blocks()[j], t), grads[j]);
      dp.step(x, coding::block_gradients(views));
      if (c.rank() == 0 && s.reached < 0 && problem.loss(x) <= reach_factor * initial_loss) s.reached = t + 1;
    }
    dp.finish(x);
    s.bytes[static_cast<std::size_t>(c.rank())] = c.counters().total().bytes_sent;
    if (c.rank() == 0) s.final_model = x;
  });
  return summarise(std::move(name), s,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// local_sgd, async_ps and partitioned: one gradient per rank, of its own shard's mini-batch.
template <class Sync>
result train_model_exchange(std::string name, const typename policy::sync_traits<Sync>::options& so) {
  using Dp = data_parallel<policy::uncoded<>, policy::dense, Sync, metered_local>;
  const typename Dp::options o{.lr = lr, .sync = so};
  constexpr bool server_based = std::is_same_v<Sync, policy::async_ps>;
  shared_state s;
  s.in_updates = server_based;
  const auto t0 = std::chrono::steady_clock::now();
  comm::local_group(ranks).run([&](comm::local& base) {
    metered_local c(base);
    Dp dp(c, problem.dim(), o);
    std::vector<float> x = zeros, g(problem.dim());
    dp.start(x);
    // async_ps: the workers (ranks 1..3) split the data set among themselves; the server computes nothing.
    const int shard = server_based ? c.rank() - 1 : c.rank();
    const int shards = server_based ? ranks - 1 : ranks;
    for (int t = 0; t < steps && dp.computes_gradients(); ++t) {
      const auto rows = problem.batch(shard, shards, t, global_batch / ranks);
      problem.gradient(x, rows, g);
      dp.step(x, std::span<const float>(g), {.loss = problem.loss(x, rows)}); // adaptive local_sgd reads it
      if constexpr (server_based) {
        const auto version = static_cast<int>(dp.strategy().version()); // of the model just pulled into x
        if (problem.loss(x) <= reach_factor * initial_loss) {
          std::lock_guard lock(s.mu);
          if (s.reached < 0 || version < s.reached) s.reached = version;
        }
      } else if (c.rank() == 0 && s.reached < 0 && problem.loss(x) <= reach_factor * initial_loss) {
        s.reached = t + 1;
      }
    }
    dp.finish(x);
    s.bytes[static_cast<std::size_t>(c.rank())] = c.counters().total().bytes_sent;
    if (c.rank() == 0) s.final_model = x;
  });
  return summarise(std::move(name), s,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

template <class Coding, class Compression = policy::dense>
using sync_dp = data_parallel<Coding, Compression, policy::synchronous, metered_local>;

} // namespace

int main(int argc, char** argv) {
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--check") == 0) {
      check = true;
    } else {
      std::fprintf(stderr, "usage: %s [--check]\n", argv[0]);
      return 2;
    }
  }

  std::vector<result> rows;
  rows.push_back(
      train_synchronous<sync_dp<policy::uncoded<>>>("synchronous, uncoded ring all-reduce", {.lr = lr}));
  rows.push_back(train_synchronous<sync_dp<policy::uncoded<coding::by_all_gather>>>(
      "synchronous, uncoded all-gather", {.lr = lr}));
  rows.push_back(train_synchronous<sync_dp<policy::uncoded<coding::by_unicast>>>(
      "synchronous, uncoded unicast", {.lr = lr}));

  const policy::redundancy_options coded{.redundancy = 2};
  rows.push_back(train_synchronous<sync_dp<policy::cssgd<coding::xor_bits>>>(
      "synchronous, cssgd xor_bits r=2", {.lr = lr, .coding = coded}));
  rows.push_back(train_synchronous<sync_dp<policy::cssgd<coding::int32_sum>>>(
      "synchronous, cssgd int32_sum r=2", {.lr = lr, .coding = coded}));
  rows.push_back(train_synchronous<sync_dp<policy::uncoded_shuffle>>("synchronous, uncoded_shuffle r=2",
                                                                     {.lr = lr, .coding = coded}));

  policy::top_k_settings sparse{.top_k = {.density = 0.25}};
  rows.push_back(train_synchronous<sync_dp<policy::uncoded<>, policy::top_k<select::exact>>>(
      "synchronous, top_k exact, density 0.25", {.lr = lr, .compression = sparse}));
  rows.push_back(train_synchronous<sync_dp<policy::uncoded<>, policy::top_k<select::laplace_bisect>>>(
      "synchronous, top_k laplace_bisect, density 0.25", {.lr = lr, .compression = sparse}));
  sparse.top_k.density = 0.1;
  rows.push_back(train_synchronous<sync_dp<policy::uncoded<>, policy::top_k<select::exact>>>(
      "synchronous, top_k exact, density 0.1", {.lr = lr, .compression = sparse}));

  sync::local_sgd_options local;
  local.period = 4;
  rows.push_back(train_model_exchange<policy::local_sgd>("local_sgd, fixed H=4", local));
  local.adaptive = true;
  local.max_period = 16;
  local.correction = sync::correction_mode::every_step;
  local.alpha = 0.1f;
  rows.push_back(train_model_exchange<policy::local_sgd>(
      "local_sgd, adaptive H0=4 (max 16), every-step alpha=0.1", local));

  sync::async_ps_options ps; // server = rank 0, workers 1..3
  ps.keep_log = false;
  rows.push_back(train_model_exchange<policy::async_ps>("async_ps, j=1", ps));
  ps.staleness_scaling = true;
  rows.push_back(train_model_exchange<policy::async_ps>("async_ps, j=1, staleness scaling", ps));
  ps.apply_after = 3;
  rows.push_back(train_model_exchange<policy::async_ps>("async_ps, j=3, staleness scaling", ps));
  ps.apply_after = 1;
  ps.staleness_scaling = false;
  ps.staleness_bound = 1;
  rows.push_back(train_model_exchange<policy::async_ps>("async_ps, j=1, staleness bound s=1", ps));

  policy::partitioned_settings part;
  part.layer_sizes = {16, 48}; // two "layers", exchanged last layer first as backward would produce them
  part.partitioned.partition_elements = 16;
  part.partitioned.credit_bytes = 2 * 16 * sizeof(float); // two partitions in flight
  rows.push_back(
      train_model_exchange<policy::partitioned>("partitioned, 16-element partitions, credit 128 B", part));

  std::printf("Toy least squares: %zu samples, dim %zu, %d ranks on comm::local (metered), lr %.2f, "
              "%d steps, global batch %zu; initial loss %.4f\n\n",
              problem.samples(), problem.dim(), ranks, static_cast<double>(lr), steps, global_batch,
              initial_loss);
  std::printf("| composition | steps to loss <= 1e-3 x initial | final loss | bytes sent per rank (mean) | "
              "bytes sent (max rank) | final distance to x* | wall s |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  bool ok = true;
  for (const auto& r : rows) {
    const std::string reached = r.reached < 0  ? "not reached"
                                : r.in_updates ? std::to_string(r.reached) + " server updates"
                                               : std::to_string(r.reached);
    std::printf("| %s | %s | %.3e | %.0f | %llu | %.3e | %.2f |\n", r.name.c_str(), reached.c_str(),
                r.final_loss, r.bytes_mean, static_cast<unsigned long long>(r.bytes_max), r.distance,
                r.seconds);
    if (!(r.final_loss < check_factor * initial_loss)) ok = false;
  }
  if (check && !ok) {
    std::fprintf(stderr, "check failed: a composition did not reach %.0e x the initial loss\n", check_factor);
    return 1;
  }
  return 0;
}
