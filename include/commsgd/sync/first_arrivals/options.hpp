// sync::first_arrivals_options and round_report, and the check that refuses bad options before the strategy
// reserves tags on the communicator, so a bad option names itself.
#pragma once

#include <commsgd/coding/gradient_code.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sync/delays.hpp>
#include <commsgd/sync/sgd.hpp>

#include <cmath>
#include <cstdint>

namespace commsgd::inline v1::sync {

struct first_arrivals_options {
  float lr = 0.01f;        // (0, inf)
  delay_model delays{};    // injected straggler delays (none by default)
  double unit_s = 0.0;     // seconds of one delay unit when step_info::compute_seconds is not given
  double timeout_s = 30.0; // real seconds the root waits for n - s answers, and a rank for the sum; (0, inf)
  int root = 0;            // the decoding rank, [0, n)
  int tag_base = -1;       // first of 2 tags; -1: reserved on the communicator (comm/tags.hpp)
};

// What the last round did, as this rank saw it.
struct round_report {
  std::uint64_t round = 0;
  coding::node_set responders = 0; // the first n - s to answer, the root's choice (every rank learns it)
  coding::node_set used = 0;       // the responders the decode read
  std::uint64_t late = 0;          // root: messages of earlier rounds drained during this round
  bool sent = false;               // this rank's vector took part (false: late or stopped)
  double delay_s = 0.0;            // the delay drawn for this rank
};

namespace detail {

// `n` is the communicator's size.
inline void check_first_arrivals_options(const first_arrivals_options& o, int n) {
  check_learning_rate("lr", o.lr);
  commsgd::check_range("root", o.root, 0, n - 1, commsgd::concat("[0, n - 1 = ", n - 1, "]"));
  if (!(std::isfinite(o.timeout_s) && o.timeout_s > 0))
    throw invalid_argument(
        commsgd::concat("argument 'timeout_s' = ", o.timeout_s, " is outside the allowed range (0, inf)"));
  if (!(std::isfinite(o.unit_s) && o.unit_s >= 0))
    throw invalid_argument(
        commsgd::concat("argument 'unit_s' = ", o.unit_s, " is outside the allowed range [0, inf)"));
  o.delays.validate(n);
}

} // namespace detail

} // namespace commsgd::inline v1::sync
