// sync::partitioned: the gradient is exchanged in fixed-size partitions, highest priority first, with at most
// `credit_bytes` of sends in flight, overlapping the exchange with the rest of the backward pass.
//
//   sync::partitioned s(comm, layer_sizes,
//                       {.lr = 0.1f, .partition_elements = 4096, .credit_bytes = 64 << 10});
//   s.start(x);
//   loop {
//     s.begin_step(grad);                         // grad must stay alive, and each layer's slice
//                                                 // unchanged once that layer is ready
//     for (layer = L - 1; layer >= 0; --layer) {  // backward produces the last layer first
//       ... fill grad's slice of `layer` ...
//       s.gradient_ready(layer);                  // sends what it can; returns at once
//     }
//     s.finish_step(x);                           // completes every partition; x -= lr * mean gradient
//   }
//   s.finish(x);
// step(x, grad, info) does all of that in one call (no overlap). tests/unit/sync_snippets.cpp runs the loop.
//
// Partitions never straddle a layer. Priority is the order the next forward pass needs them: layer 0 first,
// then by offset; among the sends that are ready, the scheduler starts them strictly in priority order and
// stops at the first that would take the bytes in flight past the credit (ByteScheduler's rule: keep the
// network queue short so that a high-priority partition that becomes ready later is not stuck behind it).
//
// The exchange of a partition is reduce-to-owner then point-to-point broadcast: partition p belongs to rank
// p mod n; the others send it their slice; the owner sums the n contributions in rank order and sends the sum
// back. Owners rotate, so every rank sends and receives about 2 (n - 1) / n of the gradient, as in a ring
// all-reduce. Every receive is posted in begin_step, so a send never waits on its receiver's scheduler and
// the credit cannot deadlock ranks whose partitions become ready in different orders.
//
// Result: the sum of every element is taken in rank order, the same order as comm::local's all_reduce_sum
// and ordered_exchange, and the update is the shared apply_mean_sum, so the model equals sync::synchronous
// over either of those bit for bit.
//
// Checkpoints (state/strategy.hpp): the schedule (layer sizes and partition size, which fix every partition and
// its owner) is saved and a stream of another schedule is refused; the state is the step counter and the
// learning rate, shared by every rank. Saving inside an open step is refused. After load() call start()
// with the model saved alongside; a loaded strategy's start() does not broadcast.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/poll.hpp>
#include <commsgd/comm/tags.hpp>
#include <commsgd/error.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/replica_promise.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <ostream>
#include <set>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

namespace commsgd::inline v1::sync {

struct partitioned_options {
  float lr = 0.01f;                          // (0, inf)
  std::size_t partition_elements = 1u << 14; // [1, inf)
  std::size_t credit_bytes = 1u << 20;       // [partition_elements * 4, inf): one partition must fit
  int tag_base = -1;     // -1: 2 * partitions free tags (comm/tags.hpp); else [0, 32767 - 2 * partitions]
  bool keep_log = false; // record partition_events (tests, traces)
};

// One fixed-size piece of the flat gradient.
struct partition {
  std::size_t layer = 0;
  std::size_t offset = 0; // into the flat gradient
  std::size_t count = 0;  // elements
  int owner = 0;
};

struct partition_event {
  enum class what { ready, send_start, send_done, reduced, result_received };
  what kind = what::ready;
  std::size_t partition = 0; // index = priority (0 first)
  int peer = -1;             // the other rank of a send or receive
  std::size_t in_flight = 0; // bytes of sends in flight after the event
  std::int64_t step = 0;
};

template <comm::communicator C>
class partitioned : public state::checkpointed<partitioned<C>> {
public:
  using options = partitioned_options;

  partitioned(C& c, std::vector<std::size_t> layer_sizes, options o)
      : comm_(&c), opt_(o), layers_(std::move(layer_sizes)) {
    detail::check_learning_rate("lr", opt_.lr);
    commsgd::check_range("partition_elements", opt_.partition_elements, std::size_t{1},
                         std::numeric_limits<std::size_t>::max() / sizeof(float), "[1, inf)");
    const std::size_t partition_bytes = opt_.partition_elements * sizeof(float);
    commsgd::check_range(
        "credit_bytes", opt_.credit_bytes, partition_bytes, std::numeric_limits<std::size_t>::max(),
        commsgd::concat("[partition_elements * 4 = ", partition_bytes, ", inf) (one partition must fit)"));
    if (layers_.empty())
      throw invalid_argument("argument 'layer_sizes' is empty; the allowed range is at least one layer");
    const int n = c.size();
    layer_first_.push_back(0);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      if (layers_[l] == 0)
        throw invalid_argument(
            commsgd::concat("argument 'layer_sizes[", l, "]' = 0 is outside the allowed range [1, inf)"));
      for (std::size_t off = 0; off < layers_[l]; off += opt_.partition_elements) {
        const std::size_t count = std::min(opt_.partition_elements, layers_[l] - off);
        parts_.push_back(
            {l, dim_ + off, count, static_cast<int>(parts_.size() % static_cast<std::size_t>(n))});
      }
      dim_ += layers_[l];
      layer_first_.push_back(parts_.size());
    }
    const long long top = static_cast<long long>(opt_.tag_base) + 2 * static_cast<long long>(parts_.size());
    if (opt_.tag_base < -1 || top > comm::mpi_tag_limit)
      throw invalid_argument(commsgd::concat(
          "argument 'tag_base' = ", opt_.tag_base, " with ", parts_.size(),
          " partitions is outside the allowed range -1 (free tags) or [0, 32767 - 2 * partitions]; use "
          "larger partitions"));
    const long long wanted = 2 * static_cast<long long>(parts_.size());
    if (wanted > comm::auto_tags_end - comm::user_tags_end)
      throw invalid_argument(commsgd::concat("partitioned: ", parts_.size(), " partitions need ", wanted,
                                             " tags, outside the allowed range [1, ",
                                             comm::auto_tags_end - comm::user_tags_end,
                                             "]; use larger partitions"));
    tags_ = opt_.tag_base < 0
                ? comm::reserve_tags(c, static_cast<int>(wanted), "partitioned")
                : comm::reserve_tags_at(c, opt_.tag_base, static_cast<int>(wanted), "partitioned");
    // Staging for contributions to the partitions this rank owns: n - 1 slices each.
    stage_offset_.assign(parts_.size(), 0);
    std::size_t staged = 0;
    for (std::size_t p = 0; p < parts_.size(); ++p)
      if (parts_[p].owner == c.rank()) {
        stage_offset_[p] = staged;
        staged += parts_[p].count * static_cast<std::size_t>(n - 1);
      }
    staging_.resize(staged);
    sum_.resize(dim_);
  }

  bool computes_gradients() const { return true; }
  std::size_t size() const { return dim_; }
  const std::vector<partition>& partitions() const { return parts_; }
  const std::vector<partition_event>& log() const { return log_; }
  void clear_log() { log_.clear(); }

  void start(std::span<float> params) {
    detail::check_same_size("params", params.size(), dim_);
    if (std::exchange(resumed_, false)) return;
    comm_->broadcast(params, 0);
  }

  step_result step(std::span<float> params, std::span<const float> grad, const step_info& = {}) {
    begin_step(grad);
    for (std::size_t l = layers_.size(); l-- > 0;)
      gradient_ready(l);
    finish_step(params);
    return {.exchanged = true, .averaged = false};
  }

  void finish(std::span<float>) {
    if (in_step_) throw invalid_argument("partitioned::finish: a step is still open; call finish_step first");
  }

  void begin_step(std::span<const float> grad) {
    if (in_step_)
      throw invalid_argument("partitioned::begin_step: the previous step is still open; call finish_step");
    detail::check_same_size("grad", grad.size(), dim_);
    grad_ = grad;
    in_step_ = true;
    ready_.assign(layers_.size(), false);
    state_.assign(parts_.size(), part_state{});
    const int n = comm_->size(), me = comm_->rank();
    for (std::size_t p = 0; p < parts_.size(); ++p) {
      const auto& part = parts_[p];
      if (n == 1) continue;
      if (part.owner == me) {
        for (int r = 0, slot = 0; r < n; ++r) {
          if (r == me) continue;
          auto dest = std::span<float>(staging_).subspan(
              stage_offset_[p] + part.count * static_cast<std::size_t>(slot++), part.count);
          receives_.push_back({comm_->irecv(dest, r, tag(p, 0)), p, r});
        }
      } else {
        receives_.push_back(
            {comm_->irecv(std::span<float>(sum_).subspan(part.offset, part.count), part.owner, tag(p, 1)), p,
             part.owner});
      }
    }
  }

  // The gradient of `layer` is final in the buffer given to begin_step; any order of layers works.
  void gradient_ready(std::size_t layer) {
    if (!in_step_) throw invalid_argument("partitioned::gradient_ready: call begin_step first");
    commsgd::check_range("layer", layer, std::size_t{0}, layers_.size() - 1,
                         commsgd::concat("[0, layers = ", layers_.size(), ")"));
    if (ready_[layer])
      throw invalid_argument(commsgd::concat("partitioned::gradient_ready: layer ", layer,
                                             " was already marked ready in this step"));
    ready_[layer] = true;
    const auto first = parts_[layer_first_[layer]].offset;
    detail::require_finite("gradient", grad_.subspan(first, layers_[layer]), first);
    const int me = comm_->rank();
    for (std::size_t p = layer_first_[layer]; p < layer_first_[layer + 1]; ++p) {
      note(partition_event::what::ready, p, me);
      state_[p].ready = true;
      if (parts_[p].owner != me) queue_.insert({p, parts_[p].owner, false});
    }
    pump();
  }

  // Completes every partition of the step, then applies the mean gradient to params.
  void finish_step(std::span<float> params) {
    if (!in_step_) throw invalid_argument("partitioned::finish_step: call begin_step first");
    detail::check_same_size("params", params.size(), dim_);
    for (std::size_t l = 0; l < layers_.size(); ++l)
      if (!ready_[l])
        throw invalid_argument(
            commsgd::concat("partitioned::finish_step: layer ", l, " was never marked ready in this step"));
    comm::poll_until([&] {
      if (complete()) return comm::poll_step::done;
      return pump() ? comm::poll_step::moved : comm::poll_step::idle;
    });
    if (comm_->size() == 1) std::copy(grad_.begin(), grad_.end(), sum_.begin());
    apply_mean_sum(params, sum_, comm_->size(), opt_.lr);
    in_step_ = false;
    ++step_;
  }

  // Moves the exchange forward without blocking; returns whether anything happened. Trainers with long
  // gaps between gradient_ready calls may call it in between.
  bool poll() { return in_step_ && pump(); }

  float learning_rate() const { return opt_.lr; }
  void set_learning_rate(float lr) {
    detail::check_learning_rate("lr", lr);
    opt_.lr = lr;
  }

  // Steps completed so far.
  std::int64_t steps() const { return step_; }

private:
  friend struct state::access;
  static constexpr const char* state_kind = "sync::partitioned";
  struct saved {
    float lr = 0.0f;
    std::int64_t step = 0;
  };
  void save_section(state::writer& w, state::part which) const {
    if (in_step_) throw invalid_argument("partitioned::save: a step is open; save after finish_step");
    if (which != state::part::shared) return;
    w.put_array(std::span<const std::size_t>(layers_));
    w.put<std::uint64_t>(opt_.partition_elements);
    w.put<float>(opt_.lr);
    w.put<std::int64_t>(step_);
  }
  void parse_section(state::reader& r, state::part which, saved& t) const {
    if (which != state::part::shared) return;
    const auto layers = r.get_vector<std::size_t>();
    if (layers != layers_)
      throw corrupt_data(commsgd::concat("saved state: ", layers.size(),
                                         " layers of other sizes than this strategy's ", layers_.size(),
                                         " layers"));
    state::expect_same(r.get<std::uint64_t>(), opt_.partition_elements, "option 'partition_elements'");
    t.lr = state::read_learning_rate(r);
    t.step = r.get<std::int64_t>();
    if (t.step < 0) throw corrupt_data(commsgd::concat("saved state: step ", t.step, " is negative"));
  }
  void commit(saved&& t) noexcept {
    opt_.lr = t.lr;
    step_ = t.step;
    resumed_ = true;
  }

  struct part_state {
    bool ready = false;
    int contributions = 0; // owner: received so far
    bool done = false;     // owner: reduced; others: result received
  };
  struct job {
    std::size_t part;
    int dest;
    bool result; // owner's sum going back (true) or a contribution going to the owner
    friend bool operator<(const job& a, const job& b) {
      return std::tie(a.part, a.result, a.dest) < std::tie(b.part, b.result, b.dest);
    }
  };
  struct pending_receive {
    comm::request_t<C> request;
    std::size_t part;
    int from;
  };
  struct pending_send {
    comm::request_t<C> request;
    std::size_t part;
    int dest;
    std::size_t bytes;
  };

  int tag(std::size_t p, int kind) const { return tags_[2 * static_cast<int>(p) + kind]; }

  void note(partition_event::what w, std::size_t p, int peer) {
    if (opt_.keep_log) log_.push_back({w, p, peer, in_flight_, step_});
  }

  bool complete() const {
    if (!queue_.empty() || !sends_.empty() || !receives_.empty()) return false;
    if (comm_->size() == 1) return true;
    return std::all_of(state_.begin(), state_.end(), [](const part_state& s) { return s.done; });
  }

  bool pump() {
    bool progressed = false;
    for (auto it = sends_.begin(); it != sends_.end();) {
      if (it->request.test()) {
        in_flight_ -= it->bytes;
        note(partition_event::what::send_done, it->part, it->dest);
        it = sends_.erase(it);
        progressed = true;
      } else {
        ++it;
      }
    }
    const int me = comm_->rank();
    for (auto it = receives_.begin(); it != receives_.end();) {
      if (it->request.test()) {
        if (parts_[it->part].owner == me) {
          ++state_[it->part].contributions;
        } else {
          state_[it->part].done = true;
          note(partition_event::what::result_received, it->part, it->from);
        }
        it = receives_.erase(it);
        progressed = true;
      } else {
        ++it;
      }
    }
    const int n = comm_->size();
    for (std::size_t p = 0; p < parts_.size(); ++p) {
      auto& s = state_[p];
      if (n == 1 || parts_[p].owner != me || s.done || !s.ready || s.contributions != n - 1) continue;
      reduce(p);
      s.done = true;
      note(partition_event::what::reduced, p, me);
      for (int r = 0; r < n; ++r)
        if (r != me) queue_.insert({p, r, true});
      progressed = true;
    }
    while (!queue_.empty()) {
      const job j = *queue_.begin();
      const std::size_t bytes = parts_[j.part].count * sizeof(float);
      if (in_flight_ + bytes > opt_.credit_bytes) break; // strict priority: nothing jumps the queue
      queue_.erase(queue_.begin());
      const auto& part = parts_[j.part];
      const auto data = j.result ? std::span<const float>(sum_).subspan(part.offset, part.count)
                                 : grad_.subspan(part.offset, part.count);
      in_flight_ += bytes;
      sends_.push_back({comm_->isend(data, j.dest, tag(j.part, j.result ? 1 : 0)), j.part, j.dest, bytes});
      note(partition_event::what::send_start, j.part, j.dest);
      progressed = true;
    }
    return progressed;
  }

  // Sum in rank order, so every element has the same bits as a rank-ordered all-reduce.
  void reduce(std::size_t p) {
    const auto& part = parts_[p];
    const int n = comm_->size(), me = comm_->rank();
    auto source = [&](int r) -> const float* {
      if (r == me) return grad_.data() + part.offset;
      const int slot = r < me ? r : r - 1;
      return staging_.data() + stage_offset_[p] + part.count * static_cast<std::size_t>(slot);
    };
    float* out = sum_.data() + part.offset;
    const float* first = source(0);
    for (std::size_t e = 0; e < part.count; ++e)
      out[e] = first[e];
    for (int r = 1; r < n; ++r) {
      const float* src = source(r);
      for (std::size_t e = 0; e < part.count; ++e)
        out[e] += src[e];
    }
  }

  C* comm_;
  options opt_;
  std::vector<std::size_t> layers_;
  std::vector<std::size_t> layer_first_; // first partition of each layer, plus the end
  comm::tag_lease tags_;
  std::vector<partition> parts_;
  std::size_t dim_ = 0;
  std::vector<std::size_t> stage_offset_;
  std::vector<float> staging_;
  std::vector<float> sum_;
  // Step state.
  bool in_step_ = false;
  std::int64_t step_ = 0;
  std::span<const float> grad_;
  std::vector<bool> ready_;
  std::vector<part_state> state_;
  std::set<job> queue_;
  std::vector<pending_send> sends_;
  std::vector<pending_receive> receives_;
  std::size_t in_flight_ = 0;
  std::vector<partition_event> log_;
  bool resumed_ = false;
};

static_assert(sync_strategy<partitioned<comm::archetype>>);

// What replica_guard may check (sync/replica_promise.hpp).
template <class C>
struct replica_promise<partitioned<C>> {
  static bool after_step(const partitioned<C>&, const step_result&) { return true; }
  static bool after_finish(const partitioned<C>&) { return true; }
};

} // namespace commsgd::inline v1::sync
