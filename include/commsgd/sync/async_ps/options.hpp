// sync::async_ps_options, and the check that refuses them before either role touches the communicator: the
// role picker checks too, so a bad option names itself rather than a role mismatch.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sync/sgd.hpp>

#include <limits>

namespace commsgd::inline v1::sync {

struct async_ps_options {
  float lr = 0.01f;               // (0, inf)
  int server = 0;                 // [0, size)
  int apply_after = 1;            // j: [1, workers = size - 1]
  bool staleness_scaling = false; // lr / max(tau, 1) per gradient
  int staleness_bound = -1;       // s: -1 for none, else [0, inf)
  int tag_base = -1;    // -1: four free tags (comm/tags.hpp); else [0, INT_MAX - 3], the four from it
  bool keep_log = true; // the server records every applied gradient
};

namespace detail {

template <comm::communicator C>
void check_async_ps_options(const C& c, const async_ps_options& o) {
  if (c.size() < 2)
    throw invalid_argument(commsgd::concat("async_ps: communicator size = ", c.size(),
                                           " is outside the allowed range [2, inf) (a server and a "
                                           "worker at least)"));
  check_learning_rate("lr", o.lr);
  commsgd::check_range("server", o.server, 0, c.size() - 1, commsgd::concat("[0, size = ", c.size(), ")"));
  commsgd::check_range("apply_after", o.apply_after, 1, c.size() - 1,
                       commsgd::concat("[1, workers = ", c.size() - 1, "]"));
  commsgd::check_range("staleness_bound", o.staleness_bound, -1, std::numeric_limits<int>::max(),
                       "-1 (none) or [0, inf)");
  commsgd::check_range("tag_base", o.tag_base, -1, std::numeric_limits<int>::max() - 3,
                       "-1 (four free tags) or [0, INT_MAX - 3]");
}

} // namespace detail

} // namespace commsgd::inline v1::sync
