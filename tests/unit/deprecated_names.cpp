// The names renamed in this release still compile and behave the same for one release: the old reducer
// headers forward to the new ones, a policy that specialises the old policy::sparsifier_traits is a
// compression policy (directly, and through policy::compressor_traits), policy::sparsifier_policy agrees
// with policy::compression_policy, the deprecated data_parallel::sparsifier() is compression(), and the
// simulator's and the cost model's traffic structs are comm::traffic, and the checkpoint headers forward to
// state/.
// Built with -Wno-deprecated-declarations (tests/CMakeLists.txt): using the old names is the point.
#include <commsgd/coding/reducer.hpp>
#include <commsgd/compress/reducer.hpp>
#include <commsgd/sparsify/reducer.hpp>
#include <commsgd/sync/reducer.hpp>
// The checkpoint headers before they moved to state/.
#include <commsgd/checkpoint.hpp>
#include <commsgd/sparsify/exchange.hpp>
#include <commsgd/sparsify/state_io.hpp>
#include <commsgd/sync/exchange.hpp>
#include <commsgd/sync/state.hpp>

#include <commsgd/comm/local.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/cost/time.hpp>
#include <commsgd/cost/traffic.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/select/exact.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

// What the old headers declare is reachable through them.
static_assert(sync::reducer<coding::block_reducer<coding::uncoded<local>>>);
static_assert(
    sync::reducer<sparsify::sparse_reducer<sparsify::top_k<select::exact>, coding::uncoded<local>, local>>);
static_assert(sync::reducer<compress::reducer<compress::sign, coding::uncoded<local>, local>>);
static_assert(std::is_same_v<comm::link_load, comm::traffic>);
static_assert(std::is_same_v<cost::node_traffic, comm::traffic>);
static_assert(std::is_same_v<sparsify::exchange_report, comm::exchange_report>);

namespace user {

// Sends every entry of g + e whose magnitude reaches a fixed threshold and keeps the rest as the residual e
// (tests/unit/data_parallel_user_policies.cpp has the same sparsifier).
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

struct options : data_parallel_options {
  float threshold = 0.05f;
};

// The same sparsifier behind a tag of the old name and one of the new.
struct old_threshold {};
struct new_threshold {};
// EF-SignSGD behind a tag of the old name, through compressor_traits as a user compressor would be written
// before this release; policy::sign is the same compressor under the new name.
struct old_sign {};

struct no_traits {};

} // namespace user

template <>
struct commsgd::policy::sparsifier_traits<user::old_threshold> {
  static constexpr bool dense_blocks = false;
  using type = user::threshold_sparsifier;
  static type make(std::size_t length, const user::options& o) { return type(length, o.threshold); }
};

template <>
struct commsgd::policy::compression_traits<user::new_threshold> {
  static constexpr bool dense_blocks = false;
  using type = user::threshold_sparsifier;
  static type make(std::size_t length, const user::options& o) { return type(length, o.threshold); }
};

template <>
struct commsgd::policy::sparsifier_traits<user::old_sign>
    : policy::compressor_traits<sparsifier_traits<user::old_sign>, compress::sign> {
  template <class Options>
  static compress::sign make(std::size_t length, const Options& o) {
    return compress::sign(length, o.sign);
  }
};

namespace {

// The old concept and the new one agree, on policies of either name and on a type that is none.
template <class P>
constexpr bool agree = policy::sparsifier_policy<P> == policy::compression_policy<P>;
static_assert(agree<user::old_threshold> && policy::compression_policy<user::old_threshold>);
static_assert(agree<user::new_threshold> && policy::compression_policy<user::new_threshold>);
static_assert(agree<user::old_sign> && policy::compression_policy<user::old_sign>);
static_assert(agree<policy::dense> && policy::compression_policy<policy::dense>);
static_assert(agree<policy::top_k<select::exact>> &&
              policy::compression_policy<policy::top_k<select::exact>>);
static_assert(agree<policy::sign> && policy::compression_policy<policy::sign>);
static_assert(agree<user::no_traits> && !policy::compression_policy<user::no_traits>);
static_assert(agree<int> && !policy::compression_policy<int>);
static_assert(policy::is_dense<policy::dense> && !policy::is_dense<user::old_threshold>);

template <class P>
using dp = data_parallel<policy::uncoded<>, P, policy::synchronous>;

// The old-name policies build the same parts as their new-name twins.
static_assert(std::is_same_v<dp<user::old_threshold>::reducer_type, dp<user::new_threshold>::reducer_type>);
static_assert(std::is_same_v<dp<user::old_sign>::reducer_type, dp<policy::sign>::reducer_type>);

const toy::least_squares problem({.samples = 960, .dim = 12, .seed = 11});
constexpr int steps = 30;

struct run {
  std::vector<std::vector<float>> models;    // every rank's final model
  std::vector<std::vector<float>> residuals; // every rank's residual, where the state has one
  std::uint64_t state_steps = 0;             // rank 0's count of compression steps
};

// Trains every rank through dp<P>; reads the state through the deprecated sparsifier() when `old_accessor`,
// through compression() otherwise, and checks both reach the same object.
template <class P, class Options>
run train(int n, const Options& o, bool old_accessor) {
  run out;
  out.models.resize(static_cast<std::size_t>(n));
  out.residuals.resize(static_cast<std::size_t>(n));
  local_group(n).run([&](local& c) {
    dp<P> trainer(c, problem.dim(), o);
    std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
    trainer.start(x);
    for (int t = 0; t < steps; ++t) {
      problem.gradient(x, problem.batch(c.rank(), c.size(), t, 40), g);
      trainer.step(x, std::span<const float>(g));
    }
    trainer.finish(x);
    const dp<P>& ct = trainer;
    CHECK(&trainer.sparsifier() == &trainer.compression());
    CHECK(&ct.sparsifier() == &ct.compression());
    auto& state = old_accessor ? trainer.sparsifier() : trainer.compression();
    const auto r = static_cast<std::size_t>(c.rank());
    out.models[r] = x;
    if constexpr (requires { state.residual(); })
      out.residuals[r].assign(state.residual().begin(), state.residual().end());
    if (c.rank() == 0) out.state_steps = state.steps();
  });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void same(const run& a, const run& b) {
  REQUIRE(a.models.size() == b.models.size());
  for (std::size_t r = 0; r < a.models.size(); ++r) {
    CAPTURE(r);
    CHECK(same_bits(a.models[r], b.models[r]));
    CHECK(same_bits(a.residuals[r], b.residuals[r]));
  }
  CHECK(a.state_steps == b.state_steps);
  CHECK(a.state_steps == static_cast<std::uint64_t>(steps));
}

} // namespace

TEST_CASE("a sparsifier specialising the old sparsifier_traits trains bit for bit as under the new name") {
  user::options o;
  o.lr = 0.05f;
  for (int n : {1, 3}) {
    CAPTURE(n);
    const run old_run = train<user::old_threshold>(n, o, true);
    const run new_run = train<user::new_threshold>(n, o, false);
    same(old_run, new_run);
    // It moved the model at all.
    CHECK_FALSE(same_bits(new_run.models[0], std::vector<float>(problem.dim(), 0.0f)));
  }
}

TEST_CASE("a compressor written against the old sparsifier_traits trains bit for bit as policy::sign") {
  data_parallel_options o;
  o.lr = 0.05f;
  for (int n : {1, 3}) {
    CAPTURE(n);
    same(train<user::old_sign>(n, o, true), train<policy::sign>(n, o, false));
  }
}

TEST_CASE("a node's traffic taken as a point-to-point load is the same traffic") {
  const comm::traffic t = cost::cssgd(6, 2, 1000, 4);
  CHECK(t.messages_sent > 0);
  CHECK(cost::as_point_to_point(t) == t);
  CHECK(cost::ring_all_reduce_load(6, 1001, 4, 3) == cost::ring_all_reduce(6, 1001, 4, 3));
  CHECK(cost::unicast_load(6, 1001, 4) == cost::unicast(6, 1001, 4));
  CHECK(cost::uncoded_shuffle_load(6, 2, 1001, 4, 3) == cost::uncoded_shuffle(6, 2, 1001, 4, 3));
  // Models leave calls at 0; measured() drops what a meter counted of them.
  comm::traffic counted = t;
  counted.calls = 7;
  CHECK(cost::measured(counted) == t);
}
