// The slot every communication scheme plugs into. A scheme owns one global step on one rank: it decides which
// samples of the batch this rank computes, exchanges through the metered communicator, and updates this
// rank's parameters. The trainer owns data, timing and evaluation, so schemes compare on the same footing.
#pragma once

#include "timing.hpp"

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace fmnist {

// What the trainer hands a scheme for one step.
struct step_env {
  std::size_t step = 0;  // global step counter, from 0
  std::size_t batch = 0; // samples in this global batch
  float lr = 0.1f;
  std::span<float> params; // this rank's replica
  // Writes into `grad` the gradient of (sum of the losses of batch samples [first, first + count)) / batch
  // and returns that loss sum; the time it takes is charged as this rank's compute.
  std::function<double(std::size_t first, std::size_t count, std::span<float> grad)> gradient;
  // The same with an explicit divisor and a call as each layer's slice of `grad` becomes final (last layer
  // first), for schemes that start exchanging before the backward pass ends. Its time is charged as compute,
  // so whatever `on_layer` does must be measured and taken back out of *compute by the scheme.
  std::function<double(std::size_t first, std::size_t count, double scale, std::span<float> grad,
                       const std::function<void(std::size_t layer)>& on_layer)>
      gradient_by_layer;
  // Ranks the step's exchanges run over, and this rank.
  int rank = 0;
  int size = 1;
  // Local work a scheme does besides the gradient (selection, encoding, summing what arrived) is a node's
  // compute too: run it through charged() so it lands in this rank's compute time.
  const compute_clock* clock = nullptr;
  double* compute = nullptr;
  // Set by the trainer when it dumps what a top-k selector sees: called after each sparsifier step, outside
  // the charged time, with the accumulator p = g + e the selector was given and the count it sent.
  std::function<void(std::span<const float> accumulator, std::size_t sent)> on_accumulator;
  template <class F>
  void charged(F&& f) const {
    const double t0 = clock->now();
    f();
    *compute += clock->now() - t0;
  }
};

// This rank's equal share of a batch: [begin, end).
inline std::pair<std::size_t, std::size_t> share_of(std::size_t batch, int rank, int size) {
  const auto r = static_cast<std::size_t>(rank), n = static_cast<std::size_t>(size);
  return {batch * r / n, batch * (r + 1) / n};
}

template <class Comm>
class scheme {
public:
  virtual ~scheme() = default;
  virtual void step(Comm& comm, step_env& env) = 0;
  // After the last step: completes what is pending (local SGD averages the steps since its last sync).
  virtual void finish(Comm&, step_env&) {}
  // Modelled seconds this rank's step takes on `net`, from the compute measured in it and the link load that
  // comm::simulated charged for it. Default: the exchange starts after the compute and nothing overlaps, so
  // the step is compute + the busier side of the link (the simulated clock's own rule).
  virtual double step_seconds(double compute, const commsgd::comm::traffic& load,
                              const commsgd::comm::network_model& net) const {
    return compute + commsgd::comm::busy_seconds(load, net);
  }
  // A model to evaluate: rank 0's replica unless a scheme keeps replicas apart (local SGD between averages).
  virtual std::span<const float> model(std::span<const float> params) const { return params; }
  // Extra text for the per-epoch line (clip counts, current interval, staleness).
  virtual std::string note() const { return {}; }
};

template <class Comm>
using scheme_ptr = std::unique_ptr<scheme<Comm>>;

} // namespace fmnist
