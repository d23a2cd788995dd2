// compact: the selected set of a threshold as (index, value) pairs in index order.
//
// Selected: {i : |x_i| > value} plus the first `at` indices with |x_i| == value, as the contract says; so the
// pairs are the same on CPU and GPU. Two reads of x (count per tile, then write) and two scans of the tile
// counts; no host synchronisation. Indices are uint32 (for n < 2^32) or uint64, as the caller chooses.
#pragma once

#include <commsgd/cuda/memory.cuh>
#include <commsgd/cuda/select/compact_kernels.cuh>

#include <cub/device/device_scan.cuh>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace commsgd::inline v1::cuda {

// Writes at most `capacity` pairs; *d_count (device) receives the size of the selected set, which may exceed
// capacity when the caller sized the output too small (nothing is written past capacity).
template <class Index>
requires(std::is_same_v<Index, std::uint32_t> || std::is_same_v<Index, std::uint64_t>) void compact(
    void* workspace, std::size_t& workspace_bytes, const float* x, std::size_t n,
    const device_result* d_threshold, Index* out_index, float* out_value, std::size_t capacity,
    unsigned long long* d_count, cudaStream_t stream = nullptr) {
  using detail::u64;
  const std::size_t tiles = (n + detail::compact_tile - 1) / detail::compact_tile;
  std::size_t scan_bytes = 0;
  if (tiles > 0)
    check(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<u64*>(nullptr),
                                        static_cast<u64*>(nullptr), static_cast<std::int64_t>(tiles), stream),
          "cub::DeviceScan::ExclusiveSum(size)");
  detail::workspace_carver carver(workspace);
  u64* tile_above = carver.take<u64>(tiles);
  u64* tile_ties = carver.take<u64>(tiles);
  u64* above_before = carver.take<u64>(tiles);
  u64* ties_before = carver.take<u64>(tiles);
  void* scan_storage = carver.take_bytes(scan_bytes);
  if (detail::size_query(workspace, workspace_bytes, carver.bytes())) return;
  if (std::is_same_v<Index, std::uint32_t> && n > std::numeric_limits<std::uint32_t>::max())
    throw invalid_argument(commsgd::concat("argument 'n' = ", n,
                                           " is outside the allowed range of uint32 indices [0, 2^32 - 1]"));
  if (d_threshold == nullptr || d_count == nullptr)
    throw invalid_argument("argument 'd_threshold' or 'd_count' is null");
  if (tiles == 0) {
    check(cudaMemsetAsync(d_count, 0, sizeof *d_count, stream), "cudaMemsetAsync");
    return;
  }
  if (tiles > std::numeric_limits<int>::max())
    throw invalid_argument("argument 'n' is too large for one grid");
  const unsigned grid = static_cast<unsigned>(tiles);
  detail::compact_count_kernel<>
      <<<grid, detail::block_threads, 0, stream>>>(x, n, d_threshold, tile_above, tile_ties);
  check_launch("compact_count_kernel");
  check(cub::DeviceScan::ExclusiveSum(scan_storage, scan_bytes, tile_above, above_before,
                                      static_cast<std::int64_t>(tiles), stream),
        "cub::DeviceScan::ExclusiveSum");
  check(cub::DeviceScan::ExclusiveSum(scan_storage, scan_bytes, tile_ties, ties_before,
                                      static_cast<std::int64_t>(tiles), stream),
        "cub::DeviceScan::ExclusiveSum");
  detail::compact_write_kernel<Index><<<grid, detail::block_threads, 0, stream>>>(
      x, n, d_threshold, above_before, ties_before, out_index, out_value, capacity, d_count);
  check_launch("compact_write_kernel");
}

// Allocating form (workspace only; the caller owns the outputs). Does not synchronise.
template <class Index>
void compact(const float* x, std::size_t n, const device_result* d_threshold, Index* out_index,
             float* out_value, std::size_t capacity, unsigned long long* d_count,
             cudaStream_t stream = nullptr) {
  std::size_t bytes = 0;
  compact<Index>(nullptr, bytes, x, n, d_threshold, out_index, out_value, capacity, d_count, stream);
  void* ws = nullptr;
  check(cudaMallocAsync(&ws, bytes, stream), "cudaMallocAsync");
  try {
    compact<Index>(ws, bytes, x, n, d_threshold, out_index, out_value, capacity, d_count, stream);
  } catch (...) {
    cudaFreeAsync(ws, stream);
    throw;
  }
  check(cudaFreeAsync(ws, stream), "cudaFreeAsync");
}

} // namespace commsgd::inline v1::cuda
