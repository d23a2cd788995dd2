// A ReLU multilayer perceptron with softmax cross-entropy, like the DNN of the CSSGD paper, whose parameters
// and gradient are single flat float vectors: that is the shape commsgd's exchanges work on, so the trainer
// hands them over without packing.
#pragma once

#include "idx.hpp"

#include <Eigen/Core>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

namespace fmnist {

class mlp {
public:
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
  using map = Eigen::Map<matrix>;
  using cmap = Eigen::Map<const matrix>;
  using vec_map = Eigen::Map<Eigen::VectorXf>;
  using cvec_map = Eigen::Map<const Eigen::VectorXf>;

  // widths = {inputs, hidden..., classes}
  explicit mlp(std::vector<int> widths) : widths_(std::move(widths)) {
    std::size_t off = 0;
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      const std::size_t in = static_cast<std::size_t>(widths_[l]),
                        out = static_cast<std::size_t>(widths_[l + 1]);
      weight_off_.push_back(off);
      off += in * out;
      bias_off_.push_back(off);
      off += out;
    }
    size_ = off;
  }

  std::size_t parameter_count() const noexcept { return size_; }
  std::size_t layers() const noexcept { return weight_off_.size(); }
  int classes() const noexcept { return widths_.back(); }
  // Where layer l's parameters begin in the flat vector (the partitioned scheme orders by it).
  std::size_t layer_offset(std::size_t l) const { return weight_off_[l]; }
  // Parameters of each layer (weights and bias, contiguous), in forward order.
  std::vector<std::size_t> layer_sizes() const {
    std::vector<std::size_t> sizes;
    for (std::size_t l = 0; l < layers(); ++l)
      sizes.push_back((l + 1 < layers() ? weight_off_[l + 1] : size_) - weight_off_[l]);
    return sizes;
  }

  // He initialisation from a portable generator (mt19937 + Box-Muller), so one seed gives one model on every
  // standard library, which std::normal_distribution does not promise.
  void initialise(std::span<float> params, std::uint64_t seed) const {
    std::mt19937_64 gen(seed);
    auto uniform = [&] { return (static_cast<double>(gen() >> 11) + 0.5) * 0x1.0p-53; };
    for (float& p : params)
      p = 0.0f;
    for (std::size_t l = 0; l < layers(); ++l) {
      const double sd = std::sqrt(2.0 / widths_[l]);
      const std::size_t count =
          static_cast<std::size_t>(widths_[l]) * static_cast<std::size_t>(widths_[l + 1]);
      for (std::size_t i = 0; i < count; i += 2) {
        const double r = std::sqrt(-2.0 * std::log(uniform())), a = 6.283185307179586 * uniform();
        params[weight_off_[l] + i] = static_cast<float>(sd * r * std::cos(a));
        if (i + 1 < count) params[weight_off_[l] + i + 1] = static_cast<float>(sd * r * std::sin(a));
      }
    }
  }

  // Adds to `grad` the gradient of (sum of the losses of the samples `index[0..count)`) / `scale`, and
  // returns that sum of losses. Dividing by the global batch size here makes the ranks' contributions add up
  // to the batch mean, so an all-reduce sum is the whole step. `on_layer(l)`, when given, is called as soon
  // as layer l's slice of `grad` is final: last layer first, as backpropagation produces them.
  double gradient(std::span<const float> params, const dataset& data, const std::uint32_t* index,
                  std::size_t count, double scale, std::span<float> grad,
                  const std::function<void(std::size_t)>& on_layer = {}) {
    if (count == 0) {
      // Nothing to add, but a caller that waits for every layer still hears of each one.
      for (std::size_t l = layers(); on_layer && l-- > 0;)
        on_layer(l);
      return 0.0;
    }
    forward(params, data, index, count);
    const auto m = static_cast<Eigen::Index>(count);
    matrix& p = act_.back(); // softmax probabilities, classes x m
    double loss = 0.0;
    for (Eigen::Index j = 0; j < m; ++j) {
      const int y = data.labels[index[j]];
      loss -= std::log(std::max(p(y, j), 1e-30f));
      p(y, j) -= 1.0f;
    }
    delta_ = p * static_cast<float>(1.0 / scale);
    for (std::size_t l = layers(); l-- > 0;) {
      const auto in = widths_[l], out = widths_[l + 1];
      map gw(grad.data() + weight_off_[l], out, in);
      vec_map gb(grad.data() + bias_off_[l], out);
      gw.noalias() += delta_ * act_[l].transpose();
      gb.noalias() += delta_.rowwise().sum();
      if (on_layer) on_layer(l);
      if (l == 0) break;
      cmap w(params.data() + weight_off_[l], out, in);
      matrix back = w.transpose() * delta_;
      delta_ = (act_[l].array() > 0.0f).select(back, 0.0f);
    }
    return loss;
  }

  // Counts correct predictions on samples [first, first + count) in order.
  std::size_t correct(std::span<const float> params, const dataset& data, std::size_t first,
                      std::size_t count) {
    std::vector<std::uint32_t> index(count);
    for (std::size_t i = 0; i < count; ++i)
      index[i] = static_cast<std::uint32_t>(first + i);
    forward(params, data, index.data(), count);
    std::size_t hits = 0;
    for (Eigen::Index j = 0; j < static_cast<Eigen::Index>(count); ++j) {
      Eigen::Index best = 0;
      act_.back().col(j).maxCoeff(&best);
      hits += best == data.labels[index[static_cast<std::size_t>(j)]];
    }
    return hits;
  }

private:
  void forward(std::span<const float> params, const dataset& data, const std::uint32_t* index,
               std::size_t count) {
    const auto m = static_cast<Eigen::Index>(count);
    act_.resize(layers() + 1);
    act_[0].resize(widths_[0], m);
    for (Eigen::Index j = 0; j < m; ++j)
      act_[0].col(j) = cvec_map(data.images.data() + std::size_t{index[j]} * data.pixels, widths_[0]);
    for (std::size_t l = 0; l < layers(); ++l) {
      const auto in = widths_[l], out = widths_[l + 1];
      cmap w(params.data() + weight_off_[l], out, in);
      cvec_map b(params.data() + bias_off_[l], out);
      act_[l + 1].noalias() = w * act_[l];
      act_[l + 1].colwise() += b;
      if (l + 1 < layers()) act_[l + 1] = act_[l + 1].cwiseMax(0.0f);
    }
    // Softmax with the column maximum subtracted, so large logits cannot overflow exp.
    matrix& z = act_.back();
    for (Eigen::Index j = 0; j < m; ++j) {
      z.col(j).array() -= z.col(j).maxCoeff();
      z.col(j) = z.col(j).array().exp();
      z.col(j) /= z.col(j).sum();
    }
  }

  std::vector<int> widths_;
  std::vector<std::size_t> weight_off_, bias_off_;
  std::size_t size_ = 0;
  std::vector<matrix> act_; // activations per layer, features x samples; act_.back() holds probabilities
  matrix delta_;
};

} // namespace fmnist
