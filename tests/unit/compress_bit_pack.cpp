// compress::detail::pack_bits and unpack_bits against a stream written and read one bit at a time (the
// format bit_pack.hpp defines: field i at bits [i w, (i + 1) w), bit j of the stream bit j % 8 of byte j / 8,
// the last byte's unused bits zero): every width 1 to 32, counts around the 32-bit words the packer flushes,
// random fields with their top bits set often, and unpacking from any field onward.
#include <commsgd/compress/bit_pack.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

using namespace commsgd;

namespace {

std::vector<std::byte> pack_reference(const std::vector<std::uint32_t>& fields, unsigned width) {
  std::vector<std::byte> out(compress::detail::packed_bytes(fields.size(), width), std::byte{0});
  std::size_t bit = 0;
  for (const std::uint32_t f : fields)
    for (unsigned j = 0; j < width; ++j, ++bit)
      if ((f >> j) & 1u) out[bit / 8] |= static_cast<std::byte>(1u << (bit % 8));
  return out;
}

} // namespace

TEST_CASE("pack_bits writes the bit stream a bit at a time would, and unpack_bits reads it back") {
  std::mt19937 rng(20261201);
  for (unsigned width = 1; width <= 32; ++width) {
    const std::uint64_t mask = (std::uint64_t{1} << width) - 1;
    for (const std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}, std::size_t{8},
          std::size_t{31}, std::size_t{32}, std::size_t{33}, std::size_t{257}, std::size_t{4099}}) {
      CAPTURE(width);
      CAPTURE(count);
      std::vector<std::uint32_t> fields(count);
      for (auto& f : fields) {
        const unsigned kind = rng() % 4; // all ones, zero, or random with or without the top bit
        f = static_cast<std::uint32_t>(kind == 0   ? mask
                                       : kind == 1 ? 0
                                                   : (rng() & mask) | (kind == 2 ? (mask >> 1) + 1 : 0));
      }
      const auto want = pack_reference(fields, width);
      // Written over a buffer of ones, so a byte the packer should write and skips shows.
      std::vector<std::byte> got(want.size() + 8, std::byte{0xff});
      compress::detail::pack_bits(std::span<std::byte>(got).first(want.size()), count, width,
                                  [&](std::size_t i) { return fields[i]; });
      for (std::size_t j = 0; j < want.size(); ++j) {
        CAPTURE(j);
        REQUIRE(got[j] == want[j]);
      }
      for (std::size_t j = want.size(); j < got.size(); ++j)
        REQUIRE(got[j] == std::byte{0xff}); // nothing past the message
      const auto in = std::span<const std::byte>(want);
      for (int trial = 0; trial < 4 && count > 0; ++trial) {
        const std::size_t first = trial == 0 ? 0 : rng() % count;
        const std::size_t m = trial == 0 ? count : rng() % (count - first + 1);
        std::size_t next = first, wrong = 0;
        compress::detail::unpack_bits(in, first, m, width, [&](std::size_t i, std::uint32_t v) {
          wrong += (i != next || v != fields[i]) ? 1 : 0;
          ++next;
        });
        CHECK(wrong == 0);
        CHECK(next == first + m);
      }
    }
  }
}
