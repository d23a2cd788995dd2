// The server's log: one entry per applied gradient, kept (options::keep_log) so that a run's staleness and
// ordering can be checked afterwards; checkpoints carry it, so a resumed server's log goes on.
#pragma once

#include <cstdint>

namespace commsgd::inline v1::sync {

// One gradient as the server applied it.
struct applied_update {
  int worker = 0;               // rank that pushed it
  std::int64_t step = 0;        // that worker's push count before this push (its step index)
  std::int64_t computed_on = 0; // version the worker computed the gradient on
  std::int64_t applied_at = 0;  // server version when applied (the update makes it applied_at + 1)
  std::int64_t staleness = 0;   // applied_at - computed_on
  std::int64_t arrival = 0;     // position in the server's arrival order
  float factor = 0.0f;          // what the gradient was multiplied by: lr (/ tau) / batch
};

} // namespace commsgd::inline v1::sync
