// The one entry to commsgd's CUDA code: selection (exact, radix, laplace_bisect, hierarchical, sampled),
// compaction, input validation, the top-k step with a host exchange (cuda::top_k), the device-resident
// step over many tensors (cuda::batched_top_k) and DiLoCo's round on device parameters
// (cuda::diloco_fragment, cuda::diloco_exchange) in namespace commsgd::cuda. Include it from .cu files only; no .hpp reaches
// it, so host-only builds never see CUDA.
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

#include <commsgd/cuda/batched_top_k.cuh>
#include <commsgd/cuda/compact.cuh>
#include <commsgd/cuda/diloco/exchange.cuh>
#include <commsgd/cuda/diloco/fragment.cuh>
#include <commsgd/cuda/error.cuh>
#include <commsgd/cuda/exact.cuh>
#include <commsgd/cuda/hierarchical.cuh>
#include <commsgd/cuda/laplace_bisect.cuh>
#include <commsgd/cuda/memory.cuh>
#include <commsgd/cuda/radix.cuh>
#include <commsgd/cuda/result.cuh>
#include <commsgd/cuda/sampled.cuh>
#include <commsgd/cuda/top_k.cuh>
#include <commsgd/cuda/validate.cuh>
