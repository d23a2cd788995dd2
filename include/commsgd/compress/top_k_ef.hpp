// compress::top_k_ef: the largest |p_i| of p = decay e + g sent as (value, index) pairs, the rest kept in the
// residual; for DiLoCo's pseudo-gradients: the codes "topk-<density>[-c<chunk>][-2bit][-b<decay>][-senders]"
// (sync/diloco_codes.hpp), SparseLoCo's recipe among them.
//
// Per round, the d values cut into chunks of `chunk` values (0: one chunk of all d; the last chunk shorter
// when chunk does not divide d), each with its own k = ceil(density * its length) (cost/top_k_plan.hpp):
//   p = decay e + g              as every compressor in compress/ forms it (compress/error_feedback.hpp), the
//                                residual first scaled by decay in [0, 1] (1: kept whole, SparseLoCo: 0.95;
//                                0: no error feedback, what is not sent is dropped)
//   selection                    per chunk, its k largest |p_i| by a selector S (select/) that selects exactly,
//                                ties at the k-th magnitude to the lowest indices, so the set is a function of
//                                p alone; each chunk has its own copy of the selector, so one that warm-starts
//                                (laplace_bisect with trim) starts from that chunk's last threshold, or one
//                                call takes every chunk (select::chunked, each chunk's warm start its own)
//   values                       the selected p_i as floats, or (two_bit) 2 bits each against one scale per
//                                chunk: s = mean |p_i| over the chunk's selection, rounded once to float;
//                                a value is sign(p_i) (|p_i| >= s ? 1.5 s : 0.5 s). Two levels at a half
//                                and one and a half of the mean are the best pair for magnitudes spread
//                                evenly around it, and the sign bit keeps -0.
// Message, the same size on every rank (the length is agreed), laid out by cost::top_k_plan: two_bit: the
// chunks' scales (4 bytes each) and the 2-bit codes, packed; else the values as floats (4 k bytes); then
// every index relative to its chunk in b bits, packed (b = cost::index_bits(chunk): 12 for chunks of 4096, 17
// for one chunk of 120,000), in increasing order within each chunk. Every rank's message is gathered and
// summed in float in rank order from +0, so every rank holds the same bits; with sender_mean each value of
// the sum is then scaled by n / the ranks whose message holds it (the engine's mean over n becomes a mean
// over the senders). The residual keeps p - sent exactly (a pair of floats; without two_bit the subtraction
// is always exact: p - p or p - 0), so sent + new residual == p, bit for bit. A round's own passes over all d
// values are p's (with its finiteness), the selection's and the sum's: the residual takes p's buffer and only
// the k sent values are split again (compress/error_feedback.hpp, commit_sparse).
// Bytes a rank sends a round: (n - 1) (40 + message_bytes), 40 the verdict of compress/agree.hpp.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/chunk_selection.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/top_k_checks.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/cost/top_k_plan.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/compact.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/select/validate.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::compress {

struct top_k_ef_options {
  double density = 0.01; // fraction of each chunk's values sent: (0, 1]
  bool two_bit = false;  // values in 2 bits against one scale per chunk (SparseLoCo)
  std::size_t chunk = 0; // values a chunk: [1, 2^32 - 1], or 0 for one chunk of the whole length
  float decay = 1.0f;    // the residual's weight in the next round: [0, 1]
  // Each value of the sum scaled by n / (the ranks that sent it): the mean the engine takes is then over
  // the senders, not over all n, so a value one rank sent is not diluted by the ranks that kept theirs.
  bool sender_mean = false;
};

// k for `density` of d values (cost/top_k_plan.hpp has the rule).
inline std::size_t top_k_ef_count(std::size_t d, double density) {
  return static_cast<std::size_t>(cost::top_k_count(d, density));
}

// The 2-bit code of a sent value: bit 1 its sign, bit 0 whether its magnitude is at or above the scale.
// Host and device code alike (the device round, cuda/diloco/, codes with it).
struct two_bit_code {
  COMMSGD_HOST_DEVICE static std::uint32_t encode(float v, float s) noexcept {
    return (std::signbit(v) ? 2u : 0u) | (std::fabs(v) >= s ? 1u : 0u);
  }
  // 1.5 s is clamped to the largest float, so that a huge mean still decodes to a finite value of the
  // right sign and p - value cannot overflow.
  COMMSGD_HOST_DEVICE static float decode(std::uint32_t code, float s) noexcept {
    const double m = (code & 1u) ? 1.5 * static_cast<double>(s) : 0.5 * static_cast<double>(s);
    const auto mag = static_cast<float>(m < static_cast<double>(FLT_MAX) ? m : static_cast<double>(FLT_MAX));
    return (code & 2u) ? -mag : mag;
  }
};

// The scale of the mean over the senders (sender_mean): sum n / senders in double, rounded once; where every
// rank or none sent the value, its bits as they were.
COMMSGD_HOST_DEVICE inline float over_senders_value(float sum, std::uint32_t senders,
                                                    std::uint32_t n) noexcept {
  if (senders == 0 || senders == n) return sum;
  return static_cast<float>(static_cast<double>(sum) * static_cast<double>(n) / static_cast<double>(senders));
}

// S: a selector whose objects select exactly k (select/exact.hpp, select/radix.hpp, laplace_bisect with
// trim, ...); the constructor refuses one that does not. An approximate one would send a count that varies
// with the data, and every rank's message must have the one size the gather expects. A warm start changes
// how fast the set is found, never the set, so it is not part of the saved state.
template <select::selector S = select::exact>
class top_k_ef : public detail::round_state {
public:
  static constexpr const char* name = "top_k_ef";

  explicit top_k_ef(std::size_t length, top_k_ef_options o = {}, S selector = {})
      : round_state(detail::checked_top_k_length(length), true, false), opt_(checked(o)),
        plan_(cost::top_k_plan::of(length, o.chunk, o.density, o.two_bit)), k_(plan_.k()),
        sel_(plan_, std::move(selector)) {
    msg_.resize(plan_.bytes);
    idx_.resize(k_);
    val_.resize(k_);
    rel_.resize(plan_.k_full);
    own_at_.reserve(k_);
    own_val_.reserve(k_);
  }

  const top_k_ef_options& options() const noexcept { return opt_; }
  // Values sent a round, over all chunks.
  std::size_t k() const noexcept { return k_; }
  const cost::top_k_chunks& chunks() const noexcept { return plan_; }

  // A rank's message for `length` values: the values (floats, or scales and 2-bit codes), then the indices.
  static std::size_t message_bytes(std::size_t length, const top_k_ef_options& o) {
    return static_cast<std::size_t>(cost::top_k_plan::of(length, o.chunk, o.density, o.two_bit).bytes);
  }

  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    // p = decay e + g and its finiteness in one pass (the residual's low word is read only where it holds
    // something: at most the last round's k values).
    auto v = detail::check_sizes(g.size(), out.size(), length_);
    if (v.problem == detail::input_problem::none) {
      const auto bad = ef_.accumulate_counted(g, p_, opt_.decay);
      if (bad.count > 0) v = {detail::input_problem::non_finite, bad.count, bad.first, 0};
    }
    detail::agree(c, what(), length_, config(), v, verdicts_);
    encode();
    const auto n = static_cast<std::size_t>(c.size());
    all_.resize(n * msg_.size());
    c.all_gather(std::span<const std::byte>(msg_), std::span<std::byte>(all_));
    // Every message decoded, and so checked, before out is written: k indices (absolute, rising) and values
    // a rank, then summed a block of out at a time.
    at_.resize(n * k_);
    sent_val_.resize(n * k_);
    for (std::size_t r = 0; r < n; ++r) {
      std::size_t j = r * k_;
      decode(std::span<const std::byte>(all_).subspan(r * msg_.size(), msg_.size()),
             [&](std::size_t i, float x) {
               at_[j] = static_cast<std::uint32_t>(i);
               sent_val_[j++] = x;
             });
    }
    sum_scan_ = sum_blocks(out, n);
    // What this rank's message decodes to: +0 but at its k indices, where the residual keeps p's rest.
    own_at_.clear();
    own_val_.clear();
    decode(msg_, [&](std::size_t i, float x) {
      own_at_.push_back(i);
      own_val_.push_back(x);
    });
    wire_ = (cost::compress_header_traffic(c.size()) + comm::all_gather_traffic(msg_.size(), c.size()))
                .bytes_sent;
    return detail::finish_sparse_round(ef_, p_, own_at_, own_val_, steps_, n, k_);
  }

  // The NaN and infinities of the sum the last successful reduce wrote into out, as select::find_non_finite
  // counts them, found as it was written: a caller that must refuse such a sum need not read it again.
  select::non_finite_scan sum_non_finite() const noexcept { return sum_scan_; }

  void save(std::ostream& os) const { detail::save_state(os, what(), params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "k", "two_bit (1 on, 0 off)", "chunk",
                                            "decay (its float bits)"};
    detail::load_state(is, what(), params(), names, length_, steps_, ef_);
  }

private:
  static top_k_ef_options checked(top_k_ef_options o) {
    detail::check_top_k_options(o.chunk, o.decay);
    return o;
  }
  static const char* what() noexcept { return "compress::top_k_ef"; }
  std::array<std::uint64_t, 5> params() const noexcept {
    return {length_, k_, opt_.two_bit ? 1u : 0u, plan_.size, std::bit_cast<std::uint32_t>(opt_.decay)};
  }
  // What the ranks must share: the saved parameters and how the sum is taken.
  std::uint64_t config() const noexcept {
    const auto p = params();
    return detail::fingerprint(std::array<std::uint64_t, 6>{p[0], p[1], p[2], p[3], p[4], opt_.sender_mean});
  }

  // Each chunk's selection into idx_ (relative to the chunk) and val_, then the message.
  void encode() {
    sel_.select(p_, plan_, idx_, val_);
    if (opt_.two_bit) {
      scale_.resize(plan_.count);
      std::size_t at = 0;
      for (std::uint64_t j = 0; j < plan_.count; ++j) {
        const auto kj = static_cast<std::size_t>(plan_.k_of(j));
        double sum = 0.0;
        for (std::size_t i = at; i < at + kj; ++i)
          sum += std::fabs(static_cast<double>(val_[i]));
        scale_[j] = kj == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(kj));
        at += kj;
      }
      if (plan_.count != 0) std::memcpy(msg_.data(), scale_.data(), 4 * plan_.count);
      std::uint64_t j = 0, end = plan_.count ? plan_.k_of(0) : 0;
      detail::pack_bits(message_part(plan_.code_offset, plan_.index_offset), k_, 2, [&](std::size_t i) {
        while (i >= end)
          end += plan_.k_of(++j);
        return two_bit_code::encode(val_[i], scale_[j]);
      });
    } else if (k_ != 0) { // an empty message has no storage: memcpy must not see its null pointer
      std::memcpy(msg_.data(), val_.data(), 4 * k_);
    }
    detail::pack_bits(message_part(plan_.index_offset, plan_.bytes), k_, plan_.index_bits,
                      [&](std::size_t i) { return idx_[i]; });
  }

  // out <- the sum of the n decoded messages (at_, sent_val_: k entries a rank, rising), each value summed in
  // rank order from +0 as the engine's other codes sum theirs. A block of out at a time: zeroed, then every
  // rank's entries that fall in it added, so out is written once, in order, from cache, instead of zeroed
  // whole and then touched at random once a rank. With sender_mean, each value some rank sent is then scaled
  // by n / its senders (those none sent stay +0; s = n leaves the bits as they were). Returns the sum's NaN
  // and inf, as select::find_non_finite counts them: only a value some rank sent can be one, and once one, it
  // stays one through the later additions, so each is tested as it is written.
  select::non_finite_scan sum_blocks(std::span<float> out, std::size_t n) {
    constexpr std::size_t block = 4096;
    cursor_.resize(n);
    from_.resize(n);
    for (std::size_t r = 0; r < n; ++r)
      cursor_[r] = r * k_;
    if (opt_.sender_mean) senders_.assign(block, 0);
    const auto bad_of = [](float x) { return std::fabs(x) <= std::numeric_limits<float>::max() ? 0u : 1u; };
    unsigned bad = 0;
    for (std::size_t b0 = 0; b0 < length_; b0 += block) {
      const std::size_t b1 = std::min(length_, b0 + block);
      std::fill(out.begin() + static_cast<std::ptrdiff_t>(b0), out.begin() + static_cast<std::ptrdiff_t>(b1),
                0.0f);
      for (std::size_t r = 0; r < n; ++r) {
        const std::size_t end = (r + 1) * k_;
        std::size_t j = cursor_[r];
        from_[r] = j;
        for (; j < end && at_[j] < b1; ++j) {
          float& o = out[at_[j]];
          o += sent_val_[j];
          bad |= bad_of(o);
        }
        if (opt_.sender_mean)
          for (std::size_t q = from_[r]; q < j; ++q)
            ++senders_[at_[q] - b0];
        cursor_[r] = j;
      }
      if (!opt_.sender_mean) continue;
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t q = from_[r]; q < cursor_[r]; ++q) {
          std::uint32_t& s = senders_[at_[q] - b0];
          if (s == 0) continue; // scaled already, from an earlier rank's entry
          float& o = out[at_[q]];
          o = over_senders_value(o, s, static_cast<std::uint32_t>(n));
          bad |= bad_of(o);
          s = 0;
        }
    }
    if (bad == 0) return {0, out.size()};
    return select::find_non_finite(std::span<const float>(out));
  }

  // Every rank decodes every message, so an index out of its chunk or out of order (a corrupt peer) is
  // refused on all of them.
  template <class Sink>
  void decode(std::span<const std::byte> m, Sink&& sink) const {
    const auto part = [&](std::uint64_t from, std::uint64_t to) {
      return m.subspan(static_cast<std::size_t>(from), static_cast<std::size_t>(to - from));
    };
    const auto idx = part(plan_.index_offset, plan_.bytes);
    std::size_t at = 0;
    for (std::uint64_t j = 0; j < plan_.count; ++j) {
      const auto kj = static_cast<std::size_t>(plan_.k_of(j));
      const auto first = static_cast<std::size_t>(plan_.first(j)), len = plan_.length(j);
      detail::unpack_bits(idx, at, kj, plan_.index_bits, [&](std::size_t i, std::uint32_t rel) {
        if (rel >= len)
          throw corrupt_data(commsgd::concat(what(), ": a message holds index ", rel, " in chunk ", j,
                                             ", outside [0, its length = ", len, ")"));
        // The encoder writes a chunk's indices rising: one that does not is a corrupt peer's.
        if (i > at && rel <= rel_[i - at - 1])
          throw corrupt_data(commsgd::concat(what(), ": a message holds index ", rel, " in chunk ", j,
                                             " after ", rel_[i - at - 1], "; a chunk's indices rise"));
        rel_[i - at] = rel;
      });
      if (opt_.two_bit) {
        float s;
        std::memcpy(&s, m.data() + 4 * j, 4);
        detail::unpack_bits(part(plan_.code_offset, plan_.index_offset), at, kj, 2,
                            [&](std::size_t i, std::uint32_t code) {
                              sink(first + rel_[i - at], two_bit_code::decode(code, s));
                            });
      } else {
        for (std::size_t i = at; i < at + kj; ++i) {
          float x;
          std::memcpy(&x, m.data() + 4 * i, 4);
          sink(first + rel_[i - at], x);
        }
      }
      at += kj;
    }
  }

  // Bytes [from, to) of this rank's message.
  std::span<std::byte> message_part(std::uint64_t from, std::uint64_t to) {
    return std::span<std::byte>(msg_).subspan(static_cast<std::size_t>(from),
                                              static_cast<std::size_t>(to - from));
  }

  top_k_ef_options opt_;
  cost::top_k_plan plan_;
  std::size_t k_;
  detail::chunk_selection<S> sel_;
  std::vector<std::uint32_t> idx_;
  std::vector<float> val_, scale_;
  mutable std::vector<std::uint32_t> rel_; // one chunk's indices while it is decoded
  std::vector<std::byte> msg_, all_;
  std::vector<std::uint32_t> at_;          // every rank's message decoded: its indices (k a rank) ...
  std::vector<float> sent_val_;            // ... and values
  std::vector<std::size_t> cursor_, from_; // sum_blocks: where each rank's entries stand
  std::vector<std::uint32_t> senders_;     // sender_mean: the ranks that sent each value of a block
  std::vector<std::size_t> own_at_;        // this rank's message decoded: its indices and values
  std::vector<float> own_val_;
  select::non_finite_scan sum_scan_;
};

static_assert(compressor<top_k_ef<>, comm::archetype>);

} // namespace commsgd::inline v1::compress
