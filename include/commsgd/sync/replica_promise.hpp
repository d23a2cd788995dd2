// sync::replica_promise<S>: whether strategy S promises every rank the same model bits after a step
// (after_step) and after finish (after_finish). sync::replica_guard checks only where a promise holds.
// Each strategy specialises it in its own header, beside the code whose behaviour the promise states;
// a strategy written elsewhere does the same. Unknown strategies promise nothing, so the guard never checks
// them.
#pragma once

#include <commsgd/sync/strategy.hpp>

namespace commsgd::inline v1::sync {

template <class S>
struct replica_promise {
  static bool after_step(const S&, const step_result&) { return false; }
  static bool after_finish(const S&) { return false; }
};

} // namespace commsgd::inline v1::sync
