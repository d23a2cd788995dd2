// Data-parallel training of the MLP on one rank, with any scheme, reporting modelled-cluster time and bytes.
#pragma once

#include "fit.hpp"
#include "idx.hpp"
#include "mlp.hpp"
#include "schemes.hpp"
#include "timing.hpp"

#include <commsgd/comm/metered.hpp>
#include <commsgd/select/select.hpp>
#include <commsgd/sparsify/top_k.hpp>
#include <commsgd/sync/async_ps.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace fmnist {

struct train_options {
  std::string scheme = "ring";
  int ranks = 4;
  int epochs = 1;
  std::size_t batch = 128; // global: split among the ranks
  float lr = 0.1f;
  std::uint64_t seed = 1;
  int evals_per_epoch = 4;
  double target = 0.80;
  network_options network;
  bool wall_clock = false;
  bool quiet = false;
  std::string dump_gradient; // where to write a mid-training raw float32 gradient of rank 0 ("" = none)
  bool fit = true;           // Laplace/Gaussian W1 distances of rank 0's gradient at each evaluation
  std::vector<int> hidden{256, 128}; // hidden layer widths of the MLP
  // Where to write rank 0's top-k accumulators p_t = g_t + e_(t-1) of steps [dump_first, dump_first +
  // dump_count) as raw float32, with a manifest ("" = none; topk schemes only).
  std::string dump_accumulators;
  std::size_t dump_first = 0, dump_count = 0;
};

// Writes what a top-k scheme's selector sees on rank 0: the scheme's own sparsifier reports its accumulator
// p = g + e after each step (step_env::on_accumulator), and the steps asked for go to one raw float32 file
// each, listed in a manifest. It runs outside the charged compute.
class accumulator_dump {
public:
  explicit accumulator_dump(const train_options& o) : o_(o) {
    const auto p = split_spec(o.scheme);
    if (p.size() != 3 || p[0] != "topk")
      throw commsgd::invalid_argument(
          "argument 'dump-accumulators' needs a scheme topk:<method>:<density>, got '" + o.scheme + "'");
    density_ = std::stod(p[2]);
    method_ = p[1];
    std::filesystem::create_directories(o.dump_accumulators);
  }

  void feed(std::span<const float> p, std::size_t sent, std::size_t step) {
    if (step < o_.dump_first || step >= o_.dump_first + o_.dump_count) return;
    const std::string name = "accumulator-" + std::to_string(step) + ".f32";
    std::ofstream f(std::filesystem::path(o_.dump_accumulators) / name, std::ios::binary);
    // Raw float32 in the machine's order; every machine this targets is little-endian.
    f.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(p.size() * sizeof(float)));
    if (!f)
      throw commsgd::invalid_argument("cannot write argument 'dump-accumulators' = '" + o_.dump_accumulators +
                                      "'");
    files_.push_back(name + " " + std::to_string(step) + " " + std::to_string(sent));
    std::ofstream m(std::filesystem::path(o_.dump_accumulators) / "manifest.txt");
    m << "# top-k accumulators p_t = g_t + e_(t-1) of rank 0, raw little-endian float32, one file per step\n"
      << "n " << p.size() << "\ndensity " << density_ << "\nmethod " << method_ << "\nscheme " << o_.scheme
      << "\nranks " << o_.ranks << "\nbatch " << o_.batch << "\nlr " << o_.lr << "\n# file step sent\n";
    for (const auto& line : files_)
      m << "file " << line << '\n';
  }

private:
  train_options o_;
  double density_ = 0;
  std::string method_;
  std::vector<std::string> files_;
};

struct curve_point {
  int epoch = 0;
  std::size_t step = 0;
  double sim_time = 0, compute = 0, comm = 0;       // seconds of the modelled cluster (comm::simulated)
  double sim_time_alt = 0;                          // the same on network_options::alt_gbit_per_s
  std::uint64_t bytes_sent = 0, bytes_received = 0; // per node, the largest over ranks
  double accuracy = 0, loss = 0;
  fit_report fit;
  double zero_fraction = 0; // exact zeros in the gradient (dead ReLUs): part of why its tails are heavy
};

struct train_result {
  std::string scheme;
  std::vector<curve_point> curve;
  double time_to_target = -1;     // modelled seconds; negative when never reached
  double time_to_target_alt = -1; // the same on the second bandwidth
  std::string note;
  double run_wall_s = 0, run_cpu_s = 0; // what the run cost this machine (experiment mode fills them)
};

// ASGD (`asgd[:j]`): rank 0 is a parameter server (sync::async_ps), ranks 1..n-1 are workers that each take
// their share of every batch, push the gradient and pull the newest model without waiting for each other.
// No rank may join a per-step collective here (the server serves only in finish()), so the modelled time is
// NIC-bound, which is comm::simulated's rule: each worker's clock runs its own compute then its push/pull
// traffic (advance() after each step), the server's clock is the load on its link; the run takes the latest
// clock. Only the final model is evaluated, so the curve has one point. Interleaving follows the threads'
// real timing, so results vary slightly from run to run, as they would on a cluster.
template <class Comm>
void train_async(Comm& comm, const train_options& o, const dataset& train, const dataset& test, mlp& net,
                 std::vector<float>& params, train_result* out) {
  auto& sim = comm.inner();
  auto& plain = sim.inner();
  const int rank = comm.rank(), n = comm.size();
  if (n < 2)
    throw commsgd::invalid_argument(
        commsgd::concat("scheme 'asgd' needs argument 'ranks' >= 2 (a server and a worker), got ", n));
  const auto p = split_spec(o.scheme);
  commsgd::sync::async_ps_options ao;
  ao.lr = o.lr;
  ao.apply_after = p.size() > 1 ? std::stoi(p[1]) : 1;
  ao.staleness_scaling = true;
  ao.keep_log = false;
  commsgd::sync::async_ps<Comm> ps(comm, ao);
  ps.start(params);

  compute_clock clock(o.wall_clock);
  double compute = 0, alt = 0; // alt: this rank's clock on the second bandwidth, from the same loads
  const auto alt_net = o.network.alternative();
  const std::size_t steps_per_epoch = train.count / o.batch;
  const int workers = n - 1;
  std::vector<float> grad(params.size());
  std::vector<std::uint32_t> order(train.count), index;
  double loss_sum = 0;
  std::size_t samples = 0;
  if (ps.computes_gradients()) {
    const auto [lo, hi] = share_of(o.batch, rank - 1, workers);
    for (int epoch = 1; epoch <= o.epochs; ++epoch) {
      shuffle_epoch(order, o.seed, static_cast<std::uint64_t>(epoch));
      for (std::size_t s = 0; s < steps_per_epoch; ++s) {
        index.assign(order.begin() + static_cast<std::ptrdiff_t>(s * o.batch + lo),
                     order.begin() + static_cast<std::ptrdiff_t>(s * o.batch + hi));
        const double t0 = clock.now();
        std::fill(grad.begin(), grad.end(), 0.0f);
        // Each push is one worker's own mini-batch, so its mean gradient is what the server applies.
        loss_sum +=
            net.gradient(params, train, index.data(), index.size(), static_cast<double>(index.size()), grad);
        samples += index.size();
        const double c = clock.now() - t0;
        compute += c;
        alt += commsgd::comm::busy_seconds(sim.load(), alt_net) + c;
        sim.advance(c);
        ps.step(params, grad, {});
      }
    }
  }
  ps.finish(params);

  // After finish() nobody serves any more, so the bookkeeping collectives are safe again.
  const auto t = comm.counters().total();
  alt += commsgd::comm::busy_seconds(sim.load(), alt_net);
  std::vector<double> mine{compute, sim.now(), loss_sum, static_cast<double>(samples), alt};
  std::vector<double> all(5 * static_cast<std::size_t>(n));
  plain.all_gather(std::span<const double>(mine), std::span<double>(all));
  std::vector<std::uint64_t> bytes{t.bytes_sent, t.bytes_received},
      all_bytes(2 * static_cast<std::size_t>(n));
  plain.all_gather(std::span<const std::uint64_t>(bytes), std::span<std::uint64_t>(all_bytes));
  if (rank != 0 || !out) return;
  curve_point pt;
  pt.epoch = o.epochs;
  pt.step = steps_per_epoch * static_cast<std::size_t>(o.epochs);
  double loss = 0, count = 0;
  for (int r = 0; r < n; ++r) {
    const auto* a = &all[5 * static_cast<std::size_t>(r)];
    pt.compute = std::max(pt.compute, a[0]);
    pt.comm = std::max(pt.comm, a[1] - a[0]);
    pt.sim_time = std::max(pt.sim_time, a[1]);
    pt.sim_time_alt = std::max(pt.sim_time_alt, a[4]);
    loss += a[2];
    count += a[3];
    pt.bytes_sent = std::max(pt.bytes_sent, all_bytes[2 * static_cast<std::size_t>(r)]);
    pt.bytes_received = std::max(pt.bytes_received, all_bytes[2 * static_cast<std::size_t>(r) + 1]);
  }
  pt.loss = loss / std::max(1.0, count);
  pt.accuracy =
      static_cast<double>(net.correct(params, test, 0, test.count)) / static_cast<double>(test.count);
  train_result res;
  res.scheme = o.scheme;
  if (pt.accuracy >= o.target) {
    res.time_to_target = pt.sim_time;
    res.time_to_target_alt = pt.sim_time_alt;
  }
  res.curve.push_back(pt);
  res.note = "final model only";
  if (!o.quiet)
    std::printf("%-28s epoch %d  acc %.4f  loss %.4f  sent/node %8.2f MB  recv/node %8.2f MB  time %8.3f s "
                "(compute %.3f, comm %.3f)  server applies after %d push(es), lr / staleness\n",
                o.scheme.c_str(), o.epochs, pt.accuracy, pt.loss, pt.bytes_sent / 1e6,
                pt.bytes_received / 1e6, pt.sim_time, pt.compute, pt.comm, ao.apply_after);
  *out = std::move(res);
}

// Trains on one rank. Every rank of `base` calls this with the same options; rank 0 fills `out`.
//
// The scheme's communicator is metered<simulated<Base>>: simulated keeps this rank's virtual clock from the
// network model, metered outside it counts the bytes, and align_to_slowest (which travels over Base) stays
// off both. After each step the clock is advanced by the compute the step exposes (all of it, unless the
// scheme overlaps it with the exchange) and aligned to the slowest rank, as a bulk-synchronous cluster would
// be. Local SGD's independent steps are aligned too: a slightly pessimistic reading for it (the per-step
// maximum of ten ranks' compute rather than the maximum of their sums), but compute is a small part of every
// step.
template <class Base>
void train_rank(Base base, const train_options& o, const dataset& train, const dataset& test,
                train_result* out) {
  using sim_t = commsgd::comm::simulated<Base>;
  using comm_t = commsgd::comm::metered<sim_t>;
  comm_t comm(sim_t(std::move(base), o.network.primary()));
  auto& sim = comm.inner();
  auto& plain = sim.inner(); // bookkeeping traffic that is not the scheme's: neither metered nor charged
  const auto alt_net = o.network.alternative();
  const int rank = comm.rank(), n = comm.size();
  std::vector<int> widths{static_cast<int>(train.pixels)};
  widths.insert(widths.end(), o.hidden.begin(), o.hidden.end());
  widths.push_back(10);
  mlp net(widths);
  std::vector<float> params(net.parameter_count());
  net.initialise(params, o.seed);
  if (split_spec(o.scheme).front() == "asgd") return train_async(comm, o, train, test, net, params, out);
  auto sch = make_scheme<comm_t>(o.scheme, comm, o.lr, net.layer_sizes());

  const std::size_t steps_per_epoch = train.count / o.batch;
  if (steps_per_epoch == 0)
    throw commsgd::invalid_argument(commsgd::concat("argument 'batch' = ", o.batch,
                                                    " is larger than the training set (", train.count, ")"));
  const std::size_t total_steps = steps_per_epoch * static_cast<std::size_t>(o.epochs);
  const std::size_t eval_every =
      std::max<std::size_t>(1, steps_per_epoch / static_cast<std::size_t>(std::max(1, o.evals_per_epoch)));
  const std::size_t dump_step = total_steps / 2;

  std::unique_ptr<accumulator_dump> dump;
  if (rank == 0 && !o.dump_accumulators.empty()) dump = std::make_unique<accumulator_dump>(o);

  compute_clock clock(o.wall_clock);
  std::vector<std::uint32_t> order(train.count);
  std::vector<std::uint32_t> batch_index;
  double step_compute = 0, loss_window = 0;
  std::size_t samples_window = 0;
  std::vector<float> fit_copy;
  bool want_copy = false;

  step_env env;
  env.rank = rank;
  env.size = n;
  env.lr = o.lr;
  env.params = params;
  env.clock = &clock;
  env.compute = &step_compute;
  if (dump)
    env.on_accumulator = [&](std::span<const float> p, std::size_t sent) { dump->feed(p, sent, env.step); };
  env.gradient = [&](std::size_t first, std::size_t count, std::span<float> grad) {
    const double t0 = clock.now();
    std::fill(grad.begin(), grad.end(), 0.0f);
    const double loss =
        net.gradient(params, train, batch_index.data() + first, count, static_cast<double>(env.batch), grad);
    step_compute += clock.now() - t0;
    loss_window += loss;
    samples_window += count;
    if (want_copy) {
      fit_copy.assign(grad.begin(), grad.end());
      want_copy = false;
    }
    return loss;
  };
  env.gradient_by_layer = [&](std::size_t first, std::size_t count, double scale, std::span<float> grad,
                              const std::function<void(std::size_t)>& on_layer) {
    const double t0 = clock.now();
    std::fill(grad.begin(), grad.end(), 0.0f);
    const double loss = net.gradient(params, train, batch_index.data() + first, count, scale, grad, on_layer);
    step_compute += clock.now() - t0;
    loss_window += loss;
    samples_window += count;
    if (want_copy) {
      // Scaled as env.gradient's would be, so the fits compare across schemes.
      fit_copy.assign(grad.begin(), grad.end());
      for (float& v : fit_copy)
        v *= static_cast<float>(scale / static_cast<double>(env.batch));
      want_copy = false;
    }
    return loss;
  };

  train_result res;
  res.scheme = o.scheme;
  double sim_compute = 0, sim_alt = 0;
  std::vector<double> mine(2), all(2 * static_cast<std::size_t>(n));
  std::size_t step = 0;

  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    shuffle_epoch(order, o.seed, static_cast<std::uint64_t>(epoch));

    for (std::size_t s = 0; s < steps_per_epoch; ++s, ++step) {
      batch_index.assign(order.begin() + static_cast<std::ptrdiff_t>(s * o.batch),
                         order.begin() + static_cast<std::ptrdiff_t>((s + 1) * o.batch));
      env.batch = o.batch;
      env.step = step;
      const bool eval_now = (step + 1) % eval_every == 0 || s + 1 == steps_per_epoch;
      want_copy = rank == 0 && ((o.fit && eval_now) || (!o.dump_gradient.empty() && step == dump_step));
      step_compute = 0;
      sch->step(comm, env);
      if (step + 1 == total_steps) sch->finish(comm, env);

      // The simulated clock holds the step's link load since the last advance(); the scheme says how much of
      // the step's compute that traffic does not hide. The step ends when the slowest rank's clock does.
      const auto load = sim.load();
      const double step_s = sch->step_seconds(step_compute, load, sim.network());
      sim.advance(std::max(0.0, step_s - commsgd::comm::busy_seconds(load, sim.network())));
      sim.align_to_slowest();
      mine = {step_compute, sch->step_seconds(step_compute, load, alt_net)};
      plain.all_gather(std::span<const double>(mine), std::span<double>(all));
      double worst_compute = 0, worst_alt = 0;
      for (int r = 0; r < n; ++r) {
        worst_compute = std::max(worst_compute, all[2 * static_cast<std::size_t>(r)]);
        worst_alt = std::max(worst_alt, all[2 * static_cast<std::size_t>(r) + 1]);
      }
      sim_compute += worst_compute;
      sim_alt += worst_alt;

      if (rank == 0 && step == dump_step && !o.dump_gradient.empty() && !fit_copy.empty()) {
        std::ofstream f(o.dump_gradient, std::ios::binary);
        // Raw float32 in the machine's order; every machine this targets is little-endian.
        f.write(reinterpret_cast<const char*>(fit_copy.data()),
                static_cast<std::streamsize>(fit_copy.size() * sizeof(float)));
        if (!f)
          throw commsgd::invalid_argument("cannot write argument 'dump-gradient' = '" + o.dump_gradient +
                                          "'");
      }

      if (!eval_now) continue;
      std::vector<double> window{loss_window, static_cast<double>(samples_window)};
      plain.all_reduce_sum(std::span<double>(window));
      std::vector<std::uint64_t> bytes{comm.counters().total().bytes_sent,
                                       comm.counters().total().bytes_received};
      std::vector<std::uint64_t> all_bytes(2 * static_cast<std::size_t>(n));
      plain.all_gather(std::span<const std::uint64_t>(bytes), std::span<std::uint64_t>(all_bytes));
      loss_window = 0;
      samples_window = 0;
      if (rank != 0) continue;

      curve_point pt;
      pt.epoch = epoch;
      pt.step = step + 1;
      pt.sim_time = sim.now();
      pt.sim_time_alt = sim_alt;
      pt.compute = sim_compute;
      pt.comm = pt.sim_time - sim_compute; // what the slowest compute does not cover
      for (int r = 0; r < n; ++r) {
        pt.bytes_sent = std::max(pt.bytes_sent, all_bytes[2 * static_cast<std::size_t>(r)]);
        pt.bytes_received = std::max(pt.bytes_received, all_bytes[2 * static_cast<std::size_t>(r) + 1]);
      }
      pt.loss = window[0] / std::max(1.0, window[1]);
      const auto model = sch->model(params);
      pt.accuracy =
          static_cast<double>(net.correct(model, test, 0, test.count)) / static_cast<double>(test.count);
      if (o.fit && !fit_copy.empty()) {
        pt.fit = fmnist::fit(fit_copy);
        pt.zero_fraction = static_cast<double>(std::count(fit_copy.begin(), fit_copy.end(), 0.0f)) /
                           static_cast<double>(fit_copy.size());
      }
      if (res.time_to_target < 0 && pt.accuracy >= o.target) {
        res.time_to_target = pt.sim_time;
        res.time_to_target_alt = pt.sim_time_alt;
      }
      res.curve.push_back(pt);
      if (s + 1 == steps_per_epoch && !o.quiet)
        std::printf(
            "%-28s epoch %d  acc %.4f  loss %.4f  sent/node %8.2f MB  recv/node %8.2f MB  time %8.3f s "
            "(compute %.3f, comm %.3f)  W1 laplace %.3g gauss %.3g  %s\n",
            o.scheme.c_str(), epoch, pt.accuracy, pt.loss, pt.bytes_sent / 1e6, pt.bytes_received / 1e6,
            pt.sim_time, pt.compute, pt.comm, pt.fit.w1_laplace, pt.fit.w1_gaussian, sch->note().c_str());
      std::fflush(stdout);
    }
  }
  if (rank == 0 && out) {
    res.note = sch->note();
    *out = std::move(res);
  }
}

} // namespace fmnist
