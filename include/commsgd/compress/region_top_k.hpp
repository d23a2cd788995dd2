// compress::region_top_k: every rank's own top-k with error feedback, summed by the owner of each chunk
// (Ok-Topk's region sums, for DiLoCo's pseudo-gradients) and cut again to the chunk's k, so that a rank's
// bytes a round do not grow with the number of ranks; the codes "topk-<density>[-c<chunk>][-b<decay>]-regions"
// (sync/diloco_codes.hpp).
//
// Why: a gathered top-k code (top_k_ef) sends each rank's message to the n - 1 others, and the sum holds up to
// n k values. Here each chunk has an owner, and the sum of a chunk is cut to its k largest before it travels,
// so a rank sends about 2 k values a round whatever n. What the cut drops is given back to the residuals of
// the ranks that picked it: nothing is lost, it is sent in a later round.
//
// Per round, the d values cut into chunks as top_k_ef cuts them (cost/top_k_plan.hpp), chunk c owned by rank
// c mod n:
//   p = decay e + g          as top_k_ef (compress/error_feedback.hpp)
//   picks                    per chunk, this rank's k largest |p_i| by an exact selector S (ties to the lowest
//                            index), each value rounded once to bf16
//   to the owners            an all-to-all: to each owner a block with this rank's picks in the chunks it
//                            owns (bf16 values, then indices relative to the chunk in b bits, chunks in
//                            increasing order), padded to ceil(chunks / n) full chunks
//   region sums              the owner sums each chunk's picks in float in rank order and counts the ranks
//                            that picked each index; the mean over those ranks, times n
//                            (compress::over_senders_value: the engine's mean over n is then the mean over
//                            the senders, as top_k_ef's sender_mean), is cut to the chunk's k largest
//                            magnitudes (exact, ties to the lowest index) and rounded once to bf16
//   to every rank            an all-gather of each owner's cut sums (the same layout), so every rank holds
//                            the same bits: out is zero outside the k indices of each chunk
// A rank has sent the picks whose index survived its chunk's cut; the others stay in its residual, so
// sent + new residual == p bit for bit (bf16's remainder included, compress/error_feedback.hpp's pair).
// Bytes a rank sends a round: the 40-byte verdict, a block and a slot to each of the n - 1 others
// (cost::region_top_k_traffic): about 7 k bytes at 12-bit indices while the chunks are at least n.
#pragma once

#include <commsgd/comm/all_to_all.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/chunk_selection.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/top_k_checks.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/top_k_plan.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/compact.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/selector.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <vector>

namespace commsgd::inline v1::compress {

inline constexpr int region_top_k_tag = 31103;

struct region_top_k_options {
  double density = 0.01; // fraction of each chunk's values sent: (0, 1]
  std::size_t chunk = 0; // values a chunk: [1, 2^32 - 1], or 0 for one chunk of the whole length
  float decay = 1.0f;    // the residual's weight in the next round: [0, 1]
};

template <select::selector S = select::exact>
class region_top_k : public detail::round_state {
public:
  static constexpr const char* name = "region_top_k";

  explicit region_top_k(std::size_t length, region_top_k_options o = {}, S selector = {})
      : round_state(detail::checked_top_k_length(length), true), opt_(checked(o)),
        chunks_(cost::top_k_chunks::of(length, o.chunk, o.density)), k_(chunks_.k()), sel_(chunks_, selector),
        cut_(selector) {
    idx_.resize(k_);
    val_.resize(k_);
  }

  const region_top_k_options& options() const noexcept { return opt_; }
  std::size_t k() const noexcept { return k_; }
  const cost::top_k_chunks& chunks() const noexcept { return chunks_; }

  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    const auto v = detail::take_input(g, out.size(), length_, ef_, p_, opt_.decay);
    detail::agree(c, what(), length_, config(), v, verdicts_);
    const int n = c.size();
    const auto block = static_cast<std::size_t>(cost::region_top_k_block_bytes(chunks_, n));
    rel_.resize(std::max<std::size_t>(slot_k(n), 1));
    pick();
    send_.assign(static_cast<std::size_t>(n) * block, std::byte{0});
    for (int j = 0; j < n; ++j)
      write_block(j, n, std::span<std::byte>(send_).subspan(static_cast<std::size_t>(j) * block, block),
                  [&](std::uint64_t ch, std::size_t i) {
                    return std::pair{idx_[at(ch) + i], val_[at(ch) + i]};
                  });
    recv_.resize(send_.size());
    comm::all_to_all(c, std::span<const std::byte>(send_), std::span<std::byte>(recv_), region_top_k_tag);
    cut_sums(c.rank(), n, block);
    all_.resize(recv_.size());
    c.all_gather(std::span<const std::byte>(slot_), std::span<std::byte>(all_));

    // Every owner's cut sums into out; this rank's picks whose index survived are what it sent.
    std::fill(out.begin(), out.end(), 0.0f);
    kept_.assign(length_, 0);
    for (int j = 0; j < n; ++j)
      read_block(j, n, std::span<const std::byte>(all_).subspan(static_cast<std::size_t>(j) * block, block),
                 [&](std::uint64_t ch, std::uint32_t rel, float x) {
                   const auto i = static_cast<std::size_t>(chunks_.first(ch)) + rel;
                   out[i] = x;
                   kept_[i] = 1;
                 });
    std::fill(d_.begin(), d_.end(), 0.0f);
    for (std::uint64_t ch = 0; ch < chunks_.count; ++ch) {
      const auto first = static_cast<std::size_t>(chunks_.first(ch));
      for (std::size_t i = at(ch); i < at(ch) + static_cast<std::size_t>(chunks_.k_of(ch)); ++i)
        if (kept_[first + idx_[i]]) d_[first + idx_[i]] = val_[i];
    }
    const auto bad = select::find_non_finite(std::span<const float>(out));
    if (bad.count > 0)
      throw non_finite(commsgd::concat(what(), ": a region's sum (beyond bf16's range)"), bad.count,
                       bad.first);
    wire_ = cost::region_top_k_traffic(chunks_, n).bytes_sent;
    return detail::finish_round(ef_, p_, d_, steps_, static_cast<std::size_t>(n), k_, false);
  }

  void save(std::ostream& os) const { detail::save_state(os, what(), params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "k", "chunk", "decay (its float bits)"};
    detail::load_state(is, what(), params(), names, length_, steps_, ef_);
  }

private:
  using format = bf16_format;

  static region_top_k_options checked(region_top_k_options o) {
    detail::check_top_k_options(o.chunk, o.decay);
    return o;
  }
  static const char* what() noexcept { return "compress::region_top_k"; }
  std::array<std::uint64_t, 4> params() const noexcept {
    return {length_, k_, chunks_.size, std::bit_cast<std::uint32_t>(opt_.decay)};
  }
  std::uint64_t config() const noexcept { return detail::fingerprint(params()); }

  // Where chunk ch's k values start in a list of every chunk's (all chunks but the last have k_full).
  std::size_t at(std::uint64_t ch) const noexcept { return static_cast<std::size_t>(ch * chunks_.k_full); }

  // This rank's k largest of each chunk, indices relative to the chunk, values rounded to bf16.
  void pick() {
    sel_.select(p_, chunks_, idx_, val_);
    for (auto& x : val_)
      x = format::decode(format::encode(x));
  }

  // A block of the chunks owner j holds: their values in bf16, then their indices packed, each entry from
  // entry(ch, i) as (relative index, value).
  template <class Entry>
  void write_block(int j, int n, std::span<std::byte> b, Entry&& entry) const {
    const std::size_t room = slot_k(n);
    std::size_t m = 0;
    for_owned(j, n, [&](std::uint64_t ch) {
      for (std::size_t i = 0; i < static_cast<std::size_t>(chunks_.k_of(ch)); ++i, ++m) {
        const auto [rel, x] = entry(ch, i);
        const std::uint16_t h = format::encode(x);
        std::memcpy(b.data() + 2 * m, &h, 2);
        rel_[m] = rel;
      }
    });
    detail::pack_bits(b.subspan(2 * room), m, chunks_.index_bits, [&](std::size_t i) { return rel_[i]; });
  }

  // Calls f(ch, relative index, value) for each entry of owner j's block, refusing (on every rank that
  // reads it) an index outside its chunk or not above the one before it.
  template <class F>
  void read_block(int j, int n, std::span<const std::byte> b, F&& f) const {
    const std::size_t room = slot_k(n);
    std::size_t m = 0;
    for_owned(j, n, [&](std::uint64_t ch) {
      const auto kj = static_cast<std::size_t>(chunks_.k_of(ch));
      const auto len = chunks_.length(ch);
      detail::unpack_bits(
          b.subspan(2 * room), m, kj, chunks_.index_bits, [&](std::size_t q, std::uint32_t rel) {
            if (rel >= len)
              throw corrupt_data(commsgd::concat(what(), ": a block holds index ", rel, " in chunk ", ch,
                                                 ", outside [0, its length = ", len, ")"));
            if (q > m && rel <= rel_[q - 1])
              throw corrupt_data(commsgd::concat(what(), ": a block holds index ", rel, " in chunk ", ch,
                                                 " after ", rel_[q - 1], "; a chunk's indices rise"));
            rel_[q] = rel;
          });
      for (std::size_t i = 0; i < kj; ++i) {
        std::uint16_t h;
        std::memcpy(&h, b.data() + 2 * (m + i), 2);
        f(ch, rel_[m + i], format::decode(h));
      }
      m += kj;
    });
  }

  // The chunks rank j owns over n ranks, in increasing order.
  template <class F>
  void for_owned(int j, int n, F&& f) const {
    for (std::uint64_t ch = static_cast<std::uint64_t>(j); ch < chunks_.count;
         ch += static_cast<std::uint64_t>(n))
      f(ch);
  }
  std::size_t slot_k(int n) const noexcept {
    return static_cast<std::size_t>(chunks_.room(static_cast<std::uint64_t>(n)));
  }

  // As owner: every rank's picks in the chunks this rank owns summed in rank order and counted, each chunk's
  // means over the senders times n cut to its k largest, into slot_.
  void cut_sums(int me, int n, std::size_t block) {
    const auto size = static_cast<std::size_t>(chunks_.size);
    const auto un = static_cast<std::uint64_t>(n);
    std::size_t owned = 0;
    for_owned(me, n, [&](std::uint64_t) { ++owned; });
    sum_.assign(owned * size, 0.0f);
    count_.assign(owned * size, 0u);
    // Chunk ch = me + q n is the q-th this rank owns.
    for (int r = 0; r < n; ++r)
      read_block(me, n, std::span<const std::byte>(recv_).subspan(static_cast<std::size_t>(r) * block, block),
                 [&](std::uint64_t ch, std::uint32_t rel, float x) {
                   const auto at = static_cast<std::size_t>(ch / un) * size + rel;
                   sum_[at] += x;
                   ++count_[at];
                 });
    for (std::size_t i = 0; i < sum_.size(); ++i)
      sum_[i] = over_senders_value(sum_[i], count_[i], static_cast<std::uint32_t>(n));
    std::size_t m = 0, held = 0; // the cut's values, and the owned chunks' values
    for_owned(me, n, [&](std::uint64_t ch) {
      m += static_cast<std::size_t>(chunks_.k_of(ch));
      held += static_cast<std::size_t>(chunks_.length(ch));
    });
    cut_idx_.resize(m);
    cut_val_.resize(m);
    if constexpr (select::chunk_selector<S>) {
      // The owned chunks lie one after another in sum_, all full but perhaps the last: one call cuts them all.
      cut_.select_chunks(
          std::span<const float>(sum_).first(held), size,
          [&](std::size_t q) { return static_cast<std::size_t>(chunks_.k_of(me + q * un)); }, cut_idx_,
          cut_val_);
    } else {
      m = 0;
      for_owned(me, n, [&](std::uint64_t ch) {
        const auto kj = static_cast<std::size_t>(chunks_.k_of(ch));
        const auto x = std::span<const float>(sum_).subspan(static_cast<std::size_t>(ch / un) * size,
                                                            static_cast<std::size_t>(chunks_.length(ch)));
        const auto t = cut_.select(x, kj);
        select::compact<std::uint32_t>(x, t, std::span<std::uint32_t>(cut_idx_).subspan(m, kj),
                                       std::span<float>(cut_val_).subspan(m, kj));
        m += kj;
      });
    }
    slot_.assign(block, std::byte{0});
    m = 0;
    write_block(me, n, std::span<std::byte>(slot_), [&](std::uint64_t, std::size_t) {
      const auto e = std::pair{cut_idx_[m], cut_val_[m]};
      ++m;
      return e;
    });
  }

  region_top_k_options opt_;
  cost::top_k_chunks chunks_;
  std::size_t k_;
  detail::chunk_selection<S> sel_; // this rank's picks
  S cut_;                          // the owner's cut of its chunks' sums
  std::vector<std::uint32_t> idx_, cut_idx_, count_;
  std::vector<float> val_, sum_, cut_val_;
  mutable std::vector<std::uint32_t> rel_; // a block's indices while it is written or read
  std::vector<std::uint8_t> kept_;         // the indices the cuts kept, over the whole length
  std::vector<std::byte> send_, recv_, slot_, all_;
};

static_assert(compressor<region_top_k<>, comm::archetype>);

} // namespace commsgd::inline v1::compress
