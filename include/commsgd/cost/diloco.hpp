// The codes a DiLoCo pseudo-gradient travels in: their one set of names, their message sizes and the bytes a
// rank sends a round. sync::diloco runs them (sync/diloco_code.hpp makes the engine for a code named at run
// time), compress/ implements them, commsgd_torch reads names and sizes from here through its extension.
// The names are those of the exchanges in cost/candidate.hpp ("dense", "fp16", "topk-<density>", ...).
//
//   name            compressor (compress/)         message (d values)                    the round
//   dense           (uncompressed floats)          4 d                                   ring all-reduce
//   fp16, bf16      fp16, bf16                     2 d                                   16-bit ring all-reduce
//   int8            int8 (blocks of 256)           4 ceil(d / 256) + d                   all-gather
//   e3m0            e3m0 (blocks of 256)           4 ceil(d / 256) + ceil(d / 2)         all-gather
//   topk-<density>  top_k_ef (error feedback)      8 k, k = ceil(density d)              all-gather
//
// Every gathered code also gathers the 40-byte verdict of compress/agree.hpp each round (fp16 and bf16 only
// in their first): a refusal (NaN, inf, ranks built differently) reaches every rank with the payload.
#pragma once

#include <commsgd/comm/traffic.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/error.hpp>

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace commsgd::inline v1::cost {

enum class diloco_format : std::uint8_t { dense, fp16, bf16, int8, e3m0, top_k };

// Values per scale of the int8 and e3m0 codes.
inline constexpr std::uint64_t diloco_block_size = 256;

// Bytes of a block-quantised message: a float scale per block, then `bits` per value, packed.
constexpr std::uint64_t block_quant_message_bytes(std::uint64_t d, std::uint64_t block_size,
                                                  unsigned bits) noexcept {
  return 4 * ((d + block_size - 1) / block_size) + (d * bits + 7) / 8;
}

// Bytes of a top-k message of k pairs: float values (or, two_bit, a float scale and 2 bits a value), then
// u32 indices.
constexpr std::uint64_t top_k_message_bytes(std::uint64_t k, bool two_bit) noexcept {
  return (two_bit ? 4 + (k * 2 + 7) / 8 : 4 * k) + 4 * k;
}

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

struct diloco_code {
  diloco_format format = diloco_format::dense;
  double density = 0.0; // top_k: the fraction of values sent, (0, 1]

  static constexpr const char* names = "'dense', 'fp16', 'bf16', 'int8', 'e3m0' or 'topk-<density>' with a "
                                       "density in (0, 1]";

  // From its name; anything else is refused with the allowed names.
  static diloco_code parse(std::string_view text) {
    auto bad = [&] {
      return invalid_argument(commsgd::concat("argument 'compression' = '", text,
                                              "' is not a code; the allowed codes are ", names));
    };
    if (text == "dense") return {diloco_format::dense};
    if (text == "fp16") return {diloco_format::fp16};
    if (text == "bf16") return {diloco_format::bf16};
    if (text == "int8") return {diloco_format::int8};
    if (text == "e3m0") return {diloco_format::e3m0};
    constexpr std::string_view prefix = "topk-";
    if (!text.starts_with(prefix)) throw bad();
    const std::string_view number = text.substr(prefix.size());
    double density = 0.0;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), density);
    if (ec != std::errc() || end != number.data() + number.size() || !(density > 0.0 && density <= 1.0))
      throw bad();
    return {diloco_format::top_k, density};
  }

  std::string name() const {
    switch (format) {
    case diloco_format::dense:
      return "dense";
    case diloco_format::fp16:
      return "fp16";
    case diloco_format::bf16:
      return "bf16";
    case diloco_format::int8:
      return "int8";
    case diloco_format::e3m0:
      return "e3m0";
    case diloco_format::top_k:
      return commsgd::concat("topk-", density);
    }
    return "?";
  }

  bool gathered() const noexcept {
    return format == diloco_format::int8 || format == diloco_format::e3m0 || format == diloco_format::top_k;
  }

  // Bytes of one rank's message for d values.
  std::uint64_t message_bytes(std::uint64_t d) const {
    switch (format) {
    case diloco_format::dense:
      return 4 * d;
    case diloco_format::fp16:
    case diloco_format::bf16:
      return 2 * d;
    case diloco_format::int8:
      return block_quant_message_bytes(d, diloco_block_size, 8);
    case diloco_format::e3m0:
      return block_quant_message_bytes(d, diloco_block_size, 4);
    case diloco_format::top_k:
      return top_k_message_bytes(top_k_count(d, density), false);
    }
    return 0;
  }

  // What `rank` of n sends and receives in one round of d values (first_round: fp16 and bf16 also gather
  // the verdict then).
  comm::traffic round_traffic(std::uint64_t d, int n, int rank, bool first_round) const {
    switch (format) {
    case diloco_format::dense:
      return comm::ring_all_reduce_traffic(d, sizeof(float), n, rank);
    case diloco_format::fp16:
    case diloco_format::bf16:
      return half_traffic(d, n, rank, first_round);
    default:
      return compress_header_traffic(n) + comm::all_gather_traffic(message_bytes(d), n);
    }
  }
};

} // namespace commsgd::inline v1::cost
