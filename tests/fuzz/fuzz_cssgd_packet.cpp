// Fuzz target: coding::decode_cssgd_packet, the receiver's side of a CSSGD multicast, on packets built the
// way a sender builds them and then damaged, and on raw bytes.
//
// Checked, for xor_bits and int32_sum, packets of L words (0 to 40), r from 1 to 4, a kept segment of any
// length up to L and own segments of any length up to L (awkward floats: NaN, inf, both zeros, values past
// int32_sum's range):
//   - an intact packet decodes to the missing segment's words, bit for bit;
//   - a packet of another size (bytes cut or added, down to a partial word) is corrupt_data;
//   - a bit flipped in the padding is always corrupt_data; a bit flipped in the segment decodes and changes
//     exactly that word (no check can see it, and none claims to);
//   - raw bytes either decode to what removing the own segments from them gives, or raise corrupt_data;
//   - on corrupt_data, `out` is untouched.
#include "fuzz_support.hpp"

#include <commsgd/coding/cssgd_packet.hpp>
#include <commsgd/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

namespace cd = commsgd::coding;
using commsgd_fuzz::byte_source;

constexpr std::uint32_t sentinel = 0xdeadbeefu;

std::vector<std::byte> to_bytes(const std::vector<std::uint32_t>& w) {
  std::vector<std::byte> b(w.size() * sizeof(std::uint32_t));
  if (!b.empty()) std::memcpy(b.data(), w.data(), b.size());
  return b;
}

template <class K>
void run(byte_source& in) {
  const std::size_t len = in.below(41);
  const int r = 1 + static_cast<int>(in.u8() % 4);
  const std::size_t keep = in.u8() % 4 == 0 ? len : in.below(len + 1);

  // The sender's r segments: r - 1 the receiver holds too, one (the last) it lacks. Only the lacking one is
  // cut to `keep`; the others have any length up to L, as segments of other blocks at other positions do.
  std::vector<std::vector<float>> seg(static_cast<std::size_t>(r));
  for (std::size_t j = 0; j < seg.size(); ++j) {
    seg[j].resize(j + 1 == seg.size() ? keep : (in.flag() ? len : in.below(len + 1)));
    for (auto& v : seg[j])
      v = in.awkward_float();
  }
  std::vector<std::span<const float>> own(seg.begin(), seg.end() - 1);

  std::vector<std::uint32_t> packet(len, 0u);
  for (const auto& s : seg)
    K::combine(packet, s);
  std::vector<std::uint32_t> want(keep, 0u);
  K::combine(want, seg.back());

  auto decode = [&](std::span<const std::byte> bytes, std::vector<std::uint32_t>& out) {
    try {
      cd::decode_cssgd_packet<K>(bytes, len, own, std::span<std::uint32_t>(out), 7);
      return true;
    } catch (const commsgd::corrupt_data& e) {
      FUZZ_CHECK_MSG(std::string(e.what()).find("node 7") != std::string::npos, e.what());
      for (auto w : out)
        FUZZ_CHECK_MSG(w == sentinel, "out was written by a failed decode");
      return false;
    }
  };
  std::vector<std::uint32_t> out(keep, sentinel);

  const unsigned mode = in.u8() % 5;
  if (mode == 0) { // intact
    FUZZ_CHECK(decode(to_bytes(packet), out));
    FUZZ_CHECK_MSG(out == want, "an intact packet did not decode to the missing segment");
  } else if (mode == 1) { // another size
    auto bytes = to_bytes(packet);
    const std::size_t cut = 1 + in.below(bytes.size() + 4);
    if (in.flag() && cut <= bytes.size())
      bytes.resize(bytes.size() - cut);
    else
      bytes.insert(bytes.end(), cut, std::byte{0});
    FUZZ_CHECK_MSG(!decode(bytes, out), "a packet of the wrong size decoded");
  } else if (mode == 2 && len > 0) { // one bit flipped
    const std::size_t e = in.below(len);
    const int bit = in.u8() % 32;
    packet[e] ^= 1u << bit;
    const bool ok = decode(to_bytes(packet), out);
    if (e >= keep) {
      FUZZ_CHECK_MSG(!ok, "a flipped padding bit went unseen");
    } else {
      FUZZ_CHECK(ok);
      for (std::size_t i = 0; i < keep; ++i)
        FUZZ_CHECK_MSG((out[i] != want[i]) == (i == e), "the flipped word is not the one that changed");
    }
  } else { // raw bytes
    const auto rest = in.rest();
    std::vector<std::byte> bytes(rest.size());
    if (!bytes.empty()) std::memcpy(bytes.data(), rest.data(), rest.size());
    const bool ok = decode(bytes, out);
    if (bytes.size() != len * sizeof(std::uint32_t)) {
      FUZZ_CHECK(!ok);
      return;
    }
    std::vector<std::uint32_t> words(len);
    if (len) std::memcpy(words.data(), bytes.data(), bytes.size());
    for (auto s : own)
      K::remove(words, s);
    bool padding_zero = true;
    for (std::size_t e = keep; e < len; ++e)
      padding_zero = padding_zero && words[e] == 0u;
    FUZZ_CHECK(ok == padding_zero);
    if (ok)
      for (std::size_t i = 0; i < keep; ++i)
        FUZZ_CHECK(out[i] == words[i]);
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  byte_source in(data, size);
  if (in.flag())
    run<cd::xor_bits>(in);
  else
    run<cd::int32_sum>(in);
  return 0;
}
