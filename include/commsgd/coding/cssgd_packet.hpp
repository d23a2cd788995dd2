// coding::decode_cssgd_packet: what a CSSGD receiver does with one packet, as a pure function.
//
// Sender s of group T multicasts the combination of its segments of the r blocks T \ {k} (k in T, k != s).
// Receiver k holds r - 1 of those blocks; removing its own r - 1 segments leaves the segment of the one block
// it lacks. A packet is L = cssgd_packet_length(d, r) words; the segment kept may be shorter (the last ones of
// a block), and every word past it must then decode to zero. cssgd's exchange calls the in-place form on
// the words it received; the byte form is the entry for anything that arrives as bytes (and for the fuzz
// target, tests/fuzz/fuzz_cssgd_packet.cpp).
#pragma once

#include <commsgd/coding/combiner.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace commsgd::inline v1::coding {

// `packet` holds the words as received and is used as the work space (own segments are removed from it).
// `packet_words` is L, the length both sides derive; `own` the receiver's segments the sender combined in
// (each at most L words); `out` receives the segment kept, out.size() <= L words. `from` names the sender in
// errors. Throws corrupt_data, leaving `out` untouched, when the packet is not L words long or a word past
// the segment does not decode to zero; invalid_argument when `own` or `out` do not fit a packet of L words
// (the caller's mistake, not the packet's).
template <combiner Combiner>
void decode_cssgd_packet(std::span<std::uint32_t> packet, std::size_t packet_words,
                         std::span<const std::span<const float>> own, std::span<std::uint32_t> out,
                         int from) {
  if (out.size() > packet_words)
    throw invalid_argument(
        commsgd::concat("decode_cssgd_packet: argument 'out' holds ", out.size(),
                        " words, outside the allowed range [0, packet_words = ", packet_words, "]"));
  for (std::size_t j = 0; j < own.size(); ++j)
    if (own[j].size() > packet_words)
      throw invalid_argument(
          commsgd::concat("decode_cssgd_packet: argument 'own[", j, "]' holds ", own[j].size(),
                          " values, outside the allowed range [0, packet_words = ", packet_words, "]"));
  if (packet.size() != packet_words)
    throw corrupt_data(commsgd::concat("CSSGD packet from node ", from, " holds ", packet.size(),
                                       " words; both sides derive ", packet_words));
  for (auto seg : own)
    Combiner::remove(packet, seg);
  for (std::size_t e = out.size(); e < packet_words; ++e)
    if (packet[e] != 0u)
      throw corrupt_data(commsgd::concat("CSSGD packet from node ", from, " decodes to ", packet[e],
                                         " in padding word ", e, " (segment of ", out.size(),
                                         " words); it was corrupted or the ranks disagree on data"));
  std::copy(packet.begin(), packet.begin() + static_cast<std::ptrdiff_t>(out.size()), out.begin());
}

// The same from bytes: `bytes` must be exactly packet_words 32-bit words (host byte order, as sent).
template <combiner Combiner>
void decode_cssgd_packet(std::span<const std::byte> bytes, std::size_t packet_words,
                         std::span<const std::span<const float>> own, std::span<std::uint32_t> out,
                         int from) {
  if (bytes.size() % sizeof(std::uint32_t) != 0 || bytes.size() / sizeof(std::uint32_t) != packet_words)
    throw corrupt_data(commsgd::concat("CSSGD packet from node ", from, " holds ", bytes.size(),
                                       " bytes; both sides derive ", packet_words, " words (",
                                       packet_words * sizeof(std::uint32_t), " bytes)"));
  std::vector<std::uint32_t> words(packet_words);
  if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
  decode_cssgd_packet<Combiner>(std::span<std::uint32_t>(words), packet_words, own, out, from);
}

} // namespace commsgd::inline v1::coding
