// docs/diloco.md quotes the loop of this file: DiLoCo with 4-bit pseudo-gradients, two fragments and a
// delay, the code named at run time, over 3 thread ranks whose inner steps are the trainer's own (plain SGD
// on a least-squares problem here). Checked: every rank holds the same common model, and its loss falls.
// The exit status is the test (ctest -R docs.diloco).
#include <commsgd/comm/local.hpp>
#include <commsgd/sync/coded_diloco.hpp>
#include <support/least_squares.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  using namespace commsgd;
  const toy::least_squares problem({.samples = 600, .dim = 40, .seed = 3});
  const std::vector<std::size_t> layer_sizes = {10, 20, 10};
  const int ranks = 3, steps = 120;
  std::vector<std::vector<float>> finals(ranks);
  std::vector<double> start_loss(ranks), end_loss(ranks);
  comm::local_group(ranks).run([&](comm::local& comm) {
    std::vector<float> theta(problem.dim(), 0.0f), grad(problem.dim());
    auto inner_optimizer_step = [&](std::vector<float>& x, int t) {
      const auto rows = problem.batch(comm.rank(), ranks, t, 16);
      problem.gradient(x, rows, grad);
      for (std::size_t i = 0; i < x.size(); ++i)
        x[i] -= 0.05f * grad[i];
    };
    start_loss[comm.rank()] = problem.loss(theta, problem.batch(0, 1, 0, 600));
    // [loop]
    sync::coded_diloco<comm::local> s(comm, layer_sizes,
                                      {.sync_every = 10, .fragments = 2, .delay = 3, .alpha = 0.5f},
                                      sync::diloco_code::parse("e3m0"));
    s.start(theta); // rank 0's model on every rank; the common model kept
    for (int t = 0; t < steps; ++t) {
      inner_optimizer_step(theta, t); // the trainer's own step on this rank's data
      s.advance(theta);               // the schedule: apply what is due, start what is next
    }
    s.finish(theta); // what is in flight, then a last round of every fragment that moved
    // [loop]
    // With alpha > 0 each rank keeps part of its own steps; the common model is the same bits everywhere.
    std::vector<float> common(problem.dim());
    for (std::size_t p = 0; p < s.num_fragments(); ++p) {
      const auto g = s.global_model(p);
      std::size_t at = 0;
      for (const auto& [off, len] : s.fragment_runs(p)) {
        std::copy_n(g.begin() + static_cast<std::ptrdiff_t>(at), len,
                    common.begin() + static_cast<std::ptrdiff_t>(off));
        at += len;
      }
    }
    finals[comm.rank()] = common;
    end_loss[comm.rank()] = problem.loss(common, problem.batch(0, 1, 0, 600));
  });
  bool ok = true;
  for (int r = 1; r < ranks; ++r)
    ok = ok && std::memcmp(finals[r].data(), finals[0].data(), finals[0].size() * sizeof(float)) == 0;
  std::printf("loss %.4f -> %.4f, ranks agree: %s\n", start_loss[0], end_loss[0], ok ? "yes" : "no");
  return ok && end_loss[0] < 0.1 * start_loss[0] ? 0 : 1;
}
