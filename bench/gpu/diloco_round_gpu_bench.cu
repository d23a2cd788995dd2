// DiLoCo's round on device parameters (cuda::diloco_fragment) against its memory floor, per code, at a
// model's size: the round's local work, encode then apply with the messages of `ranks` ranks already on
// the device (the network is not timed; on every rank it is the same bytes, see docs/diloco.md).
//
// A round reads the parameters, the common model and the momentum, writes them back, writes this rank's
// message and reads the n messages: 28 + (n + 1) b / 8 bytes a value for b-bit codes (dense: 36, the float
// message written and the sum read; top-k: 44, the residual's two floats read and written, and the pairs). The floor is those bytes at the device's streaming rate, measured in
// the same run by bench_common.cuh's floor kernel (read g, read e, write e). Parameters move by a small
// random step between rounds (outside the timed region), so every round encodes a fresh pseudo-gradient.
// Each row: min / median / max over the timed rounds; ok when every round was applied (no refusal).
//
//   gpu_bench diloco_round [--out PREFIX] [--log-n 26,28] [--ranks 4] [--rounds 30] [--warmup 5] [--quick]
#include "bench_common.cuh"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace diloco_round_bench {

namespace {

using namespace bench;

__global__ void walk_kernel(float* x, u64 n, u64 round) {
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  const u64 seed = mix(0xd11c0ull ^ mix(round + 1));
  for (u64 i = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; i < n; i += stride)
    x[i] += 1e-3f * (unit(mix(seed ^ i)) - 0.5f);
}
__global__ void init_kernel(float* x, u64 n) {
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 i = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; i < n; i += stride)
    x[i] = unit(mix(0x5eedull ^ i)) - 0.5f;
}
unsigned grid_for(u64 n) {
  return static_cast<unsigned>(std::max<u64>(1, std::min<u64>((n + 255) / 256, 132ull * 16)));
}

struct row {
  std::string code;
  u64 n = 0;
  int ranks = 0;
  double bytes_per_value = 0, floor_ms = 0;
  std::vector<double> ms;
  bool ok = true;
};

double order(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

template <class Code>
row run(u64 n, int ranks, int rounds, int warmup, double bytes_per_s, cu::diloco_fragment_options o = {},
        const char* name = Code::name) {
  row r;
  r.code = name;
  r.n = n;
  r.ranks = ranks;
  cu::device_buffer<float> x(n);
  init_kernel<<<grid_for(n), 256>>>(x.data(), n);
  cu::check_launch("init_kernel");
  const std::vector<std::pair<std::size_t, std::size_t>> runs{{0, n}};
  cu::diloco_fragment<Code> f(runs, o);
  f.start(x.data(), nullptr);
  const std::size_t mb = f.message_bytes();
  const bool dense = cu::diloco_fragment<Code>::dense;
  cu::device_buffer<std::byte> all(dense ? mb : mb * static_cast<std::size_t>(ranks));
  if constexpr (cu::diloco_fragment<Code>::dense)
    r.bytes_per_value = 36;
  else if constexpr (cu::diloco_fragment<Code>::top_k) // and the residual, both parts, read and written
    r.bytes_per_value = 44 + (ranks + 1) * static_cast<double>(mb) / static_cast<double>(n);
  else
    r.bytes_per_value = 28 + (ranks + 1) * Code::bits / 8.0;
  r.floor_ms = 1e3 * r.bytes_per_value * static_cast<double>(n) / bytes_per_s;
  cudaEvent_t e[4];
  for (auto& ev : e)
    cu::check(cudaEventCreate(&ev), "cudaEventCreate");
  for (int t = 0; t < warmup + rounds; ++t) {
    walk_kernel<<<grid_for(n), 256>>>(x.data(), n, static_cast<u64>(t));
    cu::check_launch("walk_kernel");
    cu::check(cudaEventRecord(e[0]), "cudaEventRecord");
    f.encode(x.data(), 1.0f, nullptr);
    cu::check(cudaEventRecord(e[1]), "cudaEventRecord");
    // Untimed, in place of the network: every rank's message is this rank's (each costs the same to
    // decode); dense, the all-reduce's sum is the message itself (the same bytes to read).
    if (!dense)
      for (int k = 0; k < ranks; ++k)
        cu::check(cudaMemcpyAsync(all.data() + static_cast<std::size_t>(k) * mb, f.message(), mb,
                                  cudaMemcpyDeviceToDevice),
                  "cudaMemcpyAsync");
    cu::check(cudaEventRecord(e[2]), "cudaEventRecord");
    f.apply(dense ? f.message() : all.data(), ranks, x.data(), nullptr);
    cu::check(cudaEventRecord(e[3]), "cudaEventRecord");
    cu::check(cudaEventSynchronize(e[3]), "cudaEventSynchronize");
    float encode_ms = 0, apply_ms = 0;
    cu::check(cudaEventElapsedTime(&encode_ms, e[0], e[1]), "cudaEventElapsedTime");
    cu::check(cudaEventElapsedTime(&apply_ms, e[2], e[3]), "cudaEventElapsedTime");
    const auto v = f.verdict(nullptr);
    r.ok = r.ok && v.own == 0 && v.sum == 0;
    if (t >= warmup) r.ms.push_back(static_cast<double>(encode_ms) + apply_ms);
  }
  for (auto& ev : e)
    cudaEventDestroy(ev);
  return r;
}

// The streaming rate: the floor kernel's 12 bytes a value over 2^28 values, the best of 20.
double streaming_rate() {
  const u64 n = u64{1} << 28;
  cu::device_buffer<float> g(n), acc(n);
  cu::check(cudaMemset(g.data(), 0, n * 4), "cudaMemset");
  cu::check(cudaMemset(acc.data(), 0, n * 4), "cudaMemset");
  events ev;
  double best = 1e30;
  for (int t = 0; t < 20; ++t)
    best = std::min(best, ev.time(nullptr, [&] { floor_step(g.data(), acc.data(), n); }));
  return 12.0 * static_cast<double>(n) / (1e-3 * best);
}

} // namespace

int run(int argc, char** argv) {
  std::string out = "diloco-round-gpu";
  std::vector<int> log_ns{26, 28};
  int ranks = 4, rounds = 30, warmup = 5;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--out" && i + 1 < argc)
        out = argv[++i];
      else if (a == "--log-n" && i + 1 < argc) {
        log_ns.clear();
        std::stringstream in(argv[++i]);
        for (std::string t; std::getline(in, t, ',');)
          log_ns.push_back(std::stoi(t));
      } else if (a == "--ranks" && i + 1 < argc)
        ranks = std::max(1, std::atoi(argv[++i]));
      else if (a == "--rounds" && i + 1 < argc)
        rounds = std::max(1, std::atoi(argv[++i]));
      else if (a == "--warmup" && i + 1 < argc)
        warmup = std::max(0, std::atoi(argv[++i]));
      else if (a == "--quick") {
        log_ns = {24};
        rounds = 10;
        warmup = 2;
      } else
        throw std::invalid_argument("unknown argument '" + a + "'");
    }
  } catch (const std::exception& e) {
    std::fprintf(
        stderr,
        "%s\nusage: %s [--out PREFIX] [--log-n 26,28] [--ranks 4] [--rounds 30] [--warmup 5] [--quick]\n",
        e.what(), argv[0]);
    return 2;
  }
  cudaDeviceProp prop{};
  if (!has_device(prop)) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  const double rate = streaming_rate();
  std::vector<row> rows;
  for (int log_n : log_ns) {
    const u64 n = u64{1} << log_n;
    rows.push_back(run<cu::dense_code>(n, ranks, rounds, warmup, rate));
    rows.push_back(run<commsgd::compress::int8_code>(n, ranks, rounds, warmup, rate));
    rows.push_back(run<commsgd::compress::e3m0_code>(n, ranks, rounds, warmup, rate));
    // SparseLoCo's recipe, and the 3 % that keeps float32's loss (bench/results/diloco-sparse-2026-11-28.md).
    for (double density : {0.01, 0.03}) {
      cu::diloco_fragment_options o;
      o.top_k = {.density = density, .two_bit = true, .chunk = 4096, .decay = 0.95f, .sender_mean = true};
      rows.push_back(run<cu::top_k_code>(n, ranks, rounds, warmup, rate, o,
                                         density == 0.01 ? "topk-0.01-c4096-2bit-b0.95-senders"
                                                         : "topk-0.03-c4096-2bit-b0.95-senders"));
    }
  }
  bool all_ok = true;
  std::printf("device: %s; streaming rate %.0f GB/s (floor kernel); %d ranks' messages\n", prop.name,
              rate / 1e9, ranks);
  std::printf("%-36s %6s %10s %10s %10s %10s %10s %8s %s\n", "code", "log2 N", "B/value", "floor ms",
              "min ms", "median ms", "max ms", "/floor", "ok");
  const std::string md = out + ".md";
  FILE* f = std::fopen(md.c_str(), "w");
  if (f) {
    std::fprintf(
        f, "| code | N | bytes a value | floor ms | min ms | median ms | max ms | median / floor | ok |\n");
    std::fprintf(f, "|---|---|---|---|---|---|---|---|---|\n");
  }
  for (const auto& r : rows) {
    const double med = order(r.ms, 0.5), lo = order(r.ms, 0.0), hi = order(r.ms, 1.0);
    all_ok = all_ok && r.ok;
    std::printf("%-36s %6d %10.1f %10.3f %10.3f %10.3f %10.3f %8.2f %s\n", r.code.c_str(),
                static_cast<int>(std::log2(static_cast<double>(r.n))), r.bytes_per_value, r.floor_ms, lo, med,
                hi, med / r.floor_ms, r.ok ? "yes" : "NO");
    if (f)
      std::fprintf(f, "| %s | 2^%d | %.1f | %.3f | %.3f | %.3f | %.3f | %.2fx | %s |\n", r.code.c_str(),
                   static_cast<int>(std::log2(static_cast<double>(r.n))), r.bytes_per_value, r.floor_ms, lo,
                   med, hi, med / r.floor_ms, r.ok ? "yes" : "NO");
  }
  if (f) {
    std::fprintf(f,
                 "\nDevice: %s. Streaming rate %.0f GB/s (the floor kernel, best of 20 at 2^28). %d ranks' "
                 "messages decoded; %d timed rounds after %d warm-up.\n",
                 prop.name, rate / 1e9, ranks, rounds, warmup);
    std::fclose(f);
  }
  // For diloco_round_torch.py, which times the same rounds as torch ops and sets them side by side.
  if (FILE* c = std::fopen((out + ".csv").c_str(), "w")) {
    std::fprintf(c, "code,log_n,ranks,bytes_per_value,floor_ms,min_ms,median_ms,max_ms,ok\n");
    for (const auto& r : rows)
      std::fprintf(c, "%s,%d,%d,%.1f,%.4f,%.4f,%.4f,%.4f,%d\n", r.code.c_str(),
                   static_cast<int>(std::log2(static_cast<double>(r.n))), r.ranks, r.bytes_per_value,
                   r.floor_ms, order(r.ms, 0.0), order(r.ms, 0.5), order(r.ms, 1.0), r.ok ? 1 : 0);
    std::fclose(c);
  }
  std::printf("wrote %s; %s\n", md.c_str(), all_ok ? "every round applied" : "SOME ROUNDS REFUSED");
  return all_ok ? 0 : 1;
}

} // namespace diloco_round_bench

#ifndef COMMSGD_GPU_BENCH_ONE_PROGRAM
int main(int argc, char** argv) {
  return diloco_round_bench::run(argc, argv);
}
#endif
