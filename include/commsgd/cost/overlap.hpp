// The step time of DDP-style training, where bucket exchanges overlap what is left of backward.
//
// PyTorch's reducer calls a bucket's communication hook as soon as backward has produced the bucket. What
// the hook does before it returns runs on the backward thread and so delays every later bucket; what it
// starts runs off that thread, one bucket after another in bucket order (one process group, one stream);
// the optimizer waits for backward and for every exchange. Per step, with delay the backward time hooks
// have added so far and chain the time the previous bucket's exchange is done:
//
//   non-blocking hook (returns a future):        blocking hook (returns when its exchange is done):
//     r     = ready_i + delay                      r     = ready_i + delay
//     delay += call_i                              delay += call_i + async_i + exchange_i
//     start = max(r + call_i, chain)               chain = r + call_i + async_i + exchange_i
//     chain = start + async_i + exchange_i
//
//   backward_end = backward_s + delay,  total = forward_s + max(backward_end, chain) + optimizer_s.
//
// So an exchange costs a step only the part of it that outlasts the rest of backward; a blocking hook pays
// all of it. A rank's own compute (encode, decode, the products of PowerSGD) counts like network time
// here: on one device it holds the exchange chain back just the same.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace commsgd::inline v1::cost {

struct bucket_timing {
  double ready_s = 0;    // when backward has produced the bucket, from backward's start, without hook delays
  double call_s = 0;     // the hook's synchronous part, on the backward thread
  double async_s = 0;    // the hook's local compute off the backward thread (encode, decode, products)
  double exchange_s = 0; // network seconds of its rounds
};

struct step_profile {
  double forward_s = 0;
  double backward_s = 0; // backward alone, without any hook
  double optimizer_s = 0;
  std::vector<bucket_timing> buckets; // in the order their hooks are called
};

struct step_breakdown {
  double total_s = 0;        // forward, backward with its hooks, the wait for the last exchange, optimizer
  double backward_end_s = 0; // from backward's start: backward plus what hooks added on its thread
  double exchange_end_s = 0; // from backward's start: when the last bucket's exchange is done
  // What communication adds to a step: total_s less forward, backward, optimizer and every hook's
  // synchronous part (work a step does with or without a network).
  double exposed_s = 0;
};

namespace detail {

inline void check_seconds(std::string_view name, double v) {
  if (!(std::isfinite(v) && v >= 0))
    throw invalid_argument(
        commsgd::concat("argument '", name, "' = ", v, " is outside the allowed range [0, inf)"));
}

inline void check_profile(const step_profile& p) {
  check_seconds("forward_s", p.forward_s);
  check_seconds("backward_s", p.backward_s);
  check_seconds("optimizer_s", p.optimizer_s);
  double previous = 0;
  for (std::size_t i = 0; i < p.buckets.size(); ++i) {
    const auto& b = p.buckets[i];
    const auto field = [i](const char* f) { return commsgd::concat("buckets[", i, "].", f); };
    check_seconds(field("call_s"), b.call_s);
    check_seconds(field("async_s"), b.async_s);
    check_seconds(field("exchange_s"), b.exchange_s);
    // Hooks fire in bucket order, so a bucket cannot be ready before the one called ahead of it.
    if (!(b.ready_s >= previous && b.ready_s <= p.backward_s))
      throw invalid_argument(commsgd::concat(
          "argument '", field("ready_s"), "' = ", b.ready_s, " is outside the allowed range [",
          i == 0 ? std::string("0") : commsgd::concat(previous, " (the previous bucket's ready_s)"),
          ", backward_s = ", p.backward_s, "]"));
    previous = b.ready_s;
  }
}

} // namespace detail

inline step_breakdown overlapped_step(const step_profile& p, bool blocking = false) {
  detail::check_profile(p);
  double delay = 0, chain = 0, calls = 0;
  for (const auto& b : p.buckets) {
    const double r = b.ready_s + delay;
    calls += b.call_s;
    if (blocking) {
      const double done = r + b.call_s + b.async_s + b.exchange_s;
      delay += b.call_s + b.async_s + b.exchange_s;
      chain = done;
    } else {
      delay += b.call_s;
      const double start = std::max(r + b.call_s, chain);
      chain = start + b.async_s + b.exchange_s;
    }
  }
  step_breakdown s;
  s.backward_end_s = p.backward_s + delay;
  s.exchange_end_s = chain;
  s.total_s = p.forward_s + std::max(s.backward_end_s, chain) + p.optimizer_s;
  // max() keeps rounding from reporting a negative exposure when nothing is exposed.
  s.exposed_s = std::max(0.0, s.total_s - (p.forward_s + p.backward_s + p.optimizer_s + calls));
  return s;
}

} // namespace commsgd::inline v1::cost
