// compress::detail::chunk_selection: each chunk's k largest |p_i| for the top-k codes (top_k_ef, region_top_k),
// indices relative to the chunk and rising, chunk after chunk, with the values at them.
//
// A selector that takes every chunk in one call (select::chunk_selector: select::chunked) is called once and
// keeps each chunk's warm start itself; any other is copied once a chunk, so that a warm start follows its own
// chunk, and each chunk is selected and then compacted.
#pragma once

#include <commsgd/compress/top_k_checks.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/top_k_plan.hpp>
#include <commsgd/select/compact.hpp>
#include <commsgd/select/selector.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::compress::detail {

template <select::selector S>
class chunk_selection {
public:
  // Refuses a selector that does not select exactly k (exact_selector's message).
  chunk_selection(const cost::top_k_chunks& c, S s)
      : sel_(many ? 1 : static_cast<std::size_t>(c.count), exact_selector(std::move(s))) {}

  // idx and val hold c.k() entries: chunk j's k_of(j) at the sum of the k of the chunks before it.
  void select(std::span<const float> p, const cost::top_k_chunks& c, std::span<std::uint32_t> idx,
              std::span<float> val) {
    begin();
    formed(p, c, p.size(), idx, val);
  }

  // The same result a stretch at a time, for a caller that forms p in rising stretches: begin(), then
  // formed(end) after each stretch (p[0, end) formed) selects every chunk that lies whole in [0, end) and
  // was not selected yet, while its values are likely still in cache.
  void begin() noexcept {
    next_ = 0;
    at_ = 0;
  }
  void formed(std::span<const float> p, const cost::top_k_chunks& c, std::size_t end,
              std::span<std::uint32_t> idx, std::span<float> val) {
    std::size_t j1 = next_;
    std::size_t k = 0;
    while (j1 < c.count && c.first(j1) + c.length(j1) <= end)
      k += static_cast<std::size_t>(c.k_of(j1++));
    if (j1 == next_) return;
    if constexpr (many) {
      sel_[0].select_chunk_range(
          p, static_cast<std::size_t>(c.size),
          [&](std::size_t j) { return static_cast<std::size_t>(c.k_of(j)); }, next_, j1, idx.subspan(at_, k),
          val.subspan(at_, k));
    } else {
      std::size_t at = at_;
      for (std::size_t j = next_; j < j1; ++j) {
        const auto kj = static_cast<std::size_t>(c.k_of(j));
        const auto x = p.subspan(c.first(j), c.length(j));
        select::compact<std::uint32_t>(x, sel_[j].select(x, kj), idx.subspan(at, kj), val.subspan(at, kj));
        at += kj;
      }
    }
    next_ = j1;
    at_ += k;
  }
  // Chunks selected since begin(): [0, selected()).
  std::size_t selected() const noexcept { return next_; }

private:
  static constexpr bool many = select::chunk_selector<S>;
  std::vector<S> sel_;            // one a chunk, or one for every chunk
  std::size_t next_ = 0, at_ = 0; // formed(): the next chunk to select, where its entries go
};

} // namespace commsgd::inline v1::compress::detail
