// data_parallel<Coding, Compression, Sync, C>: the composition a trainer uses.
//
//   #include <commsgd/policy/cssgd.hpp>   (and dense.hpp, synchronous.hpp: the policies it names)
//   using dp = commsgd::data_parallel<policy::cssgd<coding::xor_bits>, policy::dense, policy::synchronous,
//                                     comm::local>;
//   dp trainer(comm, params.size(), {.lr = 0.1f, .coding = {.redundancy = 2}});
//   trainer.start(params);
//   for (step) {
//     if (!trainer.computes_gradients()) break;          // a parameter server rank serves in finish()
//     auto sizes = trainer.block_sizes(batch);           // samples of every block of the batch
//     for (j, q : trainer.my_blocks()) grads[j] = gradient of block q (mean over its samples);
//     trainer.step(params, grads, {.loss = l});          // exchange and update params in place
//   }
//   trainer.finish(params);
//
// Each policy is a small tag type in namespace commsgd::policy, declared in its own header together with
// the traits that say how to build its part, which options it takes and which partners it accepts
// (policy/traits.hpp). data_parallel names and includes none of them, so a translation unit compiles only
// the policies it includes; options (policy::options) has one field per slot, of that policy's type: it builds the coding scheme, the compression if there is one (a sparsifier such as
// top_k, or a compressor such as qsgd or powersgd), and the strategy from their traits, and puts scheme and
// compression behind one reducer (sync/reducer_concept.hpp) that the strategy is handed on every step. A
// combination that makes no sense fails to compile with the static_assert of the policy that refuses it,
// which says why; README.md tabulates the built-in combinations.
//
// Every composition has the same members. compression() exists where the second slot is not policy::dense;
// last_coding() and last_exchange() report the last step's exchange and stay at their defaults where the
// composition has no such exchange. The object owns everything it built and may be moved; `comm` must
// outlive it.
#pragma once

#include <commsgd/coding/block_reducer.hpp>
#include <commsgd/coding/scheme.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/exchange_report.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/error.hpp>
#include <commsgd/policy/traits.hpp>
#include <commsgd/sparsify/sparse_reducer.hpp>
#include <commsgd/state/data_parallel.hpp>
#include <commsgd/sync/reducer_concept.hpp>
#include <commsgd/sync/replica_guard.hpp>
#include <commsgd/sync/strategy.hpp>

#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace commsgd::inline v1 {

namespace detail {

// How a sparsifier's messages are summed: the exchange settings its options carry, or the defaults.
template <class O>
sparsify::exchange_options exchange_options_of(const O& o) {
  if constexpr (requires { o.exchange; })
    return o.exchange;
  else
    return {};
}

// The reducer of a composition: the coding scheme's exchange on dense blocks, the reducer a compression
// policy builds itself (policy::builds_reducer), or the sparsifier's messages summed by the sparse exchange.
template <class Compression, class Scheme, class C>
struct reducer_for {
  using type = coding::block_reducer<Scheme>;
};
template <class Compression, class Scheme, class C>
requires(!policy::is_dense<Compression> &&
         !policy::builds_reducer<Compression, Scheme, C>) struct reducer_for<Compression, Scheme, C> {
  using type = sparsify::sparse_reducer<typename policy::compression_traits<Compression>::type, Scheme, C>;
};
template <class Compression, class Scheme, class C>
requires policy::builds_reducer<Compression, Scheme, C>
struct reducer_for<Compression, Scheme, C> {
  using type = typename policy::compression_traits<Compression>::template reducer<Scheme, C>;
};

} // namespace detail

template <class Coding, class Compression, class Sync, comm::communicator C = comm::local>
class data_parallel {
  using coding_traits = policy::coding_traits<Coding>;
  using compression_traits = policy::compression_traits<Compression>;
  using sync_traits = policy::sync_traits<Sync>;

  static_assert(coding_traits::template accepts<Compression>());
  static_assert(sync_traits::template accepts<Coding, Compression>());
  static_assert(policy::is_dense<Compression> || policy::is_plain<Coding>,
                "commsgd::data_parallel: a compression's messages are summed over one block per rank, so it "
                "pairs only with a plain coding policy (policy::uncoded<>)");

public:
  using communicator_type = C;
  // One field per slot, each its policy's own options type (policy/traits.hpp).
  using options = policy::options<Coding, Compression, Sync>;
  using coding_type = typename coding_traits::template type<C>;
  using strategy_type = typename sync_traits::template type<C>;
  using reducer_type = typename detail::reducer_for<Compression, coding_type, C>::type;

  static_assert(coding::coding_scheme<coding_type>);
  static_assert(sync::sync_strategy<strategy_type>);
  static_assert(sync::reducer<reducer_type>);

  // A strategy whose step takes a reducer sums block gradients; any other takes this rank's one gradient.
  static constexpr bool sums_blocks = sync::block_strategy<strategy_type, reducer_type>;
  static_assert(sums_blocks || (policy::is_plain<Coding> && policy::is_dense<Compression>),
                "commsgd::data_parallel: Sync takes one gradient per rank (its step takes no reducer), so it "
                "composes only with policy::uncoded<> and policy::dense");

  // Collective (a coded scheme splits its exchange groups here).
  data_parallel(C& comm, std::size_t length, const options& o)
      : comm_(&comm), length_(length), reducer_(make_reducer(comm, length, o)),
        strategy_(sync_traits::template make<C>(comm, length, o.sync, o.lr)),
        guard_(comm, o.replica_check_every) {}

  std::size_t length() const noexcept { return length_; }
  std::size_t block_count() const noexcept { return coding().block_count(); }
  std::span<const std::size_t> my_blocks() const { return coding().my_blocks(); }
  std::vector<std::size_t> block_sizes(std::size_t batch) const { return coding().block_sizes(batch); }
  // False on a parameter server rank: it only serves, inside finish().
  bool computes_gradients() const { return strategy_.computes_gradients(); }

  const coding_type& coding() const noexcept { return reducer_.scheme(); }
  strategy_type& strategy() noexcept { return strategy_; }
  const strategy_type& strategy() const noexcept { return strategy_; }
  // The compression's state: the sparsifier's or compressor's residuals and counters, for checkpoints.
  auto& compression() noexcept requires(!policy::is_dense<Compression>) { return reducer_.compression(); }
  const auto& compression() const noexcept requires(!policy::is_dense<Compression>) {
    return reducer_.compression();
  }
  void start(std::span<float> params) {
    check_length(params.size());
    strategy_.start(params);
  }

  // blocks[j] is the mean gradient of block my_blocks()[j], each of length(); the update uses the mean over
  // all blocks of the batch. Sizes are checked here; values once, by whichever part reads them.
  sync::step_result step(std::span<float> params, coding::block_gradients blocks,
                         const sync::step_info& info = {}) {
    check_length(params.size());
    coding::check_block_sizes(blocks, my_blocks().size(), length_);
    sync::step_result r;
    if constexpr (sums_blocks)
      r = strategy_.step(params, blocks, reducer_, info);
    else
      r = strategy_.step(params, blocks[0], info);
    ++steps_;
    guard_.after_step(strategy_, params, r);
    return r;
  }

  // One block per rank (uncoded): the rank's gradient itself.
  sync::step_result step(std::span<float> params, std::span<const float> grad,
                         const sync::step_info& info = {}) {
    const std::span<const float> one[1] = {grad};
    return step(params, coding::block_gradients(one), info);
  }

  void finish(std::span<float> params) {
    strategy_.finish(params);
    guard_.after_finish(strategy_, params);
  }
  const sync::replica_guard<C>& replica_guard() const noexcept { return guard_; }

  // Steps taken (restored by load).
  std::uint64_t steps() const noexcept { return steps_; }

  // Checkpoints (state/data_parallel.hpp): the composition's identity, the compression's state, the
  // strategy's and the step count; the model is the trainer's. Every rank saves part::all, or rank 0
  // part::shared and every rank part::local. After load, start(params) with the saved model goes on.
  void save(std::ostream& os, state::part p = state::part::all) const {
    state::save_data_parallel<Coding, Compression, Sync>(*this, os, p, comm_->size(), comm_->rank(), steps_);
  }
  void load(std::istream& is) {
    steps_ = state::load_data_parallel<Coding, Compression, Sync>(*this, is, comm_->size(), comm_->rank());
    guard_.resume(steps_);
  }
  void load(std::istream& shared, std::istream& local) {
    steps_ = state::load_data_parallel<Coding, Compression, Sync>(*this, shared, local, comm_->size(),
                                                                  comm_->rank());
    guard_.resume(steps_);
  }

  // What the last step's exchange reported.
  const coding::exchange_result& last_coding() const noexcept {
    if constexpr (policy::is_dense<Compression>)
      return reducer_.last();
    else
      return no_coding_;
  }
  // The last round of the compression's exchange: sparse pairs or a compressor's messages.
  const comm::exchange_report& last_exchange() const noexcept {
    if constexpr (policy::is_dense<Compression>)
      return no_exchange_;
    else
      return reducer_.last();
  }

private:
  static reducer_type make_reducer(C& comm, std::size_t length, const options& o) {
    if constexpr (policy::is_dense<Compression>)
      return reducer_type(coding_traits::template make<C>(comm, length, o.coding));
    else if constexpr (policy::builds_reducer<Compression, coding_type, C>)
      return compression_traits::template make_reducer<C>(
          comm, coding_traits::template make<C>(comm, length, o.coding), length, o.compression);
    else
      return reducer_type(comm, coding_traits::template make<C>(comm, length, o.coding),
                          compression_traits::make(length, o.compression),
                          detail::exchange_options_of(o.compression));
  }

  void check_length(std::size_t got) const {
    if (got != length_)
      throw size_mismatch(commsgd::concat("argument 'params' holds ", got,
                                          " values; this data_parallel was made for length ", length_));
  }

  static constexpr coding::exchange_result no_coding_{};
  static inline const comm::exchange_report no_exchange_{};

  C* comm_;
  std::size_t length_;
  reducer_type reducer_;
  strategy_type strategy_;
  std::uint64_t steps_ = 0;
  sync::replica_guard<C> guard_;
};

} // namespace commsgd::inline v1
