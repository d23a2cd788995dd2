// What `experiment` reports: the table grouped by family, each family's best, the source papers' claims
// recomputed from the run, summary.csv and RESULTS.md. RESULTS.md carries the same table and claims as the
// terminal, so the copy kept in the repository is what a run wrote, not a transcription.
#pragma once

#include "families.hpp"
#include "trainer.hpp"

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace fmnist {

struct run_info {
  train_options o;
  int ranks = 0;
  std::size_t train_images = 0, test_images = 0;
  double wall_s = 0, cpu_s = 0; // the whole experiment on this machine (CPU: every thread, user + sys)
};

inline void print_settings(std::FILE* f, const run_info& r) {
  std::fprintf(
      f,
      "%d ranks, switched network simulated by comm::simulated: %.3g Gbit/s (and %.3g Gbit/s from "
      "the same link loads), alpha %.0f us; %zu training images, %zu test images, %d epoch(s), batch "
      "%zu, lr %.3g, target %.2f\n"
      "time = measured compute (thread CPU time, slowest rank per step) + simulated communication\n",
      r.ranks, r.o.network.gbit_per_s, r.o.network.alt_gbit_per_s, r.o.network.alpha_s * 1e6, r.train_images,
      r.test_images, r.o.epochs, r.o.batch, static_cast<double>(r.o.lr), r.o.target);
}

inline std::string seconds_or_not(double s) {
  if (s < 0) return "not reached";
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", s);
  return b;
}

inline void print_table(std::FILE* f, const std::vector<train_result>& results, const run_info& r) {
  std::fprintf(
      f,
      "| family | scheme | time to %.2f (s) | at %.3g Gbit/s (s) | total time (s) | compute (s) | comm "
      "(s) | MB sent/node | MB recv/node | final accuracy |\n|---|---|---|---|---|---|---|---|---|---|\n",
      r.o.target, r.o.network.alt_gbit_per_s);
  for (const auto& x : results) {
    if (x.curve.empty()) continue;
    const auto& last = x.curve.back();
    std::fprintf(f, "| %s | %s | %s | %s | %.3f | %.3f | %.3f | %.2f | %.2f | %.4f |\n",
                 family_name(x.scheme).c_str(), x.scheme.c_str(), seconds_or_not(x.time_to_target).c_str(),
                 seconds_or_not(x.time_to_target_alt).c_str(), last.sim_time, last.compute, last.comm,
                 last.bytes_sent / 1e6, last.bytes_received / 1e6, last.accuracy);
  }
}

// The last panel lists each family's best, in family order.
inline void print_best(std::FILE* f, const std::vector<train_result>& results, const panel& best,
                       const run_info& r) {
  std::fprintf(
      f,
      "| family | best scheme | time to %.2f (s) | at %.3g Gbit/s (s) | MB sent/node | final accuracy "
      "|\n|---|---|---|---|---|---|\n",
      r.o.target, r.o.network.alt_gbit_per_s);
  for (const auto& name : best.schemes)
    for (const auto& x : results)
      if (x.scheme == name)
        std::fprintf(f, "| %s | %s | %s | %s | %.2f | %.4f |\n", family_name(name).c_str(), name.c_str(),
                     seconds_or_not(x.time_to_target).c_str(), seconds_or_not(x.time_to_target_alt).c_str(),
                     x.curve.back().bytes_sent / 1e6, x.curve.back().accuracy);
}

// The source papers' headline figures, recomputed from this run's time to target; a comparison whose schemes
// did not both run is left out, one that ran but missed the target says so.
inline void print_claims(std::FILE* f, const std::vector<train_result>& results, const train_options& o) {
  auto find = [&](const std::string& name) -> const train_result* {
    for (const auto& r : results)
      if (r.scheme == name) return &r;
    return nullptr;
  };
  auto show = [&](const char* what, const std::string& a, const std::string& b, const char* claim) {
    const auto *x = find(a), *y = find(b);
    if (!x || !y) return;
    std::fprintf(f, "%-52s", what);
    for (int k = 0; k < 2; ++k) {
      const double tx = k == 0 ? x->time_to_target : x->time_to_target_alt;
      const double ty = k == 0 ? y->time_to_target : y->time_to_target_alt;
      const double gbps = k == 0 ? o.network.gbit_per_s : o.network.alt_gbit_per_s;
      if (tx > 0 && ty > 0)
        std::fprintf(f, " %3.3g Gbit/s: %7.3f s vs %6.3f s = %6.3fx;", gbps, tx, ty, tx / ty);
      else
        std::fprintf(f, " %3.3g Gbit/s: n/a (short of the target);", gbps);
    }
    std::fprintf(f, "  paper: %s\n", claim);
  };
  for (const char* c : {"cssgd:2:xor", "cssgd:3:xor", "cssgd:2:int32"}) {
    show((std::string("(a) ") + c + " vs ring").c_str(), c, "ring", "-53.97 % vs SSGD");
    show((std::string("(a) ") + c + " vs allgather (paper's SSGD)").c_str(), c, "allgather",
         "-53.97 % vs SSGD");
    show((std::string("(a) ") + c + " vs asgd").c_str(), c, "asgd", "-26.89 % vs ASGD");
  }
  for (const char* d : {"0.001", "0.01"}) {
    const std::string lap = std::string("topk:laplace_bisect:") + d;
    show(("(b) radix vs laplace_bisect, density " + std::string(d)).c_str(), std::string("topk:radix:") + d,
         lap, "radixSelect takes 1.62x Laplace's time");
    show(("(b) hierarchical vs laplace_bisect, density " + std::string(d)).c_str(),
         std::string("topk:hierarchical:") + d, lap, "hierarchical takes 1.30x Laplace's time");
  }
  show("(c) local_adaptive:8:0.02 vs ring", "local_adaptive:8:0.02", "ring", "faster than SSGD");
  show("(c) local_adaptive:8:0.02 vs local:4", "local_adaptive:8:0.02", "local:4", "faster than local SGD");
  show("(-) partitioned vs ring", "partitioned", "ring", "overlap hides communication");
}

inline void write_summary(const std::string& path, const std::vector<train_result>& results,
                          const run_info& r) {
  std::ofstream s(path);
  s << "scheme,ranks,gbps,time_to_target_s,sim_time_s,compute_s,comm_s,bytes_sent_per_node,"
       "bytes_received_per_node,final_accuracy,gbps_alt,time_to_target_alt_s,sim_time_alt_s,family_index,"
       "family,run_wall_s,run_cpu_s\n";
  for (const auto& x : results) {
    if (x.curve.empty()) continue;
    const auto& last = x.curve.back();
    s << x.scheme << ',' << r.ranks << ',' << r.o.network.gbit_per_s << ',' << x.time_to_target << ','
      << last.sim_time << ',' << last.compute << ',' << last.comm << ',' << last.bytes_sent << ','
      << last.bytes_received << ',' << last.accuracy << ',' << r.o.network.alt_gbit_per_s << ','
      << x.time_to_target_alt << ',' << last.sim_time_alt << ',' << family_index(x.scheme) + 1 << ','
      << family_name(x.scheme) << ',' << x.run_wall_s << ',' << x.run_cpu_s << '\n';
  }
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

inline void write_results_md(const std::string& path, const std::vector<train_result>& results,
                             const std::vector<panel>& panels, const run_info& r) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return;
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::fprintf(
      f,
      "# Fashion-MNIST experiment: results\n\n"
      "Written by `fashion_mnist experiment` (`bash scripts/demo.sh`) on %s: %u hardware threads (%s). "
      "The whole experiment took %.0f s of wall time and %.0f s of CPU time (user + sys, every "
      "thread).\n\n",
      date, std::thread::hardware_concurrency(), cpu_model().c_str(), r.wall_s, r.cpu_s);
  print_settings(f, r);
  std::fprintf(f,
               "\nOne panel per family; ring SSGD is the grey dashed reference in each, the dotted line the "
               "target. The last panel puts the best of each family together.\n\n"
               "![test accuracy against modelled time, one panel per family](accuracy_vs_time.png)\n\n"
               "![traffic per node, one bar per scheme](bytes_per_scheme.png)\n\n"
               "## Best of each family\n\n");
  print_best(f, results, panels.back(), r);
  std::fprintf(f, "\n## Every run\n\n");
  print_table(f, results, r);
  std::fprintf(f, "\n## Source claims against this run\n\nA vs B: A's time to %.2f over B's.\n\n```\n",
               r.o.target);
  print_claims(f, results, r.o);
  std::fprintf(f, "```\n");
  std::fclose(f);
}

} // namespace fmnist
