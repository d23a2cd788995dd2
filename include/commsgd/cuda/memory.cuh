// Owning device buffers and the carving of one caller-supplied workspace into aligned pieces.
#pragma once

#include <commsgd/cuda/error.cuh>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace commsgd::inline v1::cuda {

namespace detail {

// Where an owned_array's memory comes from: device memory, or page-locked host memory (the target of
// asynchronous device-to-host copies).
struct device_memory {};
struct pinned_memory {};

// Move-only owner of `count` elements of T (uninitialised) from Memory.
template <class T, class Memory>
class owned_array {
public:
  owned_array() = default;
  explicit owned_array(std::size_t count) : count_(count) {
    if (count == 0) return;
    void* p = nullptr;
    if constexpr (pinned)
      check(cudaMallocHost(&p, count * sizeof(T)), "cudaMallocHost");
    else
      check(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc");
    data_ = static_cast<T*>(p);
  }
  owned_array(owned_array&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  owned_array& operator=(owned_array other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  ~owned_array() {
    if (!data_) return;
    if constexpr (pinned)
      cudaFreeHost(data_);
    else
      cudaFree(data_);
  }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }

private:
  static constexpr bool pinned = std::is_same_v<Memory, pinned_memory>;
  static_assert(pinned || std::is_same_v<Memory, device_memory>, "Memory is device_memory or pinned_memory");
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

} // namespace detail

// Move-only owner of device memory; used by the convenience forms and by the tests, never inside a
// selection that the caller gave a workspace.
template <class T>
using device_buffer = detail::owned_array<T, detail::device_memory>;

namespace detail {

// 256 bytes keeps every piece aligned for vector loads and matches what cudaMalloc guarantees.
inline constexpr std::size_t workspace_alignment = 256;

// Hands out aligned pieces of one workspace. With a null base it only adds up the sizes, so the same code
// answers the size query and lays out the real run: the two can never disagree.
class workspace_carver {
public:
  explicit workspace_carver(void* base) : base_(static_cast<char*>(base)) {}
  template <class T>
  T* take(std::size_t count) {
    offset_ = round_up(offset_);
    T* piece = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += count * sizeof(T);
    return piece;
  }
  void* take_bytes(std::size_t bytes) { return take<char>(bytes); }
  // Never zero, so that a real run always passes a non-null workspace, as with CUB.
  std::size_t bytes() const noexcept { return offset_ == 0 ? workspace_alignment : round_up(offset_); }

private:
  static std::size_t round_up(std::size_t v) noexcept {
    return (v + workspace_alignment - 1) / workspace_alignment * workspace_alignment;
  }
  char* base_;
  std::size_t offset_ = 0;
};

// The CUB two-phase protocol: a null workspace asks for the size; a real one must be at least that big.
inline bool size_query(void* workspace, std::size_t& workspace_bytes, std::size_t needed) {
  if (workspace == nullptr) {
    workspace_bytes = needed;
    return true;
  }
  if (workspace_bytes < needed)
    throw invalid_argument(commsgd::concat("argument 'workspace_bytes' = ", workspace_bytes,
                                           " is outside the allowed range [", needed, ", inf)"));
  return false;
}

inline int multiprocessor_count() {
  int device = 0;
  int count = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

} // namespace detail
} // namespace commsgd::inline v1::cuda
