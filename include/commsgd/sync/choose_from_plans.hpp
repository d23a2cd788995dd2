// The automatic choice of exchange on one rank, from candidate plans and a measured profile: predict every
// candidate's step (the step model of cost/overlap.hpp) from its network seconds per bucket
// (cost/candidate.hpp), and keep dense unless another is clearly faster. choose_exchange.hpp makes the same
// choice collectively, choose_from_steps.hpp from a data_parallel trainer's timed steps, and
// choose_with_history.hpp (sync::exchange_chooser) keeps every decision and saves it.
//
// A compressor that does not pay is a cost, so the rule is lopsided on purpose: a candidate other than
// dense wins only if its predicted step is below dense's times (1 - margin). The margin absorbs what the
// model leaves out (jitter, a peer's slower compute), so the choice never predicts a slower step than
// dense and turning it on is safe.
//
// Step time is not the whole story: a compressed exchange may need more steps to reach an accuracy (top-k
// lags dense in the first epochs). Each plan carries a steps factor, the steps it needs over dense's (a
// prior the caller measured or states, 1 by default), and the rule weighs step x factor: seconds to the same
// accuracy in units of dense steps.
#pragma once

#include <commsgd/comm/simulated.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/candidate.hpp>
#include <commsgd/cost/overlap.hpp>
#include <commsgd/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace commsgd::inline v1::sync {

// What a run measured with the dense exchange, per step: the phases and, per bucket, when backward had it
// and its shape.
struct base_profile {
  double forward_s = 0;
  double backward_s = 0; // without hooks
  double optimizer_s = 0;
  std::vector<double> ready_s;
  std::vector<cost::bucket_shape> shapes; // one per bucket, like ready_s
};

// A rank's own work for one bucket under a candidate (encode, decode, products); dense's is what was
// measured around the dense hook.
struct local_compute {
  double call_s = 0;  // on the backward thread
  double async_s = 0; // off it
};

struct candidate_plan {
  std::string name;
  std::vector<local_compute> compute; // one per bucket; empty: none
  bool blocking = false;              // the hook returns only when its exchange is done
  double steps_factor = 1.0;          // steps to an accuracy over dense's, in (0, inf)
};

struct exchange_choice {
  std::size_t index = 0;          // into names
  std::string name;               // names[index]
  std::vector<std::string> names; // the candidates weighed, dense among them
  std::vector<double> predicted;  // seconds a step, per candidate
  std::vector<double> factors;    // its steps factor, per candidate
  std::string reason;

  // What the rule compares: seconds a step times the steps factor.
  double weighed(std::size_t i) const { return predicted[i] * factors[i]; }
};

inline constexpr double default_choice_margin = 0.05;

namespace detail {

inline std::string milliseconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
  return buf;
}

inline void check_margin(double margin) {
  if (!(margin >= 0 && margin < 1))
    throw invalid_argument(
        commsgd::concat("argument 'margin' = ", margin, " is outside the allowed range [0, 1)"));
}

inline void check_base(const base_profile& p) {
  if (p.ready_s.size() != p.shapes.size())
    throw size_mismatch(commsgd::concat("argument 'profile' has ", p.ready_s.size(), " ready times and ",
                                        p.shapes.size(), " bucket shapes; give one of each per bucket"));
  for (const auto& s : p.shapes)
    cost::check_shape(s);
}

inline std::string choice_reason(const exchange_choice& c, std::size_t dense, double margin) {
  const auto one = [&](std::size_t i) {
    char f[32];
    std::snprintf(f, sizeof f, " x %.3g steps", c.factors[i]);
    return milliseconds(c.predicted[i]) + (c.factors[i] != 1.0 ? f : "");
  };
  const double base = c.weighed(dense);
  char buf[64];
  std::string out;
  if (c.index == dense) {
    std::snprintf(buf, sizeof buf, "%g", margin);
    out = "dense: " + one(dense) + " a step; no other candidate below dense x (1 - " + buf +
          ") = " + milliseconds(base * (1 - margin));
  } else {
    std::snprintf(buf, sizeof buf, "%.2fx", base / c.weighed(c.index));
    out = c.name + ": " + one(c.index) + " a step against dense " + one(dense) + " (" + buf + ")";
  }
  const char* separator = "; ";
  for (std::size_t i = 0; i < c.names.size(); ++i)
    if (i != c.index && i != dense) {
      out += separator + c.names[i] + " " + one(i);
      separator = ", ";
    }
  return out;
}

inline void check_factor(const std::string& name, double f) {
  if (!(std::isfinite(f) && f > 0))
    throw invalid_argument(commsgd::concat("argument 'steps_factor' of '", name, "' = ", f,
                                           " is outside the allowed range (0, inf)"));
}

// The plans with dense added (no compute, overlapped) where absent, and dense's index; every name is
// parsed, so an unknown one is refused here, and a repeated one too.
inline std::pair<std::vector<candidate_plan>, std::size_t> with_dense(std::span<const candidate_plan> plans) {
  std::vector<candidate_plan> all(plans.begin(), plans.end());
  std::size_t dense = all.size();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (cost::parse_candidate(all[i].name).kind == cost::candidate_kind::dense && dense == all.size())
      dense = i;
    for (std::size_t j = 0; j < i; ++j)
      if (all[j].name == all[i].name)
        throw invalid_argument(commsgd::concat("argument 'candidates' names '", all[i].name,
                                               "' twice; name each candidate once"));
  }
  if (dense == all.size()) all.push_back({"dense", {}, false, 1.0});
  return {std::move(all), dense};
}

} // namespace detail

// The rule alone, on predictions already made: the least weighed (step x steps factor; factors empty: all
// 1), but a candidate other than names[dense] only below dense's x (1 - margin). A collective choice
// applies it to predictions every rank agrees on.
inline exchange_choice pick(std::vector<std::string> names, std::vector<double> predicted, std::size_t dense,
                            double margin, std::vector<double> factors = {}) {
  detail::check_margin(margin);
  if (factors.empty()) factors.assign(names.size(), 1.0);
  if (names.size() != predicted.size() || names.size() != factors.size() || dense >= names.size())
    throw size_mismatch(commsgd::concat("pick: ", names.size(), " names, ", predicted.size(),
                                        " predictions, ", factors.size(), " factors and dense at ", dense,
                                        " do not match"));
  for (std::size_t i = 0; i < names.size(); ++i)
    detail::check_factor(names[i], factors[i]);
  exchange_choice c;
  c.names = std::move(names);
  c.predicted = std::move(predicted);
  c.factors = std::move(factors);
  c.index = dense;
  const double bar = c.weighed(dense) * (1 - margin);
  for (std::size_t i = 0; i < c.names.size(); ++i)
    if (i != dense && c.weighed(i) < bar && c.weighed(i) < c.weighed(c.index)) c.index = i;
  c.name = c.names[c.index];
  c.reason = detail::choice_reason(c, dense, margin);
  return c;
}

// The step `plan` predicts on `profile` over n ranks.
inline double predicted_step(const candidate_plan& plan, const base_profile& profile, int n,
                             const comm::network_model& net) {
  detail::check_base(profile);
  const cost::candidate c = cost::parse_candidate(plan.name);
  const auto buckets = profile.shapes.size();
  if (!plan.compute.empty() && plan.compute.size() != buckets)
    throw size_mismatch(commsgd::concat("argument 'compute' of '", plan.name, "' has ", plan.compute.size(),
                                        " buckets, the profile has ", buckets));
  cost::step_profile s{profile.forward_s, profile.backward_s, profile.optimizer_s, {}};
  s.buckets.reserve(buckets);
  for (std::size_t b = 0; b < buckets; ++b) {
    const local_compute w = plan.compute.empty() ? local_compute{} : plan.compute[b];
    s.buckets.push_back(
        {profile.ready_s[b], w.call_s, w.async_s, cost::exchange_seconds(c, profile.shapes[b], n, net)});
  }
  return cost::overlapped_step(s, plan.blocking).total_s;
}

// Weighs every plan (dense is added, measured compute none, when absent) and picks by the rule above.
inline exchange_choice choose(std::span<const candidate_plan> plans, const base_profile& profile, int n,
                              const comm::network_model& net, double margin = default_choice_margin) {
  cost::check_ranks(n);
  cost::check_network(net);
  detail::check_margin(margin);
  detail::check_base(profile);
  const auto [all, dense] = detail::with_dense(plans);
  std::vector<std::string> names;
  std::vector<double> predicted, factors;
  for (const auto& p : all) {
    names.push_back(p.name);
    predicted.push_back(predicted_step(p, profile, n, net));
    factors.push_back(p.steps_factor);
  }
  return pick(std::move(names), std::move(predicted), dense, margin, std::move(factors));
}

} // namespace commsgd::inline v1::sync
