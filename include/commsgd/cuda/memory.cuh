// Owning device buffers and the carving of one caller-supplied workspace into aligned pieces.
#pragma once

#include <commsgd/cuda/error.cuh>

#include <cstddef>
#include <utility>

namespace commsgd::inline v1::cuda {

// Move-only owner of device memory; used by the convenience forms and by the tests, never inside a
// selection that the caller gave a workspace.
template <class T>
class device_buffer {
public:
  device_buffer() = default;
  explicit device_buffer(std::size_t count) : count_(count) {
    if (count > 0) check(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)), "cudaMalloc");
  }
  device_buffer(device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  device_buffer& operator=(device_buffer other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  ~device_buffer() {
    if (data_) cudaFree(data_);
  }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }

private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

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
    throw invalid_argument(commsgd::detail::concat("argument 'workspace_bytes' = ", workspace_bytes,
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
