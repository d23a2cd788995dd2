// The straggler study: gradient coding (sync::first_arrivals over coding::gradient_code) against ring SSGD,
// backup workers, local SGD and CSSGD on Fashion-MNIST, with seeded straggler delays.
//
//   fashion_mnist_stragglers --ranks 10 --r 2 --delays slow --csv curves.csv
//
// Every scheme trains the same MLP from the same initial model on the same batches. Time is modelled on
// comm::simulated, so that 2 cores can stand for n nodes: a node's compute is (samples it computes) x
// --sample-us, its straggler delay comes from sync::delay_model (seeded per step and rank, the same for
// every scheme), and its communication is charged by the network model (--gbps, --latency-us). Schemes that
// wait for everyone (ring, CSSGD) align every clock to the slowest node each step; local SGD at averaging
// steps; first_arrivals proceeds with the first n - s answers on its own clock. Delay units: "slow" makes one
// node (rank n - 1) 5x slower at whatever it computes; "exp" and "pareto" add to every node a delay of mean
// the uncoded per-node compute time T = batch / n x sample time (Pareto tail index 1.5); "stop" has rank
// n - 1 never answer from step 10 on (schemes that wait for everyone never finish).
#include "block_batch.hpp"
#include "idx.hpp"
#include "mlp.hpp"

#include <commsgd/coding/coding.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/sync/first_arrivals.hpp>
#include <commsgd/sync/local_sgd.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using base_t = commsgd::comm::local;
using sim_t = commsgd::comm::simulated<base_t>;
using comm_t = commsgd::comm::metered<sim_t>;
namespace coding = commsgd::coding;
namespace policy = commsgd::policy;

struct options {
  int ranks = 10;
  int r = 2;
  std::string delays = "slow";
  std::size_t batch = 500;
  std::size_t steps = 300;
  std::size_t eval_every = 10;
  float lr = 0.1f;
  double target = 0.75;
  double sample_us = 67.0;
  double gbps = 100.0;
  double latency_us = 5.0;
  std::size_t train = 10000, test = 2000;
  std::uint64_t seed = 1;
  std::string csv;
  std::string schemes = "ring,backup,gc_fr,gc_cyclic,local4,cssgd";
};

struct point {
  std::size_t step;
  double time, accuracy;
};

struct result {
  std::string scheme;
  std::vector<point> curve;
  double time_to_target = -1;
  double final_accuracy = 0;
  double mb_sent = 0, mb_received = 0;
  bool stalled = false;
};

commsgd::sync::delay_model delay_of(const options& o) {
  commsgd::sync::delay_model m;
  m.seed = o.seed * 7919 + 17;
  if (o.delays == "slow") {
    m.kind = commsgd::sync::delay_kind::slow_node;
    m.node = o.ranks - 1;
    m.factor = 5.0;
  } else if (o.delays == "exp") {
    m.kind = commsgd::sync::delay_kind::shifted_exponential;
    m.mean = 1.0;
  } else if (o.delays == "pareto") {
    m.kind = commsgd::sync::delay_kind::pareto;
    m.mean = 1.0;
    m.shape = 1.5;
  } else if (o.delays == "stop") {
    m.kind = commsgd::sync::delay_kind::stop;
    m.node = o.ranks - 1;
    m.from_step = 10;
  } else if (o.delays != "none") {
    throw commsgd::invalid_argument("argument 'delays' = '" + o.delays +
                                    "' is outside the allowed set {none, slow, exp, pareto, stop}");
  }
  return m;
}

// One scheme on one rank. Dp is a data_parallel composition; `waits` says whether the step waits for every
// node (the delay is charged before the exchange and clocks align after it).
template <class Dp>
void train_scheme(comm_t& comm, const options& o, const fmnist::dataset& train, const fmnist::dataset& test,
                  typename Dp::options dpo, bool first_arrivals, result* out) {
  auto& sim = comm.inner();
  auto& plain = sim.inner();
  const int rank = comm.rank(), n = comm.size();
  fmnist::mlp net({static_cast<int>(train.pixels), 256, 128, 10});
  std::vector<float> params(net.parameter_count());
  net.initialise(params, o.seed);
  const auto model = delay_of(o);
  dpo.lr = o.lr;
  if constexpr (requires { dpo.sync.delays; }) dpo.sync.delays = model;
  Dp dp(comm, params.size(), dpo);
  sim.reset();
  const auto bytes0 = comm.counters().total();
  const double sample_s = o.sample_us * 1e-6;
  const double unit_t = static_cast<double>(o.batch) / n * sample_s;
  result res;
  bool stalled = false;
  fmnist::block_batch batch(train.count, o.seed);
  for (std::size_t step = 0; step < o.steps && !stalled; ++step) {
    const std::size_t samples = batch.compute(dp, net, params, train, o.batch, step);
    const double compute = static_cast<double>(samples) * sample_s;
    // "slow": 5x at whatever this node computes; the tails: units of the uncoded compute T.
    const double unit = model.kind == commsgd::sync::delay_kind::slow_node ? compute : unit_t;
    sim.advance(compute);
    if (first_arrivals) {
      dp.step(params, batch.views(), {.compute_seconds = unit});
    } else {
      const double delay = model.delay(step, rank, unit);
      // A node that never answers stalls every scheme that waits for it: all ranks know it from the model.
      double worst = 0;
      for (int k = 0; k < n; ++k)
        worst = std::max(worst, model.delay(step, k, unit));
      if (!std::isfinite(worst)) {
        stalled = true;
        break;
      }
      sim.advance(delay);
      const auto r = dp.step(params, batch.views());
      if (r.exchanged) sim.align_to_slowest();
    }
    if ((step + 1) % o.eval_every != 0 && step + 1 != o.steps) continue;
    // Local SGD evaluates the model it last averaged only when it averages; others every time.
    std::vector<std::uint64_t> b{comm.counters().total().bytes_sent - bytes0.bytes_sent,
                                 comm.counters().total().bytes_received - bytes0.bytes_received};
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(n));
    plain.all_gather(std::span<const std::uint64_t>(b), std::span<std::uint64_t>(all));
    double t = sim.now();
    std::vector<double> times(static_cast<std::size_t>(n));
    plain.all_gather(std::span<const double>(&t, 1), std::span<double>(times));
    if (rank != 0) continue;
    t = *std::max_element(times.begin(), times.end());
    const double acc = static_cast<double>(net.correct(params, test, 0, test.count)) / test.count;
    res.curve.push_back({step + 1, t, acc});
    if (res.time_to_target < 0 && acc >= o.target) res.time_to_target = t;
    res.final_accuracy = acc;
    res.mb_sent = res.mb_received = 0;
    for (int k = 0; k < n; ++k) {
      res.mb_sent = std::max(res.mb_sent, all[2 * static_cast<std::size_t>(k)] / 1e6);
      res.mb_received = std::max(res.mb_received, all[2 * static_cast<std::size_t>(k) + 1] / 1e6);
    }
  }
  if (!stalled) dp.finish(params);
  if (rank == 0) {
    res.stalled = stalled;
    *out = std::move(res);
  }
}

template <class Kind>
using gc_dp =
    commsgd::data_parallel<policy::gradient_code<Kind>, policy::dense, policy::first_arrivals, comm_t>;

void run_scheme(const std::string& name, const options& o, const fmnist::dataset& train,
                const fmnist::dataset& test, result* out) {
  const commsgd::comm::network_model net{o.latency_us * 1e-6, o.gbps * 1e9 / 8};
  commsgd::comm::local_group{o.ranks}.run([&](base_t& base) {
    comm_t comm(sim_t(base, net));
    const policy::redundancy_options coded{.redundancy = o.r};
    commsgd::sync::first_arrivals_options arrivals;
    arrivals.timeout_s = 600;
    if (name == "ring")
      train_scheme<commsgd::data_parallel<policy::uncoded<>, policy::dense, policy::synchronous, comm_t>>(
          comm, o, train, test, {}, false, out);
    else if (name == "backup")
      train_scheme<gc_dp<coding::backup_workers>>(comm, o, train, test, {.coding = coded, .sync = arrivals},
                                                  true, out);
    else if (name == "gc_fr")
      train_scheme<gc_dp<coding::fractional_repetition>>(comm, o, train, test,
                                                         {.coding = coded, .sync = arrivals}, true, out);
    else if (name == "gc_cyclic")
      train_scheme<gc_dp<coding::cyclic>>(comm, o, train, test, {.coding = coded, .sync = arrivals}, true,
                                          out);
    else if (name == "local4")
      train_scheme<commsgd::data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd, comm_t>>(
          comm, o, train, test, {.sync = {.period = 4}}, false, out);
    else if (name == "cssgd")
      train_scheme<commsgd::data_parallel<policy::cssgd<coding::xor_bits>, policy::dense, policy::synchronous,
                                          comm_t>>(comm, o, train, test, {.coding = coded}, false, out);
    else
      throw commsgd::invalid_argument("unknown scheme '" + name + "'");
  });
  out->scheme = name;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks")
      o.ranks = std::stoi(next());
    else if (a == "--r")
      o.r = std::stoi(next());
    else if (a == "--delays")
      o.delays = next();
    else if (a == "--batch")
      o.batch = std::stoul(next());
    else if (a == "--steps")
      o.steps = std::stoul(next());
    else if (a == "--eval-every")
      o.eval_every = std::stoul(next());
    else if (a == "--lr")
      o.lr = std::stof(next());
    else if (a == "--target")
      o.target = std::stod(next());
    else if (a == "--sample-us")
      o.sample_us = std::stod(next());
    else if (a == "--gbps")
      o.gbps = std::stod(next());
    else if (a == "--latency-us")
      o.latency_us = std::stod(next());
    else if (a == "--train")
      o.train = std::stoul(next());
    else if (a == "--test")
      o.test = std::stoul(next());
    else if (a == "--seed")
      o.seed = std::stoull(next());
    else if (a == "--schemes")
      o.schemes = next();
    else if (a == "--csv")
      o.csv = next();
    else {
      std::fprintf(stderr,
                   "usage: fashion_mnist_stragglers [--ranks N] [--r R] [--delays none|slow|exp|pareto|stop] "
                   "[--batch B] [--steps S] [--eval-every E] [--lr LR] [--target ACC] [--sample-us US] "
                   "[--gbps G] [--latency-us US] [--train N] [--test N] [--seed S] [--schemes a,b,...] "
                   "[--csv FILE]\n");
      return 2;
    }
  }
  try {
    delay_of(o);
    const auto dir = fmnist::default_data_dir();
    const auto train = fmnist::load_set(dir, "train", o.train);
    const auto test = fmnist::load_set(dir, "t10k", o.test);
    std::vector<std::string> names;
    for (std::size_t p = 0; p <= o.schemes.size();) {
      const auto q = std::min(o.schemes.find(',', p), o.schemes.size());
      if (q > p) names.push_back(o.schemes.substr(p, q - p));
      p = q + 1;
    }
    std::printf("n = %d, r = %d, delays %s, batch %zu, %zu steps, %.0f Gbit/s, %.0f us latency, %.0f us per "
                "sample; target %.2f\n",
                o.ranks, o.r, o.delays.c_str(), o.batch, o.steps, o.gbps, o.latency_us, o.sample_us,
                o.target);
    std::printf("%-10s %12s %10s %10s %12s %12s %9s %9s\n", "scheme", "to target s", "vs ring", "total s",
                "MB sent/node", "MB recv/node", "final acc", "last-5");
    std::vector<result> results;
    for (const auto& name : names) {
      if (name == "gc_fr" && o.ranks % o.r != 0) {
        std::printf("gc_fr skipped: fractional repetition needs r | n\n");
        continue;
      }
      result r;
      run_scheme(name, o, train, test, &r);
      results.push_back(std::move(r));
    }
    double ring = -1;
    for (const auto& r : results)
      if (r.scheme == "ring") ring = r.time_to_target;
    std::ofstream csv;
    if (!o.csv.empty()) {
      csv.open(o.csv);
      csv << "scheme,n,r,delays,step,time_s,accuracy\n";
    }
    for (const auto& r : results) {
      char ratio[32] = "-";
      if (ring > 0 && r.time_to_target > 0)
        std::snprintf(ratio, sizeof ratio, "%.2fx", ring / r.time_to_target);
      const double total = r.curve.empty() ? 0.0 : r.curve.back().time;
      // One evaluation moves by a point between neighbours; the mean of the last five is steadier.
      double last5 = 0;
      const std::size_t k = std::min<std::size_t>(5, r.curve.size());
      for (std::size_t i = r.curve.size() - k; i < r.curve.size(); ++i)
        last5 += r.curve[i].accuracy / static_cast<double>(k);
      if (r.stalled)
        std::printf("%-10s %12s %10s %10s %12s %12s %9s %9s\n", r.scheme.c_str(), "never", "-", "-", "-", "-",
                    "stalled", "-");
      else if (r.time_to_target < 0)
        std::printf("%-10s %12s %10s %10.4f %12.1f %12.1f %9.4f %9.4f\n", r.scheme.c_str(), "not reached",
                    "-", total, r.mb_sent, r.mb_received, r.final_accuracy, last5);
      else
        std::printf("%-10s %12.4f %10s %10.4f %12.1f %12.1f %9.4f %9.4f\n", r.scheme.c_str(),
                    r.time_to_target, ratio, total, r.mb_sent, r.mb_received, r.final_accuracy, last5);
      if (csv)
        for (const auto& p : r.curve)
          csv << r.scheme << "," << o.ranks << "," << o.r << "," << o.delays << "," << p.step << "," << p.time
              << "," << p.accuracy << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
