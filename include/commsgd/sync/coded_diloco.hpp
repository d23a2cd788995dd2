// sync::coded_diloco: sync::diloco with its pseudo-gradient code chosen at run time, for hosts that take it
// from a flag or a Python argument (commsgd_torch.DiLoCo, the benchmarks, the examples): constructed from
// sync::diloco_code::parse("int8"), "topk-0.01", ... Parsing the names and making the engine of each code are
// the registry's (sync/diloco_codes.hpp); this class holds that engine and forwards every call to it (see
// sync/diloco.hpp for what they do).
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/sync/diloco.hpp>
#include <commsgd/sync/diloco_codes.hpp>
#include <commsgd/sync/strategy.hpp>

#include <cstddef>
#include <cstdint>
#include <istream>
#include <numeric>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace commsgd::inline v1::sync {

template <comm::communicator C>
class coded_diloco {
public:
  using engine = diloco_engine<C>;

  // A -fit code is chosen here, once, for the sum of the layers over c's ranks (diloco_code::chosen).
  coded_diloco(C& c, std::vector<std::size_t> layer_sizes, diloco_options o, diloco_code code)
      : code_(
            code.chosen(std::accumulate(layer_sizes.begin(), layer_sizes.end(), std::uint64_t{0}), c.size())),
        e_(make_diloco_engine(c, std::move(layer_sizes), o, code_)) {}

  // The code this engine runs: the one a -fit code chose.
  const diloco_code& code() const noexcept { return code_; }

  void start(std::span<float> params, bool broadcast = true) {
    visit([&](auto& s) { s.start(params, broadcast); });
  }
  step_result step(std::span<float> params, std::span<const float> grad, const step_info& info = {}) {
    return visit([&](auto& s) { return s.step(params, grad, info); });
  }
  bool computes_gradients() const { return true; }
  step_result advance(std::span<float> params) {
    return visit([&](auto& s) { return s.advance(params); });
  }
  void finish(std::span<float> params) {
    visit([&](auto& s) { s.finish(params); });
  }
  void set_weight(float w) {
    visit([&](auto& s) { s.set_weight(w); });
  }
  float weight() const {
    return visit([](const auto& s) { return s.weight(); });
  }

  void drain() noexcept {
    visit([](auto& s) { s.drain(); });
  }
  void rebind(C& c) {
    visit([&](auto& s) { s.rebind(c); });
  }
  bool starts_after(std::size_t p, std::int64_t s) const {
    return visit([&](const auto& e) { return e.starts_after(p, s); });
  }
  std::vector<std::size_t> touched_next() const {
    return visit([](const auto& s) { return s.touched_next(); });
  }
  std::vector<std::size_t> applied_next() const {
    return visit([](const auto& s) { return s.applied_next(); });
  }
  std::int64_t steps() const {
    return visit([](const auto& s) { return s.steps(); });
  }
  std::uint64_t bytes_sent() const {
    return visit([](const auto& s) { return s.bytes_sent(); });
  }
  std::uint64_t exchanges_started() const {
    return visit([](const auto& s) { return s.exchanges_started(); });
  }
  std::uint64_t exchanges_applied() const {
    return visit([](const auto& s) { return s.exchanges_applied(); });
  }
  std::size_t num_fragments() const {
    return visit([](const auto& s) { return s.num_fragments(); });
  }
  std::span<const std::pair<std::size_t, std::size_t>> fragment_runs(std::size_t p) const {
    return visit([&](const auto& s) { return s.fragment_runs(p); });
  }
  std::size_t fragment_length(std::size_t p) const {
    return visit([&](const auto& s) { return s.fragment_length(p); });
  }
  std::span<const float> global_model(std::size_t p) const {
    return visit([&](const auto& s) { return s.global_model(p); });
  }
  std::span<const float> outer_velocity(std::size_t p) const {
    return visit([&](const auto& s) { return s.outer(p).velocity(); });
  }
  bool in_flight(std::size_t p) const {
    return visit([&](const auto& s) { return s.in_flight(p); });
  }
  // Fragment p's residual (top-k: what it has not sent yet); empty for the other codes.
  std::span<const float> residual(std::size_t p) const {
    return visit([&](const auto& s) -> std::span<const float> {
      if constexpr (std::decay_t<decltype(s)>::compressed)
        return s.compressor(p).residual();
      else
        return {};
    });
  }
  const diloco_options& opts() const {
    return visit([](const auto& s) -> const diloco_options& { return s.opts(); });
  }

  void save(std::ostream& os, state::part p = state::part::all) const {
    visit([&](const auto& s) { s.save(os, p); });
  }
  void load(std::istream& is) {
    visit([&](auto& s) { s.load(is); });
  }
  void load(std::istream& shared, std::istream& local) {
    visit([&](auto& s) { s.load(shared, local); });
  }

private:
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), e_);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), e_);
  }

  diloco_code code_;
  engine e_;
};

static_assert(sync_strategy<coded_diloco<comm::archetype>>);

} // namespace commsgd::inline v1::sync
