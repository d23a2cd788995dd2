// Batched selection over a real model's parameter list: ResNet-50's 161 parameter tensors (25,557,032
// values), density 1e-3 per tensor (k_t = ceil(1e-3 n_t)), in steady state on raw gradients drawn fresh on
// the device every step (bench_common.cuh; the drawing is untimed), `--steps` steps per row, the first
// `--warmup` untimed. Rows:
//   floor_f32            read g, read e, write e over all 25.6 M values (12 N bytes)
//   batched_f32          one cuda::batched_top_k<float> over the 161 tensors: one step
//   graph_batched_f32    the same step captured once in a CUDA graph (after one ordinary step) and replayed
//   loop_batched_f32     161 cuda::batched_top_k<float> of one tensor each, stepped in a loop (same algorithm
//                        and outputs as batched_f32)
//   loop_top_k_radix     161 cuda::top_k<radix> (exact, one host synchronisation each), stepped in a loop
// (torch.topk in a loop over the same list: bench/gpu/torch_topk.py --resnet-out.)
// All four step rows are exact with ties to the lowest index and see the same gradients, so after the same
// number of steps their residuals must be equal bit for bit: checked at the end. batched_f32 also gets the
// conservation check and the per-tensor top-set check of step_gpu_bench on one more (untimed) step; every
// message count is checked (top_k: k_t per tensor; batched: no refused or broken step).
//
//   gpu_bench batched [--out PREFIX] [--steps 100] [--warmup 20] [--quick]
#include "bench_common.cuh"

#include <cstdlib>
#include <cstring>
#include <memory>

namespace batched_bench {

namespace {

using namespace bench;

// torchvision's resnet50 parameters, in its order: conv1, bn1, the bottleneck blocks of stages [3, 4, 6, 3]
// (conv1 1x1, bn1, conv2 3x3, bn2, conv3 1x1, bn3; the first block of a stage also a 1x1 downsample conv and
// its bn), fc.
std::vector<std::size_t> resnet50_lengths() {
  std::vector<std::size_t> l;
  auto conv = [&](std::size_t in, std::size_t out, std::size_t kh) { l.push_back(out * in * kh * kh); };
  auto bn = [&](std::size_t c) {
    l.push_back(c); // weight
    l.push_back(c); // bias
  };
  conv(3, 64, 7);
  bn(64);
  std::size_t in = 64;
  const std::size_t blocks[] = {3, 4, 6, 3}, widths[] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s) {
    const std::size_t w = widths[s];
    for (std::size_t b = 0; b < blocks[s]; ++b) {
      conv(in, w, 1);
      bn(w);
      conv(w, w, 3);
      bn(w);
      conv(w, 4 * w, 1);
      bn(4 * w);
      if (b == 0) {
        conv(in, 4 * w, 1);
        bn(4 * w);
      }
      in = 4 * w;
    }
  }
  l.push_back(2048 * 1000); // fc.weight
  l.push_back(1000);        // fc.bias
  return l;
}

struct row {
  std::string method;
  std::vector<double> ms;
  double median_ms = 0, p90_ms = 0, min_ms = 0;
  bool counts_ok = true;
  std::optional<bool> same_residual, conservation_ok, top_ok;
  conservation cons;
  std::optional<u64> fast_timed, full_timed, tensors_full_timed;
  std::string note;
  bool ok() const {
    return counts_ok && same_residual.value_or(true) && conservation_ok.value_or(true) &&
           top_ok.value_or(true);
  }
};

struct fast_full {
  u64 fast = 0, full = 0;
  std::vector<u64> full_per_tensor;
};

template <class B>
void add_report(fast_full& f, const B& bt, cudaStream_t stream = nullptr) {
  const auto r = bt.report(stream);
  for (std::size_t t = 0; t < r.fast_steps.size(); ++t) {
    f.fast += r.fast_steps[t];
    f.full += r.full_steps[t];
    f.full_per_tensor.push_back(r.full_steps[t]);
  }
}

} // namespace

int run(int argc, char** argv) {
  std::string out = "batched_gpu";
  int steps = 100, warmup = 20;
  const double density = 1e-3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc)
      out = argv[++i];
    else if (a == "--steps" && i + 1 < argc)
      steps = std::max(2, std::atoi(argv[++i]));
    else if (a == "--warmup" && i + 1 < argc)
      warmup = std::max(0, std::atoi(argv[++i]));
    else if (a == "--quick") {
      steps = 40;
      warmup = 10;
    } else {
      std::fprintf(stderr, "usage: %s [--out PREFIX] [--steps 100] [--warmup 20] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (warmup >= steps) warmup = steps / 5;
  const std::vector<std::size_t> lengths = resnet50_lengths();
  std::size_t total = 0, total_k = 0;
  for (std::size_t n : lengths) {
    total += n;
    total_k += commsgd::select::k_for_density(n, density);
  }
  if (lengths.size() != 161 || total != 25557032) {
    std::fprintf(stderr, "the ResNet-50 list is wrong: %zu tensors, %zu values (want 161, 25557032)\n",
                 lengths.size(), total);
    return 3;
  }
  cudaDeviceProp prop{};
  if (!has_device(prop)) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  const u64 n = total;
  std::printf("device: %s; ResNet-50: %zu tensors, %zu values, total k %zu at density %g; %d steps per row, "
              "first %d untimed\n",
              prop.name, lengths.size(), total, total_k, density, steps, warmup);
  std::vector<std::size_t> offsets(lengths.size());
  for (std::size_t t = 1; t < lengths.size(); ++t)
    offsets[t] = offsets[t - 1] + lengths[t - 1];

  cu::device_buffer<float> g(n);
  events ev;
  std::vector<row> rows;
  std::vector<float> reference; // batched_f32's residual after steps + 1 steps

  auto finish = [&](row& r) {
    if (!r.ms.empty()) {
      r.median_ms = median(r.ms);
      r.p90_ms = quantile(r.ms, 0.9);
      r.min_ms = *std::min_element(r.ms.begin(), r.ms.end());
    }
    std::printf("  %-18s median %.4f ms  p90 %.4f ms", r.method.c_str(), r.median_ms, r.p90_ms);
    if (r.fast_timed)
      std::printf("  fast/full tensor-steps (timed) %llu/%llu, tensors with a full step %llu",
                  static_cast<unsigned long long>(*r.fast_timed),
                  static_cast<unsigned long long>(*r.full_timed),
                  static_cast<unsigned long long>(r.tensors_full_timed.value_or(0)));
    if (r.same_residual) std::printf("  residual %s", *r.same_residual ? "= batched_f32's" : "DIFFERS");
    if (r.conservation_ok)
      std::printf("  conservation %s  top sets %s", *r.conservation_ok ? "ok" : "FAILED",
                  r.top_ok.value_or(false) ? "ok" : "FAILED");
    std::printf("  counts %s%s%s\n", r.counts_ok ? "ok" : "FAILED", r.note.empty() ? "" : ": ",
                r.note.c_str());
    std::fflush(stdout);
    rows.push_back(r);
  };
  auto timed_window = [&](const fast_full& before, const fast_full& after, row& r) {
    r.fast_timed = after.fast - before.fast;
    r.full_timed = after.full - before.full;
    u64 tensors = 0;
    for (std::size_t t = 0; t < after.full_per_tensor.size(); ++t)
      tensors += after.full_per_tensor[t] > before.full_per_tensor[t];
    r.tensors_full_timed = tensors;
  };
  auto compare = [&](row& r, const std::vector<float>& residual) {
    r.same_residual = residual.size() == reference.size() &&
                      std::memcmp(residual.data(), reference.data(), residual.size() * sizeof(float)) == 0;
  };

  // The memory floor.
  {
    row r{"floor_f32"};
    cu::device_buffer<float> e(n);
    cu::check(cudaMemset(e.data(), 0, n * sizeof(float)), "cudaMemset");
    for (int s = 0; s < steps; ++s) {
      draw_gradient(g.data(), n, s);
      if (s >= warmup)
        r.ms.push_back(ev.time(nullptr, [&] { floor_step(g.data(), e.data(), n); }));
      else
        floor_step(g.data(), e.data(), n);
    }
    finish(r);
  }

  // One batched step over the 161 tensors; then the checked step.
  {
    row r{"batched_f32"};
    cu::batched_top_k<float> bt(std::span<const std::size_t>(lengths), {.density = density});
    if (bt.total_k() != total_k) r.counts_ok = false;
    fast_full before, after;
    try {
      for (int s = 0; s < steps; ++s) {
        draw_gradient(g.data(), n, s);
        if (s == warmup) add_report(before, bt);
        if (s >= warmup)
          r.ms.push_back(ev.time(nullptr, [&] { bt.step(g.data()); }));
        else
          bt.step(g.data());
      }
      add_report(after, bt);
      timed_window(before, after, r);
      const std::vector<float> old_e = bt.residual_to_host();
      draw_gradient(g.data(), n, steps);
      const sums gs = device_sums(g.data(), n);
      bt.step(g.data());
      std::vector<float> v(bt.total_k());
      std::vector<std::uint32_t> idx(bt.total_k());
      cu::check(cudaMemcpy(v.data(), bt.value(), v.size() * sizeof(float), cudaMemcpyDeviceToHost),
                "cudaMemcpy");
      cu::check(
          cudaMemcpy(idx.data(), bt.index(), idx.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
      reference = bt.residual_to_host();
      r.cons = check_conservation(host_sums(old_e.data(), old_e.size()), gs, host_sums(v.data(), v.size()),
                                  host_sums(reference.data(), reference.size()), n);
      r.conservation_ok = r.cons.ok();
      // Per tensor: its k_t pairs lie in its message range, point into it, and are its largest |p|.
      bool top = true;
      for (std::size_t t = 0; t < lengths.size() && top; ++t) {
        const std::size_t m0 = bt.message_offset(t), kt = bt.k(t);
        float least = INFINITY, most = 0.0f;
        for (std::size_t j = m0; j < m0 + kt; ++j) {
          least = std::min(least, std::fabs(v[j]));
          if (idx[j] < offsets[t] || idx[j] >= offsets[t] + lengths[t] || reference[idx[j]] != 0.0f)
            top = false;
        }
        for (std::size_t i = offsets[t]; i < offsets[t] + lengths[t]; ++i)
          most = std::max(most, std::fabs(reference[i]));
        if (kt > 0 && !(least >= most)) top = false;
      }
      r.top_ok = top;
    } catch (const std::exception& e) {
      r.counts_ok = false;
      r.note = e.what();
    }
    try {
      bt.check_refused();
      const auto rep = bt.report();
      if (rep.refused != 0 || rep.committed != static_cast<u64>(steps + 1)) {
        r.counts_ok = false;
        r.note = "committed " + std::to_string(rep.committed) + ", refused " + std::to_string(rep.refused);
      }
    } catch (const std::exception& e) {
      r.counts_ok = false;
      r.note = e.what();
    }
    finish(r);
  }

  // The same step in a CUDA graph: one ordinary step (the first is cold), then captured once and replayed.
  {
    row r{"graph_batched_f32"};
    cudaStream_t stream{};
    cu::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaGraph_t graph{};
    cudaGraphExec_t exec{};
    {
      cu::batched_top_k<float> bt(std::span<const std::size_t>(lengths), {.density = density});
      fast_full before, after;
      try {
        for (int s = 0; s <= steps; ++s) { // steps + 1, like the others (no checked step here)
          draw_gradient(g.data(), n, s, stream);
          if (s == 1) {
            bt.check_refused(stream);
            cu::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
            bt.step(g.data(), stream);
            cu::check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
            cu::check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
          }
          if (s == warmup) add_report(before, bt, stream);
          auto one = [&] {
            if (s == 0)
              bt.step(g.data(), stream);
            else
              cu::check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
          };
          if (s >= warmup && s < steps)
            r.ms.push_back(ev.time(stream, one));
          else
            one();
          if (s == steps - 1) add_report(after, bt, stream);
        }
        timed_window(before, after, r);
        compare(r, bt.residual_to_host(stream));
        bt.check_refused(stream);
        const auto rep = bt.report(stream);
        if (rep.refused != 0 || rep.committed != static_cast<u64>(steps + 1)) {
          r.counts_ok = false;
          r.note = "committed " + std::to_string(rep.committed) + ", refused " + std::to_string(rep.refused);
        }
      } catch (const std::exception& e) {
        r.counts_ok = false;
        r.note = e.what();
        cudaStreamCaptureStatus st{};
        if (cudaStreamIsCapturing(stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
          cudaGraph_t broken{};
          cudaStreamEndCapture(stream, &broken);
          if (broken) cudaGraphDestroy(broken);
        }
        cudaStreamSynchronize(stream);
        (void)cudaGetLastError();
      }
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
    }
    cudaStreamDestroy(stream);
    finish(r);
  }

  // 161 one-tensor batched steps in a loop.
  {
    row r{"loop_batched_f32"};
    std::vector<std::unique_ptr<cu::batched_top_k<float>>> bts;
    for (std::size_t t = 0; t < lengths.size(); ++t)
      bts.push_back(std::make_unique<cu::batched_top_k<float>>(
          std::span<const std::size_t>(&lengths[t], 1), cu::batched_top_k_options{.density = density}));
    auto all = [&] {
      for (std::size_t t = 0; t < lengths.size(); ++t)
        bts[t]->step(g.data() + offsets[t]);
    };
    fast_full before, after;
    std::vector<float> residual;
    try {
      for (int s = 0; s <= steps; ++s) {
        draw_gradient(g.data(), n, s);
        if (s == warmup)
          for (auto& b : bts)
            add_report(before, *b);
        if (s >= warmup && s < steps)
          r.ms.push_back(ev.time(nullptr, all));
        else
          all();
        if (s == steps - 1)
          for (auto& b : bts)
            add_report(after, *b);
      }
      timed_window(before, after, r);
      for (auto& b : bts) {
        b->check_refused();
        const auto rep = b->report();
        if (rep.refused != 0 || rep.committed != static_cast<u64>(steps + 1)) r.counts_ok = false;
        const auto e = b->residual_to_host();
        residual.insert(residual.end(), e.begin(), e.end());
      }
    } catch (const std::exception& e) {
      r.counts_ok = false;
      r.note = e.what();
    }
    compare(r, residual);
    finish(r);
  }

  // 161 cuda::top_k<radix> in a loop: one host synchronisation per tensor.
  {
    row r{"loop_top_k_radix"};
    std::vector<std::unique_ptr<cu::top_k<cu::radix>>> tks;
    for (std::size_t t = 0; t < lengths.size(); ++t)
      tks.push_back(
          std::make_unique<cu::top_k<cu::radix>>(lengths[t], cu::top_k_options{.density = density}));
    std::size_t bad = 0;
    auto all = [&] {
      for (std::size_t t = 0; t < lengths.size(); ++t)
        if (tks[t]->step(g.data() + offsets[t]).size() != tks[t]->k()) ++bad;
    };
    std::vector<float> residual;
    try {
      for (int s = 0; s <= steps; ++s) {
        draw_gradient(g.data(), n, s);
        if (s >= warmup && s < steps)
          r.ms.push_back(ev.time(nullptr, all));
        else
          all();
      }
      if (bad) {
        r.counts_ok = false;
        r.note = std::to_string(bad) + " messages of the wrong size";
      }
      for (auto& tk : tks) {
        const auto e = tk->residual_to_host();
        residual.insert(residual.end(), e.begin(), e.end());
      }
    } catch (const std::exception& e) {
      r.counts_ok = false;
      r.note = e.what();
    }
    compare(r, residual);
    finish(r);
  }

  const double floor_ms = rows.front().median_ms;
  const std::string json = out + ".json";
  std::vector<json_object> results;
  for (const row& r : rows) {
    auto& o = results.emplace_back();
    o.add("method", r.method)
        .add("timed", r.ms.size())
        .add("median_ms", r.median_ms, "%.6f")
        .add("p90_ms", r.p90_ms, "%.6f")
        .add("min_ms", r.min_ms, "%.6f")
        .add("floor_ms", floor_ms, "%.6f")
        .add("counts_ok", r.counts_ok);
    if (r.same_residual) o.add("same_residual", *r.same_residual);
    add_checks(o, r.conservation_ok, r.cons, r.top_ok);
    if (r.fast_timed)
      o.add("fast_timed", *r.fast_timed)
          .add("full_timed", *r.full_timed)
          .add("tensors_full_timed", r.tensors_full_timed.value_or(0));
    o.add("ok", r.ok()).add("note", r.note).add("ms", r.ms, "%.5f");
  }
  write_results(json,
                json_object()
                    .add("device", prop.name)
                    .add("model", "resnet50")
                    .add("tensors", lengths.size())
                    .add("n", total)
                    .add("density", density, "%g")
                    .add("total_k", total_k)
                    .add("steps", steps)
                    .add("warmup", warmup),
                results);
  const bool all_ok = std::all_of(rows.begin(), rows.end(), [](const row& r) { return r.ok(); });
  std::printf("wrote %s; %s\n", json.c_str(), all_ok ? "all checks passed" : "SOME CHECKS FAILED");
  return all_ok ? 0 : 1;
}

} // namespace batched_bench

#ifndef COMMSGD_GPU_BENCH_ONE_PROGRAM
int main(int argc, char** argv) {
  return batched_bench::run(argc, argv);
}
#endif
