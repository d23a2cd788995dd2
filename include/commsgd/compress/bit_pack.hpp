// Plain fixed-width bit packing of the sign and QSGD messages: value i occupies bits [i w, (i + 1) w) of a
// little-endian bit stream (bit j of the stream is bit j % 8 of byte j / 8), so a message of m values of w
// bits is ceil(m w / 8) bytes whatever the host's byte order, and the unused high bits of the last byte are
// zero.
#pragma once

#include <commsgd/config.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace commsgd::inline v1::compress::detail {

constexpr std::size_t packed_bytes(std::size_t count, unsigned width) noexcept {
  return (count * width + 7) / 8;
}

// Writes `count` fields of `width` bits (1..32) taken from field(i) into `out` (packed_bytes long).
template <class Field>
void pack_bits(std::span<std::byte> out, std::size_t count, unsigned width, Field&& field) {
  std::uint64_t acc = 0;
  unsigned have = 0; // bits in acc, fewer than 32 between fields, so a field of up to 32 always fits
  std::size_t o = 0;
  for (std::size_t i = 0; i < count; ++i) {
    acc |= static_cast<std::uint64_t>(field(i)) << have;
    have += width;
    if (have >= 32) { // a whole 32-bit word of the stream: its four bytes at once
      const auto word = static_cast<std::uint32_t>(acc);
      if constexpr (std::endian::native == std::endian::little) {
        std::memcpy(out.data() + o, &word, 4);
      } else {
        for (unsigned j = 0; j < 4; ++j)
          out[o + j] = static_cast<std::byte>((word >> (8 * j)) & 0xffu);
      }
      o += 4;
      acc >>= 32;
      have -= 32;
    }
  }
  for (; have > 0; have = have > 8 ? have - 8 : 0) {
    out[o++] = static_cast<std::byte>(acc & 0xff);
    acc >>= 8;
  }
}

// Calls sink(i, value) for fields first .. first + count - 1 of `width` bits (1..32) in `in`, in order.
template <class Sink>
void unpack_bits(std::span<const std::byte> in, std::size_t first, std::size_t count, unsigned width,
                 Sink&& sink) {
  if (width == 1) {
    // Signs: one bit per value, read straight from its byte.
    for (std::size_t i = first; i < first + count; ++i)
      sink(i, static_cast<std::uint32_t>((static_cast<unsigned>(in[i / 8]) >> (i % 8)) & 1u));
    return;
  }
  const std::uint64_t mask = (std::uint64_t{1} << width) - 1;
  if constexpr (std::endian::native == std::endian::little) {
    // On a little-endian host eight bytes loaded as one word are the stream's next 64 bits in order, so a
    // field is one load, shift and mask wherever eight bytes remain.
    std::size_t i = first;
    for (; i < first + count && (i * width) / 8 + 8 <= in.size(); ++i) {
      std::uint64_t word;
      std::memcpy(&word, in.data() + (i * width) / 8, 8);
      sink(i, static_cast<std::uint32_t>((word >> ((i * width) % 8)) & mask));
    }
    count -= i - first;
    first = i;
  }
  const std::size_t bit = first * width;
  std::size_t o = bit / 8;
  unsigned skip = static_cast<unsigned>(bit % 8);
  std::uint64_t acc = 0;
  unsigned have = 0;
  for (std::size_t i = first; i < first + count; ++i) {
    while (have < width + skip) {
      acc |= static_cast<std::uint64_t>(in[o++]) << have;
      have += 8;
    }
    if (skip) {
      acc >>= skip;
      have -= skip;
      skip = 0;
    }
    sink(i, static_cast<std::uint32_t>(acc & mask));
    acc >>= width;
    have -= width;
  }
}

} // namespace commsgd::inline v1::compress::detail
