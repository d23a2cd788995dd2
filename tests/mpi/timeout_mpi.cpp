// comm::mpi with a timeout: a call a peer never completes throws comm_error within the timeout, the
// communicator refuses every later call, and calls that do complete give the same results as without one.
//
// A peer that "never answers" here answers late (after the others have timed out), and every buffer a
// timed-out call was given stays alive until a barrier on another communicator has let MPI finish it: that is
// what makes the test end cleanly. A real trainer ends its process instead (see comm/mpi.hpp).
#include "mpi/support.hpp"

#include <commsgd/comm/mpi.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

using commsgd::comm::mpi;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void world_barrier() {
  MPI_Barrier(MPI_COMM_WORLD);
}

std::vector<float> exact_floats(std::size_t n, int rank, unsigned seed) {
  std::mt19937 gen(seed * 7919u + static_cast<unsigned>(rank));
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<float> v(n);
  for (auto& x : v)
    x = static_cast<float>(d(gen)) / 8;
  return v;
}

// Checks the error of a timed-out call and that the communicator now refuses work at once.
void expect_broken(mpi& c, const std::string& what, const std::string& call, double elapsed, double timeout) {
  CAPTURE(what);
  CHECK(what.find(call) != std::string::npos);
  CHECK(what.find("timeout_s = ") != std::string::npos);
  CHECK(what.find("resume from the last checkpoint") != std::string::npos);
  CHECK(elapsed >= timeout);
  CHECK(elapsed < timeout + 5.0); // bounded: the deadline, plus a loaded machine's scheduling
  CHECK(c.timed_out());
  std::vector<float> x(4, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(c.all_reduce_sum(std::span<float>(x)), doctest::Contains("cannot be used again"),
                       commsgd::comm_error);
  CHECK_THROWS_AS(c.barrier(), commsgd::comm_error);
  CHECK_THROWS_AS(c.isend(std::span<const float>(x), 0, 1), commsgd::comm_error);
  CHECK(seconds_since(t0) < 1.0);
}

} // namespace

TEST_CASE("mpi/timeout: set_timeout takes (0, inf] and nothing else") {
  auto c = mpi::world();
  CHECK(std::isinf(c.timeout()));
  for (double bad :
       {0.0, -1.0, -0.0, std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::infinity()})
    CHECK_THROWS_WITH_AS(c.set_timeout(bad), doctest::Contains("argument 'seconds'"),
                         commsgd::invalid_argument);
  c.set_timeout(2.5);
  CHECK(c.timeout() == 2.5);
  auto child = c.split(0, c.rank());
  CHECK(child.timeout() == 2.5); // a split inherits it
  c.set_timeout(std::numeric_limits<double>::infinity());
  CHECK(std::isinf(c.timeout()));
  CHECK_FALSE(c.timed_out());
}

TEST_CASE("mpi/timeout: calls that complete give the results of the unbounded ones") {
  auto bounded = mpi::world();
  auto plain = mpi::world();
  bounded.set_timeout(60);
  const int r = bounded.rank(), p = bounded.size();
  for (std::size_t limit : {std::size_t{3}, std::size_t{mpi::default_max_chunk_elements}}) {
    bounded.set_max_chunk_elements(limit);
    plain.set_max_chunk_elements(limit);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100}}) {
      CAPTURE(limit);
      CAPTURE(n);
      auto a = exact_floats(n, r, 1), b = a;
      bounded.all_reduce_sum(std::span<float>(a));
      plain.all_reduce_sum(std::span<float>(b));
      CHECK(a == b); // exact data: any summation order gives these bits

      std::vector<float> all_a(n * static_cast<std::size_t>(p)), all_b(all_a.size());
      const auto mine = exact_floats(n, r, 2);
      bounded.all_gather(std::span<const float>(mine), std::span<float>(all_a));
      plain.all_gather(std::span<const float>(mine), std::span<float>(all_b));
      CHECK(all_a == all_b);

      const auto part = exact_floats(n * static_cast<std::size_t>(r), r, 3);
      std::vector<float> va, vb;
      CHECK(bounded.all_gather_v(std::span<const float>(part), va) ==
            plain.all_gather_v(std::span<const float>(part), vb));
      CHECK(va == vb);

      for (int root = 0; root < p; ++root) {
        auto buf = r == root ? exact_floats(n, root, 4) : std::vector<float>(n, -1.0f);
        bounded.broadcast(std::span<float>(buf), root);
        CHECK(buf == exact_floats(n, root, 4));
      }

      const int next = (r + 1) % p, prev = (r + p - 1) % p;
      const auto out = exact_floats(n, r, 5);
      std::vector<float> in(n, -1.0f);
      auto pending = bounded.irecv(std::span<float>(in), prev, 7);
      bounded.send(std::span<const float>(out), next, 7);
      pending.wait();
      CHECK(in == exact_floats(n, prev, 5));
      std::vector<float> in2(n, -1.0f);
      auto s = bounded.isend(std::span<const float>(out), next, 8);
      bounded.recv(std::span<float>(in2), prev, 8);
      s.wait();
      CHECK(in2 == in);
    }
  }
  bounded.barrier();
  CHECK_FALSE(bounded.timed_out());
}

TEST_CASE("mpi/timeout: a collective one rank joins late throws on the others, and the rest is refused") {
  auto c = mpi::world();
  c.set_verify_sizes(false); // one collective per call, so the late rank's call matches the leaked one
  const int r = c.rank();
  const double timeout = 0.3;
  std::vector<float> data(1000, static_cast<float>(r + 1)); // alive until MPI is done with it
  if (r == 1) {
    c.set_timeout(30);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    c.all_reduce_sum(std::span<float>(data)); // completes while the others wait in the barrier below
    const float n = static_cast<float>(c.size());
    CHECK(data[0] == n * (n + 1) / 2);
    CHECK_FALSE(c.timed_out());
  } else {
    c.set_timeout(timeout);
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      c.all_reduce_sum(std::span<float>(data));
    } catch (const commsgd::comm_error& e) {
      what = e.what();
    }
    expect_broken(c, what, "MPI_Allreduce", seconds_since(t0), timeout);
  }
  world_barrier();
  world_barrier();
}

TEST_CASE("mpi/timeout: a send nobody receives and a receive nobody sends to throw; requests too") {
  auto c = mpi::world();
  auto c2 = mpi::world(); // made by every rank: creating a communicator is collective
  const int r = c.rank();
  const double timeout = 0.3;
  // 1 MiB: more than any eager limit, so the send cannot complete before the receive is posted.
  std::vector<float> big(1 << 18, 2.0f), got(1 << 18, 0.0f), small(16, 0.0f);
  if (r == 0) {
    c.set_timeout(timeout);
    auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      c.send(std::span<const float>(big), 1, 11);
    } catch (const commsgd::comm_error& e) {
      what = e.what();
    }
    expect_broken(c, what, "MPI_Send", seconds_since(t0), timeout);
  } else if (r == 1) {
    c.set_timeout(30);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    c.recv(std::span<float>(got), 0, 11);
    CHECK(got == big);
    // A request's wait is bounded by the same timeout.
    c2.set_timeout(timeout);
    auto req = c2.irecv(std::span<float>(small), 0, 12);
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      req.wait();
    } catch (const commsgd::comm_error& e) {
      what = e.what();
    }
    expect_broken(c2, what, "irecv from rank 0 with tag 12", seconds_since(t0), timeout);
  }
  world_barrier();
  world_barrier();
}
