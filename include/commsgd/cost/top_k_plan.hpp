// How the top-k codes lay out what they send, worked out in one place: the chunks, each chunk's k, the bits
// of an index, where each part of a message starts and how long it is. The compressors that write these
// messages (compress/top_k_ef.hpp, shared_top_k.hpp, region_top_k.hpp), the byte counts of the codes
// (sync/diloco_codes.hpp) and the device round (cuda/diloco/) all read it, so what is sent, what is charged and
// what the device writes cannot drift apart.
//
// It sits in cost/ rather than compress/ because the byte counts need it and includes go one way,
// compress/ -> cost/. Device code reads the accessors and the plain fields; of() runs on the host only.
//
// top_k_ef's message (gathered from every rank):
//   [k floats]                                  or, two_bit, [a float scale a chunk][2-bit codes, packed]
//   [k chunk-relative indices, index_bits each, packed], from index_offset
// shared_top_k's slot and region_top_k's block have room for the chunks one of n ranks leads or owns at most.
#pragma once

#include <commsgd/comm/traffic.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/error.hpp>

#include <bit>
#include <cmath>
#include <cstdint>

namespace commsgd::inline v1::cost {

// k for `density` of d values: ceil(density d - 1e-9), at least 1, at most d (0 for d = 0). The 1e-9 keeps
// 0.07 * 100 = 7.000000000000001 at 7, which a plain ceil would make 8.
inline std::uint64_t top_k_count(std::uint64_t d, double density) {
  if (!(density > 0.0 && density <= 1.0))
    throw invalid_argument(
        commsgd::concat("argument 'density' = ", density, " is outside the allowed range (0, 1]"));
  if (d == 0) return 0;
  const double k = std::ceil(density * static_cast<double>(d) - 1e-9);
  return k <= 1.0 ? 1 : (k >= static_cast<double>(d) ? d : static_cast<std::uint64_t>(k));
}

// Bits an index into n values needs: 0 for n <= 1 (the only index is 0), 12 for 4096.
constexpr unsigned index_bits(std::uint64_t n) noexcept {
  return n <= 1 ? 0u : static_cast<unsigned>(std::bit_width(n - 1));
}

// Bytes of `count` fields of `bits` each, packed.
COMMSGD_HOST_DEVICE constexpr std::uint64_t packed_field_bytes(std::uint64_t count, unsigned bits) noexcept {
  return (count * bits + 7) / 8;
}

// How a top-k code cuts d values: chunks of `size` values (the last one shorter when size does not divide d),
// each sending k = top_k_count(its length, density) values with indices relative to the chunk.
struct top_k_chunks {
  std::uint64_t d = 0, size = 0, count = 0; // values, values a chunk, chunks
  std::uint64_t k_full = 0, k_last = 0;     // k of a full chunk, of the last one
  unsigned index_bits = 0;                  // bits an index takes

  // chunk = 0: one chunk of all d values.
  static top_k_chunks of(std::uint64_t d, std::uint64_t chunk, double density) {
    const std::uint64_t k0 = top_k_count(0, density); // checks density whatever d is
    top_k_chunks c;
    c.d = d;
    c.size = chunk == 0 || chunk > d ? d : chunk;
    c.count = c.size == 0 ? 0 : (d + c.size - 1) / c.size;
    c.k_full = c.size == 0 ? k0 : top_k_count(c.size, density);
    c.k_last = c.count == 0 ? k0 : top_k_count(d - (c.count - 1) * c.size, density);
    c.index_bits = cost::index_bits(c.size);
    return c;
  }
  COMMSGD_HOST_DEVICE constexpr std::uint64_t first(std::uint64_t j) const noexcept { return j * size; }
  COMMSGD_HOST_DEVICE constexpr std::uint64_t length(std::uint64_t j) const noexcept {
    return j + 1 == count ? d - j * size : size;
  }
  COMMSGD_HOST_DEVICE constexpr std::uint64_t k_of(std::uint64_t j) const noexcept {
    return j + 1 == count ? k_last : k_full;
  }
  COMMSGD_HOST_DEVICE constexpr std::uint64_t k() const noexcept {
    return count == 0 ? 0 : (count - 1) * k_full + k_last;
  }
  // Entries of the chunks one of n ranks takes in turn (j, j + n, ...): room for the most any rank holds,
  // so every rank's slot or block has one size.
  COMMSGD_HOST_DEVICE constexpr std::uint64_t room(std::uint64_t n) const noexcept {
    const std::uint64_t un = n < 1 ? 1 : n;
    return (count + un - 1) / un * k_full;
  }
};

// top_k_ef's message: the chunks and where each part starts.
struct top_k_plan : top_k_chunks {
  bool two_bit = false;           // values as a scale a chunk and 2-bit codes rather than floats
  std::uint64_t code_offset = 0;  // two_bit: where the 2-bit codes start, after the scales
  std::uint64_t index_offset = 0; // where the packed indices start
  std::uint64_t bytes = 0;        // the whole message

  static constexpr top_k_plan of(const top_k_chunks& c, bool two_bit) noexcept {
    top_k_plan p;
    static_cast<top_k_chunks&>(p) = c;
    p.two_bit = two_bit;
    p.code_offset = 4 * c.count;
    p.index_offset = two_bit ? p.code_offset + packed_field_bytes(c.k(), 2) : 4 * c.k();
    p.bytes = p.index_offset + packed_field_bytes(c.k(), c.index_bits);
    return p;
  }
  static top_k_plan of(std::uint64_t d, std::uint64_t chunk, double density, bool two_bit) {
    return of(top_k_chunks::of(d, chunk, density), two_bit);
  }
};

constexpr std::uint64_t top_k_message_bytes(const top_k_chunks& c, bool two_bit) noexcept {
  return top_k_plan::of(c, two_bit).bytes;
}

// What the flat-in-n codes (shared, regions) move of the k values a round, the figure sync/diloco_codes.hpp gives
// as their message: the values in 16 bits and their indices, packed.
constexpr std::uint64_t top_k_16_bit_payload_bytes(const top_k_chunks& c) noexcept {
  return 2 * c.k() + packed_field_bytes(c.k(), c.index_bits);
}

// shared_top_k: the bytes of one rank's slot of indices over n ranks, packed.
constexpr std::uint64_t shared_top_k_slot_bytes(const top_k_chunks& c, int n) noexcept {
  return packed_field_bytes(c.room(static_cast<std::uint64_t>(n < 1 ? 1 : n)), c.index_bits);
}

// shared_top_k: what `rank` of n sends and receives a round: the verdict and its slot to each of the others,
// and its share of a 16-bit ring all-reduce of the k values.
constexpr comm::traffic shared_top_k_traffic(const top_k_chunks& c, int n, int rank) noexcept {
  return compress_header_traffic(n) + comm::all_gather_traffic(shared_top_k_slot_bytes(c, n), n) +
         comm::narrow_ring_traffic(c.k(), n, rank);
}

// region_top_k: the bytes of one block (a rank's picks for one owner, or an owner's cut sums) over n ranks:
// bf16 values, then the indices packed.
constexpr std::uint64_t region_top_k_block_bytes(const top_k_chunks& c, int n) noexcept {
  const std::uint64_t room = c.room(static_cast<std::uint64_t>(n < 1 ? 1 : n));
  return 2 * room + packed_field_bytes(room, c.index_bits);
}

// region_top_k: what a rank sends and receives a round: the verdict, a block to each owner (an all-to-all)
// and its cut sums to each rank (an all-gather).
constexpr comm::traffic region_top_k_traffic(const top_k_chunks& c, int n) noexcept {
  const auto b = region_top_k_block_bytes(c, n);
  return compress_header_traffic(n) + comm::all_to_all_traffic(b, n) + comm::all_gather_traffic(b, n);
}

} // namespace commsgd::inline v1::cost
