// coding::gradient_code<Kind>: straggler-tolerant exact gradients by gradient coding, the arithmetic only:
// who holds which block, what each node sends, how a sum is decoded from the nodes that answered. The
// exchange that carries it is sync/first_arrivals.hpp (or, without stragglers,
// coding/gradient_code_scheme.hpp).
//
// n nodes, redundancy r, s = r - 1 stragglers tolerated. The batch is cut into n equal blocks and every
// block is held by r nodes, so any n - s nodes hold every block between them. Each node sends one vector of
// d values (whatever r is) and the sum of all n block gradients is decoded from any n - s of those vectors.
//
// Kinds:
//   fractional_repetition  n divisible by r. Nodes form n / r groups of r consecutive ranks; every member of
//                          group g holds blocks g r, ..., g r + r - 1 and sends their sum, folded in block
//                          order from -0.0f, so every member of a group sends the same bits. The decoder takes
//                          one sender per group (the lowest-ranked that answered) and folds the group sums in
//                          group order: the result is the same float bits whichever n - s nodes answered.
//   cyclic                 any n. Node i holds blocks i, i+1, ..., i+s (mod n) and sends the combination
//                          sum_j B[i][j] G_j, computed in double and rounded once to float. B is Tandon et
//                          al.'s cyclic construction: a fixed pseudo-random s x n matrix H with H 1 = 0, and
//                          row i of B (support i..i+s, B[i][i] = 1) chosen in H's null space, so any n - s
//                          rows of B span that (n - s)-dimensional space, which holds the all-ones vector.
//                          The decoder solves B_F^T a = 1 in double (Householder least squares, coding/solve.hpp) for the
//                          lowest n - s responders F and returns sum_k a_k c_k rounded to float. Per value e,
//                          with S the exact sum of the block gradients, c the vectors sent and rho the
//                          decoding vector's residual max_j |sum_k a_k B[k][j] - 1|:
//                            |out[e] - S[e]| <= 2^-23 (|S[e]| + sum_k |a_k| |c_k[e]|)
//                                               + (rho + 2^-46 max_k |a_k|) sum_j |G_j[e]|
//                                               + 2^-149 (1 + sum_k |a_k|)
//                          The last term is underflow: a float rounding is relative only down to the
//                          normal range; below it (subnormal c_k or out) each rounding may be off by half
//                          the subnormal spacing 2^-149 whatever the value, once per c_k (scaled by |a_k|
//                          in the decoding) and once for out. (error_bound() evaluates it;
//                          tests/unit/coding_gradient_code.cpp checks it, subnormal blocks included.)
//   backup_workers         the uncoded baseline: r is only how many answers it waits for (n - r + 1);
//                          node i holds block i alone. The decoder sums the gradients that arrived, in rank
//                          order, and scales by n / (number summed): an estimate of the full sum that drops
//                          the stragglers' data, exact only when every node answered.
//
// Nodes are ranks 0..n-1 of one communicator; sets of them are coding::node_set masks (coding/subsets.hpp).
#pragma once

#include <commsgd/coding/scheme.hpp>
#include <commsgd/coding/solve.hpp>
#include <commsgd/coding/subsets.hpp>
#include <commsgd/error.hpp>
#include <commsgd/mix.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <unordered_map>
#include <vector>

namespace commsgd::inline v1::coding {

struct fractional_repetition {};
struct cyclic {};
struct backup_workers {};

template <class K>
concept gradient_code_kind =
    std::same_as<K, fractional_repetition> || std::same_as<K, cyclic> || std::same_as<K, backup_workers>;

template <gradient_code_kind Kind>
inline constexpr const char* gradient_code_name =
    std::same_as<Kind, fractional_repetition> ? "fractional_repetition"
    : std::same_as<Kind, cyclic>              ? "cyclic"
                                              : "backup_workers";

// Fewer nodes answered than the code needs. Every rank of the exchange throws it for the same round.
class stragglers_exceeded : public error {
public:
  stragglers_exceeded(const std::string& what, std::uint64_t round, int answered, int needed)
      : error(what), round_(round), answered_(answered), needed_(needed) {}
  std::uint64_t round() const noexcept { return round_; }
  int answered() const noexcept { return answered_; }
  int needed() const noexcept { return needed_; }

private:
  std::uint64_t round_;
  int answered_;
  int needed_;
};

template <gradient_code_kind Kind>
class gradient_code {
public:
  using kind_type = Kind;

  gradient_code(int n, int r) : n_(n), r_(r) {
    commsgd::check_range("n", n, 1, max_nodes, commsgd::concat("[1, ", max_nodes, "]"));
    commsgd::check_range("r", r, 1, n, commsgd::concat("[1, n = ", n, "]"));
    if constexpr (std::same_as<Kind, fractional_repetition>)
      if (n % r != 0)
        throw invalid_argument(commsgd::concat("argument 'r' = ", r, " must divide n = ", n,
                                               " for a fractional repetition code (groups of r nodes); "
                                               "use the cyclic code for any r in [1, n]"));
    blocks_.resize(static_cast<std::size_t>(n));
    holders_.assign(static_cast<std::size_t>(n), 0);
    for (int i = 0; i < n; ++i) {
      auto& mine = blocks_[static_cast<std::size_t>(i)];
      if constexpr (std::same_as<Kind, fractional_repetition>) {
        const int g = i / r;
        for (int j = 0; j < r; ++j)
          mine.push_back(static_cast<std::size_t>(g * r + j));
      } else if constexpr (std::same_as<Kind, cyclic>) {
        for (int j = 0; j < r; ++j)
          mine.push_back(static_cast<std::size_t>((i + j) % n));
        std::sort(mine.begin(), mine.end());
      } else {
        mine.push_back(static_cast<std::size_t>(i));
      }
      for (std::size_t q : mine)
        holders_[q] |= node_bit(i);
    }
    if constexpr (std::same_as<Kind, cyclic>) build_cyclic();
  }

  int nodes() const noexcept { return n_; }
  int redundancy() const noexcept { return r_; }
  // Nodes that may be missing from a round: s = r - 1.
  int stragglers() const noexcept { return r_ - 1; }
  // Answers a decode needs: n - s.
  int needed() const noexcept { return n_ - r_ + 1; }
  std::size_t block_count() const noexcept { return static_cast<std::size_t>(n_); }

  // The blocks node i computes, ascending.
  std::span<const std::size_t> blocks_of(int node) const {
    check_node(node);
    return blocks_[static_cast<std::size_t>(node)];
  }
  node_set holders(std::size_t q) const { return holders_.at(q); }

  // Samples per block for a batch: equal shares by cumulative rounding, summing to `batch` exactly.
  std::vector<std::size_t> block_sizes(std::size_t batch) const {
    std::vector<std::size_t> sizes(static_cast<std::size_t>(n_));
    const auto p = static_cast<std::uint64_t>(n_);
    for (std::size_t q = 0; q < sizes.size(); ++q)
      sizes[q] = static_cast<std::size_t>(batch * (q + 1) / p - batch * q / p);
    return sizes;
  }

  // B[i][j]: the weight of block j in node i's vector (0 where i does not hold j).
  double coefficient(int node, std::size_t block) const {
    check_node(node);
    if (block >= block_count())
      throw invalid_argument(commsgd::concat("argument 'block' = ", block,
                                             " is outside the allowed range [0, n - 1 = ", n_ - 1, "]"));
    if (!contains(holders_[block], node)) return 0.0;
    if constexpr (std::same_as<Kind, cyclic>) return b_[static_cast<std::size_t>(node * n_) + block];
    return 1.0;
  }

  // out <- node's vector from its block gradients (blocks[j] of block blocks_of(node)[j]); checks sizes and
  // finiteness.
  void encode(int node, block_gradients blocks, std::span<float> out) const {
    const auto mine = blocks_of(node);
    const std::size_t d = out.size();
    detail::check_blocks(blocks, mine.size(), d);
    if constexpr (std::same_as<Kind, cyclic>) {
      const std::size_t row = static_cast<std::size_t>(node * n_);
      for (std::size_t e = 0; e < d; ++e) {
        double acc = 0;
        for (std::size_t j = 0; j < mine.size(); ++j)
          acc += b_[row + mine[j]] * static_cast<double>(blocks[j][e]);
        out[e] = static_cast<float>(acc);
      }
    } else {
      std::fill(out.begin(), out.end(), detail::sum_identity);
      for (std::size_t j = 0; j < mine.size(); ++j)
        for (std::size_t e = 0; e < d; ++e)
          out[e] += blocks[j][e];
    }
  }

  // The responders whose vectors a decode reads: one per group (fractional repetition), the lowest n - s
  // (cyclic), all of them (backup workers). Throws stragglers_exceeded when they cannot give the sum.
  node_set used(node_set responders) const {
    check_set(responders);
    if (set_size(responders) < needed()) throw too_few(responders);
    if constexpr (std::same_as<Kind, fractional_repetition>) {
      node_set u = 0;
      const node_set ones = r_ >= max_nodes ? ~node_set{0} : node_bit(r_) - 1;
      for (int g = 0; g < n_ / r_; ++g) {
        const node_set group = (ones << (g * r_)) & responders;
        if (group == 0) throw too_few(responders);
        u |= group & (~group + 1);
      }
      return u;
    } else if constexpr (std::same_as<Kind, cyclic>) {
      node_set u = 0;
      node_set rest = responders;
      for (int k = 0; k < needed(); ++k) {
        u |= rest & (~rest + 1);
        rest &= rest - 1;
      }
      return u;
    } else {
      return responders;
    }
  }

  // out <- the decoded sum. coded[k] is the vector of the k-th member of `responders` in ascending order;
  // members the decode does not use (used() says which) are not read and may be empty.
  void decode(node_set responders, std::span<const std::span<const float>> coded, std::span<float> out) {
    const node_set u = used(responders);
    if (coded.size() != static_cast<std::size_t>(set_size(responders)))
      throw size_mismatch(commsgd::concat("argument 'coded' holds ", coded.size(),
                                          " vectors; the responder set has ", set_size(responders),
                                          " members"));
    const std::size_t d = out.size();
    const auto who = members(responders);
    for (std::size_t k = 0; k < who.size(); ++k)
      if (contains(u, who[k]) && coded[k].size() != d)
        throw size_mismatch(commsgd::concat("argument 'coded[", k, "]' holds ", coded[k].size(),
                                            " values; it must match out.size() = ", d));
    if constexpr (std::same_as<Kind, cyclic>) {
      const auto& a = decoding_vector(responders);
      std::size_t used_k = 0;
      acc_.assign(d, 0.0);
      for (std::size_t k = 0; k < who.size(); ++k) {
        if (!contains(u, who[k])) continue;
        const double w = a[used_k++];
        for (std::size_t e = 0; e < d; ++e)
          acc_[e] += w * static_cast<double>(coded[k][e]);
      }
      for (std::size_t e = 0; e < d; ++e)
        out[e] = static_cast<float>(acc_[e]);
    } else {
      std::fill(out.begin(), out.end(), detail::sum_identity);
      for (std::size_t k = 0; k < who.size(); ++k)
        if (contains(u, who[k]))
          for (std::size_t e = 0; e < d; ++e)
            out[e] += coded[k][e];
      if constexpr (std::same_as<Kind, backup_workers>) {
        const int m = set_size(u);
        if (m != n_) {
          const float scale = static_cast<float>(static_cast<double>(n_) / static_cast<double>(m));
          for (float& v : out)
            v *= scale;
        }
      }
    }
  }

  // Cyclic only: a with sum_k a_k B[F_k][j] = 1 for every block j, F = used(responders) ascending.
  const std::vector<double>& decoding_vector(node_set responders) requires std::same_as<Kind, cyclic> {
    const node_set u = used(responders);
    auto it = cache_.find(u);
    if (it != cache_.end()) return it->second.a;
    const auto f = members(u);
    const int m = static_cast<int>(f.size());
    // B_F^T is n x m: column k is row F_k of B.
    std::vector<double> bt(static_cast<std::size_t>(n_ * m));
    for (int k = 0; k < m; ++k)
      for (int j = 0; j < n_; ++j)
        bt[static_cast<std::size_t>(k * n_ + j)] =
            b_[static_cast<std::size_t>(f[static_cast<std::size_t>(k)] * n_ + j)];
    std::vector<double> ones(static_cast<std::size_t>(n_), 1.0);
    auto a = detail::least_squares(bt, ones, n_, m);
    double rho = 0;
    for (int j = 0; j < n_; ++j) {
      double s = 0;
      for (int k = 0; k < m; ++k)
        s += a[static_cast<std::size_t>(k)] *
             b_[static_cast<std::size_t>(f[static_cast<std::size_t>(k)] * n_ + j)];
      rho = std::max(rho, std::abs(s - 1.0));
    }
    // B is built so that any n - s rows span the all-ones vector; a residual this large means they do not.
    if (!(rho < 1e-6))
      throw internal_error(commsgd::concat("cyclic gradient code n = ", n_, ", r = ", r_, ": responder set ",
                                           u, " gives a decoding residual of ", rho));
    auto& entry = cache_[u];
    entry.a = std::move(a);
    entry.residual = rho;
    return entry.a;
  }

  // Cyclic only: max_j |sum_k a_k B[F_k][j] - 1| of decoding_vector(responders).
  double decoding_residual(node_set responders) requires std::same_as<Kind, cyclic> {
    decoding_vector(responders);
    return cache_.at(used(responders)).residual;
  }

  // Cyclic only: the bound stated at the top on |out[e] - S[e]|, given S[e] (exact), the responders' values
  // c_k[e] (in responder order, as decode reads them) and sum_j |G_j[e]|.
  double error_bound(node_set responders, double exact_sum, std::span<const double> coded_e,
                     double abs_block_sum) requires std::same_as<Kind, cyclic> {
    const auto& a = decoding_vector(responders);
    const node_set u = used(responders);
    const auto who = members(responders);
    double weighted = 0, amax = 0, asum = 0;
    std::size_t used_k = 0;
    for (std::size_t k = 0; k < who.size(); ++k) {
      if (!contains(u, who[k])) continue;
      const double w = std::abs(a[used_k++]);
      weighted += w * std::abs(coded_e[k]);
      amax = std::max(amax, w);
      asum += w;
    }
    const double rho = cache_.at(u).residual;
    return std::ldexp(1.0, -23) * (std::abs(exact_sum) + weighted) +
           (rho + std::ldexp(1.0, -46) * amax) * abs_block_sum + std::ldexp(1.0, -149) * (1.0 + asum);
  }

private:
  struct decoding {
    std::vector<double> a;
    double residual = 0;
  };

  void check_node(int node) const {
    commsgd::check_range("node", node, 0, n_ - 1, commsgd::concat("[0, n - 1 = ", n_ - 1, "]"));
  }
  void check_set(node_set s) const {
    if (n_ < max_nodes && (s >> n_) != 0)
      throw invalid_argument(
          commsgd::concat("argument 'responders' = ", s, " names nodes outside [0, n - 1 = ", n_ - 1, "]"));
  }
  stragglers_exceeded too_few(node_set responders) const {
    return stragglers_exceeded(
        commsgd::concat(gradient_code_name<Kind>, " gradient code, n = ", n_, ", r = ", r_, ": ",
                        set_size(responders), " node(s) answered (set ", responders,
                        "), which do not hold every block; it tolerates at most s = ", stragglers(),
                        " missing"),
        0, set_size(responders), needed());
  }

  void build_cyclic() {
    const int s = r_ - 1;
    const auto n = static_cast<std::size_t>(n_);
    b_.assign(n * n, 0.0);
    if (s == 0) {
      for (std::size_t i = 0; i < n; ++i)
        b_[i * n + i] = 1.0;
      return;
    }
    // H: s x n, entries uniform in [-1, 1) from a fixed stream, last column making every row sum to 0. A
    // draw whose small systems are singular is measure-zero; the next stream is taken if one occurs.
    for (std::uint64_t attempt = 0;; ++attempt) {
      std::vector<double> h(static_cast<std::size_t>(s) * n);
      for (int row = 0; row < s; ++row) {
        double sum = 0;
        for (int j = 0; j + 1 < n_; ++j) {
          // A fixed stream, so that every rank builds the same B without communicating.
          const auto bits = commsgd::mix64((attempt << 40) ^ (static_cast<std::uint64_t>(row) << 20) ^
                                           static_cast<std::uint64_t>(j) ^ 0x67c0deull);
          const double v = static_cast<double>(bits >> 11) * 0x1.0p-53 * 2.0 - 1.0;
          h[static_cast<std::size_t>(row) * n + static_cast<std::size_t>(j)] = v;
          sum += v;
        }
        h[static_cast<std::size_t>(row) * n + n - 1] = -sum;
      }
      bool ok = true;
      for (int i = 0; i < n_ && ok; ++i) {
        // Row i: B[i][i] = 1, and the s others on i+1..i+s solve H[:, those] x = -H[:, i].
        std::vector<double> m(static_cast<std::size_t>(s * s)), rhs(static_cast<std::size_t>(s));
        for (int row = 0; row < s; ++row) {
          rhs[static_cast<std::size_t>(row)] =
              -h[static_cast<std::size_t>(row) * n + static_cast<std::size_t>(i)];
          for (int c = 0; c < s; ++c)
            m[static_cast<std::size_t>(row * s + c)] =
                h[static_cast<std::size_t>(row) * n + static_cast<std::size_t>((i + 1 + c) % n_)];
        }
        ok = detail::solve_small(m, rhs, s);
        if (!ok) break;
        b_[static_cast<std::size_t>(i) * n + static_cast<std::size_t>(i)] = 1.0;
        for (int c = 0; c < s; ++c)
          b_[static_cast<std::size_t>(i) * n + static_cast<std::size_t>((i + 1 + c) % n_)] =
              rhs[static_cast<std::size_t>(c)];
      }
      if (ok) return;
      if (attempt > 64) throw internal_error("cyclic gradient code: no non-singular construction found");
    }
  }

  int n_;
  int r_;
  std::vector<std::vector<std::size_t>> blocks_;
  std::vector<node_set> holders_;
  std::vector<double> b_; // cyclic: n x n, row-major
  std::unordered_map<node_set, decoding> cache_;
  std::vector<double> acc_;
};

} // namespace commsgd::inline v1::coding
