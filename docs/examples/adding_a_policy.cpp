// docs/adding-a-policy.md walks through this file. A sparsifier written outside the library, plugged into
// data_parallel's compression slot through the same traits the built-in policies use, then checked: it
// trains, it sends fewer bytes than the dense exchange, a checkpoint resumes bit for bit, and a NaN on one
// rank stops every rank.
// The exit status is the test (ctest -R docs.adding_a_policy).
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/dense.hpp>
#include <commsgd/policy/synchronous.hpp>
#include <commsgd/policy/uncoded.hpp>
#include <commsgd/state/stream.hpp>
#include <support/least_squares.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <istream>
#include <limits>
#include <memory>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

// [object]
namespace example {

// Sends every entry of p = g + e whose magnitude reaches a fixed threshold and keeps the others in the
// residual e (error feedback): what is not sent this step is added to the next step's gradient.
class threshold_sparsifier {
public:
  using message_type = commsgd::sparsify::sparse_view<std::uint32_t>;
  static constexpr const char* name = "example::threshold";

  threshold_sparsifier(std::size_t length, float threshold)
      : length_(length), threshold_(threshold), residual_(length, 0.0f) {
    if (!(threshold > 0.0f) || !std::isfinite(threshold))
      throw commsgd::invalid_argument("argument 'threshold' = " + std::to_string(threshold) +
                                      " is outside the allowed range (0, inf)");
  }

  std::size_t length() const noexcept { return length_; }
  std::uint64_t steps() const noexcept { return steps_; }

  // The new residual is built aside and swapped in only when the whole step succeeded, so a refused
  // gradient leaves the state as it was.
  message_type step(std::span<const float> g) {
    if (g.size() != length_)
      throw commsgd::size_mismatch("argument 'gradient' has " + std::to_string(g.size()) +
                                   " elements, the sparsifier's length is " + std::to_string(length_));
    next_.resize(length_);
    indices_.clear();
    values_.clear();
    std::size_t bad = 0, first_bad = 0;
    for (std::size_t i = 0; i < length_; ++i) {
      const float p = g[i] + residual_[i];
      if (!std::isfinite(p) && bad++ == 0) first_bad = i;
      if (std::abs(p) >= threshold_) {
        indices_.push_back(static_cast<std::uint32_t>(i)); // rising, as the exchange requires
        values_.push_back(p);
        next_[i] = 0.0f; // sent: nothing held back
      } else {
        next_[i] = p; // held back with its exact bits
      }
    }
    if (bad > 0) throw commsgd::non_finite("gradient + residual", bad, first_bad);
    residual_.swap(next_);
    ++steps_;
    return {length_, indices_, values_};
  }

  // Checkpoints use the frame every commsgd state shares (magic, version, byte order, size, kind, checksum),
  // so a damaged or foreign stream is refused with corrupt_data before anything changes.
  void save(std::ostream& os) const {
    commsgd::state::writer w(name);
    w.put<std::uint64_t>(length_);
    w.put<float>(threshold_);
    w.put<std::uint64_t>(steps_);
    w.put_array(std::span<const float>(residual_));
    commsgd::state::write_frame(os, std::move(w).finish());
  }
  void load(std::istream& is) {
    const auto blob = commsgd::state::read_frame(is);
    commsgd::state::reader r(blob, name);
    commsgd::state::expect_same(r.get<std::uint64_t>(), length_, "length");
    commsgd::state::expect_same(r.get<float>(), threshold_, "threshold");
    const auto steps = r.get<std::uint64_t>();
    std::vector<float> residual(length_);
    r.get_array(std::span<float>(residual), "residual");
    r.expect_end();
    residual_.swap(residual); // only now does anything change
    steps_ = steps;
  }

private:
  std::size_t length_;
  float threshold_;
  std::vector<float> residual_, next_;
  std::vector<std::uint32_t> indices_;
  std::vector<float> values_;
  std::uint64_t steps_ = 0;
};
static_assert(commsgd::sparsify::sparsifier<threshold_sparsifier>);
// [object]

// [tag]
// The tag data_parallel is instantiated with, and the options its traits name: they become the compression
// field of data_parallel's options.
struct threshold {};

struct threshold_options {
  float threshold = 0.05f;
};

} // namespace example

// The traits: how to build the part, and (dense_blocks = false) that its messages go through the sparse
// exchange, which is why it pairs with policy::uncoded<> only.
template <>
struct commsgd::policy::compression_traits<example::threshold> {
  using options = example::threshold_options;
  static constexpr bool dense_blocks = false;
  using type = example::threshold_sparsifier;
  static type make(std::size_t length, const options& o) { return type(length, o.threshold); }
};
// [tag]

namespace {

using namespace commsgd;
using metered = comm::metered<comm::local>;

// [compose]
template <class Compression>
using trainer = data_parallel<policy::uncoded<>, Compression, policy::synchronous, metered>;
// [compose]

constexpr int ranks = 4;
constexpr int steps = 300;
constexpr std::size_t batch = 32;
const toy::least_squares problem({.samples = 4096, .dim = 256, .seed = 5});

struct outcome {
  std::vector<float> model;       // rank 0's final model
  std::uint64_t bytes_sent = 0;   // rank 0's bytes over the run
  std::uint64_t sparse_steps = 0; // steps the sparse path (not the dense fallback) carried, rank 0
};

// [train]
// Trains every rank for `steps` steps from zero. With `resume_at` >= 0 every rank saves its trainer at that
// step, a fresh trainer loads the stream and finishes the run. `nan_at` puts a NaN into rank 1's gradient.
template <class Compression>
outcome train(const typename trainer<Compression>::options& o, int resume_at = -1, int nan_at = -1) {
  outcome out;
  comm::local_group{ranks}.run([&](comm::local& base) {
    metered c(base);
    std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
    auto dp = std::make_unique<trainer<Compression>>(c, problem.dim(), o);
    dp->start(x); // every rank starts from rank 0's model
    std::uint64_t sparse_steps = 0;
    for (int t = 0; t < steps; ++t) {
      if (t == resume_at) {
        std::stringstream file(std::ios::in | std::ios::out | std::ios::binary);
        dp->save(file); // every rank its own stream; the model x is the trainer's to keep
        dp = std::make_unique<trainer<Compression>>(c, problem.dim(), o);
        dp->load(file);
        dp->start(x); // a loaded trainer does not broadcast
      }
      problem.gradient(x, problem.batch(c.rank(), c.size(), t, batch), g);
      if (t == nan_at && c.rank() == 1) g[7] = std::numeric_limits<float>::quiet_NaN();
      dp->step(x, std::span<const float>(g));
      if constexpr (!policy::is_dense<Compression>) sparse_steps += dp->last_exchange().dense ? 0 : 1;
    }
    dp->finish(x);
    if (c.rank() == 0) out = {x, c.counters().total().bytes_sent, sparse_steps};
  });
  return out;
}
// [train]

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int failures = 0;
void expect(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
  failures += ok ? 0 : 1;
}

} // namespace

int main() {
  const float lr = 0.5f;
  const example::threshold_options t{.threshold = 0.05f};

  const double start = problem.loss(std::vector<float>(problem.dim(), 0.0f));
  const outcome dense = train<policy::dense>({.lr = lr});
  const outcome sparse = train<example::threshold>({.lr = lr, .compression = t});
  const double dense_loss = problem.loss(dense.model), sparse_loss = problem.loss(sparse.model);
  std::printf("initial loss %.3e; after %d steps: dense %.3e, threshold %.3e\n", start, steps, dense_loss,
              sparse_loss);
  std::printf("rank 0 sent: dense %llu bytes, threshold %llu bytes (%.3f of dense); sparse path on %llu of "
              "%d steps\n",
              static_cast<unsigned long long>(dense.bytes_sent),
              static_cast<unsigned long long>(sparse.bytes_sent),
              static_cast<double>(sparse.bytes_sent) / static_cast<double>(dense.bytes_sent),
              static_cast<unsigned long long>(sparse.sparse_steps), steps);

  // [checks]
  expect(sparse_loss < 1e-4 * start, "the threshold policy trains the toy to 1e-4 of its initial loss");
  expect(sparse.bytes_sent * 2 < dense.bytes_sent, "and sends less than half the dense exchange's bytes");

  const outcome resumed = train<example::threshold>({.lr = lr, .compression = t}, steps / 2);
  expect(same_bits(resumed.model, sparse.model), "a run saved and loaded halfway ends with the same bits");

  bool refused = false;
  try {
    train<example::threshold>({.lr = lr, .compression = t}, -1, 5);
  } catch (const non_finite& e) {
    // Rank 1 refuses its gradient; comm::local aborts the group, so the other ranks, blocked in the
    // exchange, raise comm_aborted, and run() rethrows the first error: rank 1's.
    refused = e.first_index() == 7;
    std::printf("refused: %s\n", e.what());
  }
  expect(refused, "a NaN on one rank stops the run with non_finite naming its index");
  // [checks]

  return failures == 0 ? 0 : 1;
}
