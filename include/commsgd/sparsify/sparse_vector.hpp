// sparse_vector: the (index, value) pairs a sparsifier sends, in index order, and the light views that
// sparsifiers hand to the exchange.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::sparsify {

// 32-bit indices halve the index bytes on the wire; 64-bit ones exist for vectors past 2^32 entries.
template <class I>
concept sparse_index = std::same_as<I, std::uint32_t> || std::same_as<I, std::uint64_t>;

// Whether every position of a vector of `length` entries is representable as an Index.
template <sparse_index Index>
constexpr bool index_fits(std::size_t length) noexcept {
  if constexpr (sizeof(Index) >= sizeof(std::size_t))
    return true;
  else
    return length <= std::size_t{std::numeric_limits<Index>::max()} + 1;
}

template <sparse_index Index>
void check_index_fits(std::size_t length) {
  if (!index_fits<Index>(length))
    throw invalid_argument(
        commsgd::concat("argument 'length' = ", length, " is outside the allowed range [0, ",
                        std::size_t{std::numeric_limits<Index>::max()} + 1, "] of ", sizeof(Index) * 8,
                        "-bit indices; use 64-bit indices (sparse_vector64, top_k<S, std::uint64_t>)"));
}

// One pair as it travels: packed so that a rank's message is one contiguous array.
template <sparse_index Index>
struct entry {
  Index index;
  float value;
};

// What a sparse sparsifier produced this step. Valid until its next step.
template <sparse_index Index = std::uint32_t>
struct sparse_view {
  std::size_t length = 0; // of the dense vector the pairs come from
  std::span<const Index> indices;
  std::span<const float> values;

  std::size_t size() const noexcept { return indices.size(); }
};

// What a dense sparsifier (sparsify::none) produced this step: the gradient itself.
struct dense_view {
  std::span<const float> values;

  std::size_t length() const noexcept { return values.size(); }
};

template <sparse_index Index = std::uint32_t>
class basic_sparse_vector {
public:
  using index_type = Index;

  basic_sparse_vector() = default;
  explicit basic_sparse_vector(std::size_t length) : length_(length) { check_index_fits<Index>(length); }

  std::size_t length() const noexcept { return length_; }
  std::size_t size() const noexcept { return indices_.size(); }
  bool empty() const noexcept { return indices_.empty(); }
  std::span<const Index> indices() const noexcept { return indices_; }
  std::span<const float> values() const noexcept { return values_; }

  void clear() noexcept {
    indices_.clear();
    values_.clear();
  }
  void reserve(std::size_t n) {
    indices_.reserve(n);
    values_.reserve(n);
  }

  // Unchecked: the hot path of compaction, which produces ascending in-range indices by construction.
  void push_back_unchecked(Index i, float v) {
    indices_.push_back(i);
    values_.push_back(v);
  }

  // Checked append for hand-built vectors: indices must rise strictly and stay below length().
  void push_back(Index i, float v) {
    if (static_cast<std::size_t>(i) >= length_ || (!indices_.empty() && i <= indices_.back()))
      throw invalid_argument(commsgd::concat(
          "argument 'index' = ", i, " must be below length ", length_, " and above the last index ",
          indices_.empty() ? std::string("(none)") : std::to_string(indices_.back())));
    push_back_unchecked(i, v);
  }

  sparse_view<Index> view() const noexcept { return {length_, indices_, values_}; }

  // dense[i] += value for every pair: how a receiver applies one message.
  void add_to(std::span<float> dense) const {
    if (dense.size() != length_)
      throw size_mismatch(commsgd::concat("argument 'dense' has ", dense.size(),
                                          " elements, the sparse vector's length is ", length_));
    for (std::size_t j = 0; j < indices_.size(); ++j)
      dense[indices_[j]] += values_[j];
  }

private:
  std::size_t length_ = 0;
  std::vector<Index> indices_;
  std::vector<float> values_;
};

using sparse_vector = basic_sparse_vector<std::uint32_t>;
using sparse_vector64 = basic_sparse_vector<std::uint64_t>;

} // namespace commsgd::inline v1::sparsify
