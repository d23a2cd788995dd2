// Software prefetch for the loops that stream a DiLoCo round's vectors (the models, the momentum, the
// residual, the 16-bit messages and sum) and long finiteness scans through one core. Several streams read at
// once keep fewer misses in flight than the memory's bandwidth needs on some machines, where a plain memcpy
// reaches it; asking for each line a few KiB before the loop gets there lets those loops keep more in flight
// (docs/diloco.md has what it measured). A hint only: the addresses may lie past the end of the data (they
// are formed as integers, never dereferenced), and other compilers and nvcc see nothing.
#pragma once

#include <cstddef>
#include <cstdint>

namespace commsgd::inline v1::detail {

// How far ahead of a stream's current group the lines are asked for: 4 KiB of floats.
inline constexpr std::size_t prefetch_ahead = 1024;

// Asks for the cache line at address `at` (`Write` for a stream the loop also writes).
template <bool Write = false>
inline void prefetch_address(std::uintptr_t at) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
  __builtin_prefetch(reinterpret_cast<const void*>(at), Write ? 1 : 0);
#else
  (void)at;
#endif
}

// Asks for the cache line 4 KiB past p: for a loop over 64 bytes of a stream at a time (the 16-bit messages).
template <bool Write = false>
inline void prefetch_line(const void* p) noexcept {
  prefetch_address<Write>(reinterpret_cast<std::uintptr_t>(p) + prefetch_ahead * sizeof(float));
}

// Asks for the four cache lines of the 64 floats `prefetch_ahead` past p: `Write` for a stream the loop also
// writes.
template <bool Write = false>
inline void prefetch_group(const float* p) noexcept {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + prefetch_ahead * sizeof(float);
  for (std::uintptr_t line = 0; line < 64 * sizeof(float); line += 64)
    prefetch_address<Write>(at + line);
}

} // namespace commsgd::inline v1::detail
