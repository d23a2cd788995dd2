// The communication schemes the trainer compares, and the factory that builds one from its command-line name.
//
//   ring                               SSGD (sync::synchronous): all-reduce sum of the gradient, ring as
//                                      the meter charges it
//   allgather                          SSGD as the CSSGD paper's baseline: every node gathers every node's
//                                      gradient (data_parallel over coding::uncoded<by_all_gather>)
//   topk:<method>:<density>            SSGD on top-k sparsified gradients with error feedback, sparse
//                                      all-gather (data_parallel with top-k as its sparsifier);
//                                      method: exact, radix, laplace_bisect, hierarchical, sampled
//   topk_ar:<method>:<density>         as topk, summed by the sparse all-reduce (schemes_allreduce.hpp)
//   cssgd:<r>[:xor|int32]              coded SSGD with redundancy r (data_parallel over coding::cssgd)
//   local:<H>                          local SGD, models averaged every H steps
//   local_adaptive:<H0>[:<pull>]       local SGD with ADACOMM's shrinking interval and an elastic pull to
//                                      the last average
//   partitioned[:<elements>[:<credit KiB>]]
//                                      SSGD through sync::partitioned: per-layer partitions exchanged while
//                                      the backward pass still runs (ByteScheduler / DDP buckets)
//   powersgd:<r>                       SSGD on rank-r PowerSGD approximations (schemes_powersgd.hpp)
//
//   fp16[:ef], bf16[:ef], sign, qsgd:<s>[:ef], random_k:<density>
//                                      SSGD with a compressor of commsgd/compress (schemes_compress.hpp)
//
// (asgd[:<j>] runs in trainer.hpp: a parameter server has no common step to put in this slot.)
#pragma once

#include "scheme.hpp"
#include "schemes_compress.hpp"

#include <commsgd/data_parallel.hpp>
#include <commsgd/error.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/select.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/partitioned.hpp>
#include <commsgd/sync/synchronous.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace fmnist {

// Any commsgd::sync strategy in the slot. Strategies expect this rank's mean gradient over its own samples,
// while the trainer's gradient is scaled for the whole batch, hence the rescale.
template <class Comm, class Strategy>
class sync_strategy final : public scheme<Comm> {
public:
  template <class Options>
  sync_strategy(Comm& comm, Options o) : strategy_(comm, o) {}

  void step(Comm&, step_env& env) override {
    if (!started_) {
      strategy_.start(env.params);
      started_ = true;
    }
    grad_.resize(env.params.size());
    const auto [lo, hi] = share_of(env.batch, env.rank, env.size);
    const double loss = env.gradient(lo, hi - lo, grad_);
    const float to_local =
        static_cast<float>(env.batch) / static_cast<float>(std::max<std::size_t>(hi - lo, 1));
    for (float& g : grad_)
      g *= to_local;
    const auto r = strategy_.step(env.params, grad_,
                                  {.loss = loss / static_cast<double>(std::max<std::size_t>(hi - lo, 1))});
    averages_ += r.averaged;
  }

  void finish(Comm&, step_env& env) override { strategy_.finish(env.params); }

  std::string note() const override {
    if constexpr (requires { strategy_.current_period(); }) {
      std::ostringstream s;
      s << "interval " << strategy_.current_period() << ", averages " << averages_;
      return s.str();
    }
    return {};
  }

private:
  Strategy strategy_;
  bool started_ = false;
  std::size_t averages_ = 0;
  std::vector<float> grad_;
};

// Any data_parallel composition in the slot: this rank computes the gradient of every block data_parallel
// gives it, and data_parallel does the rest (exchange, sparsification, update). data_parallel applies lr
// times the mean over all blocks of the block gradients, so each block's gradient is its loss sum divided
// by batch / block_count: the mean over blocks is then the batch mean every other scheme applies, however
// unevenly the batch splits into blocks.
template <class Comm, class Dp>
class composed final : public scheme<Comm> {
public:
  composed(Comm& comm, std::size_t length, typename Dp::options o) : dp_(comm, length, std::move(o)) {}

  // data_parallel::start() is not called: every rank builds the same initial model from the seed, and for
  // these synchronous compositions start() would only broadcast it once more, traffic that the exchanges
  // compared here have never been charged.
  void step(Comm&, step_env& env) override {
    if constexpr (requires { dp_.compression().charge_to(&env); }) dp_.compression().charge_to(&env);
    const std::size_t d = env.params.size();
    const auto sizes = dp_.block_sizes(env.batch);
    offset_.assign(sizes.size() + 1, 0);
    for (std::size_t q = 0; q < sizes.size(); ++q)
      offset_[q + 1] = offset_[q] + sizes[q];
    const auto mine = dp_.my_blocks();
    const double scale = static_cast<double>(env.batch) / static_cast<double>(dp_.block_count());
    blocks_.resize(mine.size());
    views_.clear();
    for (std::size_t j = 0; j < mine.size(); ++j) {
      blocks_[j].resize(d);
      env.gradient_by_layer(offset_[mine[j]], sizes[mine[j]], scale, blocks_[j], [](std::size_t) {});
      views_.emplace_back(blocks_[j]);
    }
    dp_.step(env.params, commsgd::coding::block_gradients(views_));
    clipped_ += dp_.last_coding().clipped;
    const auto& sparse = dp_.last_exchange();
    if (!sparse.counts.empty()) sent_ += sparse.counts[static_cast<std::size_t>(env.rank)];
    dense_ += sparse.dense;
    ++steps_;
  }

  std::string note() const override {
    std::ostringstream s;
    if constexpr (requires { dp_.compression(); }) {
      if (steps_ > 0) s << "pairs/step " << sent_ / steps_ << ", dense steps " << dense_;
    } else if constexpr (requires { dp_.coding().redundancy(); }) {
      s << "r = " << dp_.coding().redundancy() << ", blocks " << dp_.block_count() << ", clipped "
        << clipped_;
    }
    return s.str();
  }

private:
  Dp dp_;
  std::vector<std::size_t> offset_;
  std::vector<std::vector<float>> blocks_;
  std::vector<std::span<const float>> views_;
  std::uint64_t clipped_ = 0;
  std::size_t sent_ = 0, dense_ = 0, steps_ = 0;
};

// top-k as data_parallel's sparsifier, with what the comparison needs on top of policy::top_k: each selector
// runs on one thread (a rank stands for a node with its own core), and the time the sparsifier takes (the
// error-feedback sum, the selection, the compaction) is charged as this rank's compute, as a node would
// spend it. It is a policy defined outside commsgd: a tag and the traits specialised below.
template <class Selector>
struct charged_top_k {};

template <class Sparsifier>
class charged_sparsifier : public Sparsifier {
public:
  using Sparsifier::Sparsifier;

  typename Sparsifier::message_type step(std::span<const float> g) {
    typename Sparsifier::message_type m;
    if (env_)
      env_->charged([&] { m = Sparsifier::step(g); });
    else
      m = Sparsifier::step(g);
    if (env_ && env_->on_accumulator) {
      // The selector's input, rebuilt outside the charged time: sent positions hold +0 in the residual.
      const auto r = this->residual();
      accumulator_.assign(r.begin(), r.end());
      for (std::size_t i = 0; i < m.size(); ++i)
        accumulator_[m.indices[i]] = m.values[i];
      env_->on_accumulator(accumulator_, m.size());
    }
    return m;
  }

  // Where the next steps' time goes: the trainer's step_env, which outlives the run.
  void charge_to(const step_env* env) noexcept { env_ = env; }

private:
  const step_env* env_ = nullptr;
  std::vector<float> accumulator_;
};

template <class Selector>
Selector one_thread_selector() {
  if constexpr (requires(typename Selector::options o) { o.parallel; }) {
    typename Selector::options o;
    o.parallel = commsgd::select::parallel_options{1, std::size_t{1} << 20};
    return Selector{o};
  } else {
    return Selector{};
  }
}

} // namespace fmnist

template <class Selector>
struct commsgd::policy::compression_traits<fmnist::charged_top_k<Selector>> {
  using options = commsgd::policy::top_k_settings;
  static constexpr bool dense_blocks = false;
  using type = fmnist::charged_sparsifier<commsgd::sparsify::top_k<Selector>>;

  static type make(std::size_t length, const options& o) {
    return type(length, o.top_k, fmnist::one_thread_selector<Selector>());
  }
};

#include "schemes_allreduce.hpp"

namespace fmnist {

// SSGD through sync::partitioned: the gradient is cut into partitions that never straddle a layer, and
// each layer's partitions are handed to the exchange the moment backpropagation finishes that layer, so the
// exchange of the last layers runs while the first layers' gradients are still being computed.
//
// Model of the overlap (step_seconds), per rank, on one full-duplex link:
// - t_l: when layer l's gradient was final, measured on this rank's compute clock from the start of the step
//   (forward included, the time spent inside gradient_ready taken out: that is the library's bookkeeping,
//   which a real node would run on its communication thread).
// - Layer l's traffic, taken from the partition table (a partition this rank owns: n - 1 contributions in,
//   n - 1 sums out; any other: one contribution out, one sum in), occupies the link for
//   comm::busy_seconds(load_l, net), the simulated clock's own formula. The link takes layers in the order
//   they become ready (the last layer first) and serves one at a time: layer l starts at
//   max(t_l, the end of the previous layer's traffic).
// - The sum of a partition cannot come back before every contribution has arrived: one more message of the
//   largest partition (alpha + bytes / bandwidth) after the link drains.
// - The step ends at max(compute, that end). Peers are assumed to reach each layer at the same time (they
//   run the same computation on equal shares); waiting for a slower rank is charged by the trainer, which
//   aligns every clock to the slowest rank after each step.
// The per-layer loads must add up to exactly what comm::simulated charged for the step (plus the initial
// broadcast on the first step, charged serially): the scheme checks that, so the model cannot drift from the
// traffic that really moved.
template <class Comm>
class partitioned_scheme final : public scheme<Comm> {
public:
  partitioned_scheme(Comm& comm, std::vector<std::size_t> layer_sizes, commsgd::sync::partitioned_options o)
      : sync_(comm, layer_sizes, o), layer_load_(layer_sizes.size()), ready_at_(layer_sizes.size(), 0.0) {
    const int n = comm.size(), me = comm.rank();
    for (const auto& p : sync_.partitions()) {
      const std::uint64_t bytes = p.count * sizeof(float);
      largest_ = std::max(largest_, bytes);
      if (n == 1) continue;
      const auto peers = static_cast<std::uint64_t>(n - 1);
      auto& l = layer_load_[p.layer];
      if (p.owner == me)
        l += {peers, peers * bytes, peers, peers * bytes};
      else
        l += {1, bytes, 1, bytes};
    }
  }

  void step(Comm&, step_env& env) override {
    if (!started_) {
      sync_.start(env.params);
      started_ = true;
    }
    grad_.resize(env.params.size());
    const auto [lo, hi] = share_of(env.batch, env.rank, env.size);
    sync_.begin_step(grad_);
    const double t0 = env.clock->now();
    double in_exchange = 0;
    // sync::partitioned applies lr times the mean over ranks of each rank's mean gradient.
    env.gradient_by_layer(lo, hi - lo, static_cast<double>(std::max<std::size_t>(hi - lo, 1)), grad_,
                          [&](std::size_t layer) {
                            const double t = env.clock->now();
                            ready_at_[layer] = t - t0 - in_exchange;
                            sync_.gradient_ready(layer);
                            in_exchange += env.clock->now() - t;
                          });
    *env.compute -= in_exchange;
    sync_.finish_step(env.params);
  }

  double step_seconds(double compute, const commsgd::comm::traffic& load,
                      const commsgd::comm::network_model& net) const override {
    commsgd::comm::traffic modelled;
    for (const auto& l : layer_load_)
      modelled += l;
    if (modelled.messages_sent > load.messages_sent || modelled.bytes_sent > load.bytes_sent ||
        modelled.messages_received > load.messages_received || modelled.bytes_received > load.bytes_received)
      throw commsgd::invalid_argument("partitioned scheme: the per-layer loads exceed what comm::simulated "
                                      "charged for the step");
    const commsgd::comm::traffic rest{
        load.messages_sent - modelled.messages_sent, load.bytes_sent - modelled.bytes_sent,
        load.messages_received - modelled.messages_received, load.bytes_received - modelled.bytes_received};
    double link_free = 0;
    for (std::size_t l = layer_load_.size(); l-- > 0;) {
      if (layer_load_[l] == commsgd::comm::traffic{}) continue;
      link_free = std::max(link_free, ready_at_[l]) + commsgd::comm::busy_seconds(layer_load_[l], net);
    }
    if (link_free > 0) link_free += net.seconds(1, largest_);
    return commsgd::comm::busy_seconds(rest, net) + std::max(compute, link_free);
  }

  std::string note() const override {
    std::ostringstream s;
    s << sync_.partitions().size() << " partitions";
    return s.str();
  }

private:
  commsgd::sync::partitioned<Comm> sync_;
  std::vector<commsgd::comm::traffic> layer_load_;
  std::vector<double> ready_at_;
  std::uint64_t largest_ = 0;
  bool started_ = false;
  std::vector<float> grad_;
};

inline std::vector<std::string> split_spec(const std::string& spec) {
  std::vector<std::string> parts;
  std::stringstream in(spec);
  for (std::string p; std::getline(in, p, ':');)
    parts.push_back(p);
  return parts;
}

} // namespace fmnist

#include "schemes_powersgd.hpp" // after composed<>, which it uses

namespace fmnist {

// Builds a scheme from its name (see the list at the top of this file).
template <class Comm>
scheme_ptr<Comm> make_scheme(const std::string& spec, Comm& comm, float lr,
                             const std::vector<std::size_t>& layer_sizes) {
  const auto p = split_spec(spec);
  auto arg = [&](std::size_t i, const char* fallback) { return p.size() > i ? p[i] : std::string(fallback); };
  if (p.empty()) throw commsgd::invalid_argument("argument 'scheme' is empty");
  if (p[0] == "ring")
    return std::make_unique<sync_strategy<Comm, commsgd::sync::synchronous<Comm>>>(
        comm, commsgd::sync::synchronous_options{.lr = lr});
  using commsgd::data_parallel;
  namespace policy = commsgd::policy;
  const std::size_t length = std::accumulate(layer_sizes.begin(), layer_sizes.end(), std::size_t{0});
  if (p[0] == "allgather") {
    using dp = data_parallel<policy::uncoded<commsgd::coding::by_all_gather>, policy::dense,
                             policy::synchronous, Comm>;
    return std::make_unique<composed<Comm, dp>>(comm, length, typename dp::options{.lr = lr});
  }
  if (p[0] == "topk") {
    const std::string method = arg(1, "exact");
    const double density = std::stod(arg(2, "0.01"));
    const policy::top_k_settings s{.top_k = {.density = density}};
    auto make = [&]<class Selector>() -> scheme_ptr<Comm> {
      using dp = data_parallel<policy::uncoded<>, charged_top_k<Selector>, policy::synchronous, Comm>;
      return std::make_unique<composed<Comm, dp>>(comm, length,
                                                  typename dp::options{.lr = lr, .compression = s});
    };
    if (method == "exact") return make.template operator()<commsgd::select::exact>();
    if (method == "radix") return make.template operator()<commsgd::select::radix>();
    if (method == "laplace_bisect") return make.template operator()<commsgd::select::laplace_bisect>();
    if (method == "hierarchical") return make.template operator()<commsgd::select::hierarchical>();
    if (method == "sampled") return make.template operator()<commsgd::select::sampled>();
    throw commsgd::invalid_argument("argument 'scheme' = '" + spec + "': selection method '" + method +
                                    "' is not one of exact, radix, laplace_bisect, hierarchical, sampled");
  }
  if (p[0] == "cssgd") {
    const int r = std::stoi(arg(1, "2"));
    const std::string combiner = arg(2, "xor");
    auto make = [&]<class Combiner>() -> scheme_ptr<Comm> {
      using dp = data_parallel<policy::cssgd<Combiner>, policy::dense, policy::synchronous, Comm>;
      return std::make_unique<composed<Comm, dp>>(
          comm, length, typename dp::options{.lr = lr, .coding = {.redundancy = r}});
    };
    if (combiner == "xor") return make.template operator()<commsgd::coding::xor_bits>();
    if (combiner == "int32") return make.template operator()<commsgd::coding::int32_sum>();
    throw commsgd::invalid_argument("argument 'scheme' = '" + spec + "': combiner '" + combiner +
                                    "' is not one of xor, int32");
  }
  if (p[0] == "local" || p[0] == "local_adaptive") {
    commsgd::sync::local_sgd_options o;
    o.lr = lr;
    o.period = std::stoi(arg(1, p[0] == "local" ? "4" : "8"));
    if (p[0] == "local_adaptive") {
      o.adaptive = true;
      o.max_period = o.period;
      o.correction = commsgd::sync::correction_mode::every_step;
      o.alpha = std::stof(arg(2, "0.02"));
    }
    return std::make_unique<sync_strategy<Comm, commsgd::sync::local_sgd<Comm>>>(comm, o);
  }
  if (p[0] == "partitioned") {
    commsgd::sync::partitioned_options o;
    o.lr = lr;
    o.partition_elements = std::stoul(arg(1, "16384"));
    o.credit_bytes = std::stoul(arg(2, "1024")) * 1024;
    return std::make_unique<partitioned_scheme<Comm>>(comm, layer_sizes, o);
  }
  if (auto s = try_make_allreduce(p, spec, comm, lr, layer_sizes)) return s;
  if (auto s = try_make_compress(p, spec, comm, lr, layer_sizes)) return s;
  if (auto s = try_make_powersgd(p, spec, comm, lr, layer_sizes)) return s;
  throw commsgd::invalid_argument(
      "argument 'scheme' = '" + spec +
      "' is not one of ring, allgather, topk:<method>:<density>, topk_ar:<method>:<density>, "
      "cssgd:<r>[:xor|int32], asgd[:<j>], local:<H>, local_adaptive:<H0>[:<pull>], "
      "partitioned[:<elements>[:<credit KiB>]], fp16[:ef], bf16[:ef], sign, qsgd:<s>[:ef], "
      "random_k:<density>, powersgd:<r>");
}

} // namespace fmnist
