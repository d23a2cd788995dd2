// comm::local's promise that nothing hangs: failures reach every rank, and run() rethrows the first one.
#include <commsgd/comm/local.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

using commsgd::comm::local;
using commsgd::comm::local_group;
using clock_type = std::chrono::steady_clock;

namespace {
struct boom : std::runtime_error {
  boom() : std::runtime_error("rank 1 failed on purpose") {}
};
} // namespace

TEST_CASE("a rank that throws inside a collective ends run() with that error within 2 s") {
  for (int n : {2, 3, 4, 7}) {
    CAPTURE(n);
    std::atomic<int> aborted{0};
    const auto start = clock_type::now();
    CHECK_THROWS_AS(local_group(n).run([&](local& c) {
      std::vector<float> v(1 << 16, 1.0f);
      c.all_reduce_sum(std::span<float>(v)); // one good collective first
      if (c.rank() == 1) throw boom();
      try {
        c.all_reduce_sum(std::span<float>(v)); // the others block here until the abort reaches them
      } catch (const commsgd::comm_aborted&) {
        ++aborted;
        throw;
      }
    }),
                    boom);
    CHECK(clock_type::now() - start < std::chrono::seconds(2));
    CHECK(aborted == n - 1);
  }
}

TEST_CASE("every kind of blocking call is released by an abort") {
  for (int which = 0; which < 5; ++which) {
    CAPTURE(which);
    const auto start = clock_type::now();
    CHECK_THROWS_AS(local_group(3).run([&](local& c) {
      if (c.rank() == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        throw boom();
      }
      std::vector<float> v(8);
      std::vector<float> all(24);
      std::vector<float> gathered;
      switch (which) {
      case 0:
        c.barrier();
        break;
      case 1:
        c.broadcast(std::span<float>(v), 0);
        break;
      case 2:
        c.all_gather_v(std::span<const float>(v), gathered);
        break;
      case 3:
        c.recv(std::span<float>(v), 2, 0);
        break;
      default: {
        auto sub = c.split(0, 0);
        (void)sub;
      }
      }
    }),
                    boom);
    CHECK(clock_type::now() - start < std::chrono::seconds(2));
  }
}

TEST_CASE("a rank that returns while a peer waits for it is an error, not a hang") {
  const auto start = clock_type::now();
  CHECK_THROWS_AS(local_group(2).run([](local& c) {
    if (c.rank() == 0) return;
    std::vector<int> v(3);
    c.recv(std::span<int>(v), 0, 0);
  }),
                  commsgd::comm_error);
  CHECK_THROWS_AS(local_group(3).run([](local& c) {
    if (c.rank() == 0) return;
    c.barrier();
  }),
                  commsgd::comm_error);
  CHECK(clock_type::now() - start < std::chrono::seconds(2));
}

TEST_CASE("local_group refuses a size below 1") {
  CHECK_THROWS_AS(local_group(0), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(local_group(-3), doctest::Contains("'n' = -3"), commsgd::invalid_argument);
}

TEST_CASE("ranks disagreeing on a collective's size all get size_mismatch") {
  std::atomic<int> caught{0};
  local_group(3).run([&](local& c) {
    std::vector<float> v(static_cast<std::size_t>(10 + (c.rank() == 1)));
    try {
      c.all_reduce_sum(std::span<float>(v));
    } catch (const commsgd::size_mismatch&) {
      ++caught;
    }
    c.barrier(); // and the group is still usable afterwards
  });
  CHECK(caught == 3);
}

TEST_CASE("run() leaves no thread behind: the group can be reused at once, many times") {
  std::atomic<int> calls{0};
  for (int i = 0; i < 50; ++i)
    local_group(4).run([&](local& c) {
      c.barrier();
      ++calls;
    });
  CHECK(calls == 200);
}
