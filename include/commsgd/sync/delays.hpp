// sync::delay_model: seeded straggler delays, the same on every rank and after a resume.
//
// A delay is the extra time a rank takes on a step before its answer can leave, on top of its compute. It is
// a pure function of (seed, step, rank), drawn from a counter-based generator, so every rank can evaluate
// every other rank's delay, two runs with one seed see the same stragglers, and a checkpoint needs no
// generator state. Delays are in units of `unit_s` (the strategy passes the step's compute time, or a fixed
// unit), so "5x slower" stays 5x whatever the hardware:
//   none                 0
//   slow_node            rank `node` takes `factor` x the unit: (factor - 1) unit; others 0
//   shifted_exponential  every rank: Exp with mean `mean` units (the shift is the compute itself)
//   pareto               every rank: a Lomax (shifted Pareto) tail with index `shape` > 1 and mean `mean`
//                        units, unit mean (shape - 1) (U^(-1/shape) - 1): heavier than exponential
//   stop                 rank `node` never answers from step `from_step` on (+inf); others 0
// How a delay is spent is the exchange's business: a real sleep over comm::local and comm::mpi, a charge on
// the virtual clock over comm::simulated (sync/first_arrivals.hpp).
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/mix.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

namespace commsgd::inline v1::sync {

enum class delay_kind : std::uint32_t { none, slow_node, shifted_exponential, pareto, stop };

inline constexpr const char* delay_kind_name(delay_kind k) noexcept {
  switch (k) {
  case delay_kind::none:
    return "none";
  case delay_kind::slow_node:
    return "slow_node";
  case delay_kind::shifted_exponential:
    return "shifted_exponential";
  case delay_kind::pareto:
    return "pareto";
  case delay_kind::stop:
    return "stop";
  }
  return "unknown";
}

struct delay_model {
  delay_kind kind = delay_kind::none;
  int node = 0;                // slow_node, stop: the rank it applies to
  double factor = 5.0;         // slow_node: [1, inf)
  double mean = 1.0;           // shifted_exponential, pareto: mean delay in units, [0, inf)
  double shape = 2.0;          // pareto: tail index, (1, inf)
  std::uint64_t from_step = 0; // stop: the first step the node misses
  std::uint64_t seed = 0;

  friend bool operator==(const delay_model&, const delay_model&) = default;

  // Extra seconds `rank` takes on `step` when a unit is `unit_s` seconds; +inf: it never answers.
  double delay(std::uint64_t step, int rank, double unit_s) const noexcept {
    switch (kind) {
    case delay_kind::none:
      return 0.0;
    case delay_kind::slow_node:
      return rank == node ? (factor - 1.0) * unit_s : 0.0;
    case delay_kind::stop:
      return rank == node && step >= from_step ? std::numeric_limits<double>::infinity() : 0.0;
    case delay_kind::shifted_exponential:
      return -std::log(uniform(step, rank)) * mean * unit_s;
    case delay_kind::pareto:
      return mean * (shape - 1.0) * (std::pow(uniform(step, rank), -1.0 / shape) - 1.0) * unit_s;
    }
    return 0.0;
  }

  // Checks the fields the kind reads; n is the group size.
  void validate(int n) const {
    using commsgd::concat;
    if (static_cast<std::uint32_t>(kind) > static_cast<std::uint32_t>(delay_kind::stop))
      throw invalid_argument(concat("delay_model: 'kind' = ", static_cast<std::uint32_t>(kind),
                                    " is outside the allowed range [0, 4]"));
    if (kind == delay_kind::slow_node || kind == delay_kind::stop)
      commsgd::check_range("delay_model.node", node, 0, n - 1, concat("[0, n - 1 = ", n - 1, "]"));
    if (kind == delay_kind::slow_node && !(std::isfinite(factor) && factor >= 1.0))
      throw invalid_argument(
          concat("delay_model: 'factor' = ", factor, " is outside the allowed range [1, inf)"));
    if ((kind == delay_kind::shifted_exponential || kind == delay_kind::pareto) &&
        !(std::isfinite(mean) && mean >= 0.0))
      throw invalid_argument(
          concat("delay_model: 'mean' = ", mean, " is outside the allowed range [0, inf)"));
    if (kind == delay_kind::pareto && !(std::isfinite(shape) && shape > 1.0))
      throw invalid_argument(
          concat("delay_model: 'shape' = ", shape, " is outside the allowed range (1, inf)"));
  }

private:
  // Uniform in (0, 1], from (seed, step, rank) alone.
  double uniform(std::uint64_t step, int rank) const noexcept {
    std::uint64_t x = seed ^ (step * commsgd::golden_gamma) ^ (static_cast<std::uint64_t>(rank) << 48) ^
                      (static_cast<std::uint64_t>(kind) << 56);
    x = commsgd::mix64(commsgd::mix64(x));
    return (static_cast<double>(x >> 11) + 1.0) * 0x1.0p-53;
  }
};

} // namespace commsgd::inline v1::sync
