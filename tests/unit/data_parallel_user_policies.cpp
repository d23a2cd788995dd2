// A sparsifier and a sync strategy written here, outside the library, compose through data_parallel exactly
// as the built-in policies do: a tag, a traits specialisation beside it, and nothing else. Each composition
// is checked bit for bit against a single-process replay of the same float operations.
#include <commsgd/comm/local.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/sync/sgd.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <istream>
#include <mutex>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace user {

// Sends every entry of g + e whose magnitude reaches a fixed threshold and keeps the rest as the residual e
// (error feedback with a threshold instead of a count).
class threshold_sparsifier {
public:
  using message_type = sparsify::sparse_view<std::uint32_t>;
  static constexpr const char* name = "threshold";

  threshold_sparsifier(std::size_t length, float threshold)
      : length_(length), threshold_(threshold), residual_(length, 0.0f) {}

  std::size_t length() const noexcept { return length_; }
  std::uint64_t steps() const noexcept { return steps_; }
  std::span<const float> residual() const noexcept { return residual_; }

  message_type step(std::span<const float> g) {
    if (g.size() != length_) throw size_mismatch("threshold_sparsifier: wrong gradient length");
    indices_.clear();
    values_.clear();
    for (std::size_t i = 0; i < length_; ++i) {
      const float p = g[i] + residual_[i];
      if (!std::isfinite(p)) throw non_finite("gradient", 1, i);
      if (std::abs(p) >= threshold_) {
        indices_.push_back(static_cast<std::uint32_t>(i));
        values_.push_back(p);
        residual_[i] = 0.0f;
      } else {
        residual_[i] = p;
      }
    }
    ++steps_;
    return {length_, indices_, values_};
  }

  void save(std::ostream&) const {}
  void load(std::istream&) {}

private:
  std::size_t length_;
  float threshold_;
  std::vector<float> residual_;
  std::vector<std::uint32_t> indices_;
  std::vector<float> values_;
  std::uint64_t steps_ = 0;
};
static_assert(sparsify::sparsifier<threshold_sparsifier>);

// Heavy-ball momentum on the mean of the summed block gradients: v <- mu v + mean, x <- x - lr v.
template <comm::communicator C>
class heavy_ball {
public:
  heavy_ball(C& c, float lr, float mu) : comm_(&c), lr_(lr), mu_(mu) {}

  bool computes_gradients() const { return true; }
  void start(std::span<float> params) {
    comm_->broadcast(params, 0);
    velocity_.assign(params.size(), 0.0f);
  }
  // This strategy sums block gradients only, through whatever reducer it is handed.
  template <sync::reducer R>
  sync::step_result step(std::span<float> params, sync::block_gradients blocks, R& reduce,
                         const sync::step_info& = {}) {
    sum_.resize(params.size());
    reduce.reduce(blocks, std::span<float>(sum_));
    const float n = static_cast<float>(reduce.block_count());
    for (std::size_t i = 0; i < params.size(); ++i) {
      velocity_[i] = mu_ * velocity_[i] + sum_[i] / n;
      params[i] = params[i] - lr_ * velocity_[i];
    }
    return {.exchanged = true, .averaged = false};
  }
  // The sync_strategy concept's one-gradient form, for use without data_parallel.
  sync::step_result step(std::span<float> params, std::span<const float> grad, const sync::step_info& = {}) {
    sync::all_reduce_exchange<C> ex(*comm_);
    sum_.assign(grad.begin(), grad.end());
    ex.sum(std::span<float>(sum_));
    const float n = static_cast<float>(comm_->size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      velocity_[i] = mu_ * velocity_[i] + sum_[i] / n;
      params[i] = params[i] - lr_ * velocity_[i];
    }
    return {.exchanged = true, .averaged = false};
  }
  void finish(std::span<float>) {}

private:
  C* comm_;
  float lr_, mu_;
  std::vector<float> velocity_, sum_;
};

constexpr float threshold = 0.05f;
constexpr float mu = 0.5f;

// The policy tags, as a user's own header would declare them, and their settings: each traits names its
// options type, and data_parallel's options hold one per slot.
struct threshold_policy {};
struct heavy_ball_policy {};
struct threshold_options {
  float threshold = user::threshold;
  sparsify::exchange_options exchange{}; // how sparsify::exchanger sums the messages
};
struct heavy_ball_options {
  float mu = user::mu;
};

// The threshold sparsifier with an exchange of its own: each rank densifies its message and the dense sum
// runs through the communicator's all-reduce. It stands for a policy that does not fit sparsify::exchanger
// (several collectives, another reduction) and so builds its reducer itself.
struct dense_threshold_policy {};

template <class Scheme, comm::communicator C>
class dense_threshold_reducer {
public:
  dense_threshold_reducer(C& c, Scheme scheme, threshold_sparsifier s)
      : comm_(&c), scheme_(std::move(scheme)), sparsifier_(std::move(s)) {}

  void reduce(std::span<const std::span<const float>> blocks, std::span<float> out) {
    const auto m = sparsifier_.step(blocks[0]);
    std::fill(out.begin(), out.end(), 0.0f);
    for (std::size_t j = 0; j < m.size(); ++j)
      out[m.indices[j]] = m.values[j];
    comm_->all_reduce_sum(out);
  }
  std::size_t block_count() const { return scheme_.block_count(); }
  const Scheme& scheme() const noexcept { return scheme_; }
  threshold_sparsifier& compression() noexcept { return sparsifier_; }
  const threshold_sparsifier& compression() const noexcept { return sparsifier_; }
  const comm::exchange_report& last() const noexcept { return last_; }

private:
  C* comm_;
  Scheme scheme_;
  threshold_sparsifier sparsifier_;
  comm::exchange_report last_{};
};

} // namespace user

template <>
struct commsgd::policy::compression_traits<user::dense_threshold_policy> {
  using options = user::threshold_options;
  static constexpr bool dense_blocks = false;
  template <class Scheme, comm::communicator C>
  using reducer = user::dense_threshold_reducer<Scheme, C>;
  template <comm::communicator C, class Scheme>
  static reducer<Scheme, C> make_reducer(C& c, Scheme scheme, std::size_t length, const options& o) {
    return reducer<Scheme, C>(c, std::move(scheme), user::threshold_sparsifier(length, o.threshold));
  }
};

template <>
struct commsgd::policy::compression_traits<user::threshold_policy> {
  using options = user::threshold_options;
  static constexpr bool dense_blocks = false;
  using type = user::threshold_sparsifier;
  static type make(std::size_t length, const options& o) { return type(length, o.threshold); }
};

template <>
struct commsgd::policy::sync_traits<user::heavy_ball_policy> {
  using options = user::heavy_ball_options;
  template <comm::communicator C>
  using type = user::heavy_ball<C>;
  template <comm::communicator C>
  static type<C> make(C& c, std::size_t, const options& o, float lr) {
    return type<C>(c, lr, o.mu);
  }
  template <class Coding, class Compression>
  static consteval bool accepts() {
    return true;
  }
};

namespace {

const toy::least_squares problem({.samples = 960, .dim = 12, .seed = 11});
constexpr std::size_t batch = 240;
constexpr int steps = 40;

toy::rows block_rows(const std::vector<std::size_t>& sizes, std::size_t q, int t) {
  std::size_t first = (static_cast<std::size_t>(t) * batch) % problem.samples();
  for (std::size_t j = 0; j < q; ++j)
    first += sizes[j];
  return {first, sizes[q]};
}

// Trains every rank through Dp; returns every rank's final model and rank 0's count of sparsifier steps
// where there is a sparsifier.
template <class Dp>
std::vector<std::vector<float>> train(int n, const typename Dp::options& o) {
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(n));
  local_group(n).run([&](local& c) {
    Dp dp(c, problem.dim(), o);
    std::vector<float> x(problem.dim(), 0.0f);
    dp.start(x);
    const auto sizes = dp.block_sizes(batch);
    std::vector<std::vector<float>> grads(dp.my_blocks().size(), std::vector<float>(problem.dim()));
    std::vector<std::span<const float>> views(grads.begin(), grads.end());
    for (int t = 0; t < steps; ++t) {
      for (std::size_t j = 0; j < grads.size(); ++j)
        problem.gradient(x, block_rows(sizes, dp.my_blocks()[j], t), grads[j]);
      dp.step(x, coding::block_gradients(views));
    }
    dp.finish(x);
    if constexpr (requires { dp.compression(); }) CHECK(dp.compression().steps() == steps);
    finals[static_cast<std::size_t>(c.rank())] = x;
  });
  return finals;
}

// The single-process replay of uncoded blocks (block q = rank q), each rank's gradient through its own
// threshold sparsifier when `sparse`, summed in rank order as comm::local and the sparse exchange do, then
// either plain SGD or heavy ball.
std::vector<float> replay(int n, float lr, bool sparse, bool momentum) {
  const coding::assignment a(n, 1);
  const auto sizes = a.block_sizes(batch);
  std::vector<user::threshold_sparsifier> sp;
  for (int r = 0; r < n; ++r)
    sp.emplace_back(problem.dim(), user::threshold);
  std::vector<float> x(problem.dim(), 0.0f), g(problem.dim()), sum(problem.dim()), v(problem.dim(), 0.0f);
  for (int t = 0; t < steps; ++t) {
    // A sparse sum starts from +0 and adds each rank's pairs in rank order; a dense one folds the gradients.
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int q = 0; q < n; ++q) {
      problem.gradient(x, block_rows(sizes, static_cast<std::size_t>(q), t), g);
      if (sparse) {
        const auto m = sp[static_cast<std::size_t>(q)].step(g);
        for (std::size_t j = 0; j < m.size(); ++j)
          sum[m.indices[j]] += m.values[j];
      } else {
        for (std::size_t i = 0; i < g.size(); ++i)
          sum[i] = q == 0 ? g[i] : sum[i] + g[i];
      }
    }
    if (momentum) {
      for (std::size_t i = 0; i < x.size(); ++i) {
        v[i] = user::mu * v[i] + sum[i] / static_cast<float>(n);
        x[i] = x[i] - lr * v[i];
      }
    } else {
      sync::apply_mean_sum(x, sum, n, lr);
    }
  }
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The replay sums pairs, as the sparse path does.
constexpr sparsify::exchange_options sparse_path{.path = cost::sparse_path::sparse};
constexpr user::threshold_options sparse_pairs{.exchange = sparse_path};

} // namespace

TEST_CASE("a user sparsifier composes with uncoded<> and synchronous, bit for bit against a replay") {
  using dp = data_parallel<policy::uncoded<>, user::threshold_policy, policy::synchronous>;
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(std::declval<dp&>().compression())>,
                               user::threshold_sparsifier>);
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const auto got = train<dp>(n, {.lr = 0.05f, .compression = sparse_pairs});
    const auto want = replay(n, 0.05f, true, false);
    for (const auto& x : got)
      CHECK(same_bits(x, want));
  }
}

TEST_CASE("a user sync strategy composes with every coding scheme and with top_k") {
  const double start = problem.loss(std::vector<float>(problem.dim(), 0.0f));
  SUBCASE("uncoded ring: bit for bit against a replay") {
    for (int n : {1, 3}) {
      CAPTURE(n);
      const auto got =
          train<data_parallel<policy::uncoded<>, policy::dense, user::heavy_ball_policy>>(n, {.lr = 0.02f});
      for (const auto& x : got)
        CHECK(same_bits(x, replay(n, 0.02f, false, true)));
    }
    // The strategy's own setting travels in the derived options: no momentum is plain SGD.
    const auto sgd = train<data_parallel<policy::uncoded<>, policy::dense, user::heavy_ball_policy>>(
        3, {.lr = 0.02f, .sync = {.mu = 0.0f}});
    const auto want = replay(3, 0.02f, false, false);
    for (std::size_t i = 0; i < want.size(); ++i)
      CHECK(sgd[0][i] == want[i]);
  }
  SUBCASE("cssgd and the uncoded shuffle of the same assignment agree bit for bit, and both converge") {
    const auto coded =
        train<data_parallel<policy::cssgd<coding::xor_bits>, policy::dense, user::heavy_ball_policy>>(
            4, {.lr = 0.05f, .coding = {.redundancy = 2}});
    const auto shuffled =
        train<data_parallel<policy::uncoded_shuffle, policy::dense, user::heavy_ball_policy>>(
            4, {.lr = 0.05f, .coding = {.redundancy = 2}});
    for (std::size_t r = 0; r < coded.size(); ++r) {
      CHECK(same_bits(coded[r], shuffled[r]));
      CHECK(same_bits(coded[r], coded[0]));
    }
    CHECK(problem.loss(coded[0]) < 0.1 * start);
  }
  SUBCASE("top_k at density 1 sends everything, so it equals the dense composition's update") {
    const auto sparse =
        train<data_parallel<policy::uncoded<>, policy::top_k<select::exact>, user::heavy_ball_policy>>(
            3, {.lr = 0.02f, .compression = {.top_k = {.density = 1.0}, .exchange = sparse_path}});
    const auto dense =
        train<data_parallel<policy::uncoded<>, policy::dense, user::heavy_ball_policy>>(3, {.lr = 0.02f});
    // The sparse sum starts from +0, the ring from rank 0's value: equal up to the sign of an exact zero.
    for (std::size_t i = 0; i < dense[0].size(); ++i)
      CHECK(sparse[0][i] == dense[0][i]);
  }
}

TEST_CASE("a user sparsifier and a user sync strategy compose with each other") {
  using dp = data_parallel<policy::uncoded<>, user::threshold_policy, user::heavy_ball_policy>;
  for (int n : {2, 4}) {
    CAPTURE(n);
    const auto got = train<dp>(n, {.lr = 0.02f, .compression = sparse_pairs});
    const auto want = replay(n, 0.02f, true, true);
    for (const auto& x : got)
      CHECK(same_bits(x, want));
  }
}

TEST_CASE("a user sparsifier policy that builds its own reducer composes, equal to the replay") {
  using dp = data_parallel<policy::uncoded<>, user::dense_threshold_policy, policy::synchronous>;
  static_assert(policy::builds_reducer<user::dense_threshold_policy, dp::coding_type, local>);
  static_assert(std::is_same_v<dp::reducer_type, user::dense_threshold_reducer<dp::coding_type, local>>);
  for (int n : {1, 3, 4}) {
    CAPTURE(n);
    const auto got = train<dp>(n, {.lr = 0.05f});
    const auto want = replay(n, 0.05f, true, false);
    // The all-reduce folds from rank 0's value, the replay from +0: equal up to the sign of an exact zero.
    for (const auto& x : got)
      for (std::size_t i = 0; i < want.size(); ++i)
        CHECK(x[i] == want[i]);
  }
}
