// sync::diloco: DiLoCo, the one engine. Ranks take H local steps, then an outer optimizer moves the common
// model with the mean of the ranks' pseudo-gradients; optionally streamed (the model cut into P fragments,
// each on a schedule of its own, its exchange overlapping `delay` local steps) and compressed. The PyTorch
// class commsgd_torch.DiLoCo runs this engine through its extension; the C++ trainer calls it directly:
//
//   sync::diloco s(comm, layer_sizes, {.sync_every = 30, .fragments = 3, .delay = 5});
//   s.start(x);
//   loop { grad at x; s.step(x, grad); }        // an inner SGD step (options.lr), then the schedule
//   loop { own optimizer on x; s.advance(x); }  // or: the trainer's own inner step, then the schedule
//   s.finish(x);
//
// Fragments: layer_sizes cut the flat model into layers; fragment p holds layers p, p + P, p + 2P, ...
// (strided, so that each fragment spans the depth of the model) or, contiguous, the p-th of P runs of
// consecutive layers. P is at most the number of layers.
//
// Schedule, in inner steps counted from 1 (s = steps() after the step): fragment p's exchange starts after
// step s when s >= t_p and (s - t_p) mod H = 0, with t_p = p H / P (integer division), H = sync_every, and
// s >= 1; it is applied after step s + delay. So with P = 1 a round is H whole steps, the first one too (the
// paper's DiLoCo), and fragment p > 0 first syncs after t_p steps, which staggers the fragments by H / P.
// Starting sends fragment p's pseudo-gradient theta_global,p - theta_p (sync/outer_optimizer.hpp has the
// sign); while it travels the ranks go on stepping. Applying takes the mean over ranks, makes the outer
// step on theta_global,p (Nesterov SGD, lr 0.7 and momentum 0.9 by default) and merges:
//   theta_p <- theta_global,p + alpha (theta_p - theta_global,p)
// so alpha = 0 restarts the fragment from the common model and alpha > 0 keeps part of the local steps taken
// while it travelled. With keep_delay_steps the merge is instead
//   theta_p <- theta_global,p + (theta_p - theta_start,p)
// theta_start,p the local values when the exchange started: the delay's steps are kept whole and nothing of
// the round's own pseudo-gradient is counted twice. A code with error feedback keeps what it did not send in
// its residual, to send later; alpha > 0 would also keep part of it in the local model, and the next
// pseudo-gradient would carry it again. At any step each fragment has at most one exchange in flight
// (delay < H), so the busiest step sends about 1 / P of the model where unstreamed DiLoCo sends all of it.
//
// Exchanges: X, any compress::compressor, carries each fragment's pseudo-gradient (one compressor per
// fragment, made by `make_compressor(length)`, its residual the fragment's own); uncompressed, the floats are
// summed by all_reduce_sum. A compressor that models compress::summed_in_parts codes the pseudo-gradient as
// the engine forms it, a stretch at a time, and hands the sum back a part at a time to the outer step, so
// neither is written whole (unless the sum may hold NaN or inf, or is saved with its exchange in flight).
// sync/diloco_codes.hpp names the codes and makes the engine of each; sync/coded_diloco.hpp runs one chosen
// at run time. Exchanges run on one thread (sync/exchange_thread.hpp) in the order they start, the same on
// every rank; the trainer must not use the communicator between calls while one is in flight. With
// comm::mpi, MPI must allow calls from that thread (boost::mpi::threading::serialized). bytes_sent() counts
// what this rank put on the wire, by comm/traffic.hpp's rules (the compressors' wire_bytes()).
//
// Refusal: a pseudo-gradient with NaN or inf is refused on every rank when its exchange is applied
// (commsgd::non_finite): uncompressed, the bad values reach the sum on every rank; compressed, the
// compressors' verdicts agree. That exchange is dropped and nothing of the fragment's outer state changes
// (common model, momentum, residual); the step's local update and the step count stand, as the fragments'
// next turns come on schedule.
//
// A failed exchange (comm_error: a peer left, a deadline passed) is dropped the same way: apply() rethrows it
// with nothing of the outer state changed (the compressors commit their residuals only after their
// collectives succeed), so a trainer over a membership engine can rebuild the group, rebind() the engine
// and go on; the local model keeps the round's steps, which the next exchange carries.
//
// finish(): applies the exchanges in flight, then exchanges once more every fragment that has moved since
// its last exchange was applied (every fragment when the merge keeps local steps). A fragment applied after the
// last step has a zero pseudo-gradient, and exchanging it would still move the common model by the outer
// momentum.
//
// Checkpoints (state/strategy.hpp): the options and layer sizes are saved and a stream of others is refused;
// the shared part holds the step counter, every fragment's common model and outer momentum, and the
// exchanges in flight (waited for, then saved with their sums and due steps, so a resumed run applies the same
// bits on the same step); the local part holds each fragment's compressor (its residual). The local model is
// the trainer's `params`, saved by the trainer. After load() call start() with this rank's saved model: it
// does not broadcast.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/difference.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/validate.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/diloco_math.hpp>
#include <commsgd/sync/exchange_thread.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/outer_optimizer.hpp>
#include <commsgd/sync/replica_promise.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::sync {

enum class fragment_layout { strided, contiguous };

// The P fragments' (offset, length) runs in the flat model of `layers` (their sizes, in flat order): layer l
// goes to fragment l mod P (strided), or to the run that holds it when the layers are cut into P runs as evenly
// as whole layers allow (contiguous); adjacent layers of one fragment make one run. A layer may hold no
// values (a rank's shard of a small sharded layer): it keeps its place, and a fragment of no values its turns,
// so that every shard of a model syncs fragment p on the same steps. A device trainer cuts its model with it
// too, so that its fragments are the engine's.
inline std::vector<std::vector<std::pair<std::size_t, std::size_t>>>
fragment_runs_of(std::span<const std::size_t> layers, std::size_t P, fragment_layout layout) {
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> out(P);
  const std::size_t nl = layers.size();
  std::size_t begin = 0;
  for (std::size_t l = 0; l < nl; ++l) {
    const std::size_t p = layout == fragment_layout::strided ? l % P : l * P / nl;
    auto& runs = out[p];
    if (!runs.empty() && runs.back().first + runs.back().second == begin)
      runs.back().second += layers[l];
    else
      runs.emplace_back(begin, layers[l]);
    begin += layers[l];
  }
  return out;
}

struct diloco_options {
  float lr = 0.01f;              // the inner SGD step of step(params, grad): (0, inf); advance() takes none
  int sync_every = 100;          // H, inner steps a round: [1, inf)
  int fragments = 1;             // P: [1, number of layers]
  int delay = 0;                 // tau, the local steps an exchange overlaps: [0, H)
  float alpha = 0.0f;            // the local model's weight in the merge: [0, 1]
  bool keep_delay_steps = false; // the merge keeps the steps taken while the exchange travelled; alpha 0 only
  fragment_layout layout = fragment_layout::strided;
  outer_sgd_options outer = {}; // DiLoCo's lr 0.7, momentum 0.9
};

template <comm::communicator C, class X = uncompressed>
requires std::same_as<X, uncompressed> || compress::compressor<X, C>
class diloco : public state::checkpointed<diloco<C, X>> {
public:
  using options = diloco_options;
  static constexpr bool compressed = !std::same_as<X, uncompressed>;
  // Whether the outer step reads the compressor's sum a part at a time from cache rather than whole from
  // memory.
  static constexpr bool in_parts = [] {
    if constexpr (compressed)
      return compress::summed_in_parts<X, C>;
    else
      return false;
  }();
  // Makes fragment p's compressor for its length (compressed only).
  using compressor_factory = std::function<X(std::size_t length)>;

  diloco(C& c, std::vector<std::size_t> layer_sizes, options o) requires(!compressed)
      : diloco(c, std::move(layer_sizes), o, nullptr) {}

  diloco(C& c, std::vector<std::size_t> layer_sizes, options o, compressor_factory make_compressor)
      : comm_(&c), ranks_(c.size()), rank_(c.rank()), opt_(o), layers_(std::move(layer_sizes)),
        thread_(std::make_unique<exchange_thread>()) {
    detail::check_learning_rate("lr", opt_.lr);
    commsgd::check_range("sync_every", opt_.sync_every, 1, std::numeric_limits<int>::max(), "[1, inf)");
    if (layers_.empty())
      throw invalid_argument("argument 'layer_sizes' is empty; the allowed range is at least one layer");
    commsgd::check_range("fragments", opt_.fragments, 1, static_cast<int>(layers_.size()),
                         commsgd::concat("[1, number of layers = ", layers_.size(), "]"));
    commsgd::check_range("delay", opt_.delay, 0, opt_.sync_every - 1,
                         commsgd::concat("[0, sync_every - 1 = ", opt_.sync_every - 1, "]"));
    commsgd::check_range("alpha", opt_.alpha, 0.0f, 1.0f, "[0, 1]");
    if (opt_.keep_delay_steps && opt_.alpha != 0.0f)
      throw invalid_argument(commsgd::concat("argument 'alpha' = ", opt_.alpha,
                                             " with keep_delay_steps: the two are two merges; the allowed "
                                             "alpha with keep_delay_steps is 0"));
    if (opt_.layout != fragment_layout::strided && opt_.layout != fragment_layout::contiguous)
      throw invalid_argument(commsgd::concat("argument 'layout' = ", static_cast<int>(opt_.layout),
                                             " is outside the allowed range {strided, contiguous}"));
    outer_sgd::check(opt_.outer);
    cut();
    for (std::size_t p = 0; p < frags_.size(); ++p)
      outer_.emplace_back(opt_.outer);
    if constexpr (compressed) {
      if (!make_compressor)
        throw invalid_argument("argument 'make_compressor' is empty; a compressed diloco needs one");
      for (const auto& f : frags_) {
        x_.push_back(make_compressor(f.length));
        if (x_.back().length() != f.length)
          throw invalid_argument(commsgd::concat("argument 'make_compressor' made a compressor of length ",
                                                 x_.back().length(), " for a fragment of ", f.length,
                                                 " values; the allowed length is the fragment's"));
      }
    }
    pending_.resize(frags_.size());
    spare_.resize(frags_.size());
    applied_at_.assign(frags_.size(), -1);
  }

  diloco(diloco&&) noexcept = default;
  ~diloco() { drain(); }

  bool computes_gradients() const { return true; }

  // Rank 0's params become every rank's model and the common model (a broadcast); with broadcast = false each
  // rank takes its own, which the caller has made equal (a membership engine that synchronised them). After
  // load(), the loaded common model stands and nothing is sent.
  void start(std::span<float> params, bool broadcast = true) {
    detail::check_same_size("params", params.size(), total_);
    if (std::exchange(resumed_, false) && !global_.empty()) return;
    if (broadcast) comm_->broadcast(params, 0);
    global_.resize(frags_.size());
    for (std::size_t p = 0; p < frags_.size(); ++p)
      gather(p, params, global_[p]);
  }

  step_result step(std::span<float> params, std::span<const float> grad, const step_info& = {}) {
    detail::check_same_size("params", params.size(), total_);
    detail::check_same_size("grad", grad.size(), total_);
    detail::require_finite("gradient", grad);
    require_started();
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i] = params[i] - opt_.lr * grad[i];
    return run_schedule(params);
  }

  // The schedule after an inner step the trainer took itself (its own optimizer on params): applies the
  // exchanges due, starts those whose turn it is. Counts the step.
  step_result advance(std::span<float> params) {
    detail::check_same_size("params", params.size(), total_);
    require_started();
    return run_schedule(params);
  }

  // The fragments advance() will touch after the next step (applied, started, or both), so that a trainer
  // whose parameters live elsewhere (a GPU) copies only those in and out.
  std::vector<std::size_t> touched_next() const {
    std::vector<std::size_t> out;
    const std::int64_t s = step_ + 1;
    for (std::size_t p = 0; p < frags_.size(); ++p)
      if ((pending_[p] && pending_[p]->due <= s) || starts_after(p, s)) out.push_back(p);
    return out;
  }
  // The fragments whose exchange advance() will apply after the next step (of touched_next(), those whose
  // local values it writes), so that a trainer that keeps copies of the local model elsewhere (the other
  // ranks of a replica) refreshes only those.
  std::vector<std::size_t> applied_next() const {
    std::vector<std::size_t> out;
    const std::int64_t s = step_ + 1;
    for (std::size_t p = 0; p < frags_.size(); ++p)
      if ((pending_[p] && pending_[p]->due <= s) || (opt_.delay == 0 && starts_after(p, s))) out.push_back(p);
    return out;
  }

  // Applies the exchanges in flight, then exchanges once more every fragment that has moved since its last
  // exchange was applied (all of them when the merge keeps local steps) and applies it at once: with alpha = 0
  // (keep_delay_steps or not) every rank ends holding the common model.
  void finish(std::span<float> params) {
    detail::check_same_size("params", params.size(), total_);
    require_started();
    for (std::size_t p = 0; p < frags_.size(); ++p)
      if (pending_[p]) apply(p, params);
    for (std::size_t p = 0; p < frags_.size(); ++p) {
      if (!merge_keeps_local() && applied_at_[p] == step_) continue;
      launch(p, params, step_);
      apply(p, params);
    }
  }

  // Waits for every exchange in flight without applying it (they stay due on their steps; what one threw is
  // kept for then): for a trainer that stops early, or ends its process group, with exchanges in flight.
  // The destructor and save() do the same. Collective in effect: the other ranks' exchanges must run too.
  void drain() noexcept {
    for (auto& ex : pending_)
      if (ex) wait(*ex);
  }

  // Moves the engine onto another communicator (a new membership: the ranks of a rebuilt group, in any
  // number), between exchanges: the mean of the next rounds is over c's ranks. For a trainer whose
  // membership engine rebuilds the group after a peer left or joined. Throws invalid_argument with an
  // exchange in flight (apply or drain() it first; its collective ran on the old group).
  void rebind(C& c) {
    for (std::size_t p = 0; p < pending_.size(); ++p)
      if (pending_[p])
        throw invalid_argument(
            commsgd::concat("sync::diloco::rebind: fragment ", p,
                            "'s exchange is in flight; the allowed time is between exchanges"));
    comm_ = &c;
    ranks_ = c.size();
    rank_ = c.rank();
  }

  // Scales this rank's pseudo-gradients in the exchanges started from now on by w (1 at construction), so
  // that the mean over the ranks becomes a weighted one: a membership engine whose ranks delivered unequal
  // numbers of inner steps s_r gives each w = n s_r / sum(s) (a rank that joined late counts for what it
  // did). Not saved: a membership engine sets it each round. w in [0, n], n the ranks.
  void set_weight(float w) {
    commsgd::check_range("weight", w, 0.0f, static_cast<float>(ranks_), "[0, the number of ranks]");
    weight_ = w;
  }
  float weight() const noexcept { return weight_; }

  // Whether fragment p's exchange starts after inner step s (counted from 1).
  bool starts_after(std::size_t p, std::int64_t s) const noexcept {
    const std::int64_t first = offset(p);
    return s >= 1 && s >= first && (s - first) % opt_.sync_every == 0;
  }
  std::int64_t offset(std::size_t p) const noexcept {
    return static_cast<std::int64_t>(p) * opt_.sync_every / static_cast<std::int64_t>(frags_.size());
  }

  // Inner steps taken (step() and advance() calls).
  std::int64_t steps() const noexcept { return step_; }
  // Bytes this rank has sent in exchanges, by comm/traffic.hpp's rules; counted as each exchange completes.
  std::uint64_t bytes_sent() const noexcept { return bytes_sent_; }
  std::size_t num_fragments() const noexcept { return frags_.size(); }
  // Fragment p's [offset, offset + length) runs in the flat model, in order.
  std::span<const std::pair<std::size_t, std::size_t>> fragment_runs(std::size_t p) const {
    return frags_.at(p).runs;
  }
  std::size_t fragment_length(std::size_t p) const { return frags_.at(p).length; }
  // Fragment p's common model (its values in fragment order); empty before start().
  std::span<const float> global_model(std::size_t p) const {
    return global_.empty() ? std::span<const float>() : std::span<const float>(global_.at(p));
  }
  const outer_sgd& outer(std::size_t p) const { return outer_.at(p); }
  const X& compressor(std::size_t p) const requires compressed { return x_.at(p); }
  bool in_flight(std::size_t p) const { return pending_.at(p) != nullptr; }
  // Exchanges started and applied so far (every rank alike).
  std::uint64_t exchanges_started() const noexcept { return started_; }
  std::uint64_t exchanges_applied() const noexcept { return applied_; }

  const options& opts() const noexcept { return opt_; }
  // Whether an exchange's merge leaves the local model apart from the common one.
  bool merge_keeps_local() const noexcept {
    return opt_.alpha != 0.0f || (opt_.keep_delay_steps && opt_.delay > 0);
  }
  float learning_rate() const { return opt_.lr; }
  void set_learning_rate(float lr) {
    detail::check_learning_rate("lr", lr);
    opt_.lr = lr;
  }

private:
  friend struct state::access;
  static constexpr const char* state_kind = "sync::diloco";

  struct fragment {
    std::vector<std::pair<std::size_t, std::size_t>> runs; // (offset, length) in the flat model
    std::size_t length = 0;
  };

  // One exchange from its start to its application: the pseudo-gradient sent, the sum it came back as.
  struct exchange {
    std::int64_t started = 0, due = 0;
    std::vector<float> delta, sum;
    std::vector<float> start; // keep_delay_steps: the fragment's local values when the exchange started
    std::uint64_t wire = 0;   // bytes this rank sent for it, written by the exchange thread
    bool own_finite = true;   // uncompressed: whether this rank's pseudo-gradient was finite
    // The sum's NaN and inf as the compressor counted them while writing it, where it does (then apply does
    // not read the sum again to test it).
    std::optional<select::non_finite_scan> sum_scan;
    // The sum left in the fragment's compressor (compress::summed_in_parts), read a part at a time by the
    // outer step: `sum` is not written unless the sum must be tested or saved (settle_sum).
    bool in_parts = false;
    exchange_thread::ticket done; // invalid once waited for (and for a loaded one)
    std::exception_ptr error;     // what the exchange threw, kept until it is applied
  };

  struct saved {
    std::int64_t step = 0;
    std::vector<std::vector<float>> global, velocity;
    std::vector<std::unique_ptr<exchange>> pending;
    std::vector<std::int64_t> applied_at;
    std::vector<X> x;
    float lr = 0.0f;
    std::uint64_t started = 0, applied = 0, bytes_sent = 0;
  };

  step_result run_schedule(std::span<float> params) {
    const std::int64_t s = ++step_;
    step_result r;
    for (std::size_t p = 0; p < frags_.size(); ++p)
      if (pending_[p] && pending_[p]->due <= s) {
        r.exchanged = r.averaged = true;
        apply(p, params);
      }
    for (std::size_t p = 0; p < frags_.size(); ++p)
      if (starts_after(p, s)) {
        r.exchanged = true;
        launch(p, params, s);
        if (opt_.delay == 0) {
          r.averaged = true;
          apply(p, params);
        }
      }
    return r;
  }

  void cut() {
    const auto runs = fragment_runs_of(layers_, static_cast<std::size_t>(opt_.fragments), opt_.layout);
    total_ = 0;
    for (auto l : layers_)
      total_ += l;
    frags_.assign(runs.size(), {});
    for (std::size_t p = 0; p < runs.size(); ++p) {
      frags_[p].runs = runs[p];
      for (const auto& r : runs[p])
        frags_[p].length += r.second;
    }
  }

  void gather(std::size_t p, std::span<const float> params, std::vector<float>& out) const {
    out.resize(frags_[p].length);
    std::size_t at = 0;
    for (const auto& [off, len] : frags_[p].runs) {
      std::copy_n(params.begin() + static_cast<std::ptrdiff_t>(off), len,
                  out.begin() + static_cast<std::ptrdiff_t>(at));
      at += len;
    }
  }

  void require_started() const {
    if (global_.empty())
      throw invalid_argument("sync::diloco: step() or finish() before start(); call start(params) "
                             "once, on every rank, before the first step");
  }

  // Starts fragment p's exchange on the exchange thread.
  void launch(std::size_t p, std::span<const float> params, std::int64_t t) {
    // The fragment's buffers of its last exchange, reused: a fresh vector would be zero-filled (and, large,
    // page-faulted) every round only to be overwritten.
    auto ex = spare_[p] ? std::move(spare_[p]) : std::make_unique<exchange>();
    ex->done = {};
    ex->error = nullptr;
    ex->wire = 0;
    ex->own_finite = true;
    ex->sum_scan.reset();
    ex->in_parts = false;
    ex->started = t;
    ex->due = t + opt_.delay;
    if (opt_.keep_delay_steps) gather(p, params, ex->start);
    exchange* e = ex.get();
    C* c = comm_;
    if constexpr (compressed) {
      X* x = &x_[p];
      if constexpr (in_parts) {
        // The pseudo-gradient formed a stretch at a time as the code reads it, here on the trainer's thread
        // (params change once launch returns); the collective half on the exchange thread.
        code_pseudo_gradient(p, params);
        ex->delta.clear();
        ex->in_parts = true;
        ex->done = thread_->submit([e, c, x] {
          x->reduce_coded(*c);
          e->wire = x->wire_bytes();
        });
      } else {
        // delta <- global - local, gathered from the fragment's runs in one pass.
        pseudo_gradient_of(p, params, ex->delta);
        ex->sum.resize(ex->delta.size());
        ex->done = thread_->submit([e, c, x] {
          x->reduce(*c, std::span<const float>(e->delta), std::span<float>(e->sum));
          e->wire = x->wire_bytes();
          if constexpr (requires { x->sum_non_finite(); }) e->sum_scan = x->sum_non_finite();
        });
      }
    } else {
      // Summed in place: the pseudo-gradient itself is not kept, only whether it was finite (for the
      // refusal's wording).
      ex->own_finite = pseudo_gradient_of(p, params, ex->sum) == 0;
      const std::uint64_t wire =
          comm::ring_all_reduce_traffic(e->sum.size(), sizeof(float), ranks_, rank_).bytes_sent;
      ex->done = thread_->submit([e, c, wire] {
        c->all_reduce_sum(std::span<float>(e->sum));
        e->wire = wire;
      });
    }
    pending_[p] = std::move(ex);
    ++started_;
  }

  // out <- global_p - params over fragment p's runs (math::delta's sign, sync/diloco_math.hpp);
  // returns how many of out's values are NaN or inf, counted in the same pass.
  std::size_t pseudo_gradient_of(std::size_t p, std::span<const float> params,
                                 std::vector<float>& out) const {
    out.resize(frags_[p].length);
    const auto& g = global_[p];
    std::size_t at = 0, bad = 0;
    for (const auto& [off, len] : frags_[p].runs) {
      bad += pseudo_gradient_counted(std::span<const float>(g).subspan(at, len), params.subspan(off, len),
                                     std::span<float>(out).subspan(at, len));
      at += len;
    }
    if (weight_ != 1.0f) { // math::pseudo_gradient's scaling, in a second pass only when it changes bits
      bad = 0;
      for (float& v : out) {
        v = math::mul_rn(v, weight_);
        bad += std::isfinite(v) ? 0u : 1u;
      }
    }
    return bad;
  }

  // Where a walk over a fragment's runs stands: the run that holds the next value, and the fragment index
  // where that run starts.
  struct run_cursor {
    std::size_t run = 0, at = 0;
  };
  // Calls f(i, count, off) for the pieces of fragment p's values [lo, hi) that lie in one run each, off the
  // index of value i in the flat model; calls over rising ranges share one cursor.
  template <class F>
  void walk_runs(std::size_t p, std::size_t lo, std::size_t hi, run_cursor& c, F&& f) const {
    const auto& runs = frags_[p].runs;
    for (std::size_t i = lo; i < hi;) {
      while (c.at + runs[c.run].second <= i)
        c.at += runs[c.run++].second;
      const std::size_t count = std::min(hi, c.at + runs[c.run].second) - i;
      f(i, count, runs[c.run].first + (i - c.at));
      i += count;
    }
  }

  // Fragment p's pseudo-gradient (pseudo_gradient_of's values) coded by its compressor, each stretch the code
  // asks for formed into part_ as it is read; or, to a code that takes it so (compress/difference.hpp), given
  // as global - params where the stretch lies in one run and the rank's weight is 1, for the code to take the
  // difference in its own pass.
  void code_pseudo_gradient(std::size_t p, std::span<const float> params) {
    if constexpr (in_parts) {
      const auto& g = global_[p];
      run_cursor c;
      const auto formed = [&](std::size_t first, std::size_t m) {
        part_.resize(std::max(part_.size(), m));
        walk_runs(p, first, first + m, c, [&](std::size_t i, std::size_t count, std::size_t off) {
          pseudo_gradient_counted(std::span<const float>(g).subspan(i, count), params.subspan(off, count),
                                  std::span<float>(part_).subspan(i - first, count));
        });
        if (weight_ != 1.0f)
          for (std::size_t j = 0; j < m; ++j)
            part_[j] = math::mul_rn(part_[j], weight_);
        return std::span<const float>(part_.data(), m);
      };
      const auto differenced = [&](std::size_t first, std::size_t m, compress::as_difference_t) {
        if (weight_ == 1.0f) {
          const float* local = nullptr;
          std::size_t pieces = 0;
          run_cursor at = c;
          walk_runs(p, first, first + m, at, [&](std::size_t, std::size_t, std::size_t off) {
            local = params.data() + off;
            ++pieces;
          });
          if (pieces == 1) {
            c = at;
            return compress::difference(std::span<const float>(g).subspan(first, m), local);
          }
        }
        return compress::difference(formed(first, m));
      };
      x_[p].code(compress::difference_input{formed, differenced});
    }
  }

  static void wait(exchange& e) noexcept {
    if (e.done.valid()) e.error = e.done.wait();
  }

  // Writes a succeeded exchange's sum, left in fragment p's compressor, into e.sum: for a sum that must be
  // tested for NaN and inf before anything moves, or saved.
  void settle_sum(std::size_t p, exchange& e) const {
    if constexpr (in_parts) {
      if (!e.in_parts) return;
      e.sum.resize(frags_[p].length);
      x_[p].for_each_sum_part(part_, [&](std::size_t first, std::span<const float> part) {
        std::copy(part.begin(), part.end(), e.sum.begin() + static_cast<std::ptrdiff_t>(first));
      });
      e.in_parts = false;
      e.sum_scan.reset();
    }
  }

  // The outer step and the merge on fragment p from e.sum, run by run.
  void step_from_sum(std::size_t p, exchange& e, std::span<float> params) {
    auto& g = global_[p];
    const float n = static_cast<float>(ranks_), a = opt_.alpha;
    std::size_t at = 0;
    for (const auto& [off, len] : frags_[p].runs) {
      if (opt_.keep_delay_steps)
        outer_[p].step_and_carry(g, e.sum, n, at, len, params.data() + off, e.start.data() + at);
      else
        outer_[p].step_and_merge(g, e.sum, n, at, len, params.data() + off, a);
      at += len;
    }
  }

  // The outer step and the merge on fragment p from the sum its compressor holds, each part as it is decoded.
  void step_from_parts(std::size_t p, exchange& e, std::span<float> params) {
    if constexpr (in_parts) {
      auto& g = global_[p];
      const float n = static_cast<float>(ranks_), a = opt_.alpha;
      run_cursor c;
      x_[p].for_each_sum_part(part_, [&](std::size_t lo, std::span<const float> part) {
        walk_runs(p, lo, lo + part.size(), c, [&](std::size_t i, std::size_t count, std::size_t off) {
          const float* const s = part.data() + (i - lo);
          if (opt_.keep_delay_steps)
            outer_[p].step_and_carry_part(g, s, n, i, count, params.data() + off, e.start.data() + i);
          else
            outer_[p].step_and_merge_part(g, s, n, i, count, params.data() + off, a);
        });
      });
    }
  }

  // Waits for fragment p's exchange and applies it; a refused or failed exchange is dropped, and throws.
  void apply(std::size_t p, std::span<float> params) {
    std::unique_ptr<exchange> ex = std::move(pending_[p]);
    wait(*ex);
    bytes_sent_ += ex->wire;
    try {
      if (ex->error) std::rethrow_exception(ex->error);
    } catch (const non_finite& e) {
      throw non_finite(commsgd::concat("sync::diloco: fragment ", p, "'s pseudo-gradients ",
                                       "(theta_global - theta_local, started after step ", ex->started,
                                       ") compressed by ", compressor_name(), " (", e.what(), ")"),
                       e.count(), e.first_index());
    }
    if constexpr (in_parts)
      if (ex->in_parts && !x_[p].sum_surely_finite()) settle_sum(p, *ex);
    const auto bad = ex->in_parts   ? select::non_finite_scan{0, ex->sum.size()}
                     : ex->sum_scan ? *ex->sum_scan
                                    : select::find_non_finite(std::span<const float>(ex->sum));
    if (bad.count > 0) {
      // A compressor refuses non-finite input before any sum, so a code whose pseudo-gradient was not kept
      // (in_parts) had a finite one.
      const bool mine_bad = compressed && !ex->delta.empty()
                                ? select::find_non_finite(std::span<const float>(ex->delta)).count > 0
                                : !ex->own_finite;
      throw non_finite(
          commsgd::concat("sync::diloco: the sum of the ranks' pseudo-gradients "
                          "of fragment ",
                          p, " (started after step ", ex->started, "; ",
                          mine_bad ? "this rank's own holds NaN or inf" : "this rank's own is finite", ")"),
          bad.count, bad.first);
    }
    // The outer step on the mean and the merge, in one pass (outer_sgd::step's arithmetic).
    if (ex->in_parts)
      step_from_parts(p, *ex, params);
    else
      step_from_sum(p, *ex, params);
    applied_at_[p] = step_;
    ++applied_;
    spare_[p] = std::move(ex);
  }

  static const char* compressor_name() {
    if constexpr (compressed)
      return X::name;
    else
      return "none";
  }

  void save_section(state::writer& w, state::part which) const {
    // An exchange in flight is waited for and saved with its sum; one that failed is reported now (and again
    // when it is due).
    for (std::size_t p = 0; p < pending_.size(); ++p)
      if (auto& ex = pending_[p]) {
        wait(*ex);
        if (ex->error) std::rethrow_exception(ex->error);
        settle_sum(p, *ex);
      }
    if (which == state::part::local) {
      if constexpr (compressed)
        for (const auto& x : x_)
          w.put_array(std::span<const std::byte>(state::to_bytes(x)));
      // This rank's values when each exchange in flight started (keep_delay_steps; empty otherwise): its own,
      // unlike the exchange's sum.
      for (const auto& ex : pending_)
        w.put_array(ex ? std::span<const float>(ex->start) : std::span<const float>());
      return;
    }
    w.put_array(std::span<const std::uint64_t>(layers_as_u64()));
    w.put<std::int32_t>(opt_.sync_every);
    w.put<std::int32_t>(opt_.fragments);
    w.put<std::int32_t>(opt_.delay);
    w.put<float>(opt_.alpha);
    w.put<std::uint32_t>(static_cast<std::uint32_t>(opt_.layout));
    w.put<std::uint32_t>(opt_.keep_delay_steps ? 1u : 0u);
    w.put<float>(opt_.outer.lr);
    w.put<float>(opt_.outer.momentum);
    w.put<float>(opt_.lr);
    w.put<std::int64_t>(step_);
    w.put<std::uint64_t>(started_);
    w.put<std::uint64_t>(applied_);
    w.put<std::uint64_t>(bytes_sent_);
    w.put<std::uint32_t>(global_.empty() ? 0u : 1u);
    for (std::size_t p = 0; p < frags_.size(); ++p) {
      if (!global_.empty()) w.put_array(std::span<const float>(global_[p]));
      w.put_array(outer_[p].velocity());
      w.put<std::int64_t>(applied_at_[p]);
      w.put<std::uint32_t>(pending_[p] ? 1u : 0u);
      if (pending_[p]) {
        w.put<std::int64_t>(pending_[p]->started);
        w.put<std::uint64_t>(pending_[p]->wire);
        w.put_array(std::span<const float>(pending_[p]->delta)); // empty uncompressed
        w.put<std::uint32_t>(pending_[p]->own_finite ? 1u : 0u);
        w.put_array(std::span<const float>(pending_[p]->sum));
      }
    }
  }

  std::vector<std::uint64_t> layers_as_u64() const {
    return std::vector<std::uint64_t>(layers_.begin(), layers_.end());
  }

  void parse_section(state::reader& r, state::part which, saved& t) const {
    if (which == state::part::local) {
      if constexpr (compressed)
        for (const auto& x : x_) {
          const auto bytes = r.get_bytes();
          auto is = state::from_bytes(bytes);
          t.x.push_back(x);
          t.x.back().load(is);
        }
      // The shared part is parsed first: t.pending says which exchanges are in flight.
      for (std::size_t p = 0; p < frags_.size(); ++p) {
        auto start = r.get_vector<float>();
        const bool flying = p < t.pending.size() && t.pending[p];
        const std::size_t want = flying && opt_.keep_delay_steps ? frags_[p].length : 0;
        if (start.size() != want)
          throw corrupt_data(commsgd::concat("saved state: fragment ", p, "'s start values hold ",
                                             start.size(), " values where ", want, " are expected"));
        if (flying) t.pending[p]->start = std::move(start);
      }
      return;
    }
    if (r.get_vector<std::uint64_t>() != layers_as_u64())
      throw corrupt_data("saved state: the layer sizes differ from this strategy's");
    state::expect_same(r.get<std::int32_t>(), opt_.sync_every, "option 'sync_every'");
    state::expect_same(r.get<std::int32_t>(), opt_.fragments, "option 'fragments'");
    state::expect_same(r.get<std::int32_t>(), opt_.delay, "option 'delay'");
    state::expect_same_bits(r.get<float>(), opt_.alpha, "alpha");
    state::expect_same(r.get<std::uint32_t>(), static_cast<std::uint32_t>(opt_.layout),
                       "option 'layout' (0 strided, 1 contiguous)");
    state::expect_same(r.get<std::uint32_t>(), opt_.keep_delay_steps ? 1u : 0u,
                       "option 'keep_delay_steps' (1 on, 0 off)");
    state::expect_same_bits(r.get<float>(), opt_.outer.lr, "outer.lr");
    state::expect_same_bits(r.get<float>(), opt_.outer.momentum, "outer.momentum");
    t.lr = state::read_learning_rate(r);
    t.step = r.get<std::int64_t>();
    t.started = r.get<std::uint64_t>();
    t.applied = r.get<std::uint64_t>();
    t.bytes_sent = r.get<std::uint64_t>();
    if (t.step < 0) throw corrupt_data(commsgd::concat("saved state: step ", t.step, " is negative"));
    const bool has_global = r.get<std::uint32_t>() == 1u;
    t.pending.resize(frags_.size());
    for (std::size_t p = 0; p < frags_.size(); ++p) {
      const std::size_t len = frags_[p].length;
      if (has_global) {
        t.global.push_back(r.get_vector<float>());
        if (t.global.back().size() != len)
          throw corrupt_data(commsgd::concat("saved state: fragment ", p, "'s common model holds ",
                                             t.global.back().size(), " values, the fragment ", len));
      }
      t.velocity.push_back(r.get_vector<float>());
      if (!t.velocity.back().empty() && (!outer_[p].has_momentum() || t.velocity.back().size() != len))
        throw corrupt_data(commsgd::concat("saved state: fragment ", p, "'s outer momentum holds ",
                                           t.velocity.back().size(), " values for a fragment of ", len,
                                           " (momentum ", opt_.outer.momentum, ")"));
      t.applied_at.push_back(r.get<std::int64_t>());
      if (t.applied_at.back() < -1 || t.applied_at.back() > t.step)
        throw corrupt_data(commsgd::concat("saved state: fragment ", p, " was last applied after step ",
                                           t.applied_at.back(), ", outside [-1, step ", t.step, "]"));
      if (r.get<std::uint32_t>() == 1u) {
        auto ex = std::make_unique<exchange>();
        ex->started = r.get<std::int64_t>();
        ex->wire = r.get<std::uint64_t>();
        ex->due = ex->started + opt_.delay;
        ex->delta = r.get_vector<float>();
        ex->own_finite = r.get<std::uint32_t>() == 1u;
        ex->sum = r.get_vector<float>();
        // A compressed exchange keeps its pseudo-gradient, or none where its code formed it as it read it.
        const bool delta_fits = ex->delta.size() == (compressed ? len : 0) || ex->delta.empty();
        if (!has_global || !delta_fits || ex->sum.size() != len || ex->started < 1 || ex->due < t.step ||
            !starts_after(p, ex->started))
          throw corrupt_data(commsgd::concat("saved state: fragment ", p,
                                             "'s exchange in flight "
                                             "(started after step ",
                                             ex->started, ") does not fit the schedule or the fragment"));
        t.pending[p] = std::move(ex);
      }
    }
  }

  void commit(saved&& t) noexcept {
    drain();
    opt_.lr = t.lr;
    step_ = t.step;
    applied_at_ = std::move(t.applied_at);
    started_ = t.started;
    applied_ = t.applied;
    bytes_sent_ = t.bytes_sent;
    global_ = std::move(t.global);
    for (std::size_t p = 0; p < frags_.size(); ++p)
      outer_[p].replace_velocity(std::move(t.velocity[p]));
    pending_ = std::move(t.pending);
    if constexpr (compressed)
      if (!t.x.empty()) x_ = std::move(t.x);
    resumed_ = true;
  }

  C* comm_;
  int ranks_, rank_;    // asked once: while an exchange is in flight only the exchange thread may use comm_
  float weight_ = 1.0f; // set_weight's
  options opt_;
  std::vector<std::size_t> layers_;
  std::size_t total_ = 0;
  std::vector<fragment> frags_;
  std::vector<std::vector<float>> global_; // per fragment; empty before start()
  std::vector<outer_sgd> outer_;
  std::vector<X> x_;                // compressed: one per fragment
  mutable std::vector<float> part_; // in_parts: a stretch of a pseudo-gradient, or a part of a sum
  std::vector<std::unique_ptr<exchange>> pending_;
  std::vector<std::unique_ptr<exchange>> spare_; // per fragment: the buffers of its last applied exchange
  std::vector<std::int64_t> applied_at_; // per fragment: the step its last exchange was applied after, or -1
  std::int64_t step_ = 0;
  std::uint64_t started_ = 0, applied_ = 0, bytes_sent_ = 0;
  bool resumed_ = false;
  // Last: destroyed first, after drain(), so no exchange outlives what it uses.
  std::unique_ptr<exchange_thread> thread_;
};

static_assert(sync_strategy<diloco<comm::archetype>>);

// Every rank holds the same model after a step that applied an exchange only when one fragment is the whole
// model and the merge keeps nothing local; after finish whenever the merge keeps nothing local.
template <class C, class X>
struct replica_promise<diloco<C, X>> {
  static bool after_step(const diloco<C, X>& s, const step_result& r) {
    return r.averaged && s.num_fragments() == 1 && !s.merge_keeps_local();
  }
  static bool after_finish(const diloco<C, X>& s) { return s.opts().alpha == 0.0f; }
};

} // namespace commsgd::inline v1::sync
