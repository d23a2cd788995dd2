// sync::exchange_chooser: the collective choice of exchange (choose_exchange.hpp) with its history, for a
// trainer that decides after a few profiled steps and may decide again later (the network or the model's
// phase changes). It keeps a log of every decision and saves it, and the current choice, in a checkpoint,
// so a resumed run goes on with the exchange it had and can say why.
//
//   sync::exchange_chooser chooser({.network = {50e-6, 125e6}});
//   ... steps with the dense exchange, timed ...
//   const auto& c = chooser.decide(comm, profile, plans, step);   // every rank, same result
//   if (c.name == "fp16") ...                                      // build the trainer it names
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/candidate.hpp>
#include <commsgd/state/stream.hpp>
#include <commsgd/sync/choose_exchange.hpp>
#include <commsgd/sync/choose_from_plans.hpp>

#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <string>
#include <vector>

namespace commsgd::inline v1::sync {

struct exchange_chooser_options {
  comm::network_model network{}; // the network the choice plans for: latency >= 0, bandwidth in (0, inf]
  double margin = default_choice_margin; // [0, 1)
};

// One decision: when, what was weighed and predicted, and what won.
struct choice_record {
  std::uint64_t step = 0;
  std::string choice;
  std::vector<std::string> names;
  std::vector<double> predicted; // seconds a step, per name
  std::string reason;

  friend bool operator==(const choice_record&, const choice_record&) = default;
};

class exchange_chooser {
public:
  explicit exchange_chooser(exchange_chooser_options o = {}) : opt_(o) {
    cost::check_network(opt_.network);
    detail::check_margin(opt_.margin);
  }

  const exchange_chooser_options& options() const noexcept { return opt_; }
  // "dense" until the first decision.
  const std::string& current() const noexcept { return current_; }
  const std::vector<choice_record>& log() const noexcept { return log_; }

  // Collective: every rank passes the same plans (names and blocking flags) and its own measured profile.
  template <comm::communicator C>
  const choice_record& decide(C& comm, const base_profile& profile, std::span<const candidate_plan> plans,
                              std::uint64_t step) {
    auto c = choose_exchange(comm, profile, plans, opt_.network, opt_.margin);
    current_ = c.name;
    log_.push_back(
        {step, std::move(c.name), std::move(c.names), std::move(c.predicted), std::move(c.reason)});
    return log_.back();
  }

  // The choice and the log are the same on every rank, so this is shared state: rank 0 alone may save it.
  void save(std::ostream& os) const {
    state::writer w(kind);
    w.put<double>(opt_.network.latency_s);
    w.put<double>(opt_.network.bandwidth_bytes_per_s);
    w.put<double>(opt_.margin);
    w.put_string(current_);
    w.put<std::uint64_t>(log_.size());
    for (const auto& r : log_) {
      w.put<std::uint64_t>(r.step);
      w.put_string(r.choice);
      w.put<std::uint64_t>(r.names.size());
      for (const auto& n : r.names)
        w.put_string(n);
      w.put_array(std::span<const double>(r.predicted));
      w.put_string(r.reason);
    }
    state::write_frame(os, std::move(w).finish());
  }

  // Restores the choice and the log. The settings stay this object's own (a resumed run may plan for
  // another network), but a saved choice must still be a known exchange.
  void load(std::istream& is) {
    const auto blob = state::read_frame(is);
    state::reader rd(blob, kind);
    rd.get<double>(); // the saved network and margin, kept for a reader of the stream
    rd.get<double>();
    rd.get<double>();
    std::string current(rd.get_string());
    const auto count = rd.get<std::uint64_t>();
    // Every record takes at least 40 bytes, so a corrupt count cannot make us reserve absurd memory.
    if (count > rd.remaining() / 40)
      throw corrupt_data("saved state: the exchange chooser's log runs past the stream");
    std::vector<choice_record> log(static_cast<std::size_t>(count));
    for (auto& r : log) {
      r.step = rd.get<std::uint64_t>();
      r.choice = std::string(rd.get_string());
      const auto names = rd.get<std::uint64_t>();
      if (names > rd.remaining() / 8)
        throw corrupt_data("saved state: the exchange chooser's log runs past the stream");
      for (std::uint64_t i = 0; i < names; ++i)
        r.names.emplace_back(rd.get_string());
      r.predicted = rd.get_vector<double>();
      r.reason = std::string(rd.get_string());
      if (r.predicted.size() != r.names.size())
        throw corrupt_data("saved state: a decision of the exchange chooser has names and predictions that "
                           "differ in number");
    }
    rd.expect_end();
    try {
      cost::parse_candidate(current);
    } catch (const invalid_argument&) {
      throw corrupt_data(commsgd::concat("saved state: the exchange chooser's choice '", current,
                                         "' is not a known exchange"));
    }
    current_ = std::move(current);
    log_ = std::move(log);
  }

private:
  static constexpr const char* kind = "sync::exchange_chooser";

  exchange_chooser_options opt_;
  std::string current_ = "dense";
  std::vector<choice_record> log_;
};

} // namespace commsgd::inline v1::sync
