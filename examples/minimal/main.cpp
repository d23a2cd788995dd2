// The smallest integration: an existing training loop (here least squares on y = 3x - 1) keeps computing its
// own local gradient; commsgd only exchanges it. Four ranks run as threads of this process.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>

#include <array>
#include <cmath>
#include <cstdio>

int main() {
  std::array<float, 2> final_model{};
  commsgd::comm::local_group{4}.run([&](commsgd::comm::local& base) {
    commsgd::comm::metered comm(base);  // counts the bytes every exchange puts on the wire
    std::array<float, 2> w{0.0f, 0.0f}; // slope, intercept: the same start on every rank
    for (int step = 0; step < 200; ++step) {
      // 1. The trainer's own code: the gradient over this rank's shard of the data.
      std::array<float, 2> g{0.0f, 0.0f};
      for (int i = 0; i < 8; ++i) {
        const float x = static_cast<float>(comm.rank() * 8 + i) / 32.0f, y = 3.0f * x - 1.0f;
        const float err = w[0] * x + w[1] - y;
        g[0] += err * x / 8.0f;
        g[1] += err / 8.0f;
      }
      // 2. commsgd: sum the gradients of all ranks; every rank receives the same bits.
      comm.all_reduce_sum(std::span<float>(g));
      // 3. The trainer's own update, with the average, so every replica stays identical.
      for (int j = 0; j < 2; ++j)
        w[j] -= 0.5f * g[j] / static_cast<float>(comm.size());
    }
    if (comm.rank() == 0) {
      final_model = w;
      std::printf("w = %.4f, b = %.4f after 200 steps; rank 0 sent %llu bytes\n", w[0], w[1],
                  static_cast<unsigned long long>(comm.counters().total().bytes_sent));
    }
  });
  // Exit status is the test: the fit must recover the line.
  return std::abs(final_model[0] - 3.0f) < 0.05f && std::abs(final_model[1] + 1.0f) < 0.05f ? 0 : 1;
}
