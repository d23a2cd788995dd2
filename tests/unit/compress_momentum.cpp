// hook_momentum: the dense warm-up returns momentum SGD's updates, a compressed round proposes m u + g and
// changes nothing until committed, restart zeroes exactly the sent positions, and what is applied over the
// steps adds up to momentum SGD's updates when the compressor sends everything.
#include <commsgd/compress/momentum.hpp>
#include <commsgd/error.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

using commsgd::compress::hook_momentum;

TEST_CASE("warm_up returns momentum SGD's update and keeps it") {
  hook_momentum u(0.5f, 3);
  std::vector<float> avg{1.0f, -2.0f, 4.0f};
  u.warm_up(avg);
  CHECK(avg == std::vector<float>{1.0f, -2.0f, 4.0f});
  avg = {1.0f, 1.0f, 1.0f};
  u.warm_up(avg);
  CHECK(avg == std::vector<float>{1.5f, 0.0f, 3.0f});
  CHECK(std::vector<float>(u.buffer().begin(), u.buffer().end()) == avg);
}

TEST_CASE("propose leaves the momentum alone until commit, and commit hands the old storage back") {
  hook_momentum u(0.25f);
  u.assign(std::vector<float>{4.0f, 8.0f});
  std::vector<float> next;
  u.propose(std::vector<float>{1.0f, -1.0f}, next);
  CHECK(next == std::vector<float>{2.0f, 1.0f});
  CHECK(u.buffer()[0] == 4.0f); // a failed round would stop here: nothing changed
  u.commit(next);
  CHECK(u.buffer()[0] == 2.0f);
  CHECK(u.buffer()[1] == 1.0f);
  CHECK(next == std::vector<float>{4.0f, 8.0f});
}

TEST_CASE("restart zeroes the sent positions only and refuses positions outside") {
  hook_momentum u(0.9f);
  u.assign(std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f});
  u.restart(std::span<const std::uint32_t>(std::vector<std::uint32_t>{3, 1}));
  CHECK(std::vector<float>(u.buffer().begin(), u.buffer().end()) ==
        std::vector<float>{1.0f, 0.0f, 3.0f, 0.0f});
  const std::vector<std::int64_t> bad{-1};
  CHECK_THROWS_AS(u.restart(std::span<const std::int64_t>(bad)), commsgd::invalid_argument);
  const std::vector<std::size_t> past{4};
  CHECK_THROWS_AS(u.restart(std::span<const std::size_t>(past)), commsgd::invalid_argument);
}

TEST_CASE("sending every proposal exactly applies momentum SGD's updates") {
  // The optimizer without momentum applies lr * (sent value); momentum SGD applies lr * v, v <- m v + g.
  const float m = 0.9f;
  hook_momentum u(m, 2);
  std::vector<float> next, v{0.0f, 0.0f};
  const std::vector<std::vector<float>> grads{{1.0f, 0.0f}, {0.5f, -1.0f}, {-2.0f, 3.0f}, {0.0f, 0.25f}};
  for (const auto& g : grads) {
    u.propose(g, next);
    for (std::size_t i = 0; i < 2; ++i) {
      v[i] = m * v[i] + g[i];
      CHECK(next[i] == doctest::Approx(v[i]));
    }
    u.commit(next);
  }
}

TEST_CASE("bad factors and lengths are refused with the argument named") {
  CHECK_THROWS_WITH_AS(hook_momentum(1.0f), doctest::Contains("'momentum'"), commsgd::invalid_argument);
  CHECK_THROWS_AS(hook_momentum(-0.1f), commsgd::invalid_argument);
  hook_momentum u(0.5f, 3);
  std::vector<float> two{1.0f, 2.0f}, next;
  CHECK_THROWS_WITH_AS(u.warm_up(two), doctest::Contains("'avg'"), commsgd::size_mismatch);
  CHECK_THROWS_AS(u.propose(two, next), commsgd::size_mismatch);
  u.resize(2);
  CHECK(u.length() == 2);
  CHECK(u.buffer()[0] == 0.0f);
}
