// comm::narrow_ring_sum on comm::local with 1 to 8 ranks: the independent reference bit for bit (sizes 0, 1,
// below and above n, odd, large; overflow refused or saturated; NaN reaching every rank), the bytes comm::metered
// counts (exactly the float ring's share at 2 bytes a value), and the same bits on a second run; all of it
// again with the reduce-scatter's hops cut into small uneven pieces, and the ring's own rule for cutting them.
#include "support/narrow_ring_cases.hpp"

#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/half.hpp>

#include <doctest/doctest.h>

#include <mutex>
#include <utility>
#include <vector>

using namespace commsgd;

TEST_CASE("the 16-bit ring sum equals the reference on 1 to 8 ranks, fp16 and bf16") {
  for (int n = 1; n <= 8; ++n) {
    CAPTURE(n);
    comm::local_group(n).run([](comm::local& c) {
      narrow_ring_cases::check_all<compress::fp16_format>(c);
      narrow_ring_cases::check_all<compress::bf16_format>(c);
    });
  }
}

TEST_CASE(
    "the 16-bit ring's sum is the same in pieces: the reference on 1 to 8 ranks, hops in uneven pieces") {
  for (int n = 1; n <= 8; ++n) {
    CAPTURE(n);
    comm::local_group(n).run([](comm::local& c) {
      narrow_ring_cases::check_all<compress::fp16_format>(c, narrow_ring_cases::pieces::small);
      narrow_ring_cases::check_all<compress::bf16_format>(c, narrow_ring_cases::pieces::small);
    });
  }
}

TEST_CASE("the 16-bit ring cuts a hop into pieces only where its chunks are long") {
  // The ring's own rule: whole below 2^22 values a chunk, pieces of at most 2^16 from there, none empty.
  // A 64 M model's chunks on 2, 3, 4 and 8 ranks: 2^25, 22,369,621, 2^24 and 2^23 values.
  const std::pair<int, std::size_t> model_64m[] = {{2, 512}, {3, 342}, {4, 256}, {8, 128}};
  for (const auto& [n, want] : model_64m) {
    const auto un = static_cast<std::size_t>(n);
    CHECK(comm::detail::ring_pieces(un * comm::narrow_ring_pieced - 1, n) == 1);
    CHECK(comm::detail::ring_pieces(un * comm::narrow_ring_pieced, n) == 64);
    CHECK(comm::detail::ring_pieces(un * comm::narrow_ring_pieced + un * 65537, n) == 66);
    CHECK(comm::detail::ring_pieces(std::size_t{1} << 26, n) == want);
  }
  // cost/'s count: (n - 1) (pieces + 1) messages each way, the bytes of the unpieced ring.
  constexpr std::size_t long_ring = 4 * comm::narrow_ring_pieced;
  static_assert(comm::narrow_ring_traffic(long_ring, 4, 1).messages_sent == 3 * 65);
  CHECK(comm::narrow_ring_traffic(long_ring, 4, 1).bytes_sent ==
        comm::ring_all_reduce_traffic(long_ring, 2, 4, 1).bytes_sent);
  // Set small: pieces of at most `piece` values from `pieced_from` on.
  CHECK(comm::detail::ring_pieces(1000, 4, 64, 100) == 4);
  CHECK(comm::detail::ring_pieces(400, 4, 64, 100) == 2);
  CHECK(comm::detail::ring_pieces(396, 4, 64, 100) == 1);
}

TEST_CASE("the 16-bit ring moves half a float ring's bytes, in (n - 1) (pieces + 1) messages each way") {
  for (int n = 1; n <= 8; ++n)
    for (const std::size_t d : {std::size_t{0}, std::size_t{3}, std::size_t{1000}, std::size_t{4099}}) {
      CAPTURE(n);
      CAPTURE(d);
      std::mutex m;
      std::vector<std::vector<float>> first(static_cast<std::size_t>(n)), second(first);
      for (auto* out : {&first, &second})
        comm::local_group(n).run([&](comm::local& raw) {
          comm::metered<comm::local> c(raw);
          auto x = narrow_ring_cases::input<compress::fp16_format>(c.rank(), d, 5, false);
          comm::narrow_ring_buffers buf;
          if (out == &second) { // small pieces: the same bytes and bits in more messages
            buf.piece = 64;
            buf.pieced_from = 100;
          }
          comm::narrow_ring_sum<compress::fp16_format>(c, std::span<float>(x), false, buf);
          const auto t = c.counters().total();
          const auto share = comm::ring_all_reduce_share(d, n, c.rank());
          // The reduce-scatter's hops go in pieces, the all-gather's whole.
          const std::uint64_t pieces = comm::detail::ring_pieces(d, n, buf.piece, buf.pieced_from);
          if (out == &second && d == 4099) CHECK(pieces == (4099 / n + 63) / 64);
          const std::uint64_t msgs = n > 1 ? static_cast<std::uint64_t>(n - 1) * (pieces + 1) : 0;
          std::lock_guard lock(m);
          CHECK(t.bytes_sent == 2 * share.sent);
          CHECK(t.bytes_received == 2 * share.received);
          CHECK(t.messages_sent == msgs);
          CHECK(t.messages_received == msgs);
          if (out == &first) { // the ring's own pieces: what cost/ counts
            const auto model = comm::narrow_ring_traffic(d, n, c.rank());
            CHECK(t.messages_sent == model.messages_sent);
            CHECK(t.bytes_sent == model.bytes_sent);
            CHECK(t.bytes_received == model.bytes_received);
          }
          (*out)[static_cast<std::size_t>(c.rank())] = x;
        });
      for (int r = 0; r < n; ++r) {
        CHECK(narrow_ring_cases::same_bits(first[static_cast<std::size_t>(r)], first[0]));
        CHECK(narrow_ring_cases::same_bits(second[static_cast<std::size_t>(r)], first[0]));
      }
    }
}

TEST_CASE("the 16-bit ring from wire values refuses values that lie in its own buffers, and a copy of them "
          "gives the ring's bits") {
  comm::local_group(1).run([](comm::local& c) {
    comm::narrow_ring_buffers buf;
    const std::vector<float> x = narrow_ring_cases::input<compress::fp16_format>(0, 300, 7, false);
    const auto own = narrow_ring_cases::wire_of<compress::fp16_format>(x);
    comm::narrow_ring_sum_wire<compress::fp16_format>(c, own, false, buf);
    const std::vector<std::uint16_t> sum = buf.wire;
    CHECK(sum == own); // one rank: the values themselves
    // All of buf.wire, a part of it, and the inbox's room: each refused, naming the argument; buf untouched.
    for (const std::span<const std::uint16_t> inside :
         {std::span<const std::uint16_t>(buf.wire), std::span<const std::uint16_t>(buf.wire).subspan(100, 7)}) {
      CHECK_THROWS_WITH_AS(comm::narrow_ring_sum_wire<compress::fp16_format>(c, inside, false, buf),
                           doctest::Contains("argument 'own'"), commsgd::invalid_argument);
      CHECK(buf.wire == sum);
    }
    buf.inbox.assign(16, 0);
    CHECK_THROWS_AS(comm::narrow_ring_sum_wire<compress::fp16_format>(
                        c, std::span<const std::uint16_t>(buf.inbox).subspan(3, 4), false, buf),
                    commsgd::invalid_argument);
    // Empty, or beside the buffers: taken.
    comm::narrow_ring_sum_wire<compress::fp16_format>(c, std::span<const std::uint16_t>(), false, buf);
    CHECK(buf.wire.empty());
    const std::vector<std::uint16_t> copy = sum;
    comm::narrow_ring_sum_wire<compress::fp16_format>(c, copy, false, buf);
    CHECK(buf.wire == sum);
  });
}
