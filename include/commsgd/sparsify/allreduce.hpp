// A sparse all-reduce whose per-node traffic does not grow with the number of ranks (after Ok-Topk).
//
// Each rank brings its local top-k message (pairs in rising index order) and the global count K. The
// index space [0, d) is cut into n contiguous regions; rank j owns region j. One exchange runs:
//   1. header    every rank sends every peer, point to point, its pair count, the length, its verdict on its
//                own input, the pairs it holds in that peer's region, K and its exchange count. Every rank
//                thus sees every verdict and raises the same error on bad input anywhere, before any pair
//                moves, and every owner learns how many pairs to expect from whom.
//   2. scatter   rank i sends its pairs of region j to owner j, point to point, in rotated order (round s
//                sends to i + s and receives from i - s), so no owner is the destination of every rank at
//                once. Ranks with nothing for an owner send nothing.
//   3. reduce    owner j sums the pairs of its region in rank order (rank 0's first), from +0: the sum of an
//                index is fl(...fl(fl(0 + v_a) + v_b)... + v_z) over the ranks a < b < ... < z that sent it,
//                whatever order the messages arrived in.
//   4. select    the global threshold t is the lower edge of the histogram bin (1/8 octave of magnitude)
//                in which the count of reduced sums from the top reaches K. The histogram is all-reduced
//                (integer counts, so every rank finds the same t) on the first exchange, every
//                refresh_steps exchanges, and on the exchange after one whose selection left
//                [K / drift, K drift]; in between t is reused (Ok-Topk reuses its threshold for many steps).
//                Owner j keeps the sums of its region with |sum| >= t.
//   5. gather    all_gather_v of the selected (index, sum) pairs. Owners go in rank order and regions rise
//                with the rank, so the gathered list is in rising index order; every rank writes it into
//                `out`, which is zero elsewhere: the same bits on every rank.
// What is applied and what goes back: a pair (i, v) of rank r is applied exactly when i was selected; the
// others are returned() to rank r, which hands them back to its error-feedback residual (top_k::
// restore_unsent). So, per rank r and index i, bit for bit: either v went into out[i]'s sum, or v is back in
// r's residual; out[i] is the rank-ordered sum of the applied values at i. If the exchange throws, every
// pair of the rank is in returned(), so nothing is lost.
// Region boundaries start even (d j / n) and are then set from the previous exchange's selection, which every
// rank holds: boundary q is the index of the selected pair at position q G / n of the G gathered, so each
// region held an equal share of what was last selected.
// Dense fallback: when cost/sparse_allreduce.hpp estimates from the announced counts that the dense ring
// moves fewer bytes (or path = dense), every rank densifies its own pairs and the ring all-reduce sums
// them; all pairs are then applied and none is returned.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/sparse.hpp>
#include <commsgd/cost/sparse_allreduce.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/sparsify/finite.hpp>
#include <commsgd/sparsify/sparse_exchange.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::sparsify {

struct allreduce_options {
  cost::sparse_path path = cost::sparse_path::automatic; // sparse, dense, or by the estimate
  std::uint64_t refresh_steps = 8; // [1, inf): the threshold is recomputed at least this often
  double drift = 2.0;              // [1, inf]: recompute early when the selection leaves [K / drift, K drift]
};

inline void validate(const allreduce_options& o) {
  if (o.refresh_steps < 1)
    throw invalid_argument(commsgd::concat("argument 'refresh_steps' = ", o.refresh_steps,
                                           " is outside the allowed range [1, inf)"));
  if (!(o.drift >= 1.0))
    throw invalid_argument(
        commsgd::concat("argument 'drift' = ", o.drift, " is outside the allowed range [1, inf]"));
}

// comm::exchange_report's fields (dense, the total and the per-rank counts of announced pairs) and what this
// exchange adds.
struct allreduce_report : comm::exchange_report {
  bool refreshed = false;                   // the threshold histogram was all-reduced this exchange
  std::uint32_t threshold_key = 0;          // t as a magnitude key (select/key.hpp)
  std::uint64_t selected_total = 0;         // G, pairs applied over all ranks
  std::uint64_t returned = 0;               // this rank's pairs handed back
  std::vector<std::uint64_t> sent_to;       // this rank's pairs per region (its own region included)
  std::vector<std::uint64_t> received_from; // pairs each rank held in this rank's region
  std::vector<std::uint64_t> selected;      // pairs each owner selected
  std::vector<std::uint64_t> bounds;        // the n + 1 region boundaries used

  cost::sparse_allreduce_shape shape() const noexcept {
    return {dense, refreshed, sent_to, received_from, selected};
  }
};

namespace detail {
inline constexpr int allreduce_header_tag = 31001;
inline constexpr int allreduce_pairs_tag = 31002;
// The header code of a rank whose sparsifier refused its gradient before the exchange (abandon()).
inline constexpr std::uint64_t allreduce_refused = 0xff;
} // namespace detail

template <sparse_index Index = std::uint32_t>
class allreducer {
public:
  explicit allreducer(allreduce_options opt = {}) : opt_(opt) { validate(opt_); }

  const allreduce_options& options() const noexcept { return opt_; }
  const allreduce_report& last() const noexcept { return rep_; }
  // This rank's pairs of the last exchange that were not applied, in rising index order.
  std::span<const Index> returned_indices() const noexcept { return back_idx_; }
  std::span<const float> returned_values() const noexcept { return back_val_; }
  // Sparse exchanges run so far (the history region boundaries and the threshold derive from).
  std::uint64_t history() const noexcept { return history_; }

  // Collective: takes part in the header round of an exchange this rank cannot join (its sparsifier refused
  // the gradient), so that every other rank raises comm_aborted instead of waiting for pairs that will not
  // come. The caller then throws its own error.
  template <comm::communicator C>
  void abandon(C& c, std::uint64_t length, std::uint64_t k_global) {
    const int n = c.size(), me = c.rank();
    constexpr std::size_t hf = cost::allreduce_header_fields;
    head_out_.assign(hf * static_cast<std::size_t>(n), 0);
    head_in_.assign(hf * static_cast<std::size_t>(n), 0);
    for (int j = 0; j < n; ++j) {
      auto* h = head_out_.data() + hf * static_cast<std::size_t>(j);
      h[1] = length;
      h[2] = detail::allreduce_refused;
      h[5] = k_global;
      h[6] = history_;
    }
    exchange_headers(c, n, me);
  }

  // Collective. out <- the sum of the selected pairs (see above), identical bits on every rank; k_global is
  // K and must agree on every rank.
  template <comm::communicator C>
  const allreduce_report& sum(C& c, sparse_view<Index> mine, std::uint64_t k_global, std::span<float> out) {
    const int n = c.size(), me = c.rank();
    const auto un = static_cast<std::size_t>(n), ume = static_cast<std::size_t>(me);
    // Until the exchange has succeeded, every pair counts as returned.
    back_idx_.assign(mine.indices.begin(), mine.indices.end());
    back_val_.assign(mine.values.begin(),
                     mine.values.begin() + std::min(mine.values.size(), mine.indices.size()));
    rep_ = allreduce_report{};
    rep_.counts.resize(un);

    std::uint64_t where = 0;
    const auto problem = detail::inspect_message(mine, out, where);
    const bool ok = problem == detail::message_problem::none;
    const std::uint64_t d = mine.length;
    if (bounds_.size() != un + 1 || bounds_.back() != d) even_bounds(n, d);
    // Pairs of region j are mine[offsets_[j], offsets_[j+1]); a rank with bad input sends none.
    offsets_.assign(un + 1, 0);
    for (std::size_t j = 0; j <= un; ++j)
      offsets_[j] =
          ok ? static_cast<std::size_t>(std::lower_bound(mine.indices.begin(), mine.indices.end(), bounds_[j],
                                                         [](Index a, std::uint64_t b) {
                                                           return static_cast<std::uint64_t>(a) < b;
                                                         }) -
                                        mine.indices.begin())
             : 0;
    if (ok) offsets_[un] = mine.size();

    // 1. Headers, one per peer.
    constexpr std::size_t hf = cost::allreduce_header_fields;
    head_out_.assign(hf * un, 0);
    head_in_.assign(hf * un, 0);
    for (std::size_t j = 0; j < un; ++j) {
      auto* h = head_out_.data() + hf * j;
      h[0] = ok ? mine.size() : 0;
      h[1] = d;
      h[2] = static_cast<std::uint64_t>(problem);
      h[3] = where;
      h[4] = offsets_[j + 1] - offsets_[j];
      h[5] = k_global;
      h[6] = history_;
    }
    exchange_headers(c, n, me);
    const std::uint64_t* h0 = head_in_.data();
    for (std::size_t r = 0; r < un; ++r) {
      const auto* h = head_in_.data() + hf * r;
      if (h[2] == detail::allreduce_refused)
        throw comm_aborted(commsgd::concat("sparse all-reduce: rank ", r,
                                           " refused its gradient before the exchange (that rank "
                                           "raised the reason)"));
      detail::raise_message_problem(static_cast<int>(r), me, h);
      agree(r, "length", h0[1], h[1]);
      agree(r, "k_global", h0[5], h[5]);
      agree(r, "exchange count", h0[6], h[6]);
      rep_.counts[r] = h[0];
      rep_.total += h[0];
    }
    rep_.bounds = bounds_;

    std::fill(out.begin(), out.end(), 0.0f);
    rep_.dense = cost::sparse_allreduce_uses_dense(opt_.path, rep_.counts, d, k_global, sizeof(entry<Index>));
    if (rep_.dense) {
      for (std::size_t j = 0; j < mine.size(); ++j)
        out[mine.indices[j]] = mine.values[j];
      c.all_reduce_sum(out);
      back_idx_.clear();
      back_val_.clear();
      return rep_;
    }

    // 2. Scatter the pairs to their owners.
    packed_.resize(mine.size());
    for (std::size_t j = 0; j < mine.size(); ++j)
      packed_[j] = entry<Index>{mine.indices[j], mine.values[j]};
    rep_.sent_to.resize(un);
    rep_.received_from.resize(un);
    for (std::size_t j = 0; j < un; ++j) {
      rep_.sent_to[j] = offsets_[j + 1] - offsets_[j];
      rep_.received_from[j] = head_in_[hf * j + 4];
    }
    inbox_.resize(un);
    {
      std::vector<comm::request_t<C>> reqs;
      reqs.reserve(2 * un);
      for (int s = 1; s < n; ++s) {
        const auto from = static_cast<std::size_t>((me - s + n) % n);
        inbox_[from].resize(rep_.received_from[from]);
        if (!inbox_[from].empty())
          reqs.push_back(c.irecv(std::span<entry<Index>>(inbox_[from]), static_cast<int>(from),
                                 detail::allreduce_pairs_tag));
      }
      for (int s = 1; s < n; ++s) {
        const auto to = static_cast<std::size_t>((me + s) % n);
        if (rep_.sent_to[to] > 0)
          reqs.push_back(
              c.isend(std::span<const entry<Index>>(packed_.data() + offsets_[to], rep_.sent_to[to]),
                      static_cast<int>(to), detail::allreduce_pairs_tag));
      }
      for (auto& r : reqs)
        r.wait();
    }

    // 3. Reduce this rank's region in rank order.
    const std::uint64_t lo = bounds_[ume], hi = bounds_[ume + 1];
    seen_.assign(static_cast<std::size_t>(hi - lo), 0);
    touched_.clear();
    for (std::size_t r = 0; r < un; ++r) {
      const std::span<const entry<Index>> from =
          r == ume ? std::span<const entry<Index>>(packed_.data() + offsets_[ume], rep_.sent_to[ume])
                   : std::span<const entry<Index>>(inbox_[r]);
      for (const auto& e : from) {
        const auto i = static_cast<std::uint64_t>(e.index);
        if (i < lo || i >= hi)
          throw corrupt_data(commsgd::concat("sparse all-reduce: rank ", r, " sent index ", i,
                                             " to the owner of region [", lo, ", ", hi, ")"));
        auto& s = seen_[static_cast<std::size_t>(i - lo)];
        if (!s) {
          s = 1;
          touched_.push_back(i);
        }
        out[static_cast<std::size_t>(i)] += e.value;
      }
    }
    std::sort(touched_.begin(), touched_.end());

    // 4. The threshold, and this owner's selection.
    rep_.refreshed = !have_threshold_ || since_refresh_ >= opt_.refresh_steps || drifted_;
    if (rep_.refreshed) {
      threshold_ = agree_threshold(c, out, k_global);
      have_threshold_ = true;
      since_refresh_ = 0;
    }
    rep_.threshold_key = threshold_;
    chosen_.clear();
    for (auto i : touched_) {
      const float v = out[static_cast<std::size_t>(i)];
      if (select::magnitude_key(v) >= threshold_) chosen_.push_back({static_cast<Index>(i), v});
      out[static_cast<std::size_t>(i)] = 0.0f;
    }

    // 5. Gather the selection; check it, write it, and find which of this rank's pairs it applied.
    const auto got = c.all_gather_v(std::span<const entry<Index>>(chosen_), gathered_);
    rep_.selected.assign(got.begin(), got.end());
    rep_.selected_total = gathered_.size();
    std::size_t pos = 0;
    std::uint64_t prev = 0;
    for (std::size_t r = 0; r < un; ++r)
      for (std::size_t j = 0; j < got[r]; ++j, ++pos) {
        const auto i = static_cast<std::uint64_t>(gathered_[pos].index);
        if (i < bounds_[r] || i >= bounds_[r + 1] || (pos > 0 && i <= prev))
          throw corrupt_data(commsgd::concat("sparse all-reduce: owner ", r, " selected index ", i,
                                             " outside its region [", bounds_[r], ", ", bounds_[r + 1],
                                             ") or out of order"));
        prev = i;
      }
    std::uint64_t bad = 0, first = 0;
    for (std::size_t j = 0; j < gathered_.size(); ++j)
      if (!detail::is_finite_bits(gathered_[j].value) && bad++ == 0) first = gathered_[j].index;
    if (bad > 0) throw non_finite("sparse all-reduce sums (overflow)", bad, first);

    back_idx_.clear();
    back_val_.clear();
    std::size_t g = 0;
    for (std::size_t j = 0; j < mine.size(); ++j) {
      const Index i = mine.indices[j];
      while (g < gathered_.size() && gathered_[g].index < i)
        ++g;
      if (g < gathered_.size() && gathered_[g].index == i) continue;
      back_idx_.push_back(i);
      back_val_.push_back(mine.values[j]);
    }
    rep_.returned = back_idx_.size();
    for (const auto& e : gathered_)
      out[static_cast<std::size_t>(e.index)] = e.value;

    // The next exchange's state, from what every rank holds.
    ++history_;
    ++since_refresh_;
    const double G = static_cast<double>(gathered_.size()), K = static_cast<double>(k_global);
    drifted_ = k_global > 0 && (G * opt_.drift < K || G > K * opt_.drift);
    if (gathered_.size() >= un)
      for (std::size_t q = 1; q < un; ++q)
        bounds_[q] = static_cast<std::uint64_t>(gathered_[q * gathered_.size() / un].index);
    return rep_;
  }

private:
  // Round 1: every rank's header to every peer, rotated; receives posted before sends.
  template <comm::communicator C>
  void exchange_headers(C& c, int n, int me) {
    constexpr std::size_t hf = cost::allreduce_header_fields;
    const auto ume = static_cast<std::size_t>(me);
    std::copy_n(head_out_.data() + hf * ume, hf, head_in_.data() + hf * ume);
    std::vector<comm::request_t<C>> reqs;
    reqs.reserve(2 * static_cast<std::size_t>(n));
    for (int s = 1; s < n; ++s) {
      const auto from = static_cast<std::size_t>((me - s + n) % n);
      reqs.push_back(c.irecv(std::span<std::uint64_t>(head_in_.data() + hf * from, hf),
                             static_cast<int>(from), detail::allreduce_header_tag));
    }
    for (int s = 1; s < n; ++s) {
      const auto to = static_cast<std::size_t>((me + s) % n);
      reqs.push_back(c.isend(std::span<const std::uint64_t>(head_out_.data() + hf * to, hf),
                             static_cast<int>(to), detail::allreduce_header_tag));
    }
    for (auto& r : reqs)
      r.wait();
  }

  void even_bounds(int n, std::uint64_t d) {
    const auto un = static_cast<std::uint64_t>(n);
    bounds_.resize(static_cast<std::size_t>(n) + 1);
    for (std::uint64_t j = 0; j <= un; ++j)
      bounds_[static_cast<std::size_t>(j)] = d / un * j + d % un * j / un; // floor(d j / n) without overflow
  }

  static void agree(std::size_t r, const char* what, std::uint64_t first, std::uint64_t theirs) {
    if (first != theirs)
      throw size_mismatch(commsgd::concat("sparse all-reduce: ranks disagree on '", what, "' (rank 0 has ",
                                          first, ", rank ", r, " has ", theirs, ")"));
  }

  // The magnitude key from which the reduced sums of every region reach k_global: the lower edge of the bin
  // where the count from the top first reaches it; 0 (everything) when there are fewer sums than that, and
  // above every key when k_global is 0.
  template <comm::communicator C>
  std::uint32_t agree_threshold(C& c, std::span<const float> out, std::uint64_t k_global) {
    hist_.assign(cost::allreduce_histogram_bins, 0);
    for (auto i : touched_)
      ++hist_[select::magnitude_key(out[static_cast<std::size_t>(i)]) >> cost::allreduce_histogram_shift];
    c.all_reduce_sum(std::span<std::uint32_t>(hist_));
    if (k_global == 0) return std::numeric_limits<std::uint32_t>::max();
    std::uint64_t above = 0;
    for (std::size_t b = hist_.size(); b-- > 0;) {
      above += hist_[b];
      if (above >= k_global) return static_cast<std::uint32_t>(b << cost::allreduce_histogram_shift);
    }
    return 0;
  }

  allreduce_options opt_;
  allreduce_report rep_;
  std::uint64_t history_ = 0, since_refresh_ = 0;
  bool have_threshold_ = false, drifted_ = false;
  std::uint32_t threshold_ = 0;
  std::vector<std::uint64_t> bounds_, head_out_, head_in_, touched_;
  std::vector<std::size_t> offsets_;
  std::vector<std::uint8_t> seen_;
  std::vector<std::uint32_t> hist_;
  std::vector<entry<Index>> packed_, chosen_, gathered_;
  std::vector<std::vector<entry<Index>>> inbox_;
  std::vector<Index> back_idx_;
  std::vector<float> back_val_;
};

} // namespace commsgd::inline v1::sparsify
