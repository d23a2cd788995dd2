// sync::async_ps_server: the parameter server role (rank options::server only). It holds the model and
// serves every worker inside finish(), so its state moves only there.
//
// - Version v counts the updates applied. A pushed gradient carries the version its worker computed on; when
//   it is applied at version v its staleness is tau = v - computed_on.
// - Soft synchronisation: the server applies an update once `apply_after` (j) gradients have arrived: the
//   mean of the j gradients, each scaled by lr (or lr / max(tau, 1) with staleness_scaling). j = 1 is plain
//   ASGD, j = workers is a synchronous parameter server.
// - A worker's pull is answered only after its own pushed gradient has been applied, so every gradient a
//   worker computes is on a model that includes its previous one.
// - Staleness bound s (SSP): a worker that has pushed c gradients may pull (and so start step c) only once
//   every other unfinished worker has pushed at least c - s gradients.
// - Nothing can stall: when every unfinished worker is either waiting on a pending gradient or held back by
//   the bound, the pending gradients are applied even if fewer than j; finished workers count for neither
//   rule. After the last worker says done, every worker receives the final model.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/poll.hpp>
#include <commsgd/error.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/async_ps/checkpoint.hpp>
#include <commsgd/sync/async_ps/log.hpp>
#include <commsgd/sync/async_ps/options.hpp>
#include <commsgd/sync/async_ps/wire.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::sync {

namespace detail {

// The server computes no gradient, so the worker's calls name where it does its work instead.
inline invalid_argument not_a_worker(const char* what, int rank) {
  return invalid_argument(commsgd::concat("async_ps::", what, ": rank ", rank,
                                          " is the parameter server; it serves in finish()"));
}

} // namespace detail

template <comm::communicator C>
class async_ps_server : public detail::async_ps_wire<C>, public state::checkpointed<async_ps_server<C>> {
  using base = detail::async_ps_wire<C>;
  using base::comm_, base::opt_, base::started_, base::version_;
  using typename base::header;

public:
  using options = async_ps_options;

  async_ps_server(C& c, options o) : base(c, o) {
    if (c.rank() != opt_.server)
      throw invalid_argument(commsgd::concat("async_ps_server: rank ", c.rank(),
                                             " is not the server (options 'server' = ", opt_.server,
                                             "); make an async_ps_worker there"));
    pushes_.assign(static_cast<std::size_t>(c.size() - 1), 0);
  }

  bool computes_gradients() const { return false; }
  bool is_server() const { return true; }

  void start(std::span<float> params) {
    // A loaded server that had started hands out its model: the run goes on from there.
    if (std::exchange(resumed_, false) && started_) {
      detail::check_same_size("params", params.size(), model_.size());
      std::copy(model_.begin(), model_.end(), params.begin());
      return;
    }
    model_.assign(params.begin(), params.end());
    started_ = true;
  }

  // A server computes no gradient: it serves in finish().
  step_result step(std::span<float>, std::span<const float>, const step_info& = {}) {
    throw detail::not_a_worker("step", comm_->rank());
  }

  void finish(std::span<float> params) {
    this->require_started("finish");
    detail::check_same_size("params", params.size(), model_.size());
    serve();
    std::copy(model_.begin(), model_.end(), params.begin());
  }

  // Every applied gradient in the order applied.
  const std::vector<applied_update>& log() const { return log_; }
  // How many gradients each worker (in rank order, the server left out) has pushed so far.
  const std::vector<std::int64_t>& pushes() const { return pushes_; }
  const std::vector<float>& model() const { return model_; }

  // Checkpoints (save, load): the server saves before start() or after finish() (it serves only inside
  // finish()).

private:
  friend struct state::access;
  template <comm::communicator>
  friend class async_ps;
  using saved = detail::async_ps_saved;
  static constexpr const char* state_kind = detail::async_ps_state_kind;

  void save_section(state::writer& w, state::part which) const {
    if (which == state::part::shared) return detail::save_async_ps_shared(w, opt_);
    detail::save_async_ps_role(w, true, started_);
    w.put<std::int64_t>(version_);
    w.put_array(std::span<const float>(model_));
    w.put<std::int64_t>(arrivals_);
    w.put_array(std::span<const std::int64_t>(pushes_));
    w.put<std::uint64_t>(log_.size());
    for (const auto& u : log_) {
      w.put<std::int32_t>(u.worker);
      w.put<std::int64_t>(u.step);
      w.put<std::int64_t>(u.computed_on);
      w.put<std::int64_t>(u.applied_at);
      w.put<std::int64_t>(u.staleness);
      w.put<std::int64_t>(u.arrival);
      w.put<float>(u.factor);
    }
  }
  void parse_section(state::reader& r, state::part which, saved& t) const {
    if (which == state::part::shared) return detail::parse_async_ps_shared(r, opt_);
    t.server = true;
    t.started = detail::parse_async_ps_role(r, true, comm_->rank());
    t.version = r.get<std::int64_t>();
    t.model = r.get_vector<float>();
    t.arrivals = r.get<std::int64_t>();
    t.pushes.resize(pushes_.size());
    r.get_array(std::span<std::int64_t>(t.pushes), "push counts");
    const auto entries = r.get<std::uint64_t>();
    // An entry takes 48 bytes; a count the stream cannot hold is refused before anything is allocated.
    if (entries > r.remaining() / 48)
      throw corrupt_data("saved state: a field runs past the end of the stream");
    t.log.resize(static_cast<std::size_t>(entries));
    for (auto& u : t.log) {
      u.worker = r.get<std::int32_t>();
      u.step = r.get<std::int64_t>();
      u.computed_on = r.get<std::int64_t>();
      u.applied_at = r.get<std::int64_t>();
      u.staleness = r.get<std::int64_t>();
      u.arrival = r.get<std::int64_t>();
      u.factor = r.get<float>();
      if (u.worker < 0 || u.worker >= comm_->size() || u.worker == opt_.server)
        throw corrupt_data(commsgd::concat("saved state: a log entry names worker ", u.worker));
    }
    std::int64_t total = 0;
    for (const auto p : t.pushes) {
      if (p < 0) throw corrupt_data(commsgd::concat("saved state: a push count of ", p, " is negative"));
      total += p;
    }
    if (t.version < 0 || t.arrivals != total || t.version > t.arrivals)
      throw corrupt_data(commsgd::concat("saved state: version ", t.version, ", ", t.arrivals,
                                         " arrivals and ", total,
                                         " pushes disagree (0 <= version <= arrivals = pushes)"));
    if (t.started && t.model.empty()) throw corrupt_data("saved state: a started server without a model");
  }
  void commit(saved&& t) noexcept {
    started_ = t.started;
    version_ = t.version;
    model_ = std::move(t.model);
    arrivals_ = t.arrivals;
    pushes_ = std::move(t.pushes);
    log_ = std::move(t.log);
    resumed_ = true;
  }

  // Bookkeeping for one worker.
  struct peer {
    int rank = 0;
    header incoming;
    std::optional<comm::request_t<C>> request;
    bool done = false;
    bool wants_pull = false;
    bool pending = false;
    std::int64_t pushes = 0;
    std::int64_t pending_step = 0, pending_version = 0, pending_arrival = 0;
    std::vector<float> gradient;
  };

  void reply(peer& p) { this->send_model(std::span<const float>(model_), p.rank); }

  void post(peer& p) { p.request.emplace(this->post_header(p.incoming, p.rank)); }

  // SSP: may this worker start its next step?
  bool gate_open(const peer& p) const {
    if (opt_.staleness_bound < 0) return true;
    for (const auto& q : peers_)
      if (&q != &p && !q.done && q.pushes < p.pushes - opt_.staleness_bound) return false;
    return true;
  }

  void handle(peer& p) {
    const header h = p.incoming;
    switch (h.kind) {
    case base::kind_push:
      if (h.version < 0 || h.version > version_ || p.pending)
        throw corrupt_data(commsgd::concat("async_ps: push from rank ", p.rank, " claims version ", h.version,
                                           " (server at ", version_,
                                           p.pending ? ", and a push is still pending)" : ")"));
      p.gradient.resize(model_.size());
      this->receive_gradient(std::span<float>(p.gradient), p.rank);
      p.pending = true;
      p.pending_version = h.version;
      p.pending_step = p.pushes++;
      p.pending_arrival = arrivals_++;
      queue_.push_back(&p);
      post(p);
      break;
    case base::kind_pull:
      p.wants_pull = true;
      post(p);
      break;
    case base::kind_done:
      p.done = true;
      p.request.reset();
      --active_;
      break;
    default:
      throw corrupt_data(commsgd::concat("async_ps: header of unknown kind ", h.kind, " from rank ", p.rank));
    }
  }

  bool try_apply() {
    if (queue_.empty()) return false;
    const auto j = static_cast<std::size_t>(opt_.apply_after);
    std::size_t batch = 0;
    if (queue_.size() >= j) {
      batch = j;
    } else {
      for (const auto& p : peers_)
        if (!p.done && !p.pending && !(p.wants_pull && !gate_open(p))) return false;
      batch = queue_.size(); // everyone left is blocked on us: apply what there is
    }
    for (std::size_t b = 0; b < batch; ++b) {
      peer& p = *queue_.front();
      queue_.pop_front();
      const std::int64_t tau = version_ - p.pending_version;
      float factor = opt_.lr;
      if (opt_.staleness_scaling) factor = factor / static_cast<float>(std::max<std::int64_t>(tau, 1));
      factor = factor / static_cast<float>(batch);
      for (std::size_t i = 0; i < model_.size(); ++i)
        model_[i] = model_[i] - factor * p.gradient[i];
      if (opt_.keep_log)
        log_.push_back({p.rank, p.pending_step, p.pending_version, version_, tau, p.pending_arrival, factor});
      p.pending = false;
    }
    ++version_;
    return true;
  }

  bool serve_pulls() {
    bool any = false;
    for (auto& p : peers_)
      if (p.wants_pull && !p.pending && gate_open(p)) {
        reply(p);
        p.wants_pull = false;
        any = true;
      }
    return any;
  }

  // One pass over every worker: returns whether anything moved.
  bool serve_once() {
    bool progressed = false;
    for (auto& p : peers_)
      if (!p.done && p.request && p.request->test()) {
        handle(p);
        while (try_apply()) {
        }
        progressed = true;
      }
    while (try_apply())
      progressed = true;
    return serve_pulls() || progressed;
  }

  void serve() {
    peers_.clear();
    for (int r = 0; r < comm_->size(); ++r)
      if (r != opt_.server) peers_.emplace_back().rank = r;
    active_ = static_cast<int>(peers_.size());
    for (std::size_t i = 0; i < peers_.size(); ++i)
      peers_[i].pushes = pushes_[i];
    for (auto& p : peers_)
      post(p);
    comm::poll_until(
        [&] {
          if (active_ == 0) return comm::poll_step::done;
          return serve_once() ? comm::poll_step::moved : comm::poll_step::idle;
        },
        comm::poll_clock::time_point::max(), std::chrono::microseconds(100));
    while (try_apply()) {
    }
    for (std::size_t i = 0; i < peers_.size(); ++i)
      pushes_[i] = peers_[i].pushes;
    for (auto& p : peers_)
      reply(p);
  }

  std::vector<float> model_;
  std::vector<peer> peers_;
  std::deque<peer*> queue_;
  int active_ = 0;
  std::int64_t arrivals_ = 0;
  std::vector<std::int64_t> pushes_; // per worker, carried from one finish() to the next
  std::vector<applied_update> log_;
  bool resumed_ = false;
};

static_assert(sync_strategy<async_ps_server<comm::archetype>>);

} // namespace commsgd::inline v1::sync
