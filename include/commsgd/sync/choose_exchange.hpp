// The automatic choice of exchange (choose_from_plans.hpp) made collectively, so every rank runs the same
// one.
//
// Every rank measures its own step, so predictions differ between ranks; a synchronous step waits for its
// slowest rank, so each candidate is judged by its largest prediction over the ranks, and the rule then runs
// on numbers every rank holds identically: every rank returns the same choice, bit for bit.
//
// Errors: the settings (candidate names, network, margin) are checked on every rank before any message, so
// settings that are bad everywhere raise invalid_argument everywhere without a message. A profile one rank
// alone gets wrong is agreed on: every rank raises, the rank at fault with its own message.
//
// A data_parallel trainer (which fixes its exchange in its type, so a switch is a new trainer over the same
// parameters) gets its profile and plans from sync/choose_from_steps.hpp: a step_timer around its dense
// steps, then choose_from_steps (or measure_choice_inputs and exchange_chooser::decide), with every plan
// blocking as data_parallel's step is. tests/unit/sync_choose_from_steps.cpp profiles dense, switches to
// the chosen composition through a std::variant, keeps the strategy's state and trains on, with identical
// replicas on every rank, and resumes the switched run from a checkpoint.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sync/choose_from_plans.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

namespace commsgd::inline v1::sync {

namespace detail {

// What every rank must share: the candidates by name, blocking flag and steps factor, the network and the
// margin.
inline std::uint64_t choice_fingerprint(std::span<const candidate_plan> plans, const comm::network_model& net,
                                        double margin) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto mix = [&h](std::uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  for (const auto& p : plans) {
    for (char ch : p.name)
      mix(static_cast<unsigned char>(ch));
    mix(p.blocking ? 0x100 : 0x200);
    mix(std::bit_cast<std::uint64_t>(p.steps_factor));
  }
  mix(std::bit_cast<std::uint64_t>(net.latency_s));
  mix(std::bit_cast<std::uint64_t>(net.bandwidth_bytes_per_s));
  mix(std::bit_cast<std::uint64_t>(margin));
  return h;
}

} // namespace detail

// Collective over `comm`: every rank passes the same candidates, network and margin, and its own profile
// and compute; all return the same choice, predicted for comm.size() ranks.
template <comm::communicator C>
exchange_choice choose_exchange(C& comm, const base_profile& profile,
                                std::span<const candidate_plan> candidates, const comm::network_model& net,
                                double margin = default_choice_margin) {
  // Settings first, before any message.
  cost::check_network(net);
  detail::check_margin(margin);
  const auto [all, dense] = detail::with_dense(candidates);
  for (const auto& p : all)
    detail::check_factor(p.name, p.steps_factor);

  // This rank's predictions, or the error its profile raises, held back until every rank knows.
  std::vector<double> mine(all.size(), 0.0);
  std::exception_ptr failed;
  try {
    for (std::size_t i = 0; i < all.size(); ++i)
      mine[i] = predicted_step(all[i], profile, comm.size(), net);
  } catch (const invalid_argument&) {
    failed = std::current_exception();
  }
  const auto n = static_cast<std::size_t>(comm.size());
  const std::array<std::uint64_t, 3> verdict{failed ? 1u : 0u, all.size(),
                                             detail::choice_fingerprint(all, net, margin)};
  std::vector<std::uint64_t> verdicts(3 * n);
  comm.all_gather(std::span<const std::uint64_t>(verdict), std::span<std::uint64_t>(verdicts));
  for (std::size_t r = 0; r < n; ++r)
    if (verdicts[3 * r + 1] != verdict[1] || verdicts[3 * r + 2] != verdict[2])
      throw invalid_argument(
          commsgd::concat("choose_exchange: ranks disagree on the candidates, network or margin (rank ", r,
                          " differs from rank ", comm.rank(), "); pass the same settings on every rank"));
  for (std::size_t r = 0; r < n; ++r) {
    if (verdicts[3 * r] == 0) continue;
    if (failed) std::rethrow_exception(failed);
    throw invalid_argument(
        commsgd::concat("choose_exchange: rank ", r, " refused its profile (its own error says why)"));
  }

  std::vector<double> every(all.size() * n);
  comm.all_gather(std::span<const double>(mine), std::span<double>(every));
  std::vector<double> slowest(all.size(), 0.0);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < all.size(); ++i)
      slowest[i] = std::max(slowest[i], every[r * all.size() + i]);
  std::vector<std::string> names;
  std::vector<double> factors;
  for (const auto& p : all) {
    names.push_back(p.name);
    factors.push_back(p.steps_factor);
  }
  return pick(std::move(names), std::move(slowest), dense, margin, std::move(factors));
}

} // namespace commsgd::inline v1::sync
