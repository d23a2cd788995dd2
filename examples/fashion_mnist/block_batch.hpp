// This rank's share of one step's batch under a coding scheme, for the straggler drivers (stragglers.cpp on
// thread ranks and a simulated network, stragglers_mpi.cpp on Open MPI): the epoch's shuffled order, the step's
// batch cut into the scheme's blocks, and the gradient of each block this rank holds, ready for
// coding::block_gradients. One home, so both programs train on the same samples in the same order.
#pragma once

#include "idx.hpp"
#include "mlp.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace fmnist {

class block_batch {
public:
  block_batch(std::size_t samples, std::uint64_t seed) : order_(samples), seed_(seed) {}

  // The gradients of this rank's blocks of step `step` (batch `batch` samples; each block's gradient scaled
  // so that the blocks of all ranks sum to the batch's mean), into views(). Returns the samples it took.
  template <class Dp>
  std::size_t compute(Dp& dp, mlp& net, std::span<const float> params, const dataset& train,
                      std::size_t batch, std::size_t step) {
    const std::size_t per_epoch = train.count / batch;
    if (step / per_epoch != epoch_) {
      epoch_ = step / per_epoch;
      shuffle_epoch(order_, seed_, epoch_);
    }
    const std::uint32_t* first = order_.data() + (step % per_epoch) * batch;
    const auto sizes = dp.block_sizes(batch);
    std::vector<std::size_t> offset(sizes.size() + 1, 0);
    for (std::size_t q = 0; q < sizes.size(); ++q)
      offset[q + 1] = offset[q] + sizes[q];
    const auto mine = dp.my_blocks();
    blocks_.resize(mine.size());
    views_.clear();
    std::size_t samples = 0;
    const double scale = static_cast<double>(batch) / static_cast<double>(dp.block_count());
    for (std::size_t j = 0; j < mine.size(); ++j) {
      blocks_[j].assign(params.size(), 0.0f);
      net.gradient(params, train, first + offset[mine[j]], sizes[mine[j]], scale, blocks_[j]);
      samples += sizes[mine[j]];
      views_.emplace_back(blocks_[j]);
    }
    return samples;
  }

  std::span<const std::span<const float>> views() const noexcept { return views_; }

private:
  std::vector<std::uint32_t> order_;
  std::uint64_t seed_;
  std::size_t epoch_ = static_cast<std::size_t>(-1);
  std::vector<std::vector<float>> blocks_;
  std::vector<std::span<const float>> views_;
};

} // namespace fmnist
