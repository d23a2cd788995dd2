// Per-node bytes of one PowerSGD round (compress/powersgd.hpp) under comm::metered's accounting.
//
// A round is three ring all-reduces of floats, each skipped when empty: the layers left dense in one flat
// buffer, then every compressed layer's P (rows x r) in one buffer, then every Q (cols x r) in one buffer.
// So the payload is 4 (D + sum_l r_l (rows_l + cols_l)) bytes, D the dense element count, which is also what
// PyTorch's powerSGD_hook hands its three all-reduces for the same bucket; on the ring each rank sends and
// receives about 2 (n - 1) / n of it (comm::ring_all_reduce_traffic gives the exact split per rank).
#pragma once

#include <commsgd/comm/traffic.hpp>
#include <commsgd/compress/powersgd_plan.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/sparse.hpp>

#include <cstdint>

namespace commsgd::inline v1::cost {

// Bytes handed to the all-reduces by one rank in one round (the sum of the three buffers' sizes).
inline std::uint64_t powersgd_payload_bytes(const compress::powersgd_plan& plan) noexcept {
  return 4 * (static_cast<std::uint64_t>(plan.dense_size) + plan.p_size + plan.q_size);
}

// What `rank` of `n` sends and receives in one round. An empty buffer's all-reduce is skipped, so it costs
// no messages either.
inline comm::traffic powersgd_traffic(const compress::powersgd_plan& plan, int n, int rank) noexcept {
  comm::traffic t;
  for (std::uint64_t size :
       {std::uint64_t{plan.dense_size}, std::uint64_t{plan.p_size}, std::uint64_t{plan.q_size}})
    if (size > 0) t += dense_ring_traffic(size, n, rank);
  return t;
}

// The same for a dense all-reduce of the whole gradient, the reference a compression rate is read against.
inline comm::traffic powersgd_dense_reference(const compress::powersgd_plan& plan, int n, int rank) noexcept {
  return dense_ring_traffic(plan.length, n, rank);
}

} // namespace commsgd::inline v1::cost
