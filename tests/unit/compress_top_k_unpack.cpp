// The top-k codes' chunk decode (compress/top_k_unpack.hpp): the vector path against the portable one and both
// against fields packed here, on random streams of every width from 1 to 32 (the vector path takes 1 to 25),
// chunks starting at every bit of a byte, lengths around the groups of 8, streams that end right after the
// chunk; every way a chunk's indices can fail their test, placed on every field; the 2-bit values' lookup, the
// floats' bits kept (-0, NaN, inf, subnormals).
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/top_k_unpack.hpp>
#include <commsgd/cpu.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

using namespace commsgd;
using compress::detail::unpack_rising;
using compress::detail::unpack_tables;

namespace {

// `fields` packed after `lead` fields of random bits, `slack` random bytes after them.
std::vector<std::byte> stream(const std::vector<std::uint32_t>& fields, std::size_t lead, unsigned width,
                              std::size_t slack, std::mt19937& rng) {
  const std::uint32_t mask = width == 32 ? ~0u : (1u << width) - 1u;
  std::vector<std::uint32_t> all(lead + fields.size());
  for (std::size_t i = 0; i < lead; ++i)
    all[i] = static_cast<std::uint32_t>(rng()) & mask;
  std::copy(fields.begin(), fields.end(), all.begin() + static_cast<std::ptrdiff_t>(lead));
  std::vector<std::byte> s(compress::detail::packed_bytes(all.size(), width) + slack);
  for (std::size_t b = s.size() - slack; b < s.size(); ++b)
    s[b] = static_cast<std::byte>(rng());
  compress::detail::pack_bits(std::span(s).first(s.size() - slack), all.size(), width,
                              [&](std::size_t i) { return all[i]; });
  return s;
}

// kj rising fields below len (len >= kj).
std::vector<std::uint32_t> rising(std::size_t kj, std::uint32_t len, std::mt19937& rng) {
  std::vector<std::uint32_t> all(len);
  for (std::uint32_t i = 0; i < len; ++i)
    all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(kj);
  std::sort(all.begin(), all.end());
  return all;
}

struct decoded {
  bool ok;
  std::vector<std::uint32_t> at;
};

decoded run(std::span<const std::byte> s, std::size_t q, std::size_t kj, unsigned width, std::uint32_t first,
            std::uint32_t len, bool vector) {
  const unpack_tables t(width);
  decoded d{false, std::vector<std::uint32_t>(kj + 1, 0xdeadbeefu)};
  d.ok = unpack_rising(s, q, kj, t, first, len, d.at.data(), vector);
  return d;
}

// What both paths must give: at = first + field, ok when the fields rise and stay below len.
void check_both(const std::vector<std::uint32_t>& fields, std::size_t lead, unsigned width, std::size_t slack,
                std::uint32_t first, std::uint32_t len, std::mt19937& rng) {
  const auto s = stream(fields, lead, width, slack, rng);
  bool ok = true;
  for (std::size_t i = 0; i < fields.size(); ++i)
    ok = ok && fields[i] < len && (i == 0 || fields[i] > fields[i - 1]);
  for (bool vector : {false, true}) {
    CAPTURE(vector);
    const decoded d = run(s, lead, fields.size(), width, first, len, vector);
    CHECK(d.ok == ok);
    bool same = true;
    for (std::size_t i = 0; i < fields.size(); ++i)
      same = same && d.at[i] == first + fields[i];
    CHECK(same);
    CHECK(d.at[fields.size()] == 0xdeadbeefu); // nothing written past the chunk
  }
}

} // namespace

TEST_CASE("a chunk's indices: both paths give the packed fields, at every width, offset and length") {
  if (!cpu().avx2) MESSAGE("no AVX2 on this CPU: the vector path is the portable one here");
  std::mt19937 rng(7);
  for (unsigned width = 1; width <= 32; ++width) {
    CAPTURE(width);
    const std::uint64_t room = width == 32 ? (std::uint64_t{1} << 32) : (std::uint64_t{1} << width);
    for (std::size_t lead : {0u, 1u, 2u, 3u, 5u, 7u, 8u, 13u, 64u}) {
      CAPTURE(lead);
      for (std::size_t kj : {0u, 1u, 7u, 8u, 9u, 15u, 16u, 17u, 24u, 41u, 123u}) {
        CAPTURE(kj);
        if (kj > room) continue;
        const auto len = static_cast<std::uint32_t>(std::min<std::uint64_t>(room, 4096));
        if (kj > len) continue;
        const auto first = static_cast<std::uint32_t>(rng() % 1000000);
        for (std::size_t slack : {0u, 1u, 40u}) {
          CAPTURE(slack);
          check_both(rising(kj, len, rng), lead, width, slack, first, len, rng);
          // Arbitrary fields: mostly refused, at any width.
          std::vector<std::uint32_t> any(kj);
          const std::uint32_t mask = width == 32 ? ~0u : (1u << width) - 1u;
          for (auto& f : any)
            f = static_cast<std::uint32_t>(rng()) & mask;
          check_both(any, lead, width, slack, first, len, rng);
        }
      }
    }
  }
}

TEST_CASE("a chunk's indices: an index out of range or out of order is found on every field") {
  std::mt19937 rng(11);
  for (unsigned width : {4u, 9u, 12u, 17u, 25u}) {
    CAPTURE(width);
    const auto len =
        static_cast<std::uint32_t>(std::min<std::uint64_t>((std::uint64_t{1} << width) - 3, 5000));
    for (std::size_t lead : {0u, 3u, 8u}) {
      const std::size_t kj = std::min<std::size_t>(len, 43);
      const auto good = rising(kj, len, rng);
      check_both(good, lead, width, 0, 100, len, rng);
      for (std::size_t p = 0; p < kj; ++p) {
        CAPTURE(p);
        auto bad = good;
        bad[p] =
            len + static_cast<std::uint32_t>(rng() % 3); // past the chunk (within the width where it fits)
        if (bad[p] >= (std::uint64_t{1} << width)) bad[p] = len;
        if (bad[p] < (std::uint64_t{1} << width)) check_both(bad, lead, width, 0, 100, len, rng);
        if (p > 0) {
          bad = good;
          bad[p] = bad[p - 1]; // repeated
          check_both(bad, lead, width, 0, 100, len, rng);
          bad = good;
          std::swap(bad[p], bad[p - 1]); // falling
          check_both(bad, lead, width, 0, 100, len, rng);
        }
      }
    }
  }
  // The largest index of a full chunk passes; one past it does not.
  for (unsigned width : {4u, 12u}) {
    const auto len = static_cast<std::uint32_t>(1u << width);
    std::vector<std::uint32_t> top(9);
    for (std::size_t i = 0; i < 9; ++i)
      top[i] = len - 9 + static_cast<std::uint32_t>(i);
    check_both(top, 0, width, 0, 0, len, rng);
    check_both(top, 0, width, 0, 0, len - 1, rng);
  }
}

TEST_CASE("2-bit values: both paths look up every code, the table's bits kept") {
  std::mt19937 rng(5);
  const float inf = std::numeric_limits<float>::infinity();
  const float tables[][4] = {{0.25f, 0.75f, -0.25f, -0.75f},
                             {0.0f, 0.0f, -0.0f, -0.0f},
                             {std::nanf("0x12345"), inf, -inf, -std::nanf("7")},
                             {std::numeric_limits<float>::denorm_min(), 3e-39f, -1e-45f, -3e38f}};
  for (const auto& t : tables)
    for (std::size_t q : {0u, 1u, 2u, 3u, 4u, 9u, 30u})
      for (std::size_t kj : {0u, 1u, 7u, 8u, 9u, 16u, 17u, 41u, 123u})
        for (std::size_t slack : {0u, 1u, 5u}) {
          CAPTURE(q);
          CAPTURE(kj);
          CAPTURE(slack);
          std::vector<std::byte> codes((2 * (q + kj) + 7) / 8 + slack);
          for (auto& b : codes)
            b = static_cast<std::byte>(rng());
          for (bool vector : {false, true}) {
            std::vector<float> val(kj + 1, 12345.0f);
            compress::detail::two_bit_values(codes, q, kj, t, val.data(), vector);
            bool same = true;
            for (std::size_t i = 0; i < kj; ++i) {
              const unsigned c = (std::to_integer<unsigned>(codes[(q + i) / 4]) >> (2 * ((q + i) % 4))) & 3u;
              same = same && std::bit_cast<std::uint32_t>(val[i]) == std::bit_cast<std::uint32_t>(t[c]);
            }
            CHECK(same);
            CHECK(val[kj] == 12345.0f);
          }
        }
}
