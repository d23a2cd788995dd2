// exact: CUB radix sort of all magnitude keys; the reference and the slow anchor (about 8 passes of 4N
// bytes plus the key copy).
#pragma once

#include <commsgd/cuda/engine/dispatch.cuh>
#include <commsgd/cuda/select/exact_kernels.cuh>

#include <cub/device/device_radix_sort.cuh>

namespace commsgd::inline v1::cuda {

struct exact {
  static constexpr bool is_exact = true;
  static constexpr const char* name = "exact";

  void select(void* workspace, std::size_t& workspace_bytes, const float* x, std::size_t n, std::size_t k,
              device_result* out, cudaStream_t stream = nullptr, device_result* host_out = nullptr) const {
    std::size_t sort_bytes = 0;
    if (n > 0)
      check(cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, static_cast<detail::u32*>(nullptr),
                                           static_cast<detail::u32*>(nullptr), n, 0, detail::key_bits,
                                           stream),
            "cub::DeviceRadixSort::SortKeys(size)");
    detail::workspace_carver carver(workspace);
    // The engine's buffers are only used for the state and the k == 0 path: no candidates.
    detail::engine_workspace<detail::exact_state> w{};
    w.state = carver.take<detail::exact_state>(1);
    w.hist = carver.take<detail::u64>(detail::hist_bins);
    w.edge = carver.take<detail::u64>(detail::hist_bins);
    auto* keys = carver.take<detail::u32>(n);
    auto* sorted = carver.take<detail::u32>(n);
    void* sort_storage = carver.take_bytes(sort_bytes);
    if (detail::select_prologue(w, workspace, workspace_bytes, carver.bytes(), x, n, k, out, host_out,
                                stream))
      return;
    detail::launch_init(w, detail::initial_state<detail::exact_state>(n, k), stream);
    detail::magnitude_keys_kernel<>
        <<<detail::grid_for(n), detail::block_threads, 0, stream>>>(x, keys, w.state);
    check_launch("magnitude_keys_kernel");
    check(cub::DeviceRadixSort::SortKeys(sort_storage, sort_bytes, keys, sorted, n, 0, detail::key_bits,
                                         stream),
          "cub::DeviceRadixSort::SortKeys");
    detail::sorted_threshold_kernel<><<<1, 1, 0, stream>>>(sorted, w.state);
    check_launch("sorted_threshold_kernel");
    detail::launch_finalize(w, out, nullptr, host_out, stream);
  }

  commsgd::select::threshold select(const float* x, std::size_t n, std::size_t k,
                                    cudaStream_t stream = nullptr) const {
    return detail::select_allocating(*this, x, n, k, stream);
  }
};

} // namespace commsgd::inline v1::cuda
