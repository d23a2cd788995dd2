// Per-rank bytes of one round of each compressor in compress/, under comm::metered's accounting. Every
// round starts with the verdict all_gather (compress/agree.hpp: 5 u64 per rank; fp16 and bf16 only in their
// first round), then moves its payload:
//
//   compressor   payload collective      bytes each rank contributes          sent = received (n ranks)
//   fp16, bf16   16-bit ring all-reduce  2 d, in ring chunks (and pieces)     ring share of 2 d (+ (n-1) 40)
//   sign         all_gather              4 L + ceil(d / 8)                    (n-1)(40 + 4 L + ceil(d / 8))
//   qsgd (s)     all_gather              4 L + ceil(d (1 + bit_width(s)) / 8) likewise
//   random-k     ring all_reduce_sum     k floats                             (n-1) 40 + ring share of 4 k
//   int8 / e3m0  all_gather              4 ceil(d / b) + ceil(d bits / 8)     (n-1)(40 + that message)
//   reduce-scatter of int8 / e3m0 (compress/block_reduce_scatter.hpp): all_to_all of n parts of d / n,
//                                        each part's message as above         (n-1)(40 + a part's message)
//   reduce-scatter of fp16 / bf16 (compress/half_reduce_scatter.hpp): all_to_all of n parts of d / n,
//                                        2 bytes a value                      (n-1)(40 + 2 d / n)
//
// d is the gradient length, L the number of layers (one scale or norm each), k the values random-k sends.
// Against a float ring all-reduce (about 8 (n-1)/n d each way) fp16/bf16 move half the bytes at every n,
// exactly what PyTorch's fp16 hook moves; the all-gathers pay n-1 copies of a small message instead of two
// passes of a large one: sign (1 bit) and qsgd (1 + bit_width(s) bits) keep their lead up to n of about
// 64 / bits.
#pragma once

#include <commsgd/comm/narrow_ring.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/sparse.hpp>

#include <bit>
#include <cstdint>

namespace commsgd::inline v1::cost {

inline constexpr std::uint64_t compress_header_fields = 5;
inline constexpr std::uint64_t compress_header_bytes = compress_header_fields * 8;

constexpr comm::traffic compress_header_traffic(int n) noexcept {
  return comm::all_gather_traffic(compress_header_bytes, n);
}

// Values per scale of DiLoCo's int8 and e3m0 codes (sync/diloco_codes.hpp; the device round's default).
inline constexpr std::uint64_t diloco_block_size = 256;

// Bytes of a block-quantised message: a float scale per block, then `bits` per value, packed.
constexpr std::uint64_t block_quant_message_bytes(std::uint64_t d, std::uint64_t block_size,
                                                  unsigned bits) noexcept {
  return 4 * ((d + block_size - 1) / block_size) + (d * bits + 7) / 8;
}

// A compressed reduce-scatter (compress/block_reduce_scatter.hpp): n parts of `length` / n values, each
// part's message in blocks of b, `bits` a value; a rank sends the verdict and a part's message to each of
// the others.
constexpr std::uint64_t block_reduce_scatter_part_bytes(std::uint64_t length, int n, std::uint64_t b,
                                                        unsigned bits) noexcept {
  return n < 1 ? 0 : block_quant_message_bytes(length / static_cast<std::uint64_t>(n), b, bits);
}
constexpr comm::traffic block_reduce_scatter_traffic(std::uint64_t length, int n, std::uint64_t b,
                                                     unsigned bits) noexcept {
  return compress_header_traffic(n) +
         comm::all_to_all_traffic(block_reduce_scatter_part_bytes(length, n, b, bits), n);
}

// A 16-bit reduce-scatter (compress/half_reduce_scatter.hpp): the verdict and 2 bytes a value of a part to
// each of the others.
constexpr comm::traffic half_reduce_scatter_traffic(std::uint64_t length, int n) noexcept {
  return n < 1 ? comm::traffic{}
               : compress_header_traffic(n) +
                     comm::all_to_all_traffic(2 * (length / static_cast<std::uint64_t>(n)), n);
}

constexpr std::uint64_t sign_message_bytes(std::uint64_t d, std::uint64_t layers) noexcept {
  return 4 * layers + (d + 7) / 8;
}

// Bits per value of QSGD with s levels: a sign bit and the level in [0, s].
constexpr std::uint64_t qsgd_value_bits(std::uint64_t s) noexcept {
  return 1 + static_cast<std::uint64_t>(std::bit_width(s));
}

constexpr std::uint64_t qsgd_message_bytes(std::uint64_t d, std::uint64_t layers, std::uint64_t s) noexcept {
  return 4 * layers + (d * qsgd_value_bits(s) + 7) / 8;
}

// Seen from `rank` (the ring's chunks differ by one element between ranks; its long hops go in pieces,
// comm::narrow_ring_traffic); the first round also gathers the verdict.
inline comm::traffic half_traffic(std::uint64_t d, int n, int rank, bool first_round = false) noexcept {
  const auto ring = comm::narrow_ring_traffic(d, n, rank);
  return first_round ? compress_header_traffic(n) + ring : ring;
}

constexpr comm::traffic sign_traffic(std::uint64_t d, std::uint64_t layers, int n) noexcept {
  return compress_header_traffic(n) + comm::all_gather_traffic(sign_message_bytes(d, layers), n);
}

constexpr comm::traffic qsgd_traffic(std::uint64_t d, std::uint64_t layers, std::uint64_t s, int n) noexcept {
  return compress_header_traffic(n) + comm::all_gather_traffic(qsgd_message_bytes(d, layers, s), n);
}

// Seen from `rank`: the ring's chunks differ by one element between ranks.
inline comm::traffic random_k_traffic(std::uint64_t k, int n, int rank) noexcept {
  return compress_header_traffic(n) + dense_ring_traffic(k, n, rank);
}

} // namespace commsgd::inline v1::cost
