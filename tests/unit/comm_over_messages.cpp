// comm::over_messages on comm::local: the ring all-reduce against a sum worked out here (the bits every rank
// gets equal, n = 1 to 6, sizes below and above n); the bytes its messages carry, counted by comm::metered
// beneath it, against cost/'s ring and gather rules; the 16-bit ring (point-to-point already) runs over it
// unchanged; a wrong size is the transport's error, not a hang. The DiLoCo codes' rounds over it:
// tests/unit/sync_diloco_code.cpp.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/narrow_ring.hpp>
#include <commsgd/comm/over_messages.hpp>
#include <commsgd/compress/half.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

using namespace commsgd;

static_assert(comm::communicator<comm::over_messages<comm::metered<comm::local>>>);

TEST_CASE("the ring sums as the plain sum would, the same bits on every rank, 1 to 6 ranks") {
  for (int n = 1; n <= 6; ++n)
    for (const std::size_t m :
         {std::size_t{0}, std::size_t{1}, std::size_t{4}, std::size_t{7}, std::size_t{500}}) {
      CAPTURE(n);
      CAPTURE(m);
      std::mutex mu;
      std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
      comm::local_group(n).run([&](comm::local& base) {
        comm::over_messages<comm::local> c(base);
        // Values with a fraction: the ring's order of summing shows in the last bits, and every rank must
        // still receive one rank's result.
        std::vector<float> x(m);
        for (std::size_t i = 0; i < m; ++i)
          x[i] = 0.1f * static_cast<float>(c.rank() + 1) + 0.01f * static_cast<float>(i);
        c.all_reduce_sum(std::span<float>(x));
        for (std::size_t i = 0; i < m; ++i) {
          double want = 0;
          for (int r = 0; r < n; ++r)
            want += 0.1f * static_cast<float>(r + 1) + 0.01f * static_cast<float>(i);
          CHECK(std::abs(x[i] - want) <= 1e-5 * (1 + std::abs(want)));
        }
        std::lock_guard lock(mu);
        got[static_cast<std::size_t>(c.rank())] = x;
      });
      for (const auto& g : got)
        CHECK((m == 0 || std::memcmp(g.data(), got[0].data(), m * sizeof(float)) == 0));
    }
}

TEST_CASE("the bytes its messages carry are cost/'s ring and gathers, 1 to 5 ranks") {
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    comm::local_group(n).run([&](comm::local& base) {
      comm::over_messages<comm::metered<comm::local>> c{comm::metered<comm::local>(base)};
      const int r = c.rank();
      const auto& wire = c.inner().counters();
      for (const std::size_t m : {std::size_t{3}, std::size_t{1000}, std::size_t{4099}}) {
        c.inner().reset();
        std::vector<float> x(m, 1.0f);
        c.all_reduce_sum(std::span<float>(x));
        CHECK(x[m - 1] == static_cast<float>(n));
        auto want = comm::ring_all_reduce_traffic(m, 4, n, r);
        want.calls = 2 * want.messages_sent; // a send and a receive each
        CHECK(wire.total() == want);
      }
      c.inner().reset();
      std::vector<std::uint16_t> mine(9 + static_cast<std::size_t>(r)), all;
      c.all_gather_v(std::span<const std::uint16_t>(mine), all);
      std::uint64_t others = 0;
      for (int q = 0; q < n; ++q)
        others += q == r ? 0 : (9 + static_cast<std::uint64_t>(q)) * 2;
      const auto v = comm::all_gather_v_traffic(mine.size() * 2, others, n);
      CHECK(wire.total().bytes_sent == v.bytes_sent);
      CHECK(wire.total().bytes_received == v.bytes_received);
    });
  }
}

TEST_CASE("the 16-bit ring runs over it and moves half a float ring's bytes") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    comm::local_group(n).run([&](comm::local& base) {
      comm::over_messages<comm::metered<comm::local>> c{comm::metered<comm::local>(base)};
      std::vector<float> x(1001, 1.0f);
      comm::narrow_ring_buffers buf;
      comm::narrow_ring_sum<compress::fp16_format>(c, std::span<float>(x), false, buf);
      CHECK(x[1000] == static_cast<float>(n));
      CHECK(c.inner().counters().total().bytes_sent ==
            comm::ring_all_reduce_traffic(1001, sizeof(std::uint16_t), n, c.rank()).bytes_sent);
    });
  }
}

TEST_CASE("a rank whose size differs gets the transport's error, not a hang") {
  CHECK_THROWS_AS(comm::local_group(2).run([](comm::local& base) {
    comm::over_messages<comm::local> c(base);
    std::vector<float> x(c.rank() == 0 ? 10 : 12, 1.0f);
    c.all_reduce_sum(std::span<float>(x));
  }),
                  commsgd::comm_error);
}
