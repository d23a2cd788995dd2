// The int8 and e3m0 passes (compress/block_quant.hpp's detail::encode_blocks, sum_blocks, decode_message)
// against the per-value formulas they replaced, kept below as they were: the same message bytes, the same
// sums and decodes bit for bit, and the same NaN / inf count and first index, on random blocks of many
// seeds, lengths and block sizes, and on the values where a float shortcut could slip: rounding ties,
// thresholds and their neighbours, +0 and -0, subnormal values and scales, the largest floats.
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/block_quant.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/validate.hpp>

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
#include <sstream>
#include <string>
#include <vector>

using namespace commsgd;

namespace {

// The passes as they were before they were fused: the block maxima, then every value's code through the bit
// packer; each message decoded value by value, summed in rank order from +0.
template <class Code>
std::vector<std::byte> reference_message(const std::vector<float>& p, std::size_t b) {
  const std::size_t d = p.size(), blocks = (d + b - 1) / b;
  std::vector<std::byte> msg(static_cast<std::size_t>(cost::block_quant_message_bytes(d, b, Code::bits)));
  std::vector<float> scales(blocks, 0.0f);
  for (std::size_t k = 0; k < blocks; ++k) {
    float s = 0.0f;
    for (std::size_t i = k * b; i < std::min(d, (k + 1) * b); ++i)
      s = std::max(s, std::fabs(p[i]));
    scales[k] = s;
    std::memcpy(msg.data() + 4 * k, &s, 4);
  }
  compress::detail::pack_bits(std::span<std::byte>(msg).subspan(4 * blocks), d, Code::bits,
                              [&](std::size_t i) { return compress::block_code<Code>(p[i], scales[i / b]); });
  return msg;
}

template <class Code>
std::vector<float> reference_decode(std::span<const std::byte> m, std::size_t d, std::size_t b) {
  const std::size_t blocks = (d + b - 1) / b;
  std::vector<float> out(d);
  for (std::size_t k = 0; k < blocks; ++k) {
    float s;
    std::memcpy(&s, m.data() + 4 * k, 4);
    const std::size_t first = k * b, count = std::min(d, first + b) - first;
    compress::detail::unpack_bits(m.subspan(4 * blocks), first, count, Code::bits,
                                  [&](std::size_t i, std::uint32_t code) { out[i] = Code::decode(code, s); });
  }
  return out;
}

template <class Code>
std::vector<float> reference_sum(const std::vector<std::vector<std::byte>>& msgs, std::size_t d,
                                 std::size_t b) {
  std::vector<float> out(d, 0.0f);
  for (const auto& m : msgs) {
    const auto x = reference_decode<Code>(m, d, b);
    for (std::size_t i = 0; i < d; ++i)
      out[i] += x[i];
  }
  return out;
}

// The first index where two float arrays differ in their bits, or -1.
long first_difference(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return static_cast<long>(i);
  return -1;
}

long first_difference(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<long>(i);
  return -1;
}

// Values of many kinds, a kind per block so that blocks of one kind meet their own scale: gradient-like
// normals, values across 60 binades, rounding ties and threshold neighbours of the block's scale, zeros of
// both signs, subnormals, the largest floats.
std::vector<float> mixed(std::mt19937& rng, std::size_t d, std::size_t b) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> kind_of(0, 8), binade(-30, 30), code(-127, 127);
  std::vector<float> p(d);
  for (std::size_t k0 = 0; k0 < d; k0 += b) {
    const int kind = kind_of(rng);
    // A scale of the block's own: its largest |p| is s unless a value of the kind lands above it.
    const float s = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, binade(rng));
    for (std::size_t i = k0; i < std::min(d, k0 + b); ++i) {
      float v = 0.0f;
      switch (kind) {
      case 0:
        v = normal(rng) * s;
        break;
      case 1:
        v = normal(rng) * std::ldexp(1.0f, binade(rng));
        break;
      case 2: {
        // int8 ties: 127 v / S = c + 1/2 exactly where S = 127 2^j and v = (c + 1/2) 2^j.
        const int j = binade(rng);
        v = i == k0 ? 127.0f * std::ldexp(1.0f, j)
                    : (static_cast<float>(code(rng)) + 0.5f) * std::ldexp(1.0f, j);
        break;
      }
      case 3: {
        // e3m0 thresholds 2^-7 S and 1.5 2^i S, exact or their float neighbours.
        const float S = std::ldexp(1.0f, binade(rng)) * (rng() % 2 ? 1.0f : 1.37f);
        if (i == k0) {
          v = S;
          break;
        }
        const int t = static_cast<int>(rng() % 7);
        v = t == 0 ? std::ldexp(S, -7) : 1.5f * std::ldexp(S, t - 7);
        const int step = static_cast<int>(rng() % 5) - 2;
        for (int u = 0; u < std::abs(step); ++u)
          v = std::nextafter(v, step < 0 ? 0.0f : S);
        break;
      }
      case 4:
        v = rng() % 2 ? 0.0f : -0.0f;
        break;
      case 5:
        v = std::numeric_limits<float>::denorm_min() * static_cast<float>(rng() % 4000);
        break;
      case 6:
        v = normal(rng) * std::ldexp(1.0f, -130 + static_cast<int>(rng() % 20));
        break;
      case 7:
        v = std::numeric_limits<float>::max() * (static_cast<float>(rng() % 1000) / 1000.0f);
        break;
      default:
        v = normal(rng) * (rng() % 3 == 0 ? 0.0f : s);
        break;
      }
      p[i] = rng() % 2 ? -v : v;
    }
  }
  return p;
}

const std::size_t lengths[] = {0,   1,   2,   3,   15,  16,   17,   31,   255,
                               256, 257, 511, 512, 513, 4095, 4096, 4097, 12289};
const std::size_t block_sizes[] = {1, 2, 3, 7, 8, 16, 17, 32, 40, 64, 255, 256, 257, 4096, 4097, 5000};

// Both ways through the passes: the portable loops, and the AVX2 kernels where this CPU has them
// (compress/block_quant_x86.hpp; elsewhere both are the portable loops).
const compress::half_path paths[] = {compress::half_path::best, compress::half_path::scalar};

// Encodes p with the passes and the reference, compares the messages and what each decodes to.
template <class Code>
void same_message(const std::vector<float>& p, std::size_t b) {
  const auto want = reference_message<Code>(p, b);
  const auto want_decoded = reference_decode<Code>(want, p.size(), b);
  for (const auto path : paths) {
    CAPTURE(static_cast<int>(path));
    std::vector<std::byte> got(want.size(), std::byte{0x5a});
    std::vector<float> scales;
    const auto bad = compress::detail::encode_blocks<Code>(p, b, scales, got, path);
    REQUIRE(bad.count == 0);
    REQUIRE(first_difference(got, want) == -1);
    std::vector<float> mine(p.size(), 1.0f);
    compress::detail::decode_message<Code>(want, p.size(), b, mine, path);
    REQUIRE(first_difference(mine, want_decoded) == -1);
  }
}

template <class Code>
void same_codes_on_random_blocks() {
  for (int seed = 0; seed < 12; ++seed)
    for (std::size_t d : lengths)
      for (std::size_t b : block_sizes) {
        CAPTURE(seed);
        CAPTURE(d);
        CAPTURE(b);
        std::mt19937 rng(static_cast<unsigned>(seed * 7919 + static_cast<int>(d * 31 + b)));
        same_message<Code>(mixed(rng, d, b), b);
      }
}

template <class Code>
void same_sums() {
  int overflowed = 0;
  for (int seed = 0; seed < 6; ++seed)
    for (std::size_t d : lengths)
      for (std::size_t b : {std::size_t{1}, std::size_t{3}, std::size_t{16}, std::size_t{32}, std::size_t{44},
                            std::size_t{256}, std::size_t{257}})
        for (std::size_t n : {1, 2, 4, 5}) {
          CAPTURE(seed);
          CAPTURE(d);
          CAPTURE(b);
          CAPTURE(n);
          std::mt19937 rng(static_cast<unsigned>(seed * 104729 + static_cast<int>(d * 17 + b * 3 + n)));
          std::vector<std::vector<std::byte>> msgs;
          std::vector<std::byte> all;
          for (std::size_t r = 0; r < n; ++r) {
            msgs.push_back(reference_message<Code>(mixed(rng, d, b), b));
            all.insert(all.end(), msgs.back().begin(), msgs.back().end());
          }
          const std::size_t bytes = msgs[0].size(), blocks = (d + b - 1) / b;
          const auto want = reference_sum<Code>(msgs, d, b);
          // Values near the largest float overflow some sums: counted as find_non_finite counts them.
          const auto bad = select::find_non_finite(want);
          overflowed += bad.count > 0 ? 1 : 0;
          for (const auto path : paths) {
            CAPTURE(static_cast<int>(path));
            std::vector<float> got(d, 1.0f);
            const auto scan = compress::detail::sum_blocks<Code>(all, bytes, n, d, b, 0, blocks, got, path);
            REQUIRE(first_difference(got, want) == -1);
            REQUIRE(scan.count == bad.count);
            REQUIRE(scan.first == bad.first);
            // Blocks [k0, k1) alone: the same values there, the count of that range, the index from out's start.
            if (blocks > 2) {
              const std::size_t k0 = 1, k1 = blocks - 1, lo = k0 * b, hi = std::min(d, k1 * b);
              std::vector<float> part(d, 1.0f);
              const auto some = compress::detail::sum_blocks<Code>(all, bytes, n, d, b, k0, k1, part, path);
              REQUIRE(first_difference(std::span<const float>(part).subspan(lo, hi - lo),
                                       std::span<const float>(want).subspan(lo, hi - lo)) == -1);
              const auto in = select::find_non_finite(std::span<const float>(want).subspan(lo, hi - lo));
              REQUIRE(some.count == in.count);
              REQUIRE(some.first == lo + in.first);
            }
          }
        }
  CHECK(overflowed > 0); // the count was tested on sums that hold infinities too
}

} // namespace

TEST_CASE("int8: the one-pass encoding gives the reference's message, ties and edges included") {
  same_codes_on_random_blocks<compress::int8_code>();
}

TEST_CASE("e3m0: the one-pass encoding gives the reference's message, thresholds and edges included") {
  same_codes_on_random_blocks<compress::e3m0_code>();
}

TEST_CASE("int8 and e3m0: the sums block by block equal the reference's, bit for bit") {
  same_sums<compress::int8_code>();
  same_sums<compress::e3m0_code>();
}

TEST_CASE("int8: every code decodes as the double formula does, over scales of every binade") {
  // decode_block forms code * (s / 127) in double, or (where the scale allows, with AVX2 and FMA) in floats
  // split from it; the formula, code * s / 127. Every code (255, which no encoder writes, too), against
  // scales drawn over the whole float range (random bit patterns, either sign), subnormal ones included, the
  // extremes, and scales at both ends of the split decode's range.
  std::mt19937 rng(60);
  std::vector<float> scales{std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::max(),
                            1.0f,
                            127.0f,
                            1.27f,
                            -1.0f,
                            -0.0f,
                            0.0f};
  for (float edge : {0x1p-60f, 0x1p120f})
    for (int u = -3; u <= 3; ++u)
      for (float sign : {1.0f, -1.0f})
        scales.push_back(
            sign * std::bit_cast<float>(std::bit_cast<std::uint32_t>(edge) + static_cast<std::uint32_t>(u)));
  for (int i = 0; i < 40000; ++i) {
    const float s = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    if (std::isfinite(s)) scales.push_back(s);
  }
  // One block of 256 values: code c at index c.
  std::vector<std::byte> msg(4 + 256);
  for (std::uint32_t c = 0; c < 256; ++c)
    msg[4 + c] = static_cast<std::byte>(c);
  std::vector<float> got(256);
  std::size_t wrong = 0;
  for (const auto path : paths)
    for (float s : scales) {
      std::memcpy(msg.data(), &s, 4);
      compress::detail::decode_message<compress::int8_code>(msg, 256, 256, got, path);
      for (std::uint32_t c = 0; c < 256; ++c) {
        const float want = compress::int8_code::decode(c, s);
        if (std::bit_cast<std::uint32_t>(got[c]) != std::bit_cast<std::uint32_t>(want) && wrong++ == 0)
          FAIL_CHECK("path " << static_cast<int>(path) << ", scale " << s << ", code " << c << ": " << got[c]
                             << ", the formula " << want);
      }
    }
  CHECK(wrong == 0);
}

#if COMMSGD_HALF_X86
TEST_CASE("int8: the split decode puts what the double decode puts, in every mode") {
  // int8_put_split_avx2 against int8_put_avx2 directly: every code, 200,000 scales log-uniform over the
  // split's range with random significands and signs, written, started from +0 and added to values already
  // there (+-0 among them).
  if (!compress::detail::block_vector_path(compress::half_path::best) || !cpu().fma) {
    MESSAGE("this CPU has no AVX2 and FMA: the split decode is not taken here, and not tested");
    return;
  }
  namespace d = compress::detail;
  std::mt19937 rng(61);
  std::vector<std::byte> codes(256);
  for (std::uint32_t c = 0; c < 256; ++c)
    codes[c] = static_cast<std::byte>(c);
  std::vector<float> base(256), a(256), b(256);
  std::size_t wrong = 0, checked = 0;
  for (int i = 0; i < 200000 && wrong == 0; ++i) {
    const int e = static_cast<int>(rng() % 180) - 60;
    const float s =
        std::ldexp(1.0f + static_cast<float>(rng() & 0x7fffffu) * 0x1p-23f, e) * (rng() % 2 ? 1.0f : -1.0f);
    if (!d::int8_split_fits(s)) continue;
    const double v = static_cast<double>(s) / 127.0;
    for (std::size_t j = 0; j < 256; ++j)
      base[j] = j % 7 == 0 ? (j % 2 ? -0.0f : 0.0f)
                           : static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * std::fabs(s) / 64.0f;
    const auto same = [&] {
      for (std::size_t j = 0; j < 256; ++j)
        if (std::bit_cast<std::uint32_t>(a[j]) != std::bit_cast<std::uint32_t>(b[j]) && wrong++ == 0)
          FAIL_CHECK("scale " << s << ", code " << j << ": split " << a[j] << ", double " << b[j]);
      checked += 256;
    };
    CHECK(d::int8_put_split_avx2<d::put_mode::assign>(codes.data(), 256, s, a.data()) == 256);
    d::int8_put_avx2<d::put_mode::assign>(codes.data(), 256, v, b.data());
    same();
    d::int8_put_split_avx2<d::put_mode::first>(codes.data(), 256, s, a.data());
    d::int8_put_avx2<d::put_mode::first>(codes.data(), 256, v, b.data());
    same();
    a = base;
    b = base;
    d::int8_put_split_avx2<d::put_mode::add>(codes.data(), 256, s, a.data());
    d::int8_put_avx2<d::put_mode::add>(codes.data(), 256, v, b.data());
    same();
  }
  MESSAGE(checked << " values checked");
  CHECK(wrong == 0);
  CHECK(checked > 100000000);
}
#endif

TEST_CASE(
    "int8 and e3m0: messages of any bytes decode and sum alike both ways, as the per-value formulas do") {
  // A peer's message need not come from our encoder: every code byte (int8's 255, which no encoder writes,
  // included) and scales of any sign and binade, subnormal, zero, the largest, inf. The sums both ways
  // against the per-value reference, bit for bit; a NaN sum against a NaN (two NaN operands may meet in
  // either order, and the result keeps the first one's payload).
  const auto same = [](float a, float b) {
    return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) ||
           (std::isnan(a) && std::isnan(b));
  };
  const auto run = [&]<class Code>(Code) {
    for (int seed = 0; seed < 40; ++seed) {
      std::mt19937 rng(static_cast<unsigned>(seed + 1000 * Code::bits));
      const std::size_t d = 1 + rng() % 3000, b = std::size_t{1} << (rng() % 10), n = 1 + rng() % 6;
      CAPTURE(seed);
      CAPTURE(d);
      CAPTURE(b);
      CAPTURE(n);
      const std::size_t blocks = (d + b - 1) / b,
                        bytes = static_cast<std::size_t>(cost::block_quant_message_bytes(d, b, Code::bits));
      std::vector<std::vector<std::byte>> msgs(n, std::vector<std::byte>(bytes));
      std::vector<std::byte> all;
      for (auto& m : msgs) {
        for (auto& x : m)
          x = static_cast<std::byte>(rng());
        for (std::size_t k = 0; k < blocks; ++k) {
          const std::uint32_t pick = rng() % 8;
          const float s = pick == 0 ? 0.0f
                          : pick == 1
                              ? std::numeric_limits<float>::denorm_min() * static_cast<float>(rng() % 9)
                          : pick == 2 ? std::numeric_limits<float>::max()
                          : pick == 3 ? std::numeric_limits<float>::infinity()
                          : pick == 4 ? -std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30)
                                      : std::bit_cast<float>(static_cast<std::uint32_t>(rng()) & 0x7f7fffffu);
          std::memcpy(m.data() + 4 * k, &s, 4);
        }
        all.insert(all.end(), m.begin(), m.end());
      }
      const auto want = reference_sum<Code>(msgs, d, b);
      for (const auto path : paths) {
        CAPTURE(static_cast<int>(path));
        std::vector<float> got(d, 1.0f);
        compress::detail::sum_blocks<Code>(all, bytes, n, d, b, 0, blocks, got, path);
        for (std::size_t i = 0; i < d; ++i) {
          CAPTURE(i);
          CAPTURE(got[i]);
          CAPTURE(want[i]);
          REQUIRE(same(got[i], want[i]));
        }
        std::vector<float> one(d, 1.0f);
        compress::detail::decode_message<Code>(msgs[0], d, b, one, path);
        const auto one_want = reference_decode<Code>(msgs[0], d, b);
        for (std::size_t i = 0; i < d; ++i) {
          CAPTURE(i);
          REQUIRE(same(one[i], one_want[i]));
        }
      }
    }
  };
  run(compress::int8_code{});
  run(compress::e3m0_code{});
}

TEST_CASE("int8 and e3m0: the AVX2 kernels are taken exactly where the CPU has them") {
  // Else the comparisons above compare the portable loops with themselves: say which ran.
  CHECK(compress::detail::block_vector_path(compress::half_path::best) == compress::half_vector_path());
  CHECK_FALSE(compress::detail::block_vector_path(compress::half_path::scalar));
  const std::string which = compress::half_vector_path() ? "AVX2 kernels and portable loops compared"
                                                         : "portable loops only (no AVX2 here)";
  MESSAGE("block decoders: " << which);
}

TEST_CASE("int8 and e3m0: NaN and inf are counted as find_non_finite counts them, and refused as before") {
  for (int seed = 0; seed < 20; ++seed)
    for (std::size_t d : {std::size_t{1}, std::size_t{17}, std::size_t{256}, std::size_t{700}}) {
      CAPTURE(seed);
      CAPTURE(d);
      std::mt19937 rng(static_cast<unsigned>(seed));
      auto p = mixed(rng, d, 256);
      const std::size_t bad = 1 + rng() % 3;
      for (std::size_t j = 0; j < bad; ++j) {
        const float v = j % 3 == 0   ? std::numeric_limits<float>::quiet_NaN()
                        : j % 3 == 1 ? std::numeric_limits<float>::infinity()
                                     : -std::numeric_limits<float>::infinity();
        p[rng() % d] = v;
      }
      const auto want = select::find_non_finite(p);
      std::vector<float> scales;
      std::vector<std::byte> msg(compress::int8::message_bytes(d, 256));
      const auto got8 = compress::detail::encode_blocks<compress::int8_code>(p, 256, scales, msg);
      CHECK(got8.count == want.count);
      CHECK(got8.first == want.first);
      msg.resize(compress::e3m0::message_bytes(d, 256));
      const auto got4 = compress::detail::encode_blocks<compress::e3m0_code>(p, 256, scales, msg);
      CHECK(got4.count == want.count);
      CHECK(got4.first == want.first);

      // The round refuses it with the same error as before: its type, the compressor and the argument named,
      // the count and the first index; with and without error feedback; on the rank that holds it and the other.
      for (bool ef : {false, true})
        for (int holder : {0, 1}) {
          CAPTURE(ef);
          CAPTURE(holder);
          std::vector<std::string> what(2);
          comm::local_group(2).run([&](comm::local& c) {
            compress::int8 x(d, {.block_size = 256, .error_feedback = ef});
            std::vector<float> g = c.rank() == holder ? p : std::vector<float>(d, 0.5f), out(d);
            try {
              x.reduce(c, g, out);
            } catch (const non_finite& e) {
              CHECK(e.count() == want.count);
              CHECK(e.first_index() == want.first);
              what[static_cast<std::size_t>(c.rank())] = e.what();
            }
          });
          for (int r = 0; r < 2; ++r) {
            const std::string who = r == holder ? "this rank's" : commsgd::concat("rank ", holder, "'s");
            CHECK(what[static_cast<std::size_t>(r)] ==
                  non_finite(commsgd::concat("compress::int8: ", who, " gradient (plus its residual)"),
                             want.count, want.first)
                      .what());
          }
        }
    }
}

TEST_CASE("int8 and e3m0 rounds give the reference's sum, with and without error feedback") {
  // The whole round on 3 ranks: the sum every rank returns is the reference's decodes of the reference's
  // messages of each rank's p, summed in rank order; with error feedback the second round's p carries the
  // first round's residual, so the decode of this rank's own message is checked through it.
  for (bool ef : {false, true})
    for (std::size_t d : {std::size_t{1}, std::size_t{300}, std::size_t{1025}}) {
      CAPTURE(ef);
      CAPTURE(d);
      const std::size_t b = 256;
      std::vector<std::vector<float>> g(3);
      std::mt19937 rng(static_cast<unsigned>(d));
      for (auto& v : g)
        v = mixed(rng, d, b);
      std::vector<std::vector<float>> sums8(3), sums4(3);
      comm::local_group(3).run([&](comm::local& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        compress::int8 x8(d, {.block_size = b, .error_feedback = ef});
        compress::e3m0 x4(d, {.block_size = b, .error_feedback = ef});
        std::vector<float> out(d);
        for (int round = 0; round < 2; ++round) {
          x8.reduce(c, g[r], out);
        }
        sums8[r] = out;
        for (int round = 0; round < 2; ++round)
          x4.reduce(c, g[r], out);
        sums4[r] = out;
      });
      // The reference: two rounds, the residual p - d kept as error_feedback keeps it.
      const auto reference = [&](auto code) {
        using Code = decltype(code);
        compress::error_feedback fb(d, ef);
        std::vector<compress::error_feedback> fbs(3, fb);
        std::vector<float> sum;
        for (int round = 0; round < 2; ++round) {
          std::vector<std::vector<std::byte>> msgs;
          for (std::size_t r = 0; r < 3; ++r) {
            std::vector<float> p(d);
            fbs[r].accumulate(g[r], p);
            msgs.push_back(reference_message<Code>(p, b));
            fbs[r].commit(p, reference_decode<Code>(msgs.back(), d, b));
          }
          sum = reference_sum<Code>(msgs, d, b);
        }
        return sum;
      };
      const auto want8 = reference(compress::int8_code{});
      const auto want4 = reference(compress::e3m0_code{});
      for (std::size_t r = 0; r < 3; ++r) {
        CHECK(first_difference(sums8[r], want8) == -1);
        CHECK(first_difference(sums4[r], want4) == -1);
      }
    }
}

namespace {

// Rounds of one rank's int8 or e3m0 compressor with error feedback against the passes it fused, written out
// from their definitions: p = g + e (+ r where r holds something), the reference's message of p, its decode,
// and (e, r) <- p - decode split exactly (error_feedback::commit). Every round's residual, both words, bit
// for bit; a round refused for a NaN in the middle of p changes nothing; a checkpoint taken between rounds
// resumes on the same bits. (Every p - decode of these codes is exact, a code's value being within a factor
// of two of p or zero, so the low word stays +0; the reference computes it all the same.)
template <class Code>
void same_residual_over_rounds(std::size_t d, std::size_t b, int seed) {
  std::mt19937 rng(static_cast<unsigned>(seed * 7907 + static_cast<int>(d * 13 + b)));
  compress::block_quantizer<Code> x(d, {.block_size = b, .error_feedback = true});
  std::vector<float> e(d, 0.0f), r(d, 0.0f), out(d);
  comm::local_group(1).run([&](comm::local& c) {
    for (int round = 0; round < 6; ++round) {
      CAPTURE(round);
      auto g = mixed(rng, d, b);
      // Values near the largest float only in the first round (later, g + e could overflow); some rounds small
      // against the residual, so that p - decode is inexact in places (low words).
      for (auto& v : g) {
        if (round > 0 && std::fabs(v) > 0x1p100f) v *= 0x1p-60f;
        if (round % 2 == 1) v *= 0x1p-20f;
      }
      if (round == 3 && d > 0) {
        // Refused: a NaN late in p. Nothing of the residual moves.
        auto bad = g;
        bad[d - 1 - rng() % ((d + 1) / 2)] = std::numeric_limits<float>::quiet_NaN();
        CHECK_THROWS_AS(x.reduce(c, bad, out), non_finite);
        REQUIRE(first_difference(x.residual(), e) == -1);
        REQUIRE(first_difference(x.residual_low(), r) == -1);
      }
      if (round == 4) {
        // A checkpoint, then the rounds go on in a fresh compressor.
        std::stringstream ss;
        x.save(ss);
        compress::block_quantizer<Code> y(d, {.block_size = b, .error_feedback = true});
        y.load(ss);
        x = std::move(y);
      }
      std::vector<float> p(d);
      for (std::size_t i = 0; i < d; ++i) {
        const float s = g[i] + e[i];
        p[i] = r[i] == 0.0f ? s : s + r[i];
      }
      const auto msg = reference_message<Code>(p, b);
      const auto dec = reference_decode<Code>(msg, d, b);
      x.reduce(c, g, out);
      REQUIRE(first_difference(out, reference_sum<Code>({msg}, d, b)) == -1);
      for (std::size_t i = 0; i < d; ++i) {
        // Knuth's two-sum of p and -decode, each operation as written.
        const volatile float a = p[i], nb = -dec[i];
        const volatile float sum = a + nb;
        const volatile float bb = sum - a;
        const volatile float t = (a - (sum - bb)) + (nb - bb);
        e[i] = sum;
        r[i] = t == 0.0f ? 0.0f : t;
      }
      REQUIRE(first_difference(x.residual(), e) == -1);
      REQUIRE(first_difference(x.residual_low(), r) == -1);
    }
  });
}

} // namespace

TEST_CASE("int8 and e3m0 with error feedback: the one-pass round keeps the residual of the passes it fused") {
  for (int seed = 0; seed < 4; ++seed)
    for (std::size_t d : lengths)
      for (std::size_t b : block_sizes) {
        CAPTURE(seed);
        CAPTURE(d);
        CAPTURE(b);
        same_residual_over_rounds<compress::int8_code>(d, b, seed);
        same_residual_over_rounds<compress::e3m0_code>(d, b, seed);
      }
}

TEST_CASE("int8 and e3m0: a stretch given as a difference is formed and scanned in one pass, to the same "
          "message") {
  // encode_blocks_from given in(first, m, as_difference) forms p = a - b into its scratch and takes each
  // block's scale and finiteness in that pass (form_scan_block); it must give encode_blocks' message, scales
  // and verdict for the difference formed first. p keeps `mixed`'s blocks (ties, thresholds, zeros,
  // subnormals, values near the largest float) through pairs whose difference is p itself or near it:
  // (p, +-0), (2p, p), (p + c, c); and now and then a NaN or inf in either operand, or max - (-max).
  int refused = 0, whole = 0;
  for (int seed = 0; seed < 6; ++seed)
    for (std::size_t d : lengths)
      for (std::size_t b : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{40},
                            std::size_t{256}, std::size_t{257}, std::size_t{4097}})
        for (const auto path : paths) {
          CAPTURE(seed);
          CAPTURE(d);
          CAPTURE(b);
          CAPTURE(static_cast<int>(path));
          std::mt19937 rng(static_cast<unsigned>(seed * 6151 + static_cast<int>(d * 13 + b)));
          const auto p = mixed(rng, d, b);
          std::normal_distribution<float> normal(0.0f, 1.0f);
          std::vector<float> x(d), y(d), formed(d);
          const bool specials = seed % 2 == 1;
          for (std::size_t i = 0; i < d; ++i) {
            switch (rng() % 4) {
            case 0:
              x[i] = p[i];
              y[i] = rng() % 2 ? 0.0f : -0.0f;
              break;
            case 1:
              x[i] = 2.0f * p[i];
              y[i] = p[i];
              break;
            default: {
              const float c = normal(rng);
              x[i] = p[i] + c;
              y[i] = c;
            }
            }
            if (specials && rng() % 500 == 0) {
              const float big = std::numeric_limits<float>::max();
              switch (rng() % 4) {
              case 0:
                x[i] = std::numeric_limits<float>::quiet_NaN();
                break;
              case 1:
                y[i] = -std::numeric_limits<float>::infinity();
                break;
              case 2:
                x[i] = big;
                y[i] = -big;
                break;
              default:
                y[i] = std::numeric_limits<float>::quiet_NaN();
              }
            }
            formed[i] = x[i] - y[i];
          }
          auto check = [&]<class Code>(Code) {
            const std::size_t bytes =
                Code::bits == 8 ? compress::int8::message_bytes(d, b) : compress::e3m0::message_bytes(d, b);
            std::vector<std::byte> want(bytes, std::byte{0x5a}), got(bytes, std::byte{0x5a});
            std::vector<float> want_scales, got_scales;
            const auto w = compress::detail::encode_blocks<Code>(formed, b, want_scales, want, path);
            compress::detail::encode_scratch s;
            int differences = 0;
            const auto in = compress::difference_input{
                [&](std::size_t first, std::size_t m) {
                  return std::span<const float>(formed).subspan(first, m);
                },
                [&](std::size_t first, std::size_t m, compress::as_difference_t) {
                  ++differences;
                  return compress::difference(std::span<const float>(x).subspan(first, m), y.data() + first);
                }};
            const auto g = compress::detail::encode_blocks_from<Code>(d, b, got_scales, got, s, in, path);
            CHECK(g.count == w.count);
            CHECK(g.first == w.first);
            CHECK(first_difference(got_scales, want_scales) == -1);
            CHECK(first_difference(got, want) == -1);
            CHECK(differences ==
                  (d == 0 ? 0 : 1 + static_cast<int>((d - 1) / (compress::detail::stretch_blocks(b) * b))));
            (w.count > 0 ? refused : whole) += 1;
          };
          check(compress::int8_code{});
          check(compress::e3m0_code{});
        }
  CHECK(refused > 0); // both verdicts were compared
  CHECK(whole > 0);
}
