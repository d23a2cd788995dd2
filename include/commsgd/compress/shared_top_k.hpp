// compress::shared_top_k: top-k with error feedback whose indices every rank shares, so that the values are
// summed by a ring all-reduce and a rank's bytes a round do not grow with the number of ranks; for DiLoCo's
// pseudo-gradients, the codes "topk-<density>[-c<chunk>][-b<decay>]-shared" (sync/diloco_codes.hpp).
//
// Why: a top-k code whose every rank picks its own indices must gather n - 1 messages, so a rank receives
// (n - 1) k pairs a round, and a value one rank sends is averaged with n - 1 zeros. With one set of indices
// for all ranks, the k values are a dense vector that a ring reduces (about 2 k values a rank whatever n),
// and each of them is a mean over every rank.
//
// Per round t (the compressor's step count, equal on every rank), the d values cut into chunks as top_k_ef
// cuts them (cost/top_k_plan.hpp), each with its own k:
//   p = decay e + g          as top_k_ef (compress/error_feedback.hpp)
//   leaders                  chunk j's indices are chosen by rank (j + t) mod n: its k largest |p_i| of
//                            that chunk, by an exact selector S (ties to the lowest index), so the leaders
//                            rotate over the chunks and over the rounds and every rank's residual is read
//   index exchange           each rank packs the indices of the chunks it leads (relative to their chunk,
//                            b = cost::index_bits(chunk) bits each, chunks in increasing order) into a slot
//                            of ceil(chunks / n) k_full indices, and the slots are all-gathered
//   values                   every rank takes its p at the k shared indices, in chunk order, rounds them once
//                            to the 16-bit Format (bf16 by default: the float range, so a pseudo-gradient
//                            cannot overflow it) and the ring of comm/narrow_ring.hpp sums them (float sums,
//                            rounded to 16 bits at each hop), the same bits on every rank
// The sum is zero outside the shared indices. The residual keeps p - (what this rank's values rounded to),
// exactly (compress/error_feedback.hpp's pair of floats), so sent + new residual == p, bit for bit.
// Bytes a rank sends a round: the 40-byte verdict to each of n - 1 ranks, its slot to each of them, and the
// ring's share of k 16-bit values (cost::shared_top_k_traffic). While the chunks are at least n, the slot
// shrinks as n grows and a rank sends about 1.5 k + 4 k (n - 1) / n bytes at 12-bit indices; with fewer
// chunks than ranks the slot is one chunk's indices and the index exchange grows with n.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/narrow_ring.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/top_k_checks.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/top_k_plan.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/compact.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/select/validate.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <vector>

namespace commsgd::inline v1::compress {

struct shared_top_k_options {
  double density = 0.01; // fraction of each chunk's values sent: (0, 1]
  std::size_t chunk = 0; // values a chunk: [1, 2^32 - 1], or 0 for one chunk of the whole length
  float decay = 1.0f;    // the residual's weight in the next round: [0, 1]
};

template <select::selector S = select::exact, class Format = bf16_format>
class shared_top_k : public detail::round_state {
public:
  static constexpr const char* name = "shared_top_k";
  using format = Format;

  explicit shared_top_k(std::size_t length, shared_top_k_options o = {}, S selector = {})
      : round_state(detail::checked_top_k_length(length), true), opt_(checked(o)),
        chunks_(cost::top_k_chunks::of(length, o.chunk, o.density)), k_(chunks_.k()),
        sel_(static_cast<std::size_t>(chunks_.count), detail::exact_selector(std::move(selector))) {
    mask_.resize(k_);
    vals_.resize(k_);
    wire_vals_.resize(k_);
  }

  const shared_top_k_options& options() const noexcept { return opt_; }
  // Values sent a round, over all chunks.
  std::size_t k() const noexcept { return k_; }
  const cost::top_k_chunks& chunks() const noexcept { return chunks_; }
  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    const auto v = detail::take_input(g, out.size(), length_, ef_, p_, opt_.decay);
    detail::agree(c, what(), length_, config(), v, verdicts_);
    const int n = c.size();
    const auto slot = static_cast<std::size_t>(cost::shared_top_k_slot_bytes(chunks_, n));
    encode_slot(c.rank(), n, slot);
    all_.resize(static_cast<std::size_t>(n) * slot);
    c.all_gather(std::span<const std::byte>(slot_), std::span<std::byte>(all_));
    for (int r = 0; r < n; ++r)
      decode_slot(r, n, std::span<const std::byte>(all_).subspan(static_cast<std::size_t>(r) * slot, slot));

    // This rank's values at the shared indices, rounded once: its contribution, and what it has sent.
    for (std::size_t m = 0; m < k_; ++m)
      vals_[m] = p_[mask_[m]];
    const std::size_t overflow = Format::encode_n(vals_, wire_vals_, false);
    if (overflow < k_) {
      std::fill(vals_.begin(), vals_.end(), std::numeric_limits<float>::quiet_NaN());
    } else {
      Format::decode_n(wire_vals_, vals_);
    }
    std::fill(d_.begin(), d_.end(), 0.0f);
    for (std::size_t m = 0; m < k_; ++m)
      d_[mask_[m]] = vals_[m];
    comm::narrow_ring_sum<Format>(c, std::span<float>(vals_), false, ring_);
    if (overflow < k_) {
      const std::size_t at = mask_[overflow];
      throw invalid_argument(commsgd::concat(what(), ": this rank's value ", p_[at], " at index ", at,
                                             " is outside the range ", range(), " of the values' format"));
    }
    const auto bad = select::find_non_finite(std::span<const float>(vals_));
    if (bad.count > 0)
      throw non_finite(commsgd::concat(what(),
                                       ": the 16-bit sum (another rank refused its input, or a "
                                       "partial sum left the range ",
                                       range(), ")"),
                       bad.count, bad.count ? static_cast<std::size_t>(mask_[bad.first]) : 0);
    std::fill(out.begin(), out.end(), 0.0f);
    for (std::size_t m = 0; m < k_; ++m)
      out[mask_[m]] = vals_[m];
    wire_ = cost::shared_top_k_traffic(chunks_, n, c.rank()).bytes_sent;
    return detail::finish_round(ef_, p_, d_, steps_, static_cast<std::size_t>(n), k_, false);
  }

  void save(std::ostream& os) const { detail::save_state(os, what(), params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "k", "chunk", "decay (its float bits)",
                                            "value format (0 bf16, 1 fp16)"};
    detail::load_state(is, what(), params(), names, length_, steps_, ef_);
  }

private:
  static constexpr bool is_fp16 = Format::max_finite == fp16_format::max_finite;

  static shared_top_k_options checked(shared_top_k_options o) {
    detail::check_top_k_options(o.chunk, o.decay);
    return o;
  }
  static const char* what() noexcept { return "compress::shared_top_k"; }
  static const char* range() noexcept {
    return is_fp16 ? "[-65504, 65504] (fp16)" : "[-3.3895314e38, 3.3895314e38] (bf16)";
  }
  std::array<std::uint64_t, 5> params() const noexcept {
    return {length_, k_, chunks_.size, std::bit_cast<std::uint32_t>(opt_.decay), is_fp16 ? 1u : 0u};
  }
  std::uint64_t config() const noexcept { return detail::fingerprint(params()); }

  // The chunks rank r leads in round steps_ over n ranks, in increasing order, each as f(j).
  template <class F>
  void for_led(int r, int n, F&& f) const {
    const auto un = static_cast<std::uint64_t>(n);
    const std::uint64_t first = (static_cast<std::uint64_t>(r) + un - steps_ % un) % un;
    for (std::uint64_t j = first; j < chunks_.count; j += un)
      f(j);
  }

  // This rank's slot: the indices of the chunks it leads, relative to their chunk, packed; zero after them.
  void encode_slot(int me, int n, std::size_t slot) {
    slot_.assign(slot, std::byte{0});
    led_.clear();
    for_led(me, n, [&](std::uint64_t j) {
      const auto kj = static_cast<std::size_t>(chunks_.k_of(j));
      const auto x = std::span<const float>(p_).subspan(chunks_.first(j), chunks_.length(j));
      const auto t = sel_[j].select(x, kj);
      const auto at = led_.size();
      led_.resize(at + kj);
      select::compact<std::uint32_t>(x, t, std::span<std::uint32_t>(led_).subspan(at, kj),
                                     std::span<float>(vals_).subspan(0, kj));
    });
    detail::pack_bits(std::span<std::byte>(slot_), led_.size(), chunks_.index_bits,
                      [&](std::size_t i) { return led_[i]; });
  }

  // Rank r's slot into the shared indices of the chunks it leads. Every rank decodes every slot, so an index
  // out of its chunk or out of order (a corrupt peer) is refused on all of them.
  void decode_slot(int r, int n, std::span<const std::byte> s) {
    std::size_t at = 0;
    for_led(r, n, [&](std::uint64_t j) {
      const auto kj = static_cast<std::size_t>(chunks_.k_of(j));
      const auto first = static_cast<std::size_t>(chunks_.first(j)), len = chunks_.length(j);
      const auto base = static_cast<std::size_t>(j * chunks_.k_full);
      detail::unpack_bits(s, at, kj, chunks_.index_bits, [&](std::size_t i, std::uint32_t rel) {
        if (rel >= len)
          throw corrupt_data(commsgd::concat(what(), ": rank ", r, " shares index ", rel, " in chunk ", j,
                                             ", outside [0, its length = ", len, ")"));
        const auto m = base + (i - at);
        if (i > at && first + rel <= mask_[m - 1])
          throw corrupt_data(commsgd::concat(what(), ": rank ", r, " shares index ", rel, " in chunk ", j,
                                             " after ", mask_[m - 1] - first, "; a chunk's indices rise"));
        mask_[m] = static_cast<std::uint32_t>(first + rel);
      });
      at += kj;
    });
  }

  shared_top_k_options opt_;
  cost::top_k_chunks chunks_;
  std::size_t k_;
  std::vector<S> sel_; // one a chunk: each warm start follows its own chunk
  std::vector<std::uint32_t> mask_, led_;
  std::vector<float> vals_;
  std::vector<std::uint16_t> wire_vals_;
  std::vector<std::byte> slot_, all_;
  comm::narrow_ring_buffers ring_;
};

static_assert(compressor<shared_top_k<>, comm::archetype>);

} // namespace commsgd::inline v1::compress
