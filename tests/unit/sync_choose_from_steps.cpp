// The automatic choice for a data_parallel trainer (sync/choose_from_steps.hpp), used as a C++ trainer would:
// profile dense steps, choose on every rank alike, build the chosen composition (its own type, picked at run
// time through a std::variant) over the dense trainer's parameters and strategy state, and go on training.
#include <commsgd/comm/local.hpp>
#include <commsgd/cost/candidate.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/sync/choose_from_steps.hpp>
#include <commsgd/sync/choose_with_history.hpp>
#include <support/least_squares.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

const toy::least_squares problem({.samples = 1536, .dim = 256, .seed = 11});
constexpr std::size_t batch = 32; // rows per rank and step
constexpr int profiled = 6;       // dense steps before the choice (the timer skips the first)
constexpr int after = 40;         // steps with the chosen exchange

const comm::network_model free_network{0, std::numeric_limits<double>::infinity()};
const comm::network_model slow_network{50e-6, 1e6 / 8}; // 1 Mbit/s, 50 us

using dense_dp = data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>;
using fp16_dp = data_parallel<policy::uncoded<>, policy::fp16, policy::synchronous>;
using topk_dp = data_parallel<policy::uncoded<>, policy::top_k<select::exact>, policy::synchronous>;
using any_trainer = std::variant<dense_dp, fp16_dp, topk_dp>;

// The composition a candidate names; its type is fixed at compile time, so the choice picks a variant.
any_trainer make_trainer(local& c, const std::string& name, float lr) {
  const auto k = cost::parse_candidate(name);
  switch (k.kind) {
  case cost::candidate_kind::dense:
    return any_trainer(std::in_place_type<dense_dp>, c, problem.dim(), dense_dp::options{.lr = lr});
  case cost::candidate_kind::fp16:
    return any_trainer(std::in_place_type<fp16_dp>, c, problem.dim(), fp16_dp::options{.lr = lr});
  case cost::candidate_kind::topk:
    return any_trainer(std::in_place_type<topk_dp>, c, problem.dim(),
                       topk_dp::options{.lr = lr, .compression = {.top_k = {.density = k.density}}});
  default:
    throw invalid_argument("this trainer offers dense, fp16 and topk-<density>");
  }
}

void gradient(local& c, std::span<const float> x, std::int64_t t, std::span<float> g) {
  problem.gradient(x, problem.batch(c.rank(), c.size(), t, batch), g);
}

// The profiled dense steps; x and g end as the last step left them.
void profile(local& c, dense_dp& warm, sync::step_timer& timer, std::vector<float>& x,
             std::vector<float>& g) {
  warm.start(x);
  for (int t = 0; t < profiled; ++t) {
    timer.compute([&] { gradient(c, x, t, g); });
    timer.exchange([&] { return warm.step(x, g); });
  }
}

struct outcome {
  std::string choice;
  std::vector<double> predicted;
  double loss_at_switch = 0;
  double loss_after = 0;
  std::vector<float> x;
};

// Profiles dense, chooses among `plans` for `net`, switches and trains `after` more steps.
outcome run(local& c, const std::vector<sync::candidate_plan>& plans, const comm::network_model& net) {
  const float lr = 0.1f;
  dense_dp warm(c, problem.dim(), {.lr = lr});
  sync::step_timer timer;
  std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
  profile(c, warm, timer, x, g);
  CHECK(timer.steps().size() == profiled - 1);
  CHECK(timer.compute_s() > 0);
  CHECK(timer.exchange_s() > 0);

  const auto choice = sync::choose_from_steps(c, timer, g, sync::buckets_of(problem.dim()), plans, net);
  outcome out{choice.name, choice.predicted, problem.loss(x), 0, {}};

  auto next = make_trainer(c, choice.name, lr);
  std::visit(
      [&](auto& dp) {
        std::stringstream s(std::ios::in | std::ios::out | std::ios::binary);
        warm.strategy().save(s);
        dp.strategy().load(s); // the learning rate, and start() no longer broadcasts
        dp.start(x);
        for (int t = profiled; t < profiled + after; ++t) {
          gradient(c, x, t, g);
          dp.step(x, g);
        }
        dp.finish(x);
      },
      next);
  out.loss_after = problem.loss(x);
  out.x = x;
  return out;
}

template <class T, class Fn>
std::vector<T> on_every_rank(int n, Fn fn) {
  std::vector<T> out(static_cast<std::size_t>(n));
  local_group(n).run([&](local& c) { out[static_cast<std::size_t>(c.rank())] = fn(c); });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Profiles dense on every rank, then runs `fn(c, timer, g)` and counts the ranks that raised E.
template <class E, class Fn>
int refusals(int n, Fn fn) {
  std::atomic<int> count{0};
  local_group(n).run([&](local& c) {
    dense_dp warm(c, problem.dim(), {.lr = 0.1f});
    sync::step_timer timer;
    std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
    profile(c, warm, timer, x, g);
    try {
      fn(c, timer, g);
    } catch (const E&) {
      ++count;
    }
  });
  return count.load();
}

} // namespace

TEST_CASE("choose_from_steps: every rank switches data_parallel to the same exchange and trains on") {
  struct scenario {
    const char* what;
    comm::network_model net;
    std::vector<sync::candidate_plan> plans;
    std::vector<std::string> allowed;
  };
  const std::vector<scenario> scenarios{
      {"free network", free_network, {{.name = "fp16"}, {.name = "topk-0.1"}}, {"dense"}},
      {"1 Mbit/s", slow_network, {{.name = "fp16"}, {.name = "topk-0.1"}}, {"fp16", "topk-0.1"}},
      {"1 Mbit/s, fp16 only", slow_network, {{.name = "fp16"}}, {"fp16"}},
  };
  const double initial = problem.loss(std::vector<float>(problem.dim(), 0.0f));
  for (int n : {2, 3}) {
    for (const auto& sc : scenarios) {
      CAPTURE(n);
      CAPTURE(sc.what);
      const auto got = on_every_rank<outcome>(n, [&](local& c) { return run(c, sc.plans, sc.net); });
      CAPTURE(got[0].choice);
      CHECK(std::find(sc.allowed.begin(), sc.allowed.end(), got[0].choice) != sc.allowed.end());
      CHECK(got[0].predicted.size() == sc.plans.size() + 1); // dense added
      for (std::size_t r = 0; r < got.size(); ++r) {
        CAPTURE(r);
        CHECK(got[r].choice == got[0].choice);
        CHECK(got[r].predicted == got[0].predicted);
        CHECK(same_bits(got[r].x, got[0].x)); // replicas stay identical across the switch
      }
      CHECK(got[0].loss_at_switch < initial);
      CHECK(got[0].loss_after < got[0].loss_at_switch);
    }
  }
}

TEST_CASE("choose_from_steps: one bucket per layer, and compute a plan brings") {
  const std::vector<std::size_t> layers{100, 156};
  const auto buckets = sync::buckets_of(problem.dim(), layers);
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].values == 100);
  CHECK(buckets[1].values == 156);
  CHECK_THROWS_AS(sync::buckets_of(problem.dim(), std::vector<std::size_t>{100, 100}), size_mismatch);
  CHECK_THROWS_AS(sync::buckets_of(problem.dim(), std::vector<std::size_t>{0, 256}), invalid_argument);

  const auto got = on_every_rank<std::string>(3, [&](local& c) {
    dense_dp warm(c, problem.dim(), {.lr = 0.1f});
    sync::step_timer timer;
    std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
    profile(c, warm, timer, x, g);
    // powersgd's work is not timed here: this plan brings its own, one entry per bucket.
    const std::vector<sync::candidate_plan> plans{
        {.name = "bf16"}, {.name = "topk-0.05"}, {.name = "powersgd-r1", .compute = {{1e-3, 0}, {1e-3, 0}}}};
    const auto in = sync::measure_choice_inputs(timer, g, buckets, plans);
    CHECK(in.plans.front().name == "dense");
    CHECK(in.plans.size() == 4);
    for (const auto& p : in.plans) {
      CHECK(p.blocking);
      CHECK(p.compute.size() == (p.name == "dense" ? 0u : 2u));
    }
    CHECK(in.plans.back().compute[0].call_s == 1e-3); // kept as given
    CHECK(in.profile.ready_s == std::vector<double>(2, in.profile.backward_s));
    CHECK(in.profile.backward_s == timer.compute_s());
    return sync::choose_from_steps(c, timer, g, buckets, plans, slow_network).name;
  });
  CHECK(got[0] != "dense");
  CHECK(got[1] == got[0]);
  CHECK(got[2] == got[0]);
}

TEST_CASE("choose_from_steps: bad settings raise on every rank") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    const auto buckets = sync::buckets_of(problem.dim());
    const std::vector<sync::candidate_plan> plans{{.name = "fp16"}};
    CHECK(refusals<invalid_argument>(n, [&](local& c, const sync::step_timer& t, std::span<const float> g) {
            sync::choose_from_steps(c, t, g, buckets, plans, {50e-6, -1});
          }) == n);
    const std::vector<sync::candidate_plan> unknown{{.name = "zip"}};
    CHECK(refusals<invalid_argument>(n, [&](local& c, const sync::step_timer& t, std::span<const float> g) {
            sync::choose_from_steps(c, t, g, buckets, unknown, slow_network);
          }) == n);
    const std::vector<sync::candidate_plan> untimed{{.name = "powersgd-r2"}};
    CHECK(refusals<invalid_argument>(n, [&](local& c, const sync::step_timer& t, std::span<const float> g) {
            sync::choose_from_steps(c, t, g, buckets, untimed, slow_network);
          }) == n);
    CHECK(refusals<invalid_argument>(n, [&](local& c, const sync::step_timer&, std::span<const float> g) {
            sync::choose_from_steps(c, sync::step_timer{}, g, buckets, plans, slow_network);
          }) == n);
    const auto short_buckets = sync::buckets_of(100);
    CHECK(refusals<size_mismatch>(n, [&](local& c, const sync::step_timer& t, std::span<const float> g) {
            sync::choose_from_steps(c, t, g, short_buckets, plans, slow_network);
          }) == n);
  }
}

TEST_CASE("exchange_chooser: a resumed run rebuilds the chosen trainer and goes on bit for bit") {
  // Decide from measured steps, take a few compressed steps, checkpoint (chooser on rank 0, trainer and
  // model on every rank), then compare an uninterrupted run with one resumed from the checkpoint.
  const int n = 2;
  const float lr = 0.1f;
  const std::vector<sync::candidate_plan> plans{{.name = "fp16"}, {.name = "topk-0.1"}};
  std::string chooser_saved;
  std::vector<std::string> trainer_saved(n);
  std::vector<std::vector<float>> x_saved(n), straight(n), resumed(n);
  const auto go_on = [&](local& c, any_trainer& tr, std::vector<float>& x, int from) {
    std::vector<float> g(problem.dim());
    std::visit(
        [&](auto& dp) {
          for (int t = from; t < from + 10; ++t) {
            gradient(c, x, t, g);
            dp.step(x, g);
          }
        },
        tr);
  };
  local_group(n).run([&](local& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    dense_dp warm(c, problem.dim(), {.lr = lr});
    sync::step_timer timer;
    std::vector<float> x(problem.dim(), 0.0f), g(problem.dim());
    profile(c, warm, timer, x, g);
    sync::exchange_chooser chooser({slow_network});
    const auto in = sync::measure_choice_inputs(timer, g, sync::buckets_of(problem.dim()), plans);
    const auto& rec = chooser.decide(c, in.profile, in.plans, profiled);
    CHECK(rec.choice != "dense");
    auto tr = make_trainer(c, chooser.current(), lr);
    std::visit(
        [&](auto& dp) {
          std::stringstream s(std::ios::in | std::ios::out | std::ios::binary);
          warm.strategy().save(s);
          dp.strategy().load(s);
          dp.start(x);
        },
        tr);
    go_on(c, tr, x, profiled);
    std::ostringstream ts(std::ios::binary);
    std::visit([&](auto& dp) { dp.save(ts); }, tr);
    trainer_saved[r] = ts.str();
    x_saved[r] = x;
    if (c.rank() == 0) {
      std::ostringstream cs(std::ios::binary);
      chooser.save(cs);
      chooser_saved = cs.str();
    }
    go_on(c, tr, x, profiled + 10);
    straight[r] = x;
  });
  local_group(n).run([&](local& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    sync::exchange_chooser chooser({slow_network});
    std::istringstream cs(chooser_saved, std::ios::binary);
    chooser.load(cs);
    REQUIRE(chooser.log().size() == 1);
    CHECK(chooser.log()[0].step == profiled);
    auto tr = make_trainer(c, chooser.current(), lr);
    auto x = x_saved[r];
    std::visit(
        [&](auto& dp) {
          std::istringstream ts(trainer_saved[r], std::ios::binary);
          dp.load(ts);
          dp.start(x);
        },
        tr);
    go_on(c, tr, x, profiled + 10);
    resumed[r] = x;
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(same_bits(resumed[static_cast<std::size_t>(r)], straight[static_cast<std::size_t>(r)]));
    CHECK(same_bits(straight[static_cast<std::size_t>(r)], straight[0]));
  }
}
