// compress::block_reduce_scatter (int8 and e3m0) and comm::all_to_all under it: each rank's part of the sum
// against a reference that codes every rank's parts on its own and sums them in rank order (random inputs,
// many seeds, n = 1..5, parts of 0, 1, odd and whole-block sizes, zeros and -0), conservation with the
// residual over rounds, the bytes the meter counts against a formula written out here, checkpoints, and
// the refusals, raised on every rank.
#include <commsgd/comm/all_to_all.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/block_reduce_scatter.hpp>

#include "compress_harness.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

using namespace commsgd;
using comm::local;
using comm::local_group;

namespace {

// What p's values decode to when cut into n parts, each coded in blocks of b counted from the part's start:
// the scale is the block's largest magnitude, each value the code's own encode and decode (their maths is
// checked against the definitions in compress_block_quant.cpp).
template <class Code>
std::vector<float> reference_decoded(const std::vector<float>& p, int n, std::size_t b) {
  std::vector<float> d(p.size());
  const std::size_t part = p.size() / static_cast<std::size_t>(n);
  for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j)
    for (std::size_t first = j * part; first < (j + 1) * part; first += b) {
      const std::size_t last = std::min((j + 1) * part, first + b);
      float s = 0.0f;
      for (std::size_t i = first; i < last; ++i)
        s = std::max(s, std::fabs(p[i]));
      for (std::size_t i = first; i < last; ++i)
        d[i] = Code::decode(compress::block_code<Code>(p[i], s), s);
    }
  return d;
}

// Bytes of a part's message, written out: a float scale per block, then `bits` per value, packed.
std::uint64_t part_message(std::size_t part, std::size_t b, unsigned bits) {
  return 4 * ((part + b - 1) / b) + (part * bits + 7) / 8;
}

template <class Code>
std::string matches_reference(int n, std::size_t part, std::size_t b, std::uint64_t seed, bool ef) {
  using X = compress::block_reduce_scatter<Code>;
  const std::size_t length = part * static_cast<std::size_t>(n);
  const int rounds = 3;
  std::vector<std::vector<std::vector<float>>> g(static_cast<std::size_t>(rounds));
  for (int t = 0; t < rounds; ++t)
    for (int r = 0; r < n; ++r)
      g[static_cast<std::size_t>(t)].push_back(harness::gradient(length, seed * 1000 + 10 * t + r));
  std::vector<std::vector<std::vector<float>>> outs(static_cast<std::size_t>(n));
  std::vector<std::vector<comm::traffic>> sent(static_cast<std::size_t>(n));
  std::vector<std::vector<std::uint64_t>> wire(static_cast<std::size_t>(n));
  local_group(n).run([&](local& raw) {
    comm::metered<local> c(raw);
    X x(length, {.block_size = b, .error_feedback = ef});
    const auto me = static_cast<std::size_t>(c.rank());
    for (int t = 0; t < rounds; ++t) {
      std::vector<float> out(part);
      c.reset();
      x.reduce_scatter(c, g[static_cast<std::size_t>(t)][me], out);
      auto tr = c.counters().total();
      tr.calls = 0;
      outs[me].push_back(out);
      sent[me].push_back(tr);
      wire[me].push_back(x.wire_bytes());
    }
  });
  // The reference: without error feedback every round's p is its gradient; with it, the first round's is.
  for (int t = 0; t < (ef ? 1 : rounds); ++t) {
    std::vector<std::vector<float>> dec;
    for (int r = 0; r < n; ++r)
      dec.push_back(
          reference_decoded<Code>(g[static_cast<std::size_t>(t)][static_cast<std::size_t>(r)], n, b));
    for (int j = 0; j < n; ++j) {
      std::vector<float> want(part, 0.0f);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < part; ++i)
          want[i] += dec[static_cast<std::size_t>(r)][static_cast<std::size_t>(j) * part + i];
      if (!harness::same_bits(outs[static_cast<std::size_t>(j)][static_cast<std::size_t>(t)], want))
        return "round " + std::to_string(t) + ": rank " + std::to_string(j) +
               "'s part differs from the reference";
    }
  }
  const std::uint64_t peers = static_cast<std::uint64_t>(n - 1);
  const std::uint64_t each = peers * (40 + part_message(part, b, Code::bits));
  for (int r = 0; r < n; ++r)
    for (int t = 0; t < rounds; ++t) {
      const auto& tr = sent[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
      if (tr.bytes_sent != each || tr.bytes_received != each || tr.messages_sent != 2 * peers)
        return "rank " + std::to_string(r) + " round " + std::to_string(t) + ": the meter counted " +
               std::to_string(tr.bytes_sent) + " bytes in " + std::to_string(tr.messages_sent) +
               " messages, expected " + std::to_string(each) + " in " + std::to_string(2 * peers);
      if (wire[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)] != each)
        return "rank " + std::to_string(r) + ": wire_bytes() " +
               std::to_string(wire[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)]) +
               " != " + std::to_string(each);
    }
  return {};
}

} // namespace

TEST_CASE("all_to_all: block j of every rank's send reaches rank j in rank order; the meter counts it") {
  for (int n = 1; n <= 5; ++n)
    for (std::size_t block : {0u, 1u, 7u}) {
      CAPTURE(n);
      CAPTURE(block);
      std::vector<std::string> bad(static_cast<std::size_t>(n));
      local_group(n).run([&](local& raw) {
        comm::metered<local> c(raw);
        const auto me = static_cast<std::uint32_t>(c.rank());
        std::vector<std::uint32_t> send(block * static_cast<std::size_t>(n)), recv(send.size(), 0xdead);
        for (std::size_t j = 0; j < send.size(); ++j) // from me, to rank j / block, element j % block
          send[j] = me * 1000000u + static_cast<std::uint32_t>(j);
        comm::all_to_all(c, std::span<const std::uint32_t>(send), std::span<std::uint32_t>(recv), 700);
        for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r)
          for (std::size_t e = 0; e < block; ++e)
            if (recv[r * block + e] != static_cast<std::uint32_t>(r) * 1000000u + me * block + e)
              bad[me] = "element " + std::to_string(e) + " from rank " + std::to_string(r) + " is wrong";
        const auto t = c.counters().total();
        const std::uint64_t peers = static_cast<std::uint64_t>(n - 1);
        if (t.bytes_sent != peers * block * 4 || t.bytes_received != peers * block * 4)
          bad[me] += " / the meter counted " + std::to_string(t.bytes_sent) + " bytes";
      });
      for (const auto& b : bad)
        CHECK_MESSAGE(b.empty(), b);
    }
  local_group(2).run([](local& c) {
    std::vector<float> a(3), b(3), odd(4);
    CHECK_THROWS_WITH_AS(comm::all_to_all(c, std::span<const float>(a), std::span<float>(b), 700),
                         doctest::Contains("argument 'send' holds 3 elements"), invalid_argument);
    CHECK_THROWS_WITH_AS(comm::all_to_all(c, std::span<const float>(odd), std::span<float>(b), 700),
                         doctest::Contains("argument 'recv' holds 3 elements"), invalid_argument);
  });
}

TEST_CASE("each rank's part is the reference's: every rank's parts coded alone, summed in rank order") {
  for (int n = 1; n <= 5; ++n)
    for (std::size_t part : {0u, 1u, 3u, 64u, 301u})
      for (std::size_t b : {1u, 7u, 64u, 256u})
        for (std::uint64_t seed = 1; seed <= 3; ++seed)
          for (bool ef : {true, false}) {
            CAPTURE(n);
            CAPTURE(part);
            CAPTURE(b);
            CAPTURE(seed);
            CAPTURE(ef);
            const auto a = matches_reference<compress::int8_code>(n, part, b, seed, ef);
            CHECK_MESSAGE(a.empty(), "int8: " << a);
            const auto e = matches_reference<compress::e3m0_code>(n, part, b, seed, ef);
            CHECK_MESSAGE(e.empty(), "e3m0: " << e);
          }
}

TEST_CASE("sent + new residual == residual + input, exactly, on every rank and every round") {
  for (int n : {1, 3, 4})
    for (std::size_t b : {1u, 5u, 256u}) {
      CAPTURE(n);
      CAPTURE(b);
      const std::size_t part = 37, length = part * static_cast<std::size_t>(n);
      std::vector<std::string> bad(static_cast<std::size_t>(n));
      local_group(n).run([&](local& c) {
        compress::e3m0_reduce_scatter x(length, {.block_size = b});
        const auto me = static_cast<std::size_t>(c.rank());
        for (int t = 0; t < 6; ++t) {
          auto g = harness::gradient(length, 77 + 10 * static_cast<std::uint64_t>(t) + me);
          std::vector<float> p(length), out(part);
          for (std::size_t i = 0; i < length; ++i) { // as error_feedback adds: (g + e) + r
            const float s = g[i] + x.residual()[i];
            p[i] = x.residual_low()[i] == 0.0f ? s : s + x.residual_low()[i];
          }
          x.reduce_scatter(c, g, out);
          const auto d = reference_decoded<compress::e3m0_code>(p, n, b);
          for (std::size_t i = 0; i < length; ++i) {
            const double total = static_cast<double>(d[i]) + (static_cast<double>(x.residual()[i]) +
                                                              static_cast<double>(x.residual_low()[i]));
            if (total != static_cast<double>(p[i]) && bad[me].empty())
              bad[me] = "round " + std::to_string(t) + " index " + std::to_string(i) + ": sent + residual " +
                        std::to_string(total) + " != " + std::to_string(p[i]);
            // The split's bits, as error_feedback::commit makes them: fl(p - d) and its rounding error, which
            // is +0 for these codes (a code's value is zero or within a factor of two of p).
            const float want_e = p[i] - d[i];
            if ((std::bit_cast<std::uint32_t>(x.residual()[i]) != std::bit_cast<std::uint32_t>(want_e) ||
                 std::bit_cast<std::uint32_t>(x.residual_low()[i]) != 0u) &&
                bad[me].empty())
              bad[me] = "round " + std::to_string(t) + " index " + std::to_string(i) + ": residual " +
                        std::to_string(x.residual()[i]) + " (low " + std::to_string(x.residual_low()[i]) +
                        ") != p - d " + std::to_string(want_e);
          }
        }
      });
      for (const auto& s : bad)
        CHECK_MESSAGE(s.empty(), s);
    }
}

TEST_CASE("a checkpoint round-trips the residual: a resumed reduce-scatter goes on bit for bit") {
  const int n = 3;
  const std::size_t length = 3 * 50;
  std::vector<std::string> bad(n);
  local_group(n).run([&](local& c) {
    const auto me = static_cast<std::size_t>(c.rank());
    compress::int8_reduce_scatter x(length, {.block_size = 16});
    std::vector<float> out(50), again(50);
    for (int t = 0; t < 2; ++t)
      x.reduce_scatter(c, harness::gradient(length, 5 + t * 10 + me), out);
    std::stringstream saved;
    x.save(saved);
    compress::int8_reduce_scatter y(length, {.block_size = 16});
    y.load(saved);
    if (!harness::same_bits(x.residual(), y.residual())) bad[me] = "the residual did not round-trip";
    for (int t = 2; t < 4; ++t) {
      const auto g = harness::gradient(length, 5 + t * 10 + me);
      x.reduce_scatter(c, g, out);
      y.reduce_scatter(c, g, again);
      if (!harness::same_bits(out, again))
        bad[me] += " / the resumed round " + std::to_string(t) + " differs";
    }
    if (y.steps() != 4) bad[me] += " / steps " + std::to_string(y.steps());
    std::stringstream other;
    x.save(other);
    compress::int8_reduce_scatter z(length, {.block_size = 17});
    try {
      z.load(other);
      bad[me] += " / a state of another block size was taken";
    } catch (const corrupt_data&) {
    }
  });
  for (const auto& s : bad)
    CHECK_MESSAGE(s.empty(), s);
}

TEST_CASE("bad input and ranks built differently raise on every rank, naming what is wrong") {
  using X = compress::int8_reduce_scatter;
  CHECK_THROWS_WITH_AS(X(8, {.block_size = 0}),
                       doctest::Contains("'block_size' = 0 is outside the allowed range"), invalid_argument);
  const int n = 3;
  // A NaN on rank 1: its verdict is gathered before any payload moves.
  harness::every_names(harness::raised(
                           n, [](int) { return X(9); },
                           [](X& x, local& c) {
                             std::vector<float> g(9, 1.0f), out(3);
                             if (c.rank() == 1) g[4] = std::numeric_limits<float>::quiet_NaN();
                             x.reduce_scatter(c, g, out);
                           }),
                       "gradient (plus its residual)");
  // Rank 2's output of the wrong size, rank 0's gradient of the wrong size.
  harness::every_names(harness::raised(
                           n, [](int) { return X(9); },
                           [](X& x, local& c) {
                             std::vector<float> g(9, 1.0f), out(c.rank() == 2 ? 4 : 3);
                             x.reduce_scatter(c, g, out);
                           }),
                       "argument 'out' has 4 elements, the allowed size is the length over the ranks, 3");
  harness::every_names(harness::raised(
                           n, [](int) { return X(9); },
                           [](X& x, local& c) {
                             std::vector<float> g(c.rank() == 0 ? 8 : 9, 1.0f), out(3);
                             x.reduce_scatter(c, g, out);
                           }),
                       "argument 'gradient' has 8 elements");
  // Another block size on rank 1, another length on rank 2, a length that does not divide into the ranks.
  harness::every_names(harness::raised(
                           n, [](int r) { return X(9, {.block_size = r == 1 ? 4u : 256u}); },
                           [](X& x, local& c) {
                             std::vector<float> g(9, 1.0f), out(3);
                             x.reduce_scatter(c, g, out);
                           }),
                       "ranks disagree on the compressor's parameters");
  harness::every_names(harness::raised(
                           n, [](int r) { return X(r == 2 ? 12 : 9); },
                           [](X& x, local& c) {
                             std::vector<float> g(x.length(), 1.0f), out(x.length() / 3);
                             x.reduce_scatter(c, g, out);
                           }),
                       "ranks disagree on the compressor's 'length'");
  harness::every_names(harness::raised(
                           n, [](int) { return X(10); },
                           [](X& x, local& c) {
                             std::vector<float> g(10, 1.0f), out(3);
                             x.reduce_scatter(c, g, out);
                           }),
                       "does not divide into the 3 ranks");
}
