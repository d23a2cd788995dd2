// The coding-scheme concept: which data blocks a rank computes, and how the block gradients of all ranks
// become the global sum.
//
// A scheme is bound to a communicator when it is made (it may split sub-communicators once, collectively).
// Each step a trainer
//   1. computes the gradient of every block in `my_blocks()` (sample counts from `block_sizes(batch)`),
//   2. calls `exchange(blocks, out)` on every rank, `blocks[j]` being the gradient of block `my_blocks()[j]`,
//      all of length out.size(); afterwards `out` holds the sum over all block_count() blocks, identical on
//      every rank.
// A gradient of the whole mini-batch is therefore `out`, not `out / n`: blocks partition the batch.
//
// Models (each checked against comm::archetype by a static_assert in its header):
//   coding::uncoded<C, Exchange>      1/n of the batch per rank; ring all-reduce, all-gather or unicasts
//   coding::cssgd<Combiner, C>        redundancy r, coded multicasts in (r+1)-groups (Algorithms 2-4)
//   coding::uncoded_shuffle<C>        the same redundancy, block segments sent by plain unicast
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/tags.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/validate.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace commsgd::inline v1::coding {

// What one exchange reports besides the sum.
struct exchange_result {
  // Values this rank clipped into a quantiser's range while encoding its own blocks (int32_sum only).
  std::uint64_t clipped = 0;
};

// Block gradients of one rank, in the order of my_blocks().
using block_gradients = std::span<const std::span<const float>>;

template <class S>
concept coding_scheme = comm::communicator<typename S::communicator_type> &&
    requires(S& s, const S& cs, block_gradients blocks, std::span<float> out, std::size_t batch) {
  { cs.block_count() } -> std::same_as<std::size_t>;
  { cs.my_blocks() } -> std::same_as<std::span<const std::size_t>>;
  { cs.block_sizes(batch) } -> std::same_as<std::vector<std::size_t>>;
  { s.exchange(blocks, out) } -> std::same_as<exchange_result>;
};

// Every scheme (and data_parallel before a step) checks its input the same way so that errors read the same whatever the scheme. The sizes
// alone first: data_parallel checks them before a step and leaves the one scan for finiteness to whichever
// part reads the values (a scheme's exchange, or a sparsifier's fused pass).
inline void check_block_sizes(block_gradients blocks, std::size_t expected_blocks, std::size_t d) {
  if (blocks.size() != expected_blocks)
    throw size_mismatch(commsgd::concat("argument 'blocks' holds ", blocks.size(),
                                        " block gradients; this rank computes ", expected_blocks,
                                        " blocks (my_blocks().size())"));
  for (std::size_t j = 0; j < blocks.size(); ++j)
    if (blocks[j].size() != d)
      throw size_mismatch(commsgd::concat("argument 'blocks[", j, "]' holds ", blocks[j].size(),
                                          " values; it must match out.size() = ", d));
}

namespace detail {

inline void check_blocks(block_gradients blocks, std::size_t expected_blocks, std::size_t d) {
  check_block_sizes(blocks, expected_blocks, d);
  for (std::size_t j = 0; j < blocks.size(); ++j) {
    const auto bad = select::find_non_finite(blocks[j]);
    if (bad.count != 0)
      throw non_finite(commsgd::concat("block gradient 'blocks[", j, "]'"), bad.count, bad.first);
  }
}

// Left-to-right float sum starting from -0.0f: -0.0f + x == x for every x, so the result is exactly the
// fold G_0 + G_1 + ... that a reader would write, signed zeros included.
inline constexpr float sum_identity = -0.0f;

// Fixed tags of the uncoded exchanges, in the range comm/tags.hpp keeps for them: an exchange completes
// every message before it returns, so it never overlaps itself, and no block is handed out there.
inline constexpr int unicast_tag = 30001;
inline constexpr int shuffle_tag = 30002;
static_assert(unicast_tag >= comm::fixed_tags_first && shuffle_tag <= comm::mpi_tag_limit);

template <class Requests>
void wait_all(Requests& requests) {
  for (auto& r : requests)
    r.wait();
}

} // namespace detail
} // namespace commsgd::inline v1::coding
