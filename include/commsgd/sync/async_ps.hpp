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
// Server rules:
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
//
// Wire protocol (four tags of its own, reserved on the communicator by comm::reserve_tags unless tag_base
// names them, so other traffic can share the communicator): a 16-byte
// header worker -> server (pull, push + its gradient on the next tag, done); server -> worker a version and
// the parameters. Headers go first so that a large gradient never waits on a receive the server has not
// posted.
//
// Checkpoints (state/strategy.hpp): the options are the shared part (a stream saved under others is refused);
// the rest belongs to one rank. The server's local part is its model, version, arrival count, every
// worker's push count (what the staleness bound compares) and its log; a worker's is the version it last
// pulled. The server's state only moves inside finish(), so a consistent checkpoint of the whole group is
// taken after finish() on every rank: then every pushed gradient has been applied and every worker holds
// the final model. Loading those streams into fresh objects and calling start() again (the server hands its
// loaded model into params; workers pull it) continues where the run stopped: the same object would reach
// the same server state from the same deliveries in the same order. The same objects may also simply
// start() again after finish(); push counts and versions carry on.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/tags.hpp>
#include <commsgd/error.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/poll.hpp>
#include <commsgd/sync/replica_promise.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <deque>
#include <istream>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <utility>
#include <variant>
#include <vector>

namespace commsgd::inline v1::sync {

struct async_ps_options {
  float lr = 0.01f;               // (0, inf)
  int server = 0;                 // [0, size)
  int apply_after = 1;            // j: [1, workers = size - 1]
  bool staleness_scaling = false; // lr / max(tau, 1) per gradient
  int staleness_bound = -1;       // s: -1 for none, else [0, inf)
  int tag_base = -1;    // -1: four free tags (comm/tags.hpp); else [0, INT_MAX - 3], the four from it
  bool keep_log = true; // the server records every applied gradient
};

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

namespace detail {

// What both roles share: the checked options and the wire format.
template <comm::communicator C>
class async_ps_wire {
protected:
  async_ps_wire(C& c, const async_ps_options& o) : comm_(&c), opt_(o) {
    validate(c, o);
    tags_ = o.tag_base < 0 ? comm::reserve_tags(c, 4, "async_ps")
                           : comm::reserve_tags_at(c, o.tag_base, 4, "async_ps");
  }

  static constexpr std::int32_t kind_pull = 1, kind_push = 2, kind_done = 3;

  struct header {
    std::int32_t kind = 0;
    std::int32_t reserved = 0;
    std::int64_t version = 0;
  };

  int tag_header() const { return tags_[0]; }
  int tag_grad() const { return tags_[1]; }
  int tag_version() const { return tags_[2]; }
  int tag_model() const { return tags_[3]; }

  void require_started(const char* what) const {
    if (!started_)
      throw invalid_argument(commsgd::detail::concat("async_ps::", what, ": call start() first"));
  }

public:
  static void validate(const C& c, const async_ps_options& o) {
    if (c.size() < 2)
      throw invalid_argument(commsgd::detail::concat("async_ps: communicator size = ", c.size(),
                                                     " is outside the allowed range [2, inf) (a server and a "
                                                     "worker at least)"));
    check_learning_rate("lr", o.lr);
    commsgd::detail::check_range("server", o.server, 0, c.size() - 1,
                                 commsgd::detail::concat("[0, size = ", c.size(), ")"));
    commsgd::detail::check_range("apply_after", o.apply_after, 1, c.size() - 1,
                                 commsgd::detail::concat("[1, workers = ", c.size() - 1, "]"));
    commsgd::detail::check_range("staleness_bound", o.staleness_bound, -1, std::numeric_limits<int>::max(),
                                 "-1 (none) or [0, inf)");
    commsgd::detail::check_range("tag_base", o.tag_base, -1, std::numeric_limits<int>::max() - 3,
                                 "-1 (four free tags) or [0, INT_MAX - 3]");
  }

  // The version of the model this rank last saw (server: the current one).
  std::int64_t version() const { return version_; }
  int workers() const { return comm_->size() - 1; }
  int rank() const { return comm_->rank(); }

protected:
  // What either role parses from a stream before committing it.
  struct saved {
    bool server = false;
    bool started = false;
    std::int64_t version = 0;
    std::uint64_t dim = 0;            // worker
    std::vector<float> model;         // server
    std::int64_t arrivals = 0;        // server
    std::vector<std::int64_t> pushes; // server: per worker, in rank order
    std::vector<applied_update> log;  // server
  };
  static constexpr const char* state_kind = "sync::async_ps";

  // The shared part: the options that decide the trajectory (tag_base and keep_log do not).
  void save_shared(state::writer& w) const {
    w.put<float>(opt_.lr);
    w.put<std::int32_t>(opt_.server);
    w.put<std::int32_t>(opt_.apply_after);
    w.put<std::uint32_t>(opt_.staleness_scaling ? 1u : 0u);
    w.put<std::int32_t>(opt_.staleness_bound);
  }
  void parse_shared(state::reader& r) const {
    const float lr = r.get<float>();
    if (std::bit_cast<std::uint32_t>(lr) != std::bit_cast<std::uint32_t>(opt_.lr))
      throw corrupt_data(
          commsgd::detail::concat("saved state: option 'lr' is ", lr, ", this one's is ", opt_.lr));
    state::expect_same(r.get<std::int32_t>(), opt_.server, "option 'server'");
    state::expect_same(r.get<std::int32_t>(), opt_.apply_after, "option 'apply_after'");
    state::expect_same(r.get<std::uint32_t>(), opt_.staleness_scaling ? 1u : 0u,
                       "option 'staleness_scaling' (1 on, 0 off)");
    state::expect_same(r.get<std::int32_t>(), opt_.staleness_bound, "option 'staleness_bound'");
  }
  // The start of the local part: which role saved it.
  bool parse_role(state::reader& r, bool server) const {
    const auto role = r.get<std::uint32_t>();
    if (role > 1)
      throw corrupt_data(
          commsgd::detail::concat("saved state: role ", role, " is neither 0 (worker) nor 1 (server)"));
    if ((role == 1) != server)
      throw corrupt_data(commsgd::detail::concat(
          "saved state: saved by ", role == 1 ? "the parameter server" : "a worker", ", while rank ",
          comm_->rank(), " is ", server ? "the server" : "a worker"));
    const auto started = r.get<std::uint32_t>();
    if (started > 1)
      throw corrupt_data(commsgd::detail::concat("saved state: started = ", started, " is neither 0 nor 1"));
    return started == 1;
  }

  C* comm_;
  async_ps_options opt_;
  comm::tag_lease tags_;
  bool started_ = false;
  std::int64_t version_ = 0;
};

inline invalid_argument not_a_worker(const char* what, int rank) {
  return invalid_argument(commsgd::detail::concat("async_ps::", what, ": rank ", rank,
                                                  " is the parameter server; it serves in finish()"));
}

} // namespace detail

// The worker role: pushes gradients and pulls models; any rank but options::server.
template <comm::communicator C>
class async_ps_worker : public detail::async_ps_wire<C>, public state::checkpointed<async_ps_worker<C>> {
  using base = detail::async_ps_wire<C>;
  using base::comm_, base::opt_, base::started_, base::version_;
  using typename base::header;

public:
  using options = async_ps_options;

  async_ps_worker(C& c, options o) : base(c, o) {
    if (c.rank() == opt_.server)
      throw invalid_argument(commsgd::detail::concat("async_ps_worker: rank ", c.rank(),
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
    send_header(base::kind_done);
    receive_model(params);
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
    send_header(base::kind_push);
    comm_->send(grad, opt_.server, this->tag_grad());
    unpulled_push_ = true;
  }

  // Wait until the server grants a pull (own gradient applied, staleness bound met) and take the model.
  void pull(std::span<float> params) {
    if (dim_ != npos) detail::check_same_size("params", params.size(), dim_);
    dim_ = params.size();
    send_header(base::kind_pull);
    receive_model(params);
    unpulled_push_ = false;
  }

  // Checkpoints (save, load): not between a push and its pull (the server holds the gradient, not yet
  // applied).

private:
  friend struct state::access;
  template <comm::communicator>
  friend class async_ps;
  using typename base::saved;
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  void save_section(state::writer& w, state::part which) const {
    if (which == state::part::shared) return this->save_shared(w);
    if (unpulled_push_)
      throw invalid_argument("async_ps::save: a push is waiting for its pull; save after step() or finish()");
    w.put<std::uint32_t>(0u);
    w.put<std::uint32_t>(started_ ? 1u : 0u);
    w.put<std::int64_t>(version_);
    w.put<std::uint64_t>(dim_);
  }
  void parse_section(state::reader& r, state::part which, saved& t) const {
    if (which == state::part::shared) return this->parse_shared(r);
    t.server = false;
    t.started = this->parse_role(r, false);
    t.version = r.get<std::int64_t>();
    t.dim = r.get<std::uint64_t>();
    if (t.version < 0)
      throw corrupt_data(commsgd::detail::concat("saved state: version ", t.version, " is negative"));
  }
  void commit(saved&& t) noexcept {
    started_ = t.started;
    version_ = t.version;
    dim_ = static_cast<std::size_t>(t.dim);
    unpulled_push_ = false;
  }

  void send_header(std::int32_t kind) {
    const header h{kind, 0, version_};
    comm_->send(std::span<const header>(&h, 1), opt_.server, this->tag_header());
  }

  void receive_model(std::span<float> params) {
    std::int64_t v = 0;
    comm_->recv(std::span<std::int64_t>(&v, 1), opt_.server, this->tag_version());
    comm_->recv(params, opt_.server, this->tag_model());
    version_ = v;
  }

  std::size_t dim_ = npos;
  bool unpulled_push_ = false;
};

// The server role: holds the model and serves every worker inside finish(); rank options::server only.
template <comm::communicator C>
class async_ps_server : public detail::async_ps_wire<C>, public state::checkpointed<async_ps_server<C>> {
  using base = detail::async_ps_wire<C>;
  using base::comm_, base::opt_, base::started_, base::version_;
  using typename base::header;

public:
  using options = async_ps_options;

  async_ps_server(C& c, options o) : base(c, o) {
    if (c.rank() != opt_.server)
      throw invalid_argument(commsgd::detail::concat("async_ps_server: rank ", c.rank(),
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
  using typename base::saved;

  void save_section(state::writer& w, state::part which) const {
    if (which == state::part::shared) return this->save_shared(w);
    w.put<std::uint32_t>(1u);
    w.put<std::uint32_t>(started_ ? 1u : 0u);
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
    if (which == state::part::shared) return this->parse_shared(r);
    t.server = true;
    t.started = this->parse_role(r, true);
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
        throw corrupt_data(commsgd::detail::concat("saved state: a log entry names worker ", u.worker));
    }
    std::int64_t total = 0;
    for (const auto p : t.pushes) {
      if (p < 0)
        throw corrupt_data(commsgd::detail::concat("saved state: a push count of ", p, " is negative"));
      total += p;
    }
    if (t.version < 0 || t.arrivals != total || t.version > t.arrivals)
      throw corrupt_data(commsgd::detail::concat("saved state: version ", t.version, ", ", t.arrivals,
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

  void reply(peer& p) {
    const std::int64_t v = version_;
    comm_->send(std::span<const std::int64_t>(&v, 1), p.rank, this->tag_version());
    comm_->send(std::span<const float>(model_), p.rank, this->tag_model());
  }

  void post(peer& p) {
    p.request.emplace(comm_->irecv(std::span<header>(&p.incoming, 1), p.rank, this->tag_header()));
  }

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
        throw corrupt_data(commsgd::detail::concat("async_ps: push from rank ", p.rank, " claims version ",
                                                   h.version, " (server at ", version_,
                                                   p.pending ? ", and a push is still pending)" : ")"));
      p.gradient.resize(model_.size());
      comm_->recv(std::span<float>(p.gradient), p.rank, this->tag_grad());
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
      throw corrupt_data(
          commsgd::detail::concat("async_ps: header of unknown kind ", h.kind, " from rank ", p.rank));
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
    detail::poll_until([&] { return active_ == 0; }, [&] { return serve_once(); },
                       std::chrono::microseconds(100));
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
    detail::async_ps_wire<C>::validate(c, o);
    if (c.rank() == o.server) return server_type(c, o);
    return worker_type(c, o);
  }

  friend struct state::access;
  using saved = typename server_type::saved;
  static constexpr const char* state_kind = server_type::state_kind;
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

static_assert(sync_strategy<async_ps_server<comm::archetype>>);
static_assert(sync_strategy<async_ps_worker<comm::archetype>>);
static_assert(sync_strategy<async_ps<comm::archetype>>);

// Workers pull whichever version is newest; every rank ends with the final model.
template <class C>
struct replica_promise<async_ps<C>> {
  static bool after_step(const async_ps<C>&, const step_result&) { return false; }
  static bool after_finish(const async_ps<C>&) { return true; }
};

} // namespace commsgd::inline v1::sync
