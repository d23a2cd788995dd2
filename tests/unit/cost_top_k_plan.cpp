// The top-k layout (cost/top_k_plan.hpp) against sizes and offsets counted by hand, and the message
// compress::top_k_ef actually gathers read back at the plan's offsets byte for byte: the plan is what the
// byte counts, the compressor and the device round all trust, so it must describe the real message.
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/cost/top_k_plan.hpp>
#include <support/forwarding_comm.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

using namespace commsgd;
using comm::local;

TEST_CASE("the plan's chunks, offsets and sizes, counted by hand") {
  // 10,000 values in chunks of 4096 at 1 %: chunks of 4096, 4096 and 1808 values, k = 41, 41 and 19.
  const auto two = cost::top_k_plan::of(10000, 4096, 0.01, true);
  CHECK(two.count == 3);
  CHECK(two.k_full == 41);
  CHECK(two.k_last == 19);
  CHECK(two.k() == 101);
  CHECK(two.index_bits == 12);
  CHECK(two.code_offset == 12);          // three float scales
  CHECK(two.index_offset == 12 + 26);    // 202 bits of 2-bit codes
  CHECK(two.bytes == 12 + 26 + 152);     // 1212 bits of indices
  const auto floats = cost::top_k_plan::of(10000, 4096, 0.01, false);
  CHECK(floats.index_offset == 404);     // 101 floats
  CHECK(floats.bytes == 404 + 152);
  CHECK(cost::top_k_message_bytes(floats, false) == floats.bytes);

  // Chunks taken in turn by n ranks: at 2 ranks one rank holds two chunks, at 4 ranks one.
  CHECK(two.room(2) == 82);
  CHECK(two.room(4) == 41);
  CHECK(cost::shared_top_k_slot_bytes(two, 2) == 123);         // 82 indices of 12 bits
  CHECK(cost::region_top_k_block_bytes(two, 2) == 164 + 123);  // and 82 bf16 values before them
  CHECK(cost::top_k_16_bit_payload_bytes(two) == 202 + 152);

  // Nothing to send: no chunks, no bytes, whatever the format.
  for (bool two_bit : {false, true}) {
    const auto empty = cost::top_k_plan::of(0, 0, 0.5, two_bit);
    CHECK(empty.count == 0);
    CHECK(empty.bytes == 0);
  }
  // One value: its index needs no bits, so the message is the float alone.
  CHECK(cost::top_k_plan::of(1, 0, 0.5, false).bytes == 4);
}

namespace {

// comm::local that keeps the last byte message this rank gathered.
struct keeps_message : test_comm::forwarding<local> {
  std::vector<std::byte>* kept;

  template <comm::transferable T>
  void all_gather(std::span<const T> m, std::span<T> a) {
    if constexpr (std::is_same_v<T, std::byte>) kept->assign(m.begin(), m.end());
    inner.all_gather(m, a);
  }
  keeps_message split(int color, int key) { return {{inner.split(color, key)}, kept}; }
};
static_assert(comm::communicator<keeps_message>);

float float_at(const std::vector<std::byte>& m, std::uint64_t at) {
  float x;
  std::memcpy(&x, m.data() + at, 4);
  return x;
}

// The message top_k_ef gathers for g on one rank, in its first round (no residual yet: p = g).
std::vector<std::byte> sent(std::span<const float> g, const compress::top_k_ef_options& o) {
  std::vector<std::byte> m;
  comm::local_group(1).run([&](local& c) {
    keeps_message k{{c}, &m};
    compress::top_k_ef<> x(g.size(), o);
    std::vector<float> out(g.size());
    x.reduce(k, g, std::span<float>(out));
  });
  return m;
}

} // namespace

TEST_CASE("top_k_ef's message holds each part where the plan says") {
  // Chunks of 4, 4 and 2 values at density 0.5: k = 2, 2 and 1, 2-bit indices.
  const std::vector<float> g = {1, -5, 3, 0.5f, 0.125f, 0.25f, 8, -2, 7, -1};
  // The two largest of each chunk, in index order: -5 and 3 (indices 1, 2), 8 and -2 (2, 3), 7 (0).
  const std::byte indices[] = {std::byte{1 | 2 << 2 | 2 << 4 | 3 << 6}, std::byte{0}};

  const compress::top_k_ef_options floats{.density = 0.5, .chunk = 4};
  const auto pf = cost::top_k_plan::of(10, 4, 0.5, false);
  const auto mf = sent(g, floats);
  REQUIRE(mf.size() == pf.bytes);
  REQUIRE(pf.index_offset == 20);
  const float values[] = {-5, 3, 8, -2, 7};
  for (std::uint64_t i = 0; i < 5; ++i)
    CHECK(float_at(mf, 4 * i) == values[i]);
  CHECK(std::memcmp(mf.data() + pf.index_offset, indices, 2) == 0);

  // 2-bit: scales 4, 5 and 7 (each chunk's mean magnitude); codes sign bit 2, bit 1 at or above the scale:
  // -5 -> 3, 3 -> 0, 8 -> 1, -2 -> 2, 7 -> 1.
  compress::top_k_ef_options two = floats;
  two.two_bit = true;
  const auto p2 = cost::top_k_plan::of(10, 4, 0.5, true);
  const auto m2 = sent(g, two);
  REQUIRE(m2.size() == p2.bytes);
  REQUIRE(p2.code_offset == 12);
  REQUIRE(p2.index_offset == 14);
  CHECK(float_at(m2, 0) == 4.0f);
  CHECK(float_at(m2, 4) == 5.0f);
  CHECK(float_at(m2, 8) == 7.0f);
  const std::byte codes[] = {std::byte{3 | 0 << 2 | 1 << 4 | 2 << 6}, std::byte{1}};
  CHECK(std::memcmp(m2.data() + p2.code_offset, codes, 2) == 0);
  CHECK(std::memcmp(m2.data() + p2.index_offset, indices, 2) == 0);
}
