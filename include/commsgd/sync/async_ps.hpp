// sync::async_ps: a parameter server on one rank; the other ranks push gradients and pull parameters
// without waiting for each other. The two roles are two types, async_ps_server<C> and async_ps_worker<C>;
// async_ps<C> picks the one of this rank (the rank named by options::server serves), which is what
// data_parallel<..., policy::async_ps> holds.
//
//   sync::async_ps s(comm, {.lr = 0.1f, .apply_after = 1, .staleness_bound = 4});
//   s.start(x);                                  // server: takes x as the model; worker: pulls it
//   if (s.computes_gradients())                  // workers only
//     loop { grad at x; s.step(x, grad, {}); }   // push the gradient, pull the newest model into x
//   s.finish(x);                                 // server: serves until every worker is done;
//                                                // all: x = the final model
//
// The parts, under async_ps/: options.hpp (async_ps_options), server.hpp (the server's rules), worker.hpp,
// wire.hpp (the protocol between them), checkpoint.hpp (what a checkpoint holds and when to take one) and
// log.hpp (the server's record of applied gradients). Include this header: it is the one users name.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/async_ps/checkpoint.hpp>
#include <commsgd/sync/async_ps/log.hpp>
#include <commsgd/sync/async_ps/options.hpp>
#include <commsgd/sync/async_ps/server.hpp>
#include <commsgd/sync/async_ps/worker.hpp>
#include <commsgd/sync/replica_promise.hpp>
#include <commsgd/sync/strategy.hpp>

#include <cstdint>
#include <span>
#include <variant>
#include <vector>

namespace commsgd::inline v1::sync {

// This rank's role, chosen by options::server: the form data_parallel<..., policy::async_ps> holds.
template <comm::communicator C>
class async_ps : public state::checkpointed<async_ps<C>> {
public:
  using options = async_ps_options;
  using server_type = async_ps_server<C>;
  using worker_type = async_ps_worker<C>;

  async_ps(C& c, options o) : role_(pick(c, o)) {}

  bool computes_gradients() const { return !is_server(); }
  bool is_server() const { return std::holds_alternative<server_type>(role_); }

  void start(std::span<float> params) {
    std::visit([&](auto& r) { r.start(params); }, role_);
  }
  step_result step(std::span<float> params, std::span<const float> grad, const step_info& info = {}) {
    return std::visit([&](auto& r) { return r.step(params, grad, info); }, role_);
  }
  void finish(std::span<float> params) {
    std::visit([&](auto& r) { r.finish(params); }, role_);
  }

  // Worker: push, pull (the server refuses both).
  void push(std::span<const float> grad) { worker("push").push(grad); }
  void pull(std::span<float> params) { worker("pull").pull(params); }

  std::int64_t version() const {
    return std::visit([](const auto& r) { return r.version(); }, role_);
  }
  // Server: every applied gradient in the order applied (empty on a worker).
  const std::vector<applied_update>& log() const {
    static const std::vector<applied_update> none;
    return is_server() ? std::get<server_type>(role_).log() : none;
  }
  int workers() const {
    return std::visit([](const auto& r) { return r.workers(); }, role_);
  }

  // The role itself, for what only one of them offers.
  server_type* server() noexcept { return std::get_if<server_type>(&role_); }
  worker_type* worker() noexcept { return std::get_if<worker_type>(&role_); }

private:
  static std::variant<server_type, worker_type> pick(C& c, const options& o) {
    detail::check_async_ps_options(c, o);
    if (c.rank() == o.server) return server_type(c, o);
    return worker_type(c, o);
  }

  friend struct state::access;
  using saved = detail::async_ps_saved;
  static constexpr const char* state_kind = detail::async_ps_state_kind;
  state::place state_place() const {
    return std::visit([](const auto& r) { return state::access::place(r); }, role_);
  }
  void save_section(state::writer& w, state::part which) const {
    std::visit([&](const auto& r) { r.save_section(w, which); }, role_);
  }
  void parse_section(state::reader& r, state::part which, saved& t) const {
    std::visit([&](const auto& x) { x.parse_section(r, which, t); }, role_);
  }
  void commit(saved&& t) noexcept {
    std::visit([&](auto& r) { r.commit(std::move(t)); }, role_);
  }

  worker_type& worker(const char* what) {
    if (auto* w = worker()) return *w;
    throw detail::not_a_worker(what, std::get<server_type>(role_).rank());
  }

  std::variant<server_type, worker_type> role_;
};

static_assert(sync_strategy<async_ps<comm::archetype>>);

// Workers pull whichever version is newest; every rank ends with the final model.
template <class C>
struct replica_promise<async_ps<C>> {
  static bool after_step(const async_ps<C>&, const step_result&) { return false; }
  static bool after_finish(const async_ps<C>&) { return true; }
};

} // namespace commsgd::inline v1::sync
