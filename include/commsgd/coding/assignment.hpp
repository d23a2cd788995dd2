// Which node computes which data block in CSSGD.
//
// With n nodes and redundancy r the mini-batch is cut into P = C(n, r) blocks; block q belongs to the q-th
// r-subset of the nodes in lexicographic order, so every block is computed by exactly r nodes and node i
// computes mu = C(n-1, r-1) blocks. r = 1 is plain data parallelism (block i on node i).
//
// Block sizes are equal by default. Optional per-node weights (relative speeds) size the blocks so that a
// node's work, the sum of its blocks, is proportional to its weight: with W the total weight, block S gets
//   max(0, sum_{i in S} w_i - (r-1)/(n-1) * W)
// (normalised). Summed over the blocks of node i this is proportional to w_i exactly, unless some block
// had to be clipped at 0 (very uneven weights), in which case it is the closest non-negative choice of this
// form. With r = n there is one block and nothing to balance.
#pragma once

#include <commsgd/coding/subsets.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <unordered_map>
#include <vector>

namespace commsgd::inline v1::coding {

// Enumerating blocks and groups costs memory and set-up time linear in their number; past this many a
// configuration is a mistake, not a workload.
inline constexpr std::uint64_t max_blocks = std::uint64_t{1} << 20;

// The limits every coding scheme (and the cost of one, cost/) puts on n nodes and redundancy r: 1 <= n <=
// max_nodes, 1 <= r <= n, and at most max_blocks blocks and groups.
inline void check_nodes_and_redundancy(int n, int r) {
  commsgd::check_range("n", n, 1, max_nodes, commsgd::concat("[1, ", max_nodes, "]"));
  commsgd::check_range("r", r, 1, n, commsgd::concat("[1, n = ", n, "]"));
  const auto p = binomial(n, r);
  const auto g = binomial(n, r + 1);
  if (p > max_blocks || g > max_blocks)
    throw invalid_argument(commsgd::concat("arguments n = ", n, ", r = ", r, " give C(n, r) = ", p,
                                           " blocks and C(n, r+1) = ", g, " groups; at most ", max_blocks,
                                           " of each are supported"));
}

// Where one node finds each block during an exchange: a block it computes is blocks[held[q]] of what it
// passes in; a block it receives lands in slot lacking[q] of its receive buffer.
struct block_slots {
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> held;    // block -> index in blocks_of(node), or none
  std::vector<std::size_t> lacking; // block -> slot among the received blocks, or none
  std::size_t lacking_count = 0;
  bool holds(std::size_t q) const noexcept { return held[q] != none; }
};

class assignment {
public:
  assignment(int n, int r, std::span<const double> weights = {}) : n_(n), r_(r) {
    check_nodes_and_redundancy(n, r);
    blocks_ = subsets_lex(n, r);
    index_.reserve(blocks_.size());
    for (std::size_t q = 0; q < blocks_.size(); ++q)
      index_.emplace(blocks_[q], q);
    per_node_.resize(static_cast<std::size_t>(n));
    for (std::size_t q = 0; q < blocks_.size(); ++q)
      for (int i : members(blocks_[q]))
        per_node_[static_cast<std::size_t>(i)].push_back(q);
    set_shares(weights);
  }

  int nodes() const noexcept { return n_; }
  int redundancy() const noexcept { return r_; }
  std::size_t block_count() const noexcept { return blocks_.size(); }

  // The r nodes that compute block q.
  node_set holders(std::size_t q) const { return blocks_.at(q); }

  // The blocks node i computes, ascending.
  std::span<const std::size_t> blocks_of(int node) const {
    commsgd::check_range("node", node, 0, n_ - 1, commsgd::concat("[0, n - 1 = ", n_ - 1, "]"));
    return per_node_[static_cast<std::size_t>(node)];
  }

  block_slots slots_of(int node) const {
    block_slots s;
    s.held.assign(block_count(), block_slots::none);
    s.lacking.assign(block_count(), block_slots::none);
    const auto mine = blocks_of(node);
    for (std::size_t j = 0; j < mine.size(); ++j)
      s.held[mine[j]] = j;
    for (std::size_t q = 0; q < block_count(); ++q)
      if (!s.holds(q)) s.lacking[q] = s.lacking_count++;
    return s;
  }

  // The block held by exactly the nodes of s.
  std::size_t index_of(node_set s) const {
    auto it = index_.find(s);
    if (it == index_.end())
      throw invalid_argument(commsgd::concat("node set ", s, " is not an ", r_, "-subset of ", n_, " nodes"));
    return it->second;
  }

  // Fraction of the mini-batch in each block; they sum to 1.
  std::span<const double> shares() const noexcept { return shares_; }

  // Samples per block for a mini-batch of `batch` samples: non-negative, summing to `batch` exactly.
  std::vector<std::size_t> block_sizes(std::size_t batch) const {
    std::vector<std::size_t> sizes(blocks_.size());
    if (equal_) {
      const std::uint64_t p = blocks_.size();
      for (std::size_t q = 0; q < blocks_.size(); ++q)
        sizes[q] = static_cast<std::size_t>(batch * (q + 1) / p - batch * q / p);
      return sizes;
    }
    // Cumulative rounding: no block drifts more than one sample from its share and the total is exact.
    double cumulative = 0;
    std::size_t given = 0;
    for (std::size_t q = 0; q < blocks_.size(); ++q) {
      cumulative += shares_[q];
      auto upto = q + 1 == blocks_.size() ? batch
                                          : std::min(batch, static_cast<std::size_t>(std::llround(
                                                                cumulative * static_cast<double>(batch))));
      upto = std::max(upto, given);
      sizes[q] = upto - given;
      given = upto;
    }
    return sizes;
  }

private:
  void set_shares(std::span<const double> w) {
    const std::size_t p = blocks_.size();
    shares_.assign(p, 1.0 / static_cast<double>(p));
    equal_ = true;
    if (w.empty()) return;
    if (w.size() != static_cast<std::size_t>(n_))
      throw size_mismatch(commsgd::concat("argument 'weights' holds ", w.size(),
                                          " values; it must hold one per node, n = ", n_));
    for (std::size_t i = 0; i < w.size(); ++i)
      if (!(std::isfinite(w[i]) && w[i] > 0))
        throw invalid_argument(commsgd::concat("argument 'weights[", i, "]' = ", w[i],
                                               " is outside the allowed range (0, inf)"));
    if (r_ == n_) return;
    double total = 0;
    for (double x : w)
      total += x;
    const double offset = r_ == 1 ? 0.0 : (r_ - 1) * total / (n_ - 1);
    std::vector<double> raw(p);
    double sum = 0;
    for (std::size_t q = 0; q < p; ++q) {
      double s = 0;
      for (int i : members(blocks_[q]))
        s += w[static_cast<std::size_t>(i)];
      raw[q] = std::max(0.0, s - offset);
      sum += raw[q];
    }
    if (!(sum > 0)) return;
    for (std::size_t q = 0; q < p; ++q)
      shares_[q] = raw[q] / sum;
    equal_ = false;
  }

  int n_;
  int r_;
  std::vector<node_set> blocks_;
  std::unordered_map<node_set, std::size_t> index_;
  std::vector<std::vector<std::size_t>> per_node_;
  std::vector<double> shares_;
  bool equal_ = true;
};

} // namespace commsgd::inline v1::coding
