// sync::detail::stream_64 and stream_fence: stores that bypass the caches, for the outer step's write of a
// rank's local model when the model is larger than a cache could keep (outer_sgd's merge at alpha = 0).
//
// Why: a plain store first reads the line it writes into the cache, so writing a model that is not in cache
// costs a read and a write of it; a streaming store writes the line whole (what memcpy does for large copies;
// docs/diloco.md has what it saves a round). Below a few MiB the model stays in cache for the next inner
// step, which a streaming store would evict: hence outer_sgd::streamed_length.
//
// Streaming stores are weakly ordered: stream_fence() after the last one, before another thread may read them.
// SSE2 (every x86-64); elsewhere plain copies, and the fence does nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace commsgd::inline v1::sync::detail {

// Whether streaming stores can write from dst + head on (a CPU with them; dst a float array), head being
// set to the values before dst's first 16-byte boundary.
inline bool can_stream(const float* dst, std::size_t& head) noexcept {
#if defined(__SSE2__)
  const auto at = reinterpret_cast<std::uintptr_t>(dst);
  if (at % sizeof(float) != 0) return false;
  head = (16 - at % 16) % 16 / sizeof(float);
  return true;
#else
  (void)dst;
  (void)head;
  return false;
#endif
}

// dst[0, 64) <- src[0, 64), dst 16-byte aligned.
inline void stream_64(float* __restrict dst, const float* __restrict src) noexcept {
#if defined(__SSE2__)
  for (std::size_t q = 0; q < 64; q += 4)
    _mm_stream_ps(dst + q, _mm_loadu_ps(src + q));
#else
  std::memcpy(dst, src, 64 * sizeof(float));
#endif
}

inline void stream_fence() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

} // namespace commsgd::inline v1::sync::detail
