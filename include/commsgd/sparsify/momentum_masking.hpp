// sparsify::momentum_masking: what momentum correction does with the local momentum at a sent coordinate,
// shared by the host step (sparsify/top_k.hpp) and the device step (cuda/select/top_k.cuh).
#pragma once

#include <commsgd/config.hpp>

#include <cstdint>

namespace commsgd::inline v1::sparsify {

enum class momentum_masking : std::uint8_t {
  keep, // u runs on: the sent values plus the residual are momentum SGD's updates exactly
  dgc,  // DGC's momentum factor masking: u is zeroed where sent (the default; top_k.hpp says why)
};

} // namespace commsgd::inline v1::sparsify
