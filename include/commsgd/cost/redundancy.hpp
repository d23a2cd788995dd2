// Choosing CSSGD's redundancy r: compute grows with r, communication is whatever the cost model says.
//
// With equal blocks a node computes r/n of the batch, so compute(r) = r * T_calc with T_calc the time of
// 1/n of the batch. CSSGD's own estimate models the step as T(r) = r * T_calc + T_comm / r, which holds only
// for what a node transmits on a multicast medium; a node still receives r * C(n-1, r) packets of d/r
// values, i.e. C(n-1, r) * d values, which grows with r until r passes n/2. This chooser uses the cost model
// (cost/time.hpp) for the communication, reports that estimate beside it, and compares the best r with
// plain data parallelism over ring all-reduce. Computation and communication are not overlapped.
#pragma once

#include <commsgd/coding/assignment.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/cost/time.hpp>
#include <commsgd/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace commsgd::inline v1::cost {

struct step_model {
  int n = 1;                             // nodes
  std::uint64_t d = 0;                   // gradient length in values
  std::size_t element_size = 4;          // bytes per value
  std::size_t batch = 1;                 // samples per mini-batch, all nodes together
  double compute_seconds_per_sample = 0; // one node's measured forward + backward time per sample
  comm::network_model network{};
};

struct redundancy_option {
  int r = 1;
  double compute_s = 0;
  double comm_s = 0;        // the cost model, slowest node
  double total_s = 0;       // compute_s + comm_s
  double paper_total_s = 0; // r * T_calc + T_comm(r = 1) / r, for comparison only
};

struct redundancy_plan {
  std::vector<redundancy_option> cssgd; // r = 1 .. n
  double ring_compute_s = 0;
  double ring_comm_s = 0;
  double ring_total_s = 0;
  int best_r = 1; // best CSSGD redundancy
  double best_total_s = 0;
  bool ring_is_better = false; // uncoded ring all-reduce beats every r
};

inline redundancy_plan choose_redundancy(const step_model& m) {
  commsgd::coding::check_nodes_and_redundancy(m.n, 1);
  m.network.validate();
  if (!(std::isfinite(m.compute_seconds_per_sample) && m.compute_seconds_per_sample >= 0))
    throw invalid_argument(
        commsgd::concat("argument 'compute_seconds_per_sample' = ", m.compute_seconds_per_sample,
                        " is outside the allowed range [0, inf)"));
  redundancy_plan plan;
  const double t_calc = m.compute_seconds_per_sample * static_cast<double>(m.batch) / m.n;
  const double comm_r1 =
      exchange_seconds_slowest(exchange_kind::cssgd, m.n, 1, m.d, m.element_size, m.network);
  plan.best_total_s = std::numeric_limits<double>::infinity();
  for (int r = 1; r <= m.n; ++r) {
    // Past the supported number of blocks the configuration cannot run, so it cannot be the answer.
    if (coding::binomial(m.n, r) > coding::max_blocks || coding::binomial(m.n, r + 1) > coding::max_blocks)
      continue;
    redundancy_option o;
    o.r = r;
    o.compute_s = r * t_calc;
    o.comm_s = exchange_seconds_slowest(exchange_kind::cssgd, m.n, r, m.d, m.element_size, m.network);
    o.total_s = o.compute_s + o.comm_s;
    o.paper_total_s = r * t_calc + comm_r1 / r;
    if (o.total_s < plan.best_total_s) {
      plan.best_total_s = o.total_s;
      plan.best_r = r;
    }
    plan.cssgd.push_back(o);
  }
  plan.ring_compute_s = t_calc;
  plan.ring_comm_s =
      exchange_seconds_slowest(exchange_kind::ring_all_reduce, m.n, 1, m.d, m.element_size, m.network);
  plan.ring_total_s = plan.ring_compute_s + plan.ring_comm_s;
  plan.ring_is_better = plan.ring_total_s < plan.best_total_s;
  return plan;
}

} // namespace commsgd::inline v1::cost
