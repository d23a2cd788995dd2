// The whole top-k error-feedback step in steady state on raw gradients: every step gets a gradient drawn
// fresh on the device (bench_common.cuh: relu_like noise on a fixed per-coordinate scale with a sparse set
// of large coordinates, and a slowly drifting overall scale, so consecutive steps are correlated as in
// training). The drawing is outside the timed region (before the first CUDA event of the step). Each row
// runs `--steps` steps on a fresh object; the first `--warmup` are not timed; the table gives the median and
// the p90 of the timed steps.
//
// Rows (same gradients for all):
//   floor_f32 / floor_bf16   read g, read e, write e: the least memory traffic of any step (12 N / 10 N bytes)
//   copy                     cudaMemcpyAsync of N floats (8 N bytes), the device's copy rate
//   top_k_laplace            cuda::top_k<laplace_bisect> (default options: tol 1 %, warm start), the old step
//                            with its one host synchronisation per step; approximate: k <= count <= 1.01 k
//   top_k_radix              cuda::top_k<radix>: exact, host synchronisation per step
//   batched_f32              cuda::batched_top_k<float>, one tensor: exact, no host synchronisation
//   batched_bf16             cuda::batched_top_k<__nv_bfloat16>, the gradient in bf16
// Checks: every step's message count (top_k: k, or in [k, ceil(1.01 k)] for laplace; batched: total_k by
// construction, and no refused or broken step by report() / check_refused()); after the timed steps one more
// step is checked for conservation (sent + new residual == old residual + gradient, summed, within the
// rounding of p = g + e) and for the sent set being the largest |p| (every sent |value| >= every |residual|,
// the residual +0 at every sent index).
//
//   gpu_bench step [--out PREFIX] [--steps 100] [--warmup 20] [--cases 24:1e-3,26:1e-3,24:1e-2]
//                  [--only m1,m2] [--profile-steps S] [--quick]
// --profile-steps S: for Nsight Compute (bench/gpu/profile.sh): 5 unprofiled steps, then S steps inside
// cudaProfilerStart/Stop (the gradient drawing outside it); no checks, no JSON.
#include "bench_common.cuh"

#include <cuda_profiler_api.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>

namespace step_bench {

namespace {

using namespace bench;

struct test_case {
  int log_n;
  double density;
};

struct row {
  std::string method, grad;
  u64 n = 0, k = 0;
  double density = 0;
  int steps = 0, timed = 0;
  std::vector<double> ms;
  double median_ms = 0, p90_ms = 0, min_ms = 0;
  u64 min_count = ~0ull, max_count = 0;
  bool counts_ok = true;
  std::optional<bool> conservation_ok, top_ok;
  conservation cons;
  // batched only: steps served from the candidates (fast) or reading the tensor again (full)
  std::optional<u64> fast_timed, full_timed, fast_all, full_all;
  std::string note;
  bool ok() const { return counts_ok && conservation_ok.value_or(true) && top_ok.value_or(true); }
};

// What a method supplies to the common driver.
struct method_calls {
  std::function<void(u64 step)> step;                // enqueue one step (may synchronise inside)
  std::function<bool(u64& count)> count;             // last message's size; false if out of tolerance
  std::function<void(std::vector<float>&)> residual; // host copy of the residual (waits)
  std::function<void(std::vector<float>&, std::vector<std::uint32_t>&)> sent; // last message on the host
  std::function<void(u64& fast, u64& full)> report;                           // batched only
};

} // namespace

int run(int argc, char** argv) {
  std::string out = "step_gpu";
  int steps = 100, warmup = 20, profile_steps = 0;
  std::vector<test_case> cases{{24, 1e-3}, {26, 1e-3}, {24, 1e-2}};
  std::vector<std::string> only;
  auto parse_cases = [&](const char* s) {
    cases.clear();
    std::stringstream in(s);
    for (std::string item; std::getline(in, item, ',');) {
      const auto colon = item.find(':');
      if (colon == std::string::npos) throw std::runtime_error("--cases wants LOGN:DENSITY,...");
      cases.push_back({std::atoi(item.substr(0, colon).c_str()), std::atof(item.substr(colon + 1).c_str())});
    }
  };
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--out" && i + 1 < argc)
        out = argv[++i];
      else if (a == "--steps" && i + 1 < argc)
        steps = std::max(2, std::atoi(argv[++i]));
      else if (a == "--warmup" && i + 1 < argc)
        warmup = std::max(0, std::atoi(argv[++i]));
      else if (a == "--cases" && i + 1 < argc)
        parse_cases(argv[++i]);
      else if (a == "--only" && i + 1 < argc) {
        std::stringstream in(argv[++i]);
        for (std::string m; std::getline(in, m, ',');)
          only.push_back(m);
      } else if (a == "--profile-steps" && i + 1 < argc)
        profile_steps = std::max(1, std::atoi(argv[++i]));
      else if (a == "--quick") {
        steps = 40;
        warmup = 10;
        cases = {{24, 1e-3}, {24, 1e-2}};
      } else
        throw std::runtime_error("unknown argument " + a);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "%s\nusage: %s [--out PREFIX] [--steps 100] [--warmup 20] [--cases 24:1e-3,26:1e-3,24:1e-2] "
                 "[--only m1,m2] [--profile-steps S] [--quick]\n",
                 e.what(), argv[0]);
    return 2;
  }
  if (warmup >= steps) warmup = steps / 5;
  const bool profiling = profile_steps > 0;
  const int profile_warm = 5;
  if (profiling) {
    steps = profile_warm + profile_steps;
    warmup = steps; // nothing timed
  }
  cudaDeviceProp prop{};
  if (!has_device(prop)) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  std::printf("device: %s; %d steps per row, first %d untimed%s\n", prop.name, steps, warmup,
              profiling ? " (profile mode)" : "");
  auto wanted = [&](const std::string& m) {
    return only.empty() || std::find(only.begin(), only.end(), m) != only.end();
  };
  const double tol = 0.01;
  std::vector<row> rows;
  events ev;

  for (const test_case& tc : cases) {
    const u64 n = u64{1} << tc.log_n;
    const u64 k = commsgd::select::k_for_density(n, tc.density);
    std::printf("N = 2^%d, density %g, k = %llu\n", tc.log_n, tc.density, static_cast<unsigned long long>(k));
    cu::device_buffer<float> g32(n);
    cu::device_buffer<__nv_bfloat16> g16(n);

    // The common driver: `steps` steps, a fresh gradient before each (untimed), the last `steps - warmup`
    // timed; then, for methods with a residual, one more step that is checked.
    auto drive = [&](const char* method, const char* grad, method_calls calls, bool bf16) {
      if (!wanted(method)) return;
      row r;
      r.method = method;
      r.grad = grad;
      r.n = n;
      r.k = k;
      r.density = tc.density;
      r.steps = steps;
      u64 fast0 = 0, full0 = 0;
      auto draw = [&](u64 s) {
        if (bf16)
          draw_gradient(g16.data(), n, s);
        else
          draw_gradient(g32.data(), n, s);
      };
      try { // a throwing step (refused, broken) fails its row, not the run
        for (int s = 0; s < steps; ++s) {
          draw(static_cast<u64>(s));
          if (s == warmup && calls.report) calls.report(fast0, full0);
          if (profiling && s >= profile_warm) {
            cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
            cu::check(cudaProfilerStart(), "cudaProfilerStart");
            calls.step(static_cast<u64>(s));
            cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
            cu::check(cudaProfilerStop(), "cudaProfilerStop");
          } else if (s >= warmup) {
            r.ms.push_back(ev.time(nullptr, [&] { calls.step(static_cast<u64>(s)); }));
          } else {
            calls.step(static_cast<u64>(s));
          }
          if (calls.count) {
            u64 c = 0;
            if (!calls.count(c)) r.counts_ok = false;
            r.min_count = std::min(r.min_count, c);
            r.max_count = std::max(r.max_count, c);
          }
        }
        cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        if (calls.report) {
          u64 fast = 0, full = 0;
          calls.report(fast, full);
          r.fast_all = fast;
          r.full_all = full;
          if (!profiling) {
            r.fast_timed = fast - fast0;
            r.full_timed = full - full0;
          }
        }
        if (!profiling && calls.residual) {
          // The checked step (not timed).
          const u64 s = static_cast<u64>(steps);
          std::vector<float> old_e, new_e, sent_v;
          std::vector<std::uint32_t> sent_i;
          calls.residual(old_e);
          draw(s);
          const sums gs = bf16 ? device_sums(g16.data(), n) : device_sums(g32.data(), n);
          calls.step(s);
          cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
          if (calls.count) {
            u64 c = 0;
            if (!calls.count(c)) r.counts_ok = false;
          }
          calls.sent(sent_v, sent_i);
          calls.residual(new_e);
          r.cons = check_conservation(host_sums(old_e.data(), old_e.size()), gs,
                                      host_sums(sent_v.data(), sent_v.size()),
                                      host_sums(new_e.data(), new_e.size()), n);
          r.conservation_ok = r.cons.ok();
          r.top_ok = sent_set_is_top(sent_v, sent_i, new_e);
        }
      } catch (const std::exception& e) {
        r.counts_ok = false;
        r.note = e.what();
        std::printf("  %s: %s\n", method, e.what());
        cudaDeviceSynchronize();
        (void)cudaGetLastError();
      }
      if (!r.ms.empty()) {
        r.timed = static_cast<int>(r.ms.size());
        r.median_ms = median(r.ms);
        r.p90_ms = quantile(r.ms, 0.9);
        r.min_ms = *std::min_element(r.ms.begin(), r.ms.end());
      }
      std::printf("  %-14s %-5s median %.4f ms  p90 %.4f ms", method, grad, r.median_ms, r.p90_ms);
      if (r.fast_timed)
        std::printf("  fast/full (timed) %llu/%llu", static_cast<unsigned long long>(*r.fast_timed),
                    static_cast<unsigned long long>(*r.full_timed));
      if (r.conservation_ok)
        std::printf("  conservation %s (|diff| %.3g <= %.3g)  top set %s",
                    *r.conservation_ok ? "ok" : "FAILED", std::fabs(r.cons.lhs - r.cons.rhs), r.cons.bound,
                    r.top_ok.value_or(false) ? "ok" : "FAILED");
      std::printf("  counts %s\n", r.counts_ok ? "ok" : "OUT OF TOLERANCE");
      std::fflush(stdout);
      rows.push_back(std::move(r));
    };

    // Anchors of the memory floor.
    {
      cu::device_buffer<float> e(n), target(n);
      cu::check(cudaMemset(e.data(), 0, n * sizeof(float)), "cudaMemset");
      drive("floor_f32", "f32", {.step = [&](u64) { floor_step(g32.data(), e.data(), n); }}, false);
      drive("floor_bf16", "bf16", {.step = [&](u64) { floor_step(g16.data(), e.data(), n); }}, true);
      drive("copy", "f32",
            {.step =
                 [&](u64) {
                   cu::check(cudaMemcpyAsync(target.data(), g32.data(), n * sizeof(float),
                                             cudaMemcpyDeviceToDevice),
                             "cudaMemcpyAsync");
                 }},
            false);
    }
    // cuda::top_k: one host synchronisation per step; the message comes back in pinned host memory.
    auto top_k_row = [&](const char* method, auto make) {
      if (!wanted(method)) return;
      auto tk = make();
      std::size_t last = 0;
      const bool exact = commsgd::select::selects_exactly(tk.selector());
      const auto limit = exact ? k : static_cast<u64>(std::ceil((1.0 + tol) * static_cast<double>(k)));
      drive(method, "f32",
            {.step = [&](u64) { last = tk.step(g32.data()).size(); },
             .count =
                 [&](u64& c) {
                   c = last;
                   return c >= k && c <= limit;
                 },
             .residual = [&](std::vector<float>& h) { h = tk.residual_to_host(); },
             .sent =
                 [&](std::vector<float>& v, std::vector<std::uint32_t>& i) {
                   const auto m = tk.last();
                   v.assign(m.values.begin(), m.values.end());
                   i.assign(m.indices.begin(), m.indices.end());
                 }},
            false);
    };
    top_k_row("top_k_laplace", [&] { return cu::top_k<cu::laplace_bisect>(n, {.density = tc.density}); });
    top_k_row("top_k_radix", [&] { return cu::top_k<cu::radix>(n, {.density = tc.density}); });

    // cuda::batched_top_k with one tensor: no host synchronisation; the message stays on the device.
    auto batched_row = [&](const char* method, auto tag, bool bf16) {
      using G = decltype(tag);
      if (!wanted(method)) return;
      const std::size_t lengths[] = {static_cast<std::size_t>(n)};
      cu::batched_top_k<G> bt(std::span<const std::size_t>(lengths), {.density = tc.density});
      const G* g = nullptr;
      if constexpr (std::is_same_v<G, float>)
        g = g32.data();
      else
        g = g16.data();
      drive(method, bf16 ? "bf16" : "f32",
            {.step = [&](u64) { bt.step(g); },
             .count =
                 [&](u64& c) {
                   c = bt.total_k();
                   return c == k;
                 },
             .residual = [&](std::vector<float>& h) { h = bt.residual_to_host(); },
             .sent =
                 [&](std::vector<float>& v, std::vector<std::uint32_t>& i) {
                   v.resize(bt.total_k());
                   i.resize(bt.total_k());
                   cu::check(
                       cudaMemcpy(v.data(), bt.value(), v.size() * sizeof(float), cudaMemcpyDeviceToHost),
                       "cudaMemcpy");
                   cu::check(cudaMemcpy(i.data(), bt.index(), i.size() * sizeof(std::uint32_t),
                                        cudaMemcpyDeviceToHost),
                             "cudaMemcpy");
                 },
             .report =
                 [&](u64& fast, u64& full) {
                   const auto rep = bt.report();
                   fast = rep.fast_steps.at(0);
                   full = rep.full_steps.at(0);
                 }},
            bf16);
      // Throws on a refused step or on counts that disagreed inside a step.
      try {
        bt.check_refused();
        const auto rep = bt.report();
        if (rep.refused != 0 || rep.committed != static_cast<u64>(steps + (profiling ? 0 : 1))) {
          rows.back().counts_ok = false;
          rows.back().note =
              "committed " + std::to_string(rep.committed) + ", refused " + std::to_string(rep.refused);
        }
      } catch (const std::exception& e) {
        rows.back().counts_ok = false;
        rows.back().note = e.what();
        std::printf("  %s: %s\n", method, e.what());
      }
    };
    batched_row("batched_f32", float{}, false);
    batched_row("batched_bf16", __nv_bfloat16{}, true);
  }

  if (profiling) {
    std::printf("profile mode: %d profiled steps per row\n", profile_steps);
    return 0;
  }

  // x floor: float rows against floor_f32, bf16 rows against floor_bf16, of the same case.
  auto floor_of = [&](const row& r) -> double {
    for (const auto& f : rows)
      if (f.n == r.n && f.density == r.density && f.method == (r.grad == "bf16" ? "floor_bf16" : "floor_f32"))
        return f.median_ms;
    return 0.0;
  };
  const std::string json = out + ".json";
  std::vector<json_object> results;
  for (const row& r : rows) {
    auto& o = results.emplace_back();
    o.add("method", r.method)
        .add("grad", r.grad)
        .add("n", r.n)
        .add("density", r.density, "%g")
        .add("k", r.k)
        .add("timed", r.timed)
        .add("median_ms", r.median_ms, "%.6f")
        .add("p90_ms", r.p90_ms, "%.6f")
        .add("min_ms", r.min_ms, "%.6f")
        .add("floor_ms", floor_of(r), "%.6f")
        .add("min_count", r.min_count == ~0ull ? 0 : r.min_count)
        .add("max_count", r.max_count)
        .add("counts_ok", r.counts_ok);
    add_checks(o, r.conservation_ok, r.cons, r.top_ok);
    if (r.fast_timed)
      o.add("fast_timed", *r.fast_timed)
          .add("full_timed", *r.full_timed)
          .add("fast_all", *r.fast_all)
          .add("full_all", *r.full_all);
    o.add("ok", r.ok()).add("note", r.note).add("ms", r.ms, "%.5f");
  }
  write_results(json,
                json_object()
                    .add("device", prop.name)
                    .add("steps", steps)
                    .add("warmup", warmup)
                    .add("tolerance", tol, "%g"),
                results);
  const bool all_ok = std::all_of(rows.begin(), rows.end(), [](const row& r) { return r.ok(); });
  std::printf("wrote %s; %s\n", json.c_str(), all_ok ? "all checks passed" : "SOME CHECKS FAILED");
  return all_ok ? 0 : 1;
}

} // namespace step_bench

#ifndef COMMSGD_GPU_BENCH_ONE_PROGRAM
int main(int argc, char** argv) {
  return step_bench::run(argc, argv);
}
#endif
