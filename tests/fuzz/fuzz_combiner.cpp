// Fuzz target: the CSSGD combiners (coding::xor_bits, coding::int32_sum) on arbitrary packet words and
// arbitrary floats (NaN, inf, denormals, both zeros, values past int32_sum's [-10, 10] range).
//
// Checked, for each combiner:
//   - decode of arbitrary words: accumulate(words) + finish never misbehaves (UBSan watches the integer
//     and float conversions), and gives what the word format says: the float with those bits (xor_bits),
//     or the sum of the words read as int32 times the quantisation step (int32_sum);
//   - a packet that combines r segments (r from 1 to 4) onto arbitrary starting words and then removes r - 1
//     of them holds the starting words combined with the missing segment only, bit for bit;
//   - decoding the words of one segment equals accumulating its values directly (what every receiver
//     relies on), and count_clipped counts exactly the values outside the representable range.
// cssgd's packet-size and padding checks are decode_cssgd_packet's, fuzzed by fuzz_cssgd_packet.cpp.
#include "fuzz_support.hpp"

#include <commsgd/coding/combiner.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {

namespace cd = commsgd::coding;
using commsgd_fuzz::byte_source;

template <class K>
void check_decode_words(const std::vector<std::uint32_t>& words) {
  std::vector<typename K::accumulator> acc(words.size(), K::accumulator_zero);
  K::accumulate(acc, words);
  K::accumulate(acc, words); // two blocks' worth, as a receiver sums several
  std::vector<float> out(words.size());
  K::finish(acc, out);
  for (std::size_t e = 0; e < words.size(); ++e) {
    if constexpr (std::is_same_v<K, cd::xor_bits>) {
      const float w = std::bit_cast<float>(words[e]);
      const float want = (K::accumulator_zero + w) + w;
      FUZZ_CHECK(commsgd_fuzz::same_bits(out[e], want) || (std::isnan(out[e]) && std::isnan(want)));
    } else {
      const std::int64_t sum = 2 * static_cast<std::int64_t>(static_cast<std::int32_t>(words[e]));
      const float want = static_cast<float>(static_cast<double>(sum) * K::step);
      FUZZ_CHECK(commsgd_fuzz::same_bits(out[e], want));
      FUZZ_CHECK(std::fabs(out[e]) <= 2.0f * static_cast<float>(K::range) * 1.0001f);
    }
  }
}

template <class K>
void check_segments(byte_source& in, const std::vector<std::uint32_t>& start) {
  const std::size_t len = start.size();
  const int r = 1 + static_cast<int>(in.u8() % 4);
  std::vector<std::vector<float>> seg(static_cast<std::size_t>(r));
  for (auto& s : seg) {
    // A segment may be shorter than the packet: the last segment of a block leaves padding.
    s.resize(in.u8() % 8 == 0 ? in.below(len + 1) : len);
    for (auto& v : s)
      v = in.awkward_float();
  }
  std::vector<std::uint32_t> packet = start;
  for (const auto& s : seg)
    K::combine(packet, s);
  const std::size_t missing = in.below(static_cast<std::size_t>(r));
  for (std::size_t j = 0; j < seg.size(); ++j)
    if (j != missing) K::remove(packet, seg[j]);

  std::vector<std::uint32_t> expect = start;
  K::combine(expect, seg[missing]);
  FUZZ_CHECK_MSG(packet == expect, "removing r - 1 segments did not leave the missing one");

  // From a zero packet, decoding the recovered words equals accumulating the values themselves.
  std::vector<std::uint32_t> alone(len, 0u);
  K::combine(alone, seg[missing]);
  const auto& v = seg[missing];
  std::vector<typename K::accumulator> from_words(v.size(), K::accumulator_zero),
      from_values(v.size(), K::accumulator_zero);
  K::accumulate(from_words, std::span<const std::uint32_t>(alone).first(v.size()));
  K::accumulate(from_values, std::span<const float>(v));
  std::vector<float> a(v.size()), b(v.size());
  K::finish(from_words, a);
  K::finish(from_values, b);
  for (std::size_t e = 0; e < v.size(); ++e)
    FUZZ_CHECK_MSG(commsgd_fuzz::same_bits(a[e], b[e]) || (std::isnan(a[e]) && std::isnan(b[e])),
                   "decoded words differ from the values at " + std::to_string(e));
  // Padding past the segment is untouched by combine.
  for (std::size_t e = v.size(); e < len; ++e)
    FUZZ_CHECK(alone[e] == 0u);

  std::uint64_t clipped = 0;
  if constexpr (std::is_same_v<K, cd::int32_sum>)
    for (float x : v)
      clipped += (static_cast<double>(x) > K::range || static_cast<double>(x) < -K::range) ? 1u : 0u;
  FUZZ_CHECK(K::count_clipped(v) == clipped);

  if constexpr (std::is_same_v<K, cd::int32_sum>) {
    // Within range, one quantise/dequantise round trip is off by at most half a step (plus float rounding).
    for (std::size_t e = 0; e < v.size(); ++e)
      if (std::isfinite(v[e]) && std::fabs(v[e]) <= K::range) {
        const double err = std::fabs(static_cast<double>(a[e]) - static_cast<double>(v[e]));
        FUZZ_CHECK_MSG(err <= K::step * 0.5 + std::fabs(static_cast<double>(v[e])) * 1e-7 + 1e-12,
                       "int32_sum round trip error " + std::to_string(err));
      }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  byte_source in(data, size);
  const bool use_xor = in.flag();
  const std::size_t len = in.below(65);
  std::vector<std::uint32_t> words(len);
  const bool zero_start = in.u8() % 2 == 0;
  for (auto& w : words)
    w = zero_start ? 0u : in.u32();
  if (use_xor) {
    check_decode_words<cd::xor_bits>(words);
    check_segments<cd::xor_bits>(in, words);
  } else {
    check_decode_words<cd::int32_sum>(words);
    check_segments<cd::int32_sum>(in, words);
  }
  return 0;
}
