// The straggler study on real processes and real links: one MPI process per rank over comm::mpi, times read
// from the wall clock. Run it on the emulated cluster (docs/netcluster.md), where a slow node can be a slow
// port as well as slow compute:
//
//   netcluster exec -n 4 --rate 1gbit --up-rate 3=10mbit mpirun -- -np 4 \
//       fashion_mnist_stragglers_mpi --scheme gc_cyclic --r 2 --csv curve.csv
//   ... mpirun -- -np 4 fashion_mnist_stragglers_mpi --scheme ring --slow-rank 3 --slow-factor 4
//
// Schemes (as in stragglers.cpp, which models the same study on a virtual clock): `ring` (synchronous SGD,
// one all-reduce a step: waits for the slowest rank), `backup` (the first n - s of n uncoded gradients, s =
// r - 1), `gc_fr` and `gc_cyclic` (gradient codes of redundancy r: the exact full-batch gradient from the
// first n - s coded vectors). Slow compute: rank --slow-rank sleeps (factor - 1) x its own compute time after
// computing (sleeping, so the other ranks keep the shared cores, as on a machine of its own); under the
// first-arrivals schemes the sleep is their injected delay, cut short when the sum comes first.
//
// Faults: --timeout-s bounds every MPI call (comm::mpi::set_timeout) and the first-arrivals waits. A rank whose
// exchange fails writes the error to --log with its time and ends with exit code 3, without MPI_Finalize
// (which would wait for the lost peer). --checkpoint DIR saves every rank's model and data_parallel state
// every --checkpoint-every steps; --resume starts from the newest step every rank saved.
#include "block_batch.hpp"
#include "idx.hpp"
#include "mlp.hpp"

#include <commsgd/coding/coding.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/mpi.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/sync/first_arrivals.hpp>

#include <boost/mpi/environment.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using comm_t = commsgd::comm::metered<commsgd::comm::mpi>;
namespace coding = commsgd::coding;
namespace policy = commsgd::policy;
using clock_type = std::chrono::steady_clock;

struct options {
  std::string scheme = "ring";
  int r = 2;
  std::size_t batch = 500, steps = 150, eval_every = 10;
  float lr = 0.1f;
  double target = 0.75;
  std::size_t train = 10000, test = 2000;
  std::uint64_t seed = 1;
  int slow_rank = -1;
  double slow_factor = 1.0;
  double timeout_s = 60.0;
  std::string checkpoint, csv, log;
  std::size_t checkpoint_every = 20;
  bool resume = false;
};

// This rank's log: written by the rank itself, so it survives a link that no longer carries mpirun's output.
class rank_log {
public:
  rank_log(const std::string& path, int rank) : rank_(rank), t0_(clock_type::now()) {
    if (!path.empty()) file_ = std::fopen(path.c_str(), "a");
  }
  ~rank_log() {
    if (file_) std::fclose(file_);
  }
  template <class... A>
  void line(const char* fmt, A... a) {
    char text[2048];
    std::snprintf(text, sizeof text, fmt, a...);
    const double t = std::chrono::duration<double>(clock_type::now() - t0_).count();
    std::fprintf(stderr, "[rank %d %.3f s] %s\n", rank_, t, text);
    if (file_) {
      std::fprintf(file_, "%.3f %s\n", t, text);
      std::fflush(file_);
    }
  }

private:
  int rank_;
  clock_type::time_point t0_;
  std::FILE* file_ = nullptr;
};

std::string checkpoint_path(const options& o, int rank, std::size_t step) {
  return o.checkpoint + "/rank" + std::to_string(rank) + "-step" + std::to_string(step) + ".bin";
}

// The newest step whose checkpoint every rank has (0: none): each rank lists its own, the least wins.
std::size_t newest_common_step(const options& o, comm_t& comm) {
  std::uint64_t mine = 0;
  if (std::filesystem::exists(o.checkpoint))
    for (const auto& e : std::filesystem::directory_iterator(o.checkpoint)) {
      const auto name = e.path().filename().string();
      const auto prefix = "rank" + std::to_string(comm.rank()) + "-step";
      if (name.rfind(prefix, 0) == 0 && name.ends_with(".bin"))
        mine = std::max<std::uint64_t>(mine, std::stoull(name.substr(prefix.size())));
    }
  std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
  comm.inner().all_gather(std::span<const std::uint64_t>(&mine, 1), std::span<std::uint64_t>(all));
  return *std::min_element(all.begin(), all.end());
}

template <class Dp>
int train(comm_t& comm, const options& o, const fmnist::dataset& train_set, const fmnist::dataset& test_set,
          typename Dp::options dpo, bool first_arrivals, rank_log& log) {
  const int rank = comm.rank(), n = comm.size();
  fmnist::mlp net({static_cast<int>(train_set.pixels), 256, 128, 10});
  std::vector<float> params(net.parameter_count());
  net.initialise(params, o.seed);
  commsgd::sync::delay_model slow;
  if (o.slow_rank >= 0 && o.slow_factor > 1.0) {
    slow.kind = commsgd::sync::delay_kind::slow_node;
    slow.node = o.slow_rank;
    slow.factor = o.slow_factor;
  }
  dpo.lr = o.lr;
  if constexpr (requires { dpo.sync.delays; }) {
    dpo.sync.delays = slow;
    dpo.sync.timeout_s = o.timeout_s;
  }
  Dp dp(comm, params.size(), dpo);
  std::size_t first = 0;
  if (o.resume) {
    first = newest_common_step(o, comm);
    if (first > 0) {
      std::ifstream in(checkpoint_path(o, rank, first), std::ios::binary);
      in.read(reinterpret_cast<char*>(params.data()),
              static_cast<std::streamsize>(params.size() * sizeof(float)));
      dp.load(in);
      if (!in)
        throw commsgd::comm_error("reading the checkpoint of step " + std::to_string(first) + " failed");
    }
    log.line("resuming at step %zu", first);
  }
  dp.start(params);

  fmnist::block_batch batch(train_set.count, o.seed);
  std::ofstream csv;
  if (rank == 0 && !o.csv.empty()) {
    csv.open(o.csv, first > 0 ? std::ios::app : std::ios::trunc);
    if (first == 0) csv << "scheme,n,r,slow_rank,slow_factor,step,train_s,accuracy,mb_sent,mb_received\n";
  }
  // Rank 0's training clock: wall time less its own evaluations (a straggler elsewhere waits meanwhile).
  double train_s = 0;
  auto since = clock_type::now();
  double reached = -1;
  for (std::size_t step = first; step < o.steps; ++step) {
    const auto c0 = clock_type::now();
    batch.compute(dp, net, params, train_set, o.batch, step);
    const double compute = std::chrono::duration<double>(clock_type::now() - c0).count();
    if (first_arrivals) {
      dp.step(params, batch.views(), {.compute_seconds = compute});
    } else {
      const double delay = slow.delay(step, rank, compute);
      if (delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      dp.step(params, batch.views());
    }
    if (!o.checkpoint.empty() && (step + 1) % o.checkpoint_every == 0) {
      // Written to a temporary name and renamed, so a rank that dies mid-write leaves no torn file.
      const auto path = checkpoint_path(o, rank, step + 1);
      {
        std::ofstream out(path + ".tmp", std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(params.data()),
                  static_cast<std::streamsize>(params.size() * sizeof(float)));
        dp.save(out);
      }
      std::filesystem::rename(path + ".tmp", path);
    }
    if (rank != 0 || ((step + 1) % o.eval_every != 0 && step + 1 != o.steps)) continue;
    const auto e0 = clock_type::now();
    train_s += std::chrono::duration<double>(e0 - since).count();
    const double acc = static_cast<double>(net.correct(params, test_set, 0, test_set.count)) / test_set.count;
    if (reached < 0 && acc >= o.target) reached = train_s;
    const auto t = comm.counters().total();
    if (csv)
      csv << o.scheme << "," << n << "," << o.r << "," << o.slow_rank << "," << o.slow_factor << ","
          << step + 1 << "," << train_s << "," << acc << "," << t.bytes_sent / 1e6 << ","
          << t.bytes_received / 1e6 << "\n"
          << std::flush;
    log.line("step %zu: %.3f s training, accuracy %.4f", step + 1, train_s, acc);
    since = clock_type::now();
  }
  log.line("trained: step %zu", o.steps);
  dp.finish(params);
  log.line("finished");
  if (rank == 0) {
    // The model's bits, so that a resumed run can be compared with an uninterrupted one.
    std::uint64_t h = 1469598103934665603ull;
    for (float p : params) {
      std::uint32_t b;
      std::memcpy(&b, &p, sizeof b);
      h = (h ^ b) * 1099511628211ull;
    }
    log.line("done: %s, %zu steps, target %.2f %s%.3f s, model hash %016llx", o.scheme.c_str(), o.steps,
             o.target, reached < 0 ? "not reached, trained " : "reached at ", reached < 0 ? train_s : reached,
             static_cast<unsigned long long>(h));
  }
  return 0;
}

template <class Kind>
using gc_dp =
    commsgd::data_parallel<policy::gradient_code<Kind>, policy::dense, policy::first_arrivals, comm_t>;

int run(comm_t& comm, const options& o, const fmnist::dataset& tr, const fmnist::dataset& te, rank_log& log) {
  const policy::redundancy_options coded{.redundancy = o.r};
  if (o.scheme == "ring")
    return train<commsgd::data_parallel<policy::uncoded<>, policy::dense, policy::synchronous, comm_t>>(
        comm, o, tr, te, {}, false, log);
  if (o.scheme == "backup")
    return train<gc_dp<coding::backup_workers>>(comm, o, tr, te, {.coding = coded}, true, log);
  if (o.scheme == "gc_fr")
    return train<gc_dp<coding::fractional_repetition>>(comm, o, tr, te, {.coding = coded}, true, log);
  if (o.scheme == "gc_cyclic")
    return train<gc_dp<coding::cyclic>>(comm, o, tr, te, {.coding = coded}, true, log);
  throw commsgd::invalid_argument("argument 'scheme' = '" + o.scheme +
                                  "' is outside the allowed set {ring, backup, gc_fr, gc_cyclic}");
}

int usage() {
  std::fprintf(stderr, "usage: fashion_mnist_stragglers_mpi [--scheme ring|backup|gc_fr|gc_cyclic] [--r R] "
                       "[--batch B] [--steps S] [--eval-every E] [--lr LR] [--target ACC] [--train N] "
                       "[--test N] [--seed S] [--slow-rank K] [--slow-factor F] [--timeout-s T] "
                       "[--checkpoint DIR] [--checkpoint-every K] [--resume] [--csv FILE] [--log FILE]\n");
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--resume") {
      o.resume = true;
      continue;
    }
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    if (a == "--scheme")
      o.scheme = v;
    else if (a == "--r")
      o.r = std::stoi(v);
    else if (a == "--batch")
      o.batch = std::stoul(v);
    else if (a == "--steps")
      o.steps = std::stoul(v);
    else if (a == "--eval-every")
      o.eval_every = std::stoul(v);
    else if (a == "--lr")
      o.lr = std::stof(v);
    else if (a == "--target")
      o.target = std::stod(v);
    else if (a == "--train")
      o.train = std::stoul(v);
    else if (a == "--test")
      o.test = std::stoul(v);
    else if (a == "--seed")
      o.seed = std::stoull(v);
    else if (a == "--slow-rank")
      o.slow_rank = std::stoi(v);
    else if (a == "--slow-factor")
      o.slow_factor = std::stod(v);
    else if (a == "--timeout-s")
      o.timeout_s = std::stod(v);
    else if (a == "--checkpoint")
      o.checkpoint = v;
    else if (a == "--checkpoint-every")
      o.checkpoint_every = std::stoul(v);
    else if (a == "--csv")
      o.csv = v;
    else if (a == "--log")
      o.log = v;
    else
      return usage();
  }
  boost::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string log_path = o.log;
  if (const auto at = log_path.find("%r"); at != std::string::npos)
    log_path.replace(at, 2, std::to_string(rank));
  rank_log log(log_path, rank);
  try {
    if (o.slow_factor < 1.0 || o.checkpoint_every == 0 || o.eval_every == 0)
      throw commsgd::invalid_argument("--slow-factor must be >= 1, --checkpoint-every and --eval-every >= 1");
    if (!o.checkpoint.empty()) std::filesystem::create_directories(o.checkpoint);
    const auto dir = fmnist::default_data_dir();
    const auto tr = fmnist::load_set(dir, "train", o.train);
    const auto te = fmnist::load_set(dir, "t10k", o.test);
    comm_t comm(commsgd::comm::mpi::world());
    comm.inner().set_timeout(o.timeout_s);
    return run(comm, o, tr, te, log);
  } catch (const commsgd::invalid_argument& e) {
    log.line("error: %s", e.what());
    return 2;
  } catch (const std::exception& e) {
    // The exchange failed (a timeout, a lost peer): MPI cannot go on, and MPI_Finalize could wait for the
    // lost peer, so the process ends here with the error in its own log.
    log.line("failed: %s", e.what());
    std::fflush(nullptr);
    std::_Exit(3);
  }
}
