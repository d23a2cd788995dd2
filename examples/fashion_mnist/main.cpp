// fashion_mnist: data-parallel training of an MLP on Fashion-MNIST with commsgd's communication schemes.
//
//   fashion_mnist train --scheme ring --ranks 4 --epochs 1 --gbps 1 --csv out.csv
//   fashion_mnist experiment --out results/        (every scheme, small scale, table + CSV + PNG plots)
//   mpiexec -n 2 fashion_mnist train --comm mpi    (one rank per process; needs the commsgd::mpi build)
#include "report.hpp"
#include "trainer.hpp"

#include <commsgd/comm/local.hpp>
#if defined(FMNIST_HAS_MPI)
#include <boost/mpi/environment.hpp>
#include <commsgd/comm/mpi.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct cli {
  std::string mode = "train";
  fmnist::train_options train;
  std::string comm = "local";
  std::string data = fmnist::default_data_dir();
  std::size_t subset = 0;      // training images kept (0 = all 60,000)
  std::size_t test_subset = 0; // test images kept (0 = all 10,000)
  std::string csv;
  std::string out = "fashion_mnist_results";
  double min_accuracy = 0;
  std::vector<std::string> schemes; // experiment: overrides the default list
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr
      << "fashion_mnist: " << why << "\n"
      << "usage: fashion_mnist [train|experiment] [options]\n"
         "  --scheme S        (train; default ring) one of\n"
         "                      ring                       SSGD, ring all-reduce\n"
         "                      allgather                  SSGD, all-gather of every node's gradient\n"
         "                      topk:<method>:<density>    top-k SSGD with error feedback; method: exact,\n"
         "                                                 radix, laplace_bisect, hierarchical, sampled\n"
         "                      cssgd:<r>[:xor|int32]      coded SSGD with redundancy r\n"
         "                      asgd[:<j>]                 parameter server, applies after j pushes\n"
         "                      local:<H>                  local SGD, average every H steps\n"
         "                      local_adaptive:<H0>[:<pull>]  ADACOMM interval + elastic correction\n"
         "                      partitioned[:<elements>[:<credit KiB>]]  SSGD overlapped with backward\n"
         "                      topk_ar:<method>:<density> top-k summed by the sparse all-reduce\n"
         "                      powersgd:<r>               PowerSGD, rank r, error feedback\n"
         "                      qsgd:<s>[:ef], sign, random_k:<density>, fp16[:ef], bf16[:ef]\n"
         "                                                 the other compressors of commsgd/compress\n"
         "  --schemes A,B,..  experiment: the schemes to compare (default: every family, families.hpp)\n"
         "  --ranks N         data-parallel ranks (threads on comm::local; default 4)\n"
         "  --comm local|mpi  transport (mpi: run under mpiexec, ranks = processes)\n"
         "  --gbps G          modelled link bandwidth in Gbit/s, switched (default 1; comm::simulated)\n"
         "  --gbps-alt G      second bandwidth reported from the same link loads (default 10)\n"
         "  --alpha-us A      modelled per-message latency in microseconds (default 50)\n"
         "  --epochs E  --batch B  --lr L  --seed S  --evals-per-epoch K\n"
         "  --subset M        training images used (default all)   --test-subset T\n"
         "  --target ACC      target test accuracy for time-to-target (default 0.80)\n"
         "  --min-accuracy A  exit 1 when the final accuracy is below A\n"
         "  --csv PATH        curve CSV (train)   --out DIR  experiment output directory\n"
         "  --dump-gradient PATH  raw float32 gradient of a mid-training step (for bench/select_bench)\n"
         "  --dump-accumulators DIR  (topk schemes) rank 0's accumulators g + e of the steps below, raw\n"
         "                    float32 with DIR/manifest.txt (for select_bench sequence)\n"
         "  --dump-steps F:C  the C consecutive steps from step F (0-based; default 0:16)\n"
         "  --hidden W1,W2,.. hidden layer widths (default 256,128; 4096,4096 has about 20M parameters)\n"
         "  --clock thread|steady  compute time per rank: thread CPU time (default) or wall time\n"
         "  --data DIR        Fashion-MNIST IDX files (default $COMMSGD_FASHION_MNIST or "
         "/usr/share/datasets/fashion-mnist)\n";
  std::exit(2);
}

cli parse(int argc, char** argv) {
  cli c;
  int i = 1;
  if (i < argc && argv[i][0] != '-') c.mode = argv[i++];
  if (c.mode != "train" && c.mode != "experiment") usage("unknown mode '" + c.mode + "'");
  if (c.mode == "experiment") {
    // Small enough for a few minutes on two cores, large enough that the schemes separate: 10 nodes as in
    // the CSSGD paper, 10,000 training images, 2 epochs; every flag below can still override these.
    c.train.ranks = 10;
    c.subset = 10000;
    c.test_subset = 2000;
    c.train.epochs = 2;
    c.train.batch = 100;
    c.train.target = 0.75;
    c.train.evals_per_epoch = 10;
  }
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("option " + a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--scheme")
        c.train.scheme = value();
      else if (a == "--schemes") {
        c.schemes.clear();
        std::stringstream in(value());
        std::string item;
        while (std::getline(in, item, ','))
          if (!item.empty()) c.schemes.push_back(item);
      } else if (a == "--ranks")
        c.train.ranks = std::stoi(value());
      else if (a == "--comm")
        c.comm = value();
      else if (a == "--gbps")
        c.train.network.gbit_per_s = std::stod(value());
      else if (a == "--gbps-alt")
        c.train.network.alt_gbit_per_s = std::stod(value());
      else if (a == "--alpha-us")
        c.train.network.alpha_s = std::stod(value()) * 1e-6;
      else if (a == "--epochs")
        c.train.epochs = std::stoi(value());
      else if (a == "--batch")
        c.train.batch = std::stoul(value());
      else if (a == "--lr")
        c.train.lr = std::stof(value());
      else if (a == "--seed")
        c.train.seed = std::stoull(value());
      else if (a == "--evals-per-epoch")
        c.train.evals_per_epoch = std::stoi(value());
      else if (a == "--subset")
        c.subset = std::stoul(value());
      else if (a == "--test-subset")
        c.test_subset = std::stoul(value());
      else if (a == "--target")
        c.train.target = std::stod(value());
      else if (a == "--min-accuracy")
        c.min_accuracy = std::stod(value());
      else if (a == "--csv")
        c.csv = value();
      else if (a == "--out")
        c.out = value();
      else if (a == "--dump-gradient")
        c.train.dump_gradient = value();
      else if (a == "--dump-accumulators")
        c.train.dump_accumulators = value();
      else if (a == "--dump-steps") {
        const std::string v = value();
        const auto colon = v.find(':');
        if (colon == std::string::npos) usage("--dump-steps needs FIRST:COUNT, got '" + v + "'");
        c.train.dump_first = std::stoul(v.substr(0, colon));
        c.train.dump_count = std::stoul(v.substr(colon + 1));
      } else if (a == "--hidden") {
        c.train.hidden.clear();
        std::stringstream in(value());
        std::string item;
        while (std::getline(in, item, ','))
          c.train.hidden.push_back(std::stoi(item));
      } else if (a == "--clock")
        c.train.wall_clock = value() == "steady";
      else if (a == "--data")
        c.data = value();
      else if (a == "--no-fit")
        c.train.fit = false;
      else if (a == "--help" || a == "-h")
        usage("help");
      else
        usage("unknown option '" + a + "'");
    } catch (const std::logic_error&) {
      usage("option " + a + " has a malformed value '" + argv[i] + "'");
    }
  }
  if (c.train.ranks < 1 || c.train.ranks > 64) usage("--ranks must be in [1, 64]");
  if (c.train.epochs < 1) usage("--epochs must be at least 1");
  if (c.train.hidden.empty() ||
      std::any_of(c.train.hidden.begin(), c.train.hidden.end(), [](int w) { return w < 1 || w > 65536; }))
    usage("--hidden must list widths in [1, 65536]");
  if (!c.train.dump_accumulators.empty() && c.train.dump_count == 0) c.train.dump_count = 16;
  if (!(c.train.network.gbit_per_s > 0) || !(c.train.network.alt_gbit_per_s > 0))
    usage("--gbps and --gbps-alt must be positive");
  if (!(c.train.network.alpha_s >= 0)) usage("--alpha-us must not be negative");
  return c;
}

void write_curve_header(std::ostream& f) {
  f << "scheme,ranks,gbps,epoch,step,sim_time_s,compute_s,comm_s,bytes_sent_per_node,bytes_received_per_node,"
       "test_accuracy,train_loss,laplace_b,gauss_sd,w1_laplace,w1_gauss,zero_fraction,gbps_alt,sim_time_alt_"
       "s\n";
}

void write_curve(std::ostream& f, const fmnist::train_result& r, const fmnist::train_options& o, int ranks) {
  for (const auto& p : r.curve)
    f << r.scheme << ',' << ranks << ',' << o.network.gbit_per_s << ',' << p.epoch << ',' << p.step << ','
      << p.sim_time << ',' << p.compute << ',' << p.comm << ',' << p.bytes_sent << ',' << p.bytes_received
      << ',' << p.accuracy << ',' << p.loss << ',' << p.fit.laplace.b << ',' << p.fit.gaussian.stddev << ','
      << p.fit.w1_laplace << ',' << p.fit.w1_gaussian << ',' << p.zero_fraction << ','
      << o.network.alt_gbit_per_s << ',' << p.sim_time_alt << '\n';
}

// Runs one training with the chosen transport; returns rank 0's result (other MPI ranks get an empty one).
fmnist::train_result run_one(const cli& c, const fmnist::train_options& o, const fmnist::dataset& train,
                             const fmnist::dataset& test, int& ranks_out) {
  fmnist::train_result res;
  if (c.comm == "local") {
    commsgd::comm::local_group{o.ranks}.run([&](commsgd::comm::local& comm) {
      fmnist::train_rank(comm, o, train, test, comm.rank() == 0 ? &res : nullptr);
    });
    ranks_out = o.ranks;
    return res;
  }
#if defined(FMNIST_HAS_MPI)
  if (c.comm == "mpi") {
    auto comm = commsgd::comm::mpi::world();
    ranks_out = comm.size();
    const bool root = comm.rank() == 0;
    fmnist::train_rank(std::move(comm), o, train, test, root ? &res : nullptr);
    return res;
  }
#endif
  usage("--comm '" + c.comm + "' is not available in this build");
}

int experiment(cli& c, const fmnist::dataset& train, const fmnist::dataset& test) {
  namespace fs = std::filesystem;
  fs::create_directories(c.out);
  const auto schemes = c.schemes.empty() ? fmnist::default_schemes() : c.schemes;
  std::ofstream curves(fs::path(c.out) / "curves.csv");
  write_curve_header(curves);
  std::vector<fmnist::train_result> results;
  int ranks = c.train.ranks;
  const auto wall0 = std::chrono::steady_clock::now();
  const std::clock_t cpu0 = std::clock();
  for (std::size_t i = 0; i < schemes.size(); ++i) {
    auto o = c.train;
    o.scheme = schemes[i];
    // One real gradient for the selection benchmarks, from the first (plain SSGD) run.
    o.dump_gradient = i == 0 ? (fs::path(c.out) / "gradient.f32").string() : "";
    const auto w = std::chrono::steady_clock::now();
    const std::clock_t t = std::clock();
    results.push_back(run_one(c, o, train, test, ranks));
    results.back().run_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w).count();
    results.back().run_cpu_s = static_cast<double>(std::clock() - t) / CLOCKS_PER_SEC;
    write_curve(curves, results.back(), o, ranks);
    curves.flush();
  }
  curves.close();

  fmnist::run_info info{c.train, ranks, train.count, test.count, 0, 0};
  info.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  info.cpu_s = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
  const auto first_run = results.empty() ? fmnist::train_result{} : results.front();
  fmnist::sort_by_family(results);
  const auto panels = fmnist::make_panels(results);
  fmnist::write_panels((fs::path(c.out) / "panels.txt").string(), panels);
  fmnist::write_summary((fs::path(c.out) / "summary.csv").string(), results, info);

  std::printf("\n");
  fmnist::print_settings(stdout, info);
  std::printf("\n");
  fmnist::print_table(stdout, results, info);
  std::printf("\nbest of each family:\n\n");
  fmnist::print_best(stdout, results, panels.back(), info);
  std::printf("\nsource claims, time to %.2f test accuracy (A vs B = A's time over B's):\n", c.train.target);
  fmnist::print_claims(stdout, results, c.train);

  // Gradient shape over training, from the first scheme's run.
  if (!first_run.curve.empty()) {
    std::printf(
        "\nrank 0 gradient vs its fits over training (%s): step, Laplace b, W1 Laplace, W1 Gauss, zeros\n",
        first_run.scheme.c_str());
    for (const auto& p : first_run.curve)
      std::printf("  %6zu  %.3e  %.3e  %.3e  %.3f\n", p.step, p.fit.laplace.b, p.fit.w1_laplace,
                  p.fit.w1_gaussian, p.zero_fraction);
  }
  std::printf("\nthe experiment took %.1f s wall, %.1f s CPU (user + sys, all threads)\n", info.wall_s,
              info.cpu_s);
  fmnist::write_results_md((fs::path(c.out) / "RESULTS.md").string(), results, panels, info);
  std::printf("wrote %s/curves.csv, summary.csv, panels.txt, RESULTS.md, gradient.f32 (COMMSGD_REAL_GRADIENT "
              "for bench/select_bench)\n",
              c.out.c_str());

  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    std::printf("gnuplot not found: skipping the PNG plots\n");
    return 0;
  }
  const std::string script = FMNIST_PLOT_SCRIPT;
  const std::string cmd =
      "gnuplot -e \"dir='" + c.out + "'; target=" + std::to_string(c.train.target) + "\" '" + script + "'";
  if (std::system(cmd.c_str()) != 0)
    std::printf("gnuplot failed on %s: no plots\n", script.c_str());
  else
    std::printf("wrote %s/accuracy_vs_time.png and %s/bytes_per_scheme.png\n", c.out.c_str(), c.out.c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  auto c = parse(argc, argv);
#if defined(FMNIST_HAS_MPI)
  // MPI is started only when asked for, so the threads build runs where no MPI launcher is set up.
  std::unique_ptr<boost::mpi::environment> mpi_env;
  if (c.comm == "mpi") mpi_env = std::make_unique<boost::mpi::environment>(argc, argv);
#endif
  try {
    const auto train = fmnist::load_set(c.data, "train", c.subset);
    const auto test = fmnist::load_set(c.data, "t10k", c.test_subset);
    if (c.mode == "experiment") return experiment(c, train, test);

    int ranks = c.train.ranks;
    const auto res = run_one(c, c.train, train, test, ranks);
    if (res.curve.empty()) return 0; // not rank 0 of an MPI run
    if (!c.csv.empty()) {
      std::ofstream f(c.csv);
      write_curve_header(f);
      write_curve(f, res, c.train, ranks);
    }
    const double acc = res.curve.back().accuracy;
    if (res.time_to_target >= 0)
      std::printf("reached %.2f after %.3f s of modelled cluster time\n", c.train.target, res.time_to_target);
    if (acc < c.min_accuracy) {
      std::fprintf(stderr, "fashion_mnist: final accuracy %.4f is below --min-accuracy %.4f\n", acc,
                   c.min_accuracy);
      return 1;
    }
    return 0;
  } catch (const commsgd::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
