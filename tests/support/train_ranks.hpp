// Runs a sync strategy on n thread ranks over toy::least_squares and returns every rank's final model: the
// shared driver of the sync tests that compare one strategy's models with another's, bit for bit.
#pragma once

#include <commsgd/comm/local.hpp>
#include <support/least_squares.hpp>

#include <cstddef>
#include <vector>

namespace commsgd::inline v1::toy {

using finals_t = std::vector<std::vector<float>>;

// make(rank's communicator) builds the strategy; each rank takes `steps` steps on 8-row batches of its shard,
// then finish() (unless `finish` is false, to look at the models as the last step left them).
template <class Make>
finals_t train_ranks(const least_squares& prob, int n, int steps, Make make, bool finish = true) {
  finals_t finals(static_cast<std::size_t>(n));
  comm::local_group(n).run([&](comm::local& c) {
    auto s = make(c);
    std::vector<float> x(prob.dim(), 0.0f), g(prob.dim());
    s.start(x);
    for (int t = 0; t < steps; ++t) {
      const auto rows = prob.batch(c.rank(), n, t, 8);
      prob.gradient(x, rows, g);
      s.step(x, g, {.loss = prob.loss(x, rows)});
    }
    if (finish) s.finish(x);
    finals[static_cast<std::size_t>(c.rank())] = x;
  });
  return finals;
}

} // namespace commsgd::inline v1::toy
