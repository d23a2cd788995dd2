// Helpers shared by the fuzz targets: a reader that turns the fuzzer's bytes into typed choices, and a
// check that stops the process loudly (so libFuzzer records the input and the replay test fails).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>

namespace commsgd_fuzz {

[[noreturn]] inline void fail(const char* file, int line, const char* cond, const std::string& note) {
  std::fprintf(stderr, "%s:%d: fuzz check failed: %s%s%s\n", file, line, cond, note.empty() ? "" : "  -- ",
               note.c_str());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(cond)                                                                                     \
  do {                                                                                                       \
    if (!(cond)) ::commsgd_fuzz::fail(__FILE__, __LINE__, #cond, {});                                        \
  } while (0)
#define FUZZ_CHECK_MSG(cond, note)                                                                           \
  do {                                                                                                       \
    if (!(cond)) ::commsgd_fuzz::fail(__FILE__, __LINE__, #cond, (note));                                    \
  } while (0)

// Consumes the input front to back; once it runs dry every read yields zero, so any input is usable.
class byte_source {
public:
  byte_source(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  std::size_t left() const noexcept { return size_ - pos_; }
  bool empty() const noexcept { return pos_ >= size_; }

  std::uint8_t u8() noexcept { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint16_t u16() noexcept { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() noexcept { return static_cast<std::uint32_t>(u16()) | (std::uint32_t{u16()} << 16); }
  std::uint64_t u64() noexcept { return static_cast<std::uint64_t>(u32()) | (std::uint64_t{u32()} << 32); }
  bool flag() noexcept { return (u8() & 1u) != 0; }
  // A value in [0, n) for n > 0.
  std::size_t below(std::size_t n) noexcept { return n == 0 ? 0 : u16() % n; }

  // A float that is often one of the awkward ones: zeros of both signs, denormals, the extremes, NaN, inf,
  // and a few repeated values so that ties are common; otherwise raw bits.
  float awkward_float() noexcept {
    static constexpr std::uint32_t palette[] = {
        0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00800000u, 0x3f800000u,
        0xbf800000u, 0x3f000000u, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
        0xffc00001u, 0x7f800001u, 0x41200000u, 0xc1200000u, 0x41200001u, 0x4f000000u};
    const std::uint8_t sel = u8();
    if (sel < 96) return std::bit_cast<float>(palette[sel % std::size(palette)]);
    if (sel < 128) return static_cast<float>(static_cast<std::int8_t>(u8())) * 0.125f; // small, tie-prone
    return std::bit_cast<float>(u32());
  }

  // The rest of the input, for targets that treat it as one opaque blob.
  std::span<const std::uint8_t> rest() noexcept {
    const auto s = std::span<const std::uint8_t>(data_ + pos_, left());
    pos_ = size_;
    return s;
  }

private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

inline bool same_bits(float a, float b) noexcept {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

} // namespace commsgd_fuzz
