// The combiner concept: how CSSGD folds r segments into one packet and takes them out again.
//
// Block gradients travel as 32-bit words. A combiner maps a float segment into words, adds it into a
// packet (combine) or takes it out (remove), and sums decoded blocks into an accumulator. remove must undo
// combine exactly, so a receiver recovers the words of the one segment it lacks bit for bit.
//
// Models:
//   xor_bits   the raw IEEE-754 bit patterns XORed (as Coded TeraSort does): exact, nothing is quantised.
//   int32_sum  fixed point: [-10, 10] onto [-(2^31-1), 2^31-1], wrap-around sums, dequantise.
#pragma once

#include <commsgd/config.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

namespace commsgd::inline v1::coding {

template <class K>
concept combiner = requires(std::span<std::uint32_t> packet, std::span<const float> values,
                            std::span<const std::uint32_t> words, std::span<typename K::accumulator> acc,
                            std::span<const typename K::accumulator> cacc, std::span<float> out) {
  { K::accumulator_zero } -> std::convertible_to<typename K::accumulator>;
  { K::count_clipped(values) } -> std::same_as<std::uint64_t>;
  K::combine(packet, values); // packet[e] (+)= word(values[e]) for e < values.size()
  K::remove(packet, values);  // the inverse of combine
  K::accumulate(acc, values); // acc[e] += value as this combiner's receivers see it
  K::accumulate(acc, words);  // acc[e] += decoded words; equal to accumulating the values they came from
  K::finish(cacc, out);
};

// Exact: XOR of bit patterns is its own inverse, and summing the recovered floats is summing the originals.
struct xor_bits {
  using accumulator = float;
  static constexpr float accumulator_zero = -0.0f; // see detail::sum_identity

  static std::uint64_t count_clipped(std::span<const float>) noexcept { return 0; }

  static void combine(std::span<std::uint32_t> packet, std::span<const float> v) noexcept {
    for (std::size_t e = 0; e < v.size(); ++e)
      packet[e] ^= std::bit_cast<std::uint32_t>(v[e]);
  }
  static void remove(std::span<std::uint32_t> packet, std::span<const float> v) noexcept {
    combine(packet, v);
  }

  static void accumulate(std::span<float> acc, std::span<const float> v) noexcept {
    for (std::size_t e = 0; e < v.size(); ++e)
      acc[e] += v[e];
  }
  static void accumulate(std::span<float> acc, std::span<const std::uint32_t> w) noexcept {
    for (std::size_t e = 0; e < w.size(); ++e)
      acc[e] += std::bit_cast<float>(w[e]);
  }
  static void finish(std::span<const float> acc, std::span<float> out) noexcept {
    std::copy(acc.begin(), acc.end(), out.begin());
  }
};

// Fixed-point int32 coding. Every holder of a block quantises it the same way, and the sum is taken over the
// quantised values in a 64-bit integer and dequantised once, so all ranks get the same bits and the error of
// each output value is at most (number of blocks) * 5 / (2^31 - 1) plus the final rounding to float.
struct int32_sum {
  using accumulator = std::int64_t;
  static constexpr std::int64_t accumulator_zero = 0;

  static constexpr double range = 10.0;
  static constexpr double levels = 2147483647.0; // 2^31 - 1
  static constexpr double step = range / levels; // value of one quantisation level

  static std::int32_t quantise(float x) noexcept {
    const double c = std::clamp(static_cast<double>(x), -range, range);
    return static_cast<std::int32_t>(std::llround(c * (levels / range)));
  }

  static std::uint64_t count_clipped(std::span<const float> v) noexcept {
    std::uint64_t c = 0;
    for (float x : v)
      c += (x > range || x < -range) ? 1u : 0u;
    return c;
  }

  // Unsigned arithmetic wraps by definition; the same sums in int32 would be undefined on overflow.
  static void combine(std::span<std::uint32_t> packet, std::span<const float> v) noexcept {
    for (std::size_t e = 0; e < v.size(); ++e)
      packet[e] += static_cast<std::uint32_t>(quantise(v[e]));
  }
  static void remove(std::span<std::uint32_t> packet, std::span<const float> v) noexcept {
    for (std::size_t e = 0; e < v.size(); ++e)
      packet[e] -= static_cast<std::uint32_t>(quantise(v[e]));
  }

  static void accumulate(std::span<std::int64_t> acc, std::span<const float> v) noexcept {
    for (std::size_t e = 0; e < v.size(); ++e)
      acc[e] += quantise(v[e]);
  }
  static void accumulate(std::span<std::int64_t> acc, std::span<const std::uint32_t> w) noexcept {
    for (std::size_t e = 0; e < w.size(); ++e)
      acc[e] += static_cast<std::int32_t>(w[e]);
  }
  static void finish(std::span<const std::int64_t> acc, std::span<float> out) noexcept {
    for (std::size_t e = 0; e < acc.size(); ++e)
      out[e] = static_cast<float>(static_cast<double>(acc[e]) * step);
  }
};

static_assert(combiner<xor_bits>);
static_assert(combiner<int32_sum>);

} // namespace commsgd::inline v1::coding
