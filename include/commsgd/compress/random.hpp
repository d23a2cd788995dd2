// The counter-based randomness of random-k and QSGD: every draw is a pure function of (seed, step, rank,
// counter), so ranks that must agree (random-k's indices) agree without a message, a rank's stochastic
// rounding is reproducible after a checkpoint (only the step counter is state), and a draw's bits do not
// depend on the standard library (std:: distributions are not specified to the bit).
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/mix.hpp>

#include <cstdint>

namespace commsgd::inline v1::compress::detail {

// The key of one stream: distinct (seed, step, lane) give unrelated streams.
COMMSGD_HOST_DEVICE constexpr std::uint64_t stream_key(std::uint64_t seed, std::uint64_t step,
                                                       std::uint64_t lane) noexcept {
  using commsgd::mix64;
  return mix64(mix64(mix64(seed) ^ step) ^ lane);
}

// Draw `i` of the stream `key`.
COMMSGD_HOST_DEVICE constexpr std::uint64_t draw(std::uint64_t key, std::uint64_t i) noexcept {
  using commsgd::mix64;
  return mix64(key ^ mix64(i));
}

// A double uniform in [0, 1) with 53 random bits.
COMMSGD_HOST_DEVICE constexpr double unit_double(std::uint64_t bits) noexcept {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// Sequential draws from one stream, with unbiased bounded integers (rejection of the short last cycle).
class counter_stream {
public:
  constexpr explicit counter_stream(std::uint64_t key) noexcept : key_(key) {}
  constexpr std::uint64_t next() noexcept { return draw(key_, i_++); }
  // Uniform in [0, range); range >= 1.
  constexpr std::uint64_t below(std::uint64_t range) noexcept {
    const std::uint64_t reject_under = (0 - range) % range; // 2^64 mod range
    for (;;) {
      const std::uint64_t x = next();
      if (x >= reject_under) return x % range;
    }
  }

private:
  std::uint64_t key_;
  std::uint64_t i_ = 0;
};

} // namespace commsgd::inline v1::compress::detail
