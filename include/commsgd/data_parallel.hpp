// data_parallel<Coding, Sparsifier, Sync, C>: the composition a trainer uses.
//
//   using dp = commsgd::data_parallel<policy::cssgd<coding::xor_bits>, policy::dense, policy::synchronous,
//                                     comm::local>;
//   dp trainer(comm, params.size(), {.lr = 0.1f, .redundancy = 2});
//   trainer.start(params);
//   for (step) {
//     auto sizes = trainer.block_sizes(batch);          // samples of every block of the batch
//     for (j, q : trainer.my_blocks()) grads[j] = gradient of block q (mean over its samples);
//     trainer.step(params, grads, {.loss = l});          // exchange and update params in place
//   }
//   trainer.finish(params);
//
// Each policy is a small tag type (namespace commsgd::policy); data_parallel builds the concrete objects
// over the communicator. What composes, and why the rest does not:
//
//   coding \ sync        synchronous     local_sgd   async_ps    partitioned
//   uncoded<ring>        dense, top_k    dense       dense       dense
//   uncoded<all-gather>  dense           -           -           -
//   uncoded<unicast>     dense           -           -           -
//   cssgd<K>             dense           -           -           -
//   uncoded_shuffle      dense           -           -           -
//
// - CSSGD codes equally shaped dense block gradients segment by segment; top_k leaves each rank a different
//   sparse set, so there is nothing to code together.
// - top_k brings its own exchange (an all_gather_v of pairs with a dense fallback), so only the default
//   uncoded slot makes sense with it.
// - local_sgd averages models, async_ps pushes to a server and partitioned exchanges partitions as the
//   backward pass produces them: none of them sums block gradients every step, which is what coding and
//   error-feedback sparsification are defined on.
// Unsupported combinations fail to compile with a static_assert that names both policies and the reason.
#pragma once

#include <commsgd/coding/cssgd.hpp>
#include <commsgd/coding/scheme.hpp>
#include <commsgd/coding/uncoded.hpp>
#include <commsgd/coding/uncoded_shuffle.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/sparsify/exchange.hpp>
#include <commsgd/sparsify/top_k.hpp>
#include <commsgd/sync/async_ps.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/partitioned.hpp>
#include <commsgd/sync/synchronous.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <variant>
#include <vector>

namespace commsgd::inline v1 {

namespace policy {
// Coding schemes.
template <coding::uncoded_exchange Exchange = coding::by_ring_all_reduce>
struct uncoded {};
template <coding::combiner Combiner = coding::xor_bits>
struct cssgd {};
struct uncoded_shuffle {};
// Sparsifiers.
struct dense {};
template <select::selector Selector, sparsify::sparse_index Index = std::uint32_t>
struct top_k {};
// Sync strategies.
struct synchronous {};
struct local_sgd {};
struct async_ps {};
struct partitioned {};
} // namespace policy

namespace detail {

template <class>
inline constexpr bool dependent_false = false;

template <class P>
inline constexpr bool is_top_k = false;
template <class S, class I>
inline constexpr bool is_top_k<policy::top_k<S, I>> = true;

template <class P>
inline constexpr bool is_coded = false; // schemes with a redundancy r
template <class K>
inline constexpr bool is_coded<policy::cssgd<K>> = true;
template <>
inline constexpr bool is_coded<policy::uncoded_shuffle> = true;

template <class P, class C>
struct coding_for;
template <class E, class C>
struct coding_for<policy::uncoded<E>, C> {
  using type = coding::uncoded<C, E>;
  static type make(C& c, int) { return type(c); }
};
template <class K, class C>
struct coding_for<policy::cssgd<K>, C> {
  using type = coding::cssgd<K, C>;
  static type make(C& c, int r) { return type(c, r); }
};
template <class C>
struct coding_for<policy::uncoded_shuffle, C> {
  using type = coding::uncoded_shuffle<C>;
  static type make(C& c, int r) { return type(c, r); }
};

template <class Sync>
inline constexpr const char* sync_name = "this sync strategy";
template <>
inline constexpr const char* sync_name<policy::local_sgd> = "local_sgd";
template <>
inline constexpr const char* sync_name<policy::async_ps> = "async_ps";
template <>
inline constexpr const char* sync_name<policy::partitioned> = "partitioned";

} // namespace detail

// Options of every supported composition; each field says which policies read it.
struct data_parallel_options {
  float lr = 0.01f;                           // every strategy: (0, inf)
  int redundancy = 1;                         // cssgd, uncoded_shuffle: [1, n]
  sparsify::top_k_options top_k{};            // top_k
  sparsify::exchange_options sparse_exchange; // top_k
  sync::local_sgd_options local_sgd{};        // local_sgd (its lr is replaced by `lr`)
  sync::async_ps_options async_ps{};          // async_ps (its lr is replaced by `lr`)
  sync::partitioned_options partitioned{};    // partitioned (its lr is replaced by `lr`)
  std::vector<std::size_t> layer_sizes;       // partitioned: sizes of the layers in forward order
};

// The primary template is the catch-all for combinations nobody defined: it says so at compile time.
template <class Coding, class Sparsifier, class Sync, comm::communicator C = comm::local>
class data_parallel {
  static_assert(
      detail::dependent_false<Coding>,
      "commsgd::data_parallel: this (Coding, Sparsifier, Sync) combination is not defined; the table "
      "in commsgd/data_parallel.hpp lists the ones that are, and why the others make no sense");
};

// Every step sums block gradients: any coding scheme with dense blocks, or uncoded with top_k.
template <class Coding, class Sparsifier, comm::communicator C>
class data_parallel<Coding, Sparsifier, policy::synchronous, C> {
  static_assert(
      !(detail::is_coded<Coding> && detail::is_top_k<Sparsifier>),
      "commsgd::data_parallel<cssgd or uncoded_shuffle, top_k, synchronous>: coded exchange combines "
      "equally shaped dense block gradients segment by segment, while top_k leaves each rank a "
      "different sparse set, so there is nothing to code together; use policy::uncoded<> with "
      "top_k, or the coded scheme with policy::dense");
  static_assert(
      !detail::is_top_k<Sparsifier> || std::is_same_v<Coding, policy::uncoded<>>,
      "commsgd::data_parallel<uncoded<all-gather or unicast>, top_k, synchronous>: top_k brings its "
      "own sparse exchange (all_gather_v with a dense fallback), so it pairs only with the default "
      "policy::uncoded<>");
  static_assert(
      std::is_same_v<Sparsifier, policy::dense> || detail::is_top_k<Sparsifier>,
      "commsgd::data_parallel: the Sparsifier policy must be policy::dense or policy::top_k<Selector>");

  using coding_traits = detail::coding_for<Coding, C>;
  using coding_type = typename coding_traits::type;

  // The strategy sums through this: it hands the strategy the global sum of the current blocks.
  class block_exchange {
  public:
    explicit block_exchange(data_parallel* owner) : owner_(owner) {}
    void sum(std::span<float> data) { owner_->sum_blocks(data); }
    int size() const { return static_cast<int>(owner_->coding_.block_count()); }

  private:
    data_parallel* owner_;
  };

  template <class S>
  struct sparsifier_for {
    using type = std::monostate;
  };
  template <class S, class I>
  struct sparsifier_for<policy::top_k<S, I>> {
    using type = sparsify::top_k<S, I>;
  };
  using sparsifier_type = typename sparsifier_for<Sparsifier>::type;

public:
  using communicator_type = C;
  using options = data_parallel_options;

  // Collective (a coded scheme splits its exchange groups here). `comm` must outlive the object, which
  // must not move once made (the strategy holds a pointer back to it).
  data_parallel(C& comm, std::size_t length, options o)
      : comm_(&comm), length_(length), opt_(std::move(o)),
        coding_(coding_traits::make(comm, detail::is_coded<Coding> ? opt_.redundancy : 1)),
        sync_(comm, sync::synchronous_options{.lr = opt_.lr}, block_exchange(this)) {
    if constexpr (detail::is_top_k<Sparsifier>) sparsifier_.emplace(length, opt_.top_k);
  }
  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;

  std::size_t length() const noexcept { return length_; }
  std::size_t block_count() const noexcept { return coding_.block_count(); }
  std::span<const std::size_t> my_blocks() const { return coding_.my_blocks(); }
  std::vector<std::size_t> block_sizes(std::size_t batch) const { return coding_.block_sizes(batch); }
  const coding_type& coding() const noexcept { return coding_; }

  // The sparsifier's state (top_k only): residuals and counters, for checkpoints.
  auto& sparsifier() requires detail::is_top_k<Sparsifier> { return *sparsifier_; }

  void start(std::span<float> params) {
    check_length(params.size(), "params");
    sync_.start(params);
  }

  // blocks[j] is the mean gradient of block my_blocks()[j], each of length(); the update uses the mean over
  // all blocks of the batch.
  sync::step_result step(std::span<float> params, coding::block_gradients blocks,
                         const sync::step_info& info = {}) {
    check_length(params.size(), "params");
    coding::detail::check_blocks(blocks, coding_.my_blocks().size(), length_);
    blocks_ = blocks;
    const auto r = sync_.step(params, blocks[0], info);
    blocks_ = {};
    return r;
  }

  // One block per rank (uncoded): the rank's gradient itself.
  sync::step_result step(std::span<float> params, std::span<const float> grad,
                         const sync::step_info& info = {}) {
    const std::span<const float> one[1] = {grad};
    return step(params, coding::block_gradients(one), info);
  }

  void finish(std::span<float> params) { sync_.finish(params); }

  // What the last step's exchange reported.
  const coding::exchange_result& last_coding() const noexcept { return last_coding_; }
  const sparsify::exchange_report& last_sparse() const noexcept { return last_sparse_; }

private:
  void check_length(std::size_t got, const char* what) const {
    if (got != length_)
      throw size_mismatch(commsgd::detail::concat(
          "argument '", what, "' holds ", got, " values; this data_parallel was made for length ", length_));
  }

  void sum_blocks(std::span<float> out) {
    if constexpr (detail::is_top_k<Sparsifier>) {
      auto message = sparsifier_->step(blocks_[0]);
      last_sparse_ = exchanger_.sum(*comm_, message, out);
    } else {
      last_coding_ = coding_.exchange(blocks_, out);
    }
  }

  C* comm_;
  std::size_t length_;
  options opt_;
  coding_type coding_;
  sync::synchronous<C, block_exchange> sync_;
  std::optional<sparsifier_type> sparsifier_;
  sparsify::exchanger<> exchanger_{};
  coding::block_gradients blocks_{};
  coding::exchange_result last_coding_{};
  sparsify::exchange_report last_sparse_{};
};

template <class Sync>
concept model_exchanging = std::is_same_v<Sync, policy::local_sgd> ||
    std::is_same_v<Sync, policy::async_ps> || std::is_same_v<Sync, policy::partitioned>;

// Strategies that exchange models or partitions rather than block gradients take no coding and no
// sparsifier: see the table at the top.
template <class Coding, class Sparsifier, model_exchanging Sync, comm::communicator C>
class data_parallel<Coding, Sparsifier, Sync, C> {
  static_assert(
      detail::dependent_false<Coding>,
      "commsgd::data_parallel<Coding, Sparsifier, local_sgd | async_ps | partitioned>: these strategies "
      "average models, push to a server or exchange partitions as backward produces them; none sums "
      "block gradients every step, which coding (cssgd, uncoded_shuffle, all-gather, unicast) and "
      "error-feedback sparsification (top_k) are defined on. Use policy::uncoded<> with policy::dense");
};

template <model_exchanging Sync, comm::communicator C>
class data_parallel<policy::uncoded<>, policy::dense, Sync, C> {
public:
  using communicator_type = C;
  using options = data_parallel_options;
  using strategy_type = std::conditional_t<
      std::is_same_v<Sync, policy::local_sgd>, sync::local_sgd<C>,
      std::conditional_t<std::is_same_v<Sync, policy::async_ps>, sync::async_ps<C>, sync::partitioned<C>>>;

  data_parallel(C& comm, std::size_t length, options o)
      : length_(length), coding_(comm), strategy_(make_strategy(comm, length, o)) {}

  std::size_t length() const noexcept { return length_; }
  std::size_t block_count() const noexcept { return coding_.block_count(); }
  std::span<const std::size_t> my_blocks() const { return coding_.my_blocks(); }
  std::vector<std::size_t> block_sizes(std::size_t batch) const { return coding_.block_sizes(batch); }
  // False on a parameter server rank: it only serves, inside finish().
  bool computes_gradients() const { return strategy_.computes_gradients(); }
  strategy_type& strategy() noexcept { return strategy_; }

  void start(std::span<float> params) {
    check_length(params.size());
    strategy_.start(params);
  }
  sync::step_result step(std::span<float> params, std::span<const float> grad,
                         const sync::step_info& info = {}) {
    check_length(params.size());
    return strategy_.step(params, grad, info);
  }
  void finish(std::span<float> params) { strategy_.finish(params); }

private:
  static strategy_type make_strategy(C& c, std::size_t length, const options& o) {
    if constexpr (std::is_same_v<Sync, policy::local_sgd>) {
      auto so = o.local_sgd;
      so.lr = o.lr;
      return strategy_type(c, so);
    } else if constexpr (std::is_same_v<Sync, policy::async_ps>) {
      auto so = o.async_ps;
      so.lr = o.lr;
      return strategy_type(c, so);
    } else {
      auto so = o.partitioned;
      so.lr = o.lr;
      return strategy_type(c, o.layer_sizes.empty() ? std::vector<std::size_t>{length} : o.layer_sizes, so);
    }
  }

  void check_length(std::size_t got) const {
    if (got != length_)
      throw size_mismatch(commsgd::detail::concat(
          "argument 'params' holds ", got, " values; this data_parallel was made for length ", length_));
  }

  std::size_t length_;
  coding::uncoded<C> coding_;
  strategy_type strategy_;
};

} // namespace commsgd::inline v1
