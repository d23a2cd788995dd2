// The one entry to commsgd's CUDA code; include it from .cu files only. No .hpp reaches it, so host-only
// builds never see CUDA. Its folders are floors, each including only the ones below it:
//   diloco/   DiLoCo's round on device parameters: cuda::diloco_fragment, cuda::diloco_exchange
//   batched/  the device-resident top-k step over many tensors: cuda::batched_top_k
//   select/   the selections (exact, radix, laplace_bisect, hierarchical, sampled), compaction, the NaN/inf
//             check, and the top-k step with a host exchange (cuda::top_k) built on them
//   engine/   the search every select/ method strings together: state, kernels, dispatch, tuning
//   error.cuh, memory.cuh, result.cuh: what every floor shares (exceptions, device buffers and workspace,
//             the result record and its non-finite convention)
//
// Namespaces: every public name of every floor is in commsgd::cuda, so users write cuda::radix or
// cuda::batched_top_k whatever the folder, and a cuda::select would hide commsgd::select (the host types the
// device selections return) inside commsgd::cuda. Internals go by floor: cuda::detail::diloco,
// cuda::detail::batched, and cuda::detail for select/, engine/ and the shared files, since the engine's
// states and passes are written per select/ method (CUB's agent layer to their dispatch): one search.
//
// Every selector has a two-phase form in the CUB manner,
//   s.select(nullptr, bytes, x, n, k, d_out, stream);  // size query
//   s.select(workspace, bytes, x, n, k, d_out, stream, pinned_out);
// that is stream-ordered and never synchronises the host (NaN/inf are counted into the device_result, and
// to_threshold() raises commsgd::non_finite where the caller reads it), and an allocating form
//   commsgd::select::threshold t = s.select(x, n, k, stream);
// that synchronises the stream once, to return the result.
#pragma once

#if !defined(__CUDACC__)
#error "commsgd/cuda.cuh is CUDA code: include it from a .cu file compiled by nvcc"
#endif

#include <commsgd/cuda/error.cuh>
#include <commsgd/cuda/memory.cuh>
#include <commsgd/cuda/result.cuh>

#include <commsgd/cuda/select/compact.cuh>
#include <commsgd/cuda/select/exact.cuh>
#include <commsgd/cuda/select/hierarchical.cuh>
#include <commsgd/cuda/select/laplace_bisect.cuh>
#include <commsgd/cuda/select/radix.cuh>
#include <commsgd/cuda/select/sampled.cuh>
#include <commsgd/cuda/select/top_k.cuh>
#include <commsgd/cuda/select/validate.cuh>

#include <commsgd/cuda/batched/top_k.cuh>

#include <commsgd/cuda/diloco/exchange.cuh>
#include <commsgd/cuda/diloco/fragment.cuh>
