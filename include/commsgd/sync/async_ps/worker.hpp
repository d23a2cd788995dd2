// sync::async_ps_worker: the worker role of the parameter server (any rank but options::server). It pushes
// the gradient computed on the model it last pulled, then pulls; the server answers a pull only once that
// gradient has been applied and the staleness bound lets this worker start its next step (server.hpp).
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/error.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/async_ps/checkpoint.hpp>
#include <commsgd/sync/async_ps/options.hpp>
#include <commsgd/sync/async_ps/wire.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace commsgd::inline v1::sync {

template <comm::communicator C>
class async_ps_worker : public detail::async_ps_wire<C>, public state::checkpointed<async_ps_worker<C>> {
  using base = detail::async_ps_wire<C>;
  using base::comm_, base::opt_, base::started_, base::version_;

public:
  using options = async_ps_options;

  async_ps_worker(C& c, options o) : base(c, o) {
    if (c.rank() == opt_.server)
      throw invalid_argument(commsgd::concat("async_ps_worker: rank ", c.rank(),
                                             " is the server (options 'server' = ", opt_.server,
                                             "); make an async_ps_server there"));
  }

  bool computes_gradients() const { return true; }
  bool is_server() const { return false; }

  void start(std::span<float> params) {
    started_ = true;
    pull(params);
  }

  step_result step(std::span<float> params, std::span<const float> grad, const step_info& = {}) {
    push(grad);
    pull(params);
    return {.exchanged = true, .averaged = false};
  }

  void finish(std::span<float> params) {
    this->require_started("finish");
    if (unpulled_push_) pull(params);
    this->send_header(base::kind_done);
    this->receive_model(params);
  }

  // Send the gradient computed on the last pulled model.
  void push(std::span<const float> grad) {
    this->require_started("push");
    detail::check_same_size("grad", grad.size(), dim_);
    detail::require_finite("gradient", grad);
    if (unpulled_push_)
      throw invalid_argument(
          "async_ps::push: the previous push was not followed by a pull (allowed: push, pull, "
          "push, ...)");
    this->send_header(base::kind_push);
    this->send_gradient(grad);
    unpulled_push_ = true;
  }

  // Wait until the server grants a pull (own gradient applied, staleness bound met) and take the model.
  void pull(std::span<float> params) {
    if (dim_ != npos) detail::check_same_size("params", params.size(), dim_);
    dim_ = params.size();
    this->send_header(base::kind_pull);
    this->receive_model(params);
    unpulled_push_ = false;
  }

  // Checkpoints (save, load): not between a push and its pull (the server holds the gradient, not yet
  // applied).

private:
  using saved = detail::async_ps_saved;
  static constexpr const char* state_kind = detail::async_ps_state_kind;
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  friend struct state::access;
  template <comm::communicator>
  friend class async_ps;

  void save_section(state::writer& w, state::part which) const {
    if (which == state::part::shared) return detail::save_async_ps_shared(w, opt_);
    if (unpulled_push_)
      throw invalid_argument("async_ps::save: a push is waiting for its pull; save after step() or finish()");
    detail::save_async_ps_role(w, false, started_);
    w.put<std::int64_t>(version_);
    w.put<std::uint64_t>(dim_);
  }
  void parse_section(state::reader& r, state::part which, saved& t) const {
    if (which == state::part::shared) return detail::parse_async_ps_shared(r, opt_);
    t.server = false;
    t.started = detail::parse_async_ps_role(r, false, comm_->rank());
    t.version = r.get<std::int64_t>();
    t.dim = r.get<std::uint64_t>();
    if (t.version < 0)
      throw corrupt_data(commsgd::concat("saved state: version ", t.version, " is negative"));
  }
  void commit(saved&& t) noexcept {
    started_ = t.started;
    version_ = t.version;
    dim_ = static_cast<std::size_t>(t.dim);
    unpulled_push_ = false;
  }

  std::size_t dim_ = npos;
  bool unpulled_push_ = false;
};

static_assert(sync_strategy<async_ps_worker<comm::archetype>>);

} // namespace commsgd::inline v1::sync
