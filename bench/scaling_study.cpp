// The scaling study: how the dense ring all-reduce, the all-gather top-k exchange (sparsify/sparse_exchange.hpp),
// the sparse all-reduce (sparsify/allreduce.hpp) and a rank-2 PowerSGD move bytes and time as the number of
// nodes grows.
//
//   measured  n = 8 ... 256 ranks as threads of comm::local, d = 2^20, densities 1e-4, 1e-3, 1e-2: each rank
//             runs top_k (exact selection, error feedback) on its own gradient for `steps` steps and sums
//             through the exchange under comm::metered<comm::simulated<>>; the per-node link load of every
//             step gives bytes and, on the simulated network model, seconds at 1 and 10 Gbit/s. Gradients
//             are g_r = c + x_r, c shared and x_r per rank, both heavy-tailed (a product of two
//             exponentials with a random sign and 12 % exact zeros), so ranks overlap as data-parallel
//             replicas do. Reported: the busiest node's received bytes and seconds, averaged over the
//             steps after the first (whose region boundaries are still even).
//   model     cost/ alone, n = 8 ... 1024, d = 2^20, 2^24, 2^26: every rank sends k = ceil(density d)
//             pairs; the sparse all-reduce is in its balanced form with the threshold refreshed every 8
//             steps (the histogram amortised); the all-gather exchange takes its dense fallback where its
//             rule says so; PowerSGD rank 2 treats the gradient as one square sqrt(d) x sqrt(d) matrix
//             and all-reduces P and Q by ring (2 r sqrt(d) floats per step).
// Network: comm::network_model, alpha = 50 us per message, 125e6 or 1.25e9 bytes/s, switched.
//
//   scaling_study [--max-n N] [--steps S] [--csv FILE]     (defaults 256, 4, no CSV)
// prints markdown tables and the goal check; --csv writes the model rows for bench/scaling_plot.gp.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/cost/sparse.hpp>
#include <commsgd/cost/sparse_allreduce.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/sparsify/allreduce.hpp>
#include <commsgd/sparsify/sparse_exchange.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace sp = commsgd::sparsify;
namespace sel = commsgd::select;
namespace cm = commsgd::comm;
namespace cost = commsgd::cost;

const cm::network_model gbit1{50e-6, 125e6};
const cm::network_model gbit10{50e-6, 1.25e9};

std::uint64_t k_of(double density, std::uint64_t d) {
  return static_cast<std::uint64_t>(std::ceil(density * static_cast<double>(d)));
}

// ---- model ----

struct figures {
  double rx_bytes = 0, s1 = 0, s10 = 0;
};

figures of(const cm::traffic& l) {
  return {static_cast<double>(l.bytes_received), cm::busy_seconds(l, gbit1), cm::busy_seconds(l, gbit10)};
}

figures dense_model(int n, std::uint64_t d) {
  return of(cm::load::all_reduce(d, sizeof(float), n, 0));
}

figures gather_model(int n, std::uint64_t d, std::uint64_t k) {
  const std::vector<std::uint64_t> counts(static_cast<std::size_t>(n), k);
  return of(cost::sparse_gather_balanced_load(n, d, k, cost::sparse_prefers_dense(counts, d)));
}

figures allreduce_model(int n, std::uint64_t d, std::uint64_t k, std::uint64_t refresh = 8) {
  const std::vector<std::uint64_t> counts(static_cast<std::size_t>(n), k);
  if (cost::sparse_allreduce_prefers_dense(counts, d, k)) {
    auto l = cost::allreduce_header_load(n);
    l += cm::load::all_reduce(d, sizeof(float), n, 0);
    return of(l);
  }
  const auto fresh = cost::sparse_allreduce_balanced_load(n, d, k, k, true);
  const auto reuse = cost::sparse_allreduce_balanced_load(n, d, k, k, false);
  const double t = static_cast<double>(refresh);
  return {(static_cast<double>(fresh.bytes_received) + (t - 1) * static_cast<double>(reuse.bytes_received)) /
              t,
          cost::sparse_allreduce_balanced_seconds(n, d, k, k, refresh, gbit1),
          cost::sparse_allreduce_balanced_seconds(n, d, k, k, refresh, gbit10)};
}

figures powersgd_model(int n, std::uint64_t d, int rank = 2) {
  const auto side = static_cast<std::uint64_t>(std::llround(std::sqrt(static_cast<double>(d))));
  auto l = cm::load::all_reduce(static_cast<std::uint64_t>(rank) * side, sizeof(float), n, 0);
  l += cm::load::all_reduce(static_cast<std::uint64_t>(rank) * side, sizeof(float), n, 0);
  return of(l);
}

// ---- measured ----

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Heavy-tailed: 12 % exact zeros, else a random sign times a product of two unit exponentials, times 1e-3.
float heavy(std::uint64_t h) {
  if ((h & 0xff) < 31) return 0.0f;
  const double u1 = (static_cast<double>((h >> 8) & 0xffffff) + 0.5) / 16777216.0;
  const double u2 = (static_cast<double>((h >> 32) & 0xffffff) + 0.5) / 16777216.0;
  const double m = std::log(u1) * std::log(u2) * 1e-3;
  return static_cast<float>((h >> 63) ? -m : m);
}

void fill_gradient(std::vector<float>& g, const std::vector<float>& common, int rank, int step) {
  const std::uint64_t salt =
      mix(static_cast<std::uint64_t>(rank) * 1000003ull + static_cast<std::uint64_t>(step));
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = common[i] + heavy(mix(salt ^ i));
}

struct measured {
  double rx_max = 0, rx_mean = 0, s1 = 0, s10 = 0; // busiest node, averaged over the counted steps
  double applied = 0, returned_share = 0;          // selected pairs per step; share of sent pairs returned
  bool dense = false;
};

template <bool AllReduce>
measured run_measured(int n, std::uint64_t d, double density, int steps, const std::vector<float>& common) {
  const auto un = static_cast<std::size_t>(n);
  const std::uint64_t k = k_of(density, d);
  // [step][rank]
  std::vector<std::vector<cm::traffic>> loads(static_cast<std::size_t>(steps), std::vector<cm::traffic>(un));
  std::vector<std::vector<double>> applied(static_cast<std::size_t>(steps), std::vector<double>(un)),
      returned(static_cast<std::size_t>(steps), std::vector<double>(un));
  std::vector<char> dense(un, 0);
  cm::local_group(n).run([&](cm::local& base) {
    cm::metered<cm::simulated<cm::local>> c(cm::simulated<cm::local>(base, gbit1));
    sp::top_k<sel::exact> s(d, {.k = k});
    std::vector<float> g(d), out(d);
    const auto r = static_cast<std::size_t>(base.rank());
    sp::allreducer<> ar;
    sp::exchanger<> ag;
    for (int t = 0; t < steps; ++t) {
      const auto tt = static_cast<std::size_t>(t);
      fill_gradient(g, common, base.rank(), t);
      const auto msg = s.step(g);
      c.inner().reset();
      if constexpr (AllReduce) {
        const auto& rep = ar.sum(c, msg, k, out);
        s.restore_unsent(ar.returned_indices(), ar.returned_values());
        applied[tt][r] = static_cast<double>(rep.selected_total);
        returned[tt][r] =
            static_cast<double>(rep.returned) / static_cast<double>(std::max<std::size_t>(msg.size(), 1));
        dense[r] = rep.dense;
      } else {
        const auto rep = ag.sum(c, msg, out);
        applied[tt][r] = static_cast<double>(rep.total);
        dense[r] = rep.dense;
      }
      loads[tt][r] = c.inner().load();
    }
  });
  measured m;
  const int first = steps > 1 ? 1 : 0;
  for (int t = first; t < steps; ++t) {
    const auto tt = static_cast<std::size_t>(t);
    double rx_max = 0, rx_sum = 0, s1 = 0, s10 = 0, ret = 0;
    for (std::size_t r = 0; r < un; ++r) {
      const auto& l = loads[tt][r];
      rx_max = std::max(rx_max, static_cast<double>(l.bytes_received));
      rx_sum += static_cast<double>(l.bytes_received);
      s1 = std::max(s1, cm::busy_seconds(l, gbit1));
      s10 = std::max(s10, cm::busy_seconds(l, gbit10));
      ret += returned[tt][r];
    }
    m.rx_max += rx_max;
    m.rx_mean += rx_sum / static_cast<double>(un);
    m.s1 += s1;
    m.s10 += s10;
    m.applied += applied[tt][0];
    m.returned_share += ret / static_cast<double>(un);
  }
  const double counted = steps - first;
  m.rx_max /= counted;
  m.rx_mean /= counted;
  m.s1 /= counted;
  m.s10 /= counted;
  m.applied /= counted;
  m.returned_share /= counted;
  m.dense = dense[0] != 0;
  return m;
}

std::string kb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", bytes / 1024.0);
  return b;
}
std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 0.01 ? "%.3f" : "%.2f", s * 1e3);
  return b;
}
std::string num(double x, const char* f = "%.2f") {
  char b[32];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

} // namespace

int main(int argc, char** argv) {
  int max_n = 256, steps = 4;
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--max-n" && i + 1 < argc)
      max_n = std::atoi(argv[++i]);
    else if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--csv" && i + 1 < argc)
      csv = argv[++i];
    else {
      std::fprintf(stderr, "usage: scaling_study [--max-n N] [--steps S] [--csv FILE]\n");
      return 2;
    }
  }
  const double densities[] = {1e-4, 1e-3, 1e-2};

  // ---- model ----
  std::printf("## Model (cost/ alone): per node per exchange, received KiB and ms at 1 / 10 Gbit/s\n\n");
  std::printf("alpha = 50 us; sparse all-reduce in its balanced form, threshold refreshed every 8 steps; the "
              "all-gather exchange falls back to the dense ring where its rule says so; PowerSGD rank 2 on "
              "one sqrt(d) x sqrt(d) matrix.\n\n");
  std::FILE* out = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
  if (out)
    std::fprintf(out, "d,density,n,dense_kib,gather_kib,allreduce_kib,powersgd_kib,dense_ms1,gather_ms1,"
                      "allreduce_ms1,powersgd_ms1,dense_ms10,gather_ms10,allreduce_ms10,powersgd_ms10\n");
  for (std::uint64_t d : {std::uint64_t{1} << 20, std::uint64_t{1} << 24, std::uint64_t{1} << 26}) {
    std::printf("### d = 2^%d\n\n", static_cast<int>(std::log2(static_cast<double>(d))));
    std::printf(
        "| density | n | dense ring KiB | all-gather KiB | sparse all-reduce KiB | PowerSGD r=2 KiB | "
        "ms @1G: dense / all-gather / sparse AR / PowerSGD | ms @10G: dense / all-gather / sparse AR / "
        "PowerSGD |\n|---|---|---|---|---|---|---|---|\n");
    for (double density : densities)
      for (int n = 8; n <= 1024; n *= 2) {
        const auto k = k_of(density, d);
        const auto a = dense_model(n, d), b = gather_model(n, d, k), c = allreduce_model(n, d, k),
                   p = powersgd_model(n, d);
        std::printf("| %g | %d | %s | %s | %s | %s | %s / %s / %s / %s | %s / %s / %s / %s |\n", density, n,
                    kb(a.rx_bytes).c_str(), kb(b.rx_bytes).c_str(), kb(c.rx_bytes).c_str(),
                    kb(p.rx_bytes).c_str(), ms(a.s1).c_str(), ms(b.s1).c_str(), ms(c.s1).c_str(),
                    ms(p.s1).c_str(), ms(a.s10).c_str(), ms(b.s10).c_str(), ms(c.s10).c_str(),
                    ms(p.s10).c_str());
        if (out)
          std::fprintf(out, "%llu,%g,%d,%.3f,%.3f,%.3f,%.3f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f\n",
                       static_cast<unsigned long long>(d), density, n, a.rx_bytes / 1024, b.rx_bytes / 1024,
                       c.rx_bytes / 1024, p.rx_bytes / 1024, a.s1 * 1e3, b.s1 * 1e3, c.s1 * 1e3, p.s1 * 1e3,
                       a.s10 * 1e3, b.s10 * 1e3, c.s10 * 1e3, p.s10 * 1e3);
      }
    std::printf("\n");
  }
  if (out) std::fclose(out);

  // ---- goals ----
  {
    const std::uint64_t d = std::uint64_t{1} << 24;
    const auto k = k_of(1e-3, d);
    const auto g = gather_model(256, d, k), c = allreduce_model(256, d, k), a = dense_model(256, d);
    const auto g8 = gather_model(8, d, k), c8 = allreduce_model(8, d, k);
    std::printf("## Goals (model, d = 2^24, density 1e-3, 1 Gbit/s, k = %llu)\n\n",
                static_cast<unsigned long long>(k));
    std::printf("| goal | figure | met |\n|---|---|---|\n");
    const double in_k = c.rx_bytes / (8.0 * static_cast<double>(k));
    std::printf("| n=256: a node receives <= 6k pairs | %s k pairs | %s |\n", num(in_k).c_str(),
                in_k <= 6 ? "yes" : "no");
    std::printf("| n=256: >= 10x fewer bytes than all-gather | %sx | %s |\n",
                num(g.rx_bytes / c.rx_bytes, "%.1f").c_str(), g.rx_bytes / c.rx_bytes >= 10 ? "yes" : "no");
    std::printf("| n=256: >= 5x faster than all-gather | %sx | %s |\n", num(g.s1 / c.s1, "%.1f").c_str(),
                g.s1 / c.s1 >= 5 ? "yes" : "no");
    std::printf("| n=256: >= 20x faster than the dense ring | %sx | %s |\n", num(a.s1 / c.s1, "%.1f").c_str(),
                a.s1 / c.s1 >= 20 ? "yes" : "no");
    std::printf("| n=8: <= 1.2x the all-gather's time | %sx | %s |\n\n", num(c8.s1 / g8.s1).c_str(),
                c8.s1 / g8.s1 <= 1.2 ? "yes" : "no");
  }

  // ---- measured ----
  const std::uint64_t d = std::uint64_t{1} << 20;
  std::vector<float> common(d);
  for (std::size_t i = 0; i < d; ++i)
    common[i] = heavy(mix(0x5eedull ^ (i * 0x100000001b3ull)));
  std::printf("## Measured on comm::simulated over threads, d = 2^20, %d steps (the first not counted)\n\n",
              steps);
  std::printf(
      "Busiest node per exchange: received KiB, ms at 1 / 10 Gbit/s. 'balance' is the busiest node's "
      "received bytes over the mean; 'applied' the pairs summed per step (all-gather: all sent; "
      "sparse all-reduce: the global selection, K = k); 'returned' the share of a rank's pairs handed "
      "back to its residual.\n\n");
  std::printf(
      "| density | n | k | dense ring KiB (model) | all-gather KiB | sparse AR KiB | balance | ms @1G: "
      "dense / all-gather / sparse AR | ms @10G: dense / all-gather / sparse AR | applied: all-gather / "
      "sparse AR | returned |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (double density : densities)
    for (int n = 8; n <= max_n; n *= 2) {
      const auto k = k_of(density, d);
      const auto a = dense_model(n, d);
      const auto g = run_measured<false>(n, d, density, steps, common);
      const auto c = run_measured<true>(n, d, density, steps, common);
      std::printf(
          "| %g | %d | %llu | %s | %s%s | %s%s | %s | %s / %s / %s | %s / %s / %s | %.0f / %.0f | %s |\n",
          density, n, static_cast<unsigned long long>(k), kb(a.rx_bytes).c_str(), kb(g.rx_max).c_str(),
          g.dense ? " (dense)" : "", kb(c.rx_max).c_str(), c.dense ? " (dense)" : "",
          num(c.rx_max / std::max(c.rx_mean, 1.0)).c_str(), ms(a.s1).c_str(), ms(g.s1).c_str(),
          ms(c.s1).c_str(), ms(a.s10).c_str(), ms(g.s10).c_str(), ms(c.s10).c_str(), g.applied, c.applied,
          num(c.returned_share, "%.3f").c_str());
      std::fflush(stdout);
    }
  return 0;
}
