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
// values are p's (with its finiteness) and the sum's: formed a stretch at a time (code()), each chunk is
// selected and its k sent values split in place as soon as it is whole, from cache, and the residual then
// takes p's buffer whole (compress/error_feedback.hpp, commit_split).
// Bytes a rank sends a round: (n - 1) (40 + message_bytes), 40 the verdict of compress/agree.hpp.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/chunk_selection.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/compress/difference.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/top_k_checks.hpp>
#include <commsgd/compress/top_k_unpack.hpp>
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
    scale_.resize(opt_.two_bit ? plan_.count : 0);
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
    verdict_ = detail::check_sizes(g.size(), out.size(), length_);
    if (verdict_.problem == detail::input_problem::none) {
      const auto bad = ef_.accumulate_counted(g, p_, opt_.decay);
      if (bad.count > 0) verdict_ = {detail::input_problem::non_finite, bad.count, bad.first, 0};
    }
    begin_coding(); // nothing selected yet: encode() selects from the whole p
    return round(c, [&] { sum_scan_ = sum_blocks(out); });
  }

  // reduce() in two halves, its sum not written (compress::summed_in_parts). code(in) forms p = decay e + g
  // from the input g of length() values, which in(first, m) gives a stretch at a time (a span of the values
  // [first, first + m), formed then or read where they lie; called for adjacent stretches in rising order),
  // and keeps the verdict; no communication. reduce_coded(c) is the collective rest (the selection, the
  // exchange, the residual committed); for_each_sum_part() then reads the sum a part at a time (until the
  // next round), for a caller that uses each part once while it is in cache (sync::diloco).
  template <class In>
  void code(In&& in) {
    constexpr std::size_t stretch = 4096;
    std::size_t cursor = 0, bad = 0, first_bad = length_;
    begin_coding();
    for (std::size_t first = 0; first < length_; first += stretch) {
      const std::size_t m = std::min(stretch, length_ - first);
      const auto p = std::span<float>(p_).subspan(first, m);
      const std::size_t here =
          ef_.accumulate_counted_part(stretch_of(in, first, m), p, first, cursor, opt_.decay);
      if (here != 0 && bad == 0) first_bad = first + select::find_non_finite(std::span<const float>(p)).first;
      bad += here;
      // Each chunk selected and its new residual split as soon as it is whole, from cache, rather than in a
      // read of p of its own and a commit that misses the cache at every sent value; a round that will be
      // refused selects no more (a selector refuses NaN and inf).
      if (bad == 0) {
        sel_.formed(p_, plan_, first + m, idx_, val_);
        code_chunks(sel_.selected());
      }
    }
    verdict_ = {};
    if (bad > 0) verdict_ = {detail::input_problem::non_finite, bad, first_bad, 0};
  }
  template <comm::communicator C>
  comm::exchange_report reduce_coded(C& c) {
    return round(c, [&] {
      bounded_ = sums_bounded();
      sum_scan_ = {0, length_};
    });
  }
  // After reduce_coded: whether every value of the sum is surely finite, known from the sent values alone
  // (a sum is at most the sum over the ranks of each one's largest |value|, times n with sender_mean, and
  // its n float additions round up by at most (1 + 2^-24)^n). False only near the largest float: a caller
  // that must refuse a sum with NaN or inf then writes it whole and tests it.
  bool sum_surely_finite() const noexcept { return bounded_; }
  // After reduce_coded: calls f(first, part) for parts of the sum that cover [0, length()) in rising order,
  // part[j] the sum at first + j (reduce()'s bits), each made in `scratch` from the decoded messages.
  template <class F>
  void for_each_sum_part(std::vector<float>& scratch, F&& f) const {
    scratch.resize(std::max(scratch.size(), std::min(block, length_)));
    sum_each_block(
        [&](std::size_t) { return scratch.data(); },
        [&](std::size_t b0, std::size_t b1, const float* o) { f(b0, std::span<const float>(o, b1 - b0)); });
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

  // A round's coding starts: nothing selected, scaled or split.
  void begin_coding() noexcept {
    sel_.begin();
    coded_ = 0;
    coded_at_ = 0;
    split_.clear_low();
  }

  // Chunks [coded_, j1), once selected: each one's 2-bit scale (the mean |value| it sends) and the new
  // residual at its sent values, split from p_ where they lie (p - the value the message decodes to, its
  // rounding error kept aside in split_), which the round commits whole once it succeeds.
  void code_chunks(std::size_t j1) {
    for (; coded_ < j1; ++coded_) {
      const std::size_t j = coded_, at = coded_at_;
      const auto kj = static_cast<std::size_t>(plan_.k_of(j));
      const auto first = static_cast<std::size_t>(plan_.first(j));
      if (opt_.two_bit) {
        double sum = 0.0;
        for (std::size_t i = at; i < at + kj; ++i)
          sum += std::fabs(static_cast<double>(val_[i]));
        const float sc = kj == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(kj));
        scale_[j] = sc;
        const float t[4] = {two_bit_code::decode(0, sc), two_bit_code::decode(1, sc),
                            two_bit_code::decode(2, sc), two_bit_code::decode(3, sc)};
        for (std::size_t i = at; i < at + kj; ++i) {
          const std::size_t x = first + idx_[i];
          split_.split_one(p_[x], t[two_bit_code::encode(val_[i], sc)], x);
        }
      } else {
        for (std::size_t i = at; i < at + kj; ++i) {
          const std::size_t x = first + idx_[i];
          split_.split_one(p_[x], val_[i], x);
        }
      }
      coded_at_ += kj;
    }
  }

  // The chunks code() did not select (all of them after reduce()'s pass) selected, scaled and split, then the
  // message: the values (floats, or scales and 2-bit codes), then the indices.
  void encode() {
    sel_.formed(p_, plan_, length_, idx_, val_);
    code_chunks(plan_.count);
    if (opt_.two_bit) {
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

  // The round once p is formed: the verdicts agreed on, the selection and the message, every rank's message
  // gathered and decoded (and so checked) into at_ and sent_val_ (k indices, absolute and rising, and values
  // a rank), `sum` run on them, the residual committed.
  template <comm::communicator C, class Sum>
  comm::exchange_report round(C& c, Sum&& sum) {
    detail::agree(c, what(), length_, config(), verdict_, verdicts_);
    encode();
    ranks_ = static_cast<std::size_t>(c.size());
    const std::size_t n = ranks_;
    all_.resize(n * msg_.size());
    c.all_gather(std::span<const std::byte>(msg_), std::span<std::byte>(all_));
    at_.resize(n * k_);
    sent_val_.resize(n * k_);
    for (std::size_t r = 0; r < n; ++r)
      decode(std::span<const std::byte>(all_).subspan(r * msg_.size(), msg_.size()), at_.data() + r * k_,
             sent_val_.data() + r * k_);
    sum();
    wire_ = (cost::compress_header_traffic(c.size()) + comm::all_gather_traffic(msg_.size(), c.size()))
                .bytes_sent;
    // The new residual: p - what this rank's message decodes to, which is +0 but at its k indices, split
    // there by encode() (p stays whole elsewhere, so p_ becomes the residual as it is).
    return detail::finish_split_round(ef_, p_, split_, steps_, n, k_, false);
  }

  // The sum of the n decoded messages (at_, sent_val_), each value summed in rank order from +0 as the
  // engine's other codes sum theirs, a block of `block` values at a time: the block's sums o = where(b0)
  // (o[i - b0] the sum at i) zeroed, then every rank's entries that fall in it added, so o is written once,
  // in order, from cache, instead of zeroed whole and then touched at random once a rank; then done(b0, b1,
  // o). With sender_mean, each value some rank sent is then scaled by n / its senders (those none sent stay
  // +0; s = n leaves the bits as they were). Returns whether any sum is NaN or inf: only a value some rank
  // sent can be one, and once one, it stays one through the later additions, so each is tested as it is
  // written.
  static constexpr std::size_t block = 4096;
  template <class Where, class Done>
  bool sum_each_block(Where&& where, Done&& done) const {
    const std::size_t n = ranks_;
    cursor_.resize(n);
    from_.resize(n);
    for (std::size_t r = 0; r < n; ++r)
      cursor_[r] = r * k_;
    if (opt_.sender_mean) senders_.assign(block, 0);
    const auto bad_of = [](float x) { return std::fabs(x) <= std::numeric_limits<float>::max() ? 0u : 1u; };
    unsigned bad = 0;
    for (std::size_t b0 = 0; b0 < length_; b0 += block) {
      const std::size_t b1 = std::min(length_, b0 + block);
      float* const o = where(b0);
      std::fill(o, o + (b1 - b0), 0.0f);
      for (std::size_t r = 0; r < n; ++r) {
        const std::size_t end = (r + 1) * k_;
        std::size_t j = cursor_[r];
        from_[r] = j;
        for (; j < end && at_[j] < b1; ++j) {
          float& v = o[at_[j] - b0];
          v += sent_val_[j];
          bad |= bad_of(v);
        }
        if (opt_.sender_mean)
          for (std::size_t q = from_[r]; q < j; ++q)
            ++senders_[at_[q] - b0];
        cursor_[r] = j;
      }
      if (opt_.sender_mean)
        for (std::size_t r = 0; r < n; ++r)
          for (std::size_t q = from_[r]; q < cursor_[r]; ++q) {
            std::uint32_t& s = senders_[at_[q] - b0];
            if (s == 0) continue; // scaled already, from an earlier rank's entry
            float& v = o[at_[q] - b0];
            v = over_senders_value(v, s, static_cast<std::uint32_t>(n));
            bad |= bad_of(v);
            s = 0;
          }
      done(b0, b1, static_cast<const float*>(o));
    }
    return bad != 0;
  }

  // out <- the sum (sum_each_block); its NaN and inf as select::find_non_finite counts them.
  select::non_finite_scan sum_blocks(std::span<float> out) const {
    const bool bad = sum_each_block([&](std::size_t b0) { return out.data() + b0; },
                                    [](std::size_t, std::size_t, const float*) {});
    if (!bad) return {0, out.size()};
    return select::find_non_finite(std::span<const float>(out));
  }

  // sum_surely_finite's bound: on each rank's sent values (a scaled sum, sender_mean, at most n times them).
  bool sums_bounded() const noexcept {
    detail::sum_bound bound;
    for (std::size_t r = 0; r < ranks_; ++r)
      bound.add(reinterpret_cast<const std::byte*>(sent_val_.data() + r * k_), k_);
    return bound.holds(ranks_, opt_.sender_mean ? static_cast<double>(ranks_) : 1.0);
  }

  // A message's k values into at (absolute indices, rising) and val. Every rank decodes every message, so an
  // index out of its chunk or out of order (a corrupt peer) is refused on all of them: tested as the indices
  // are unpacked, branch-free, and only where that fails, the first offence found in order and refused.
  void decode(std::span<const std::byte> m, std::uint32_t* at, float* val) const {
    const auto part = [&](std::uint64_t from, std::uint64_t to) {
      return m.subspan(static_cast<std::size_t>(from), static_cast<std::size_t>(to - from));
    };
    const auto idx = part(plan_.index_offset, plan_.bytes);
    const auto codes = part(plan_.code_offset, plan_.index_offset);
    const detail::unpack_tables tables(plan_.index_bits);
    std::size_t q = 0;
    for (std::uint64_t j = 0; j < plan_.count; ++j) {
      const auto kj = static_cast<std::size_t>(plan_.k_of(j));
      const auto first = static_cast<std::uint32_t>(plan_.first(j));
      const auto len = static_cast<std::uint32_t>(plan_.length(j));
      if (!detail::unpack_rising(idx, q, kj, tables, first, len, at + q))
        refuse_chunk(j, at + q, kj, first, len);
      if (opt_.two_bit) {
        // A chunk's values take four values, decoded once: each is then a lookup by its code.
        float s;
        std::memcpy(&s, m.data() + 4 * j, 4);
        const float t[4] = {two_bit_code::decode(0, s), two_bit_code::decode(1, s),
                            two_bit_code::decode(2, s), two_bit_code::decode(3, s)};
        detail::two_bit_values(codes, q, kj, t, val + q);
      }
      q += kj;
    }
    if (!opt_.two_bit && k_ != 0) std::memcpy(val, m.data(), 4 * k_); // the values as floats, in order
  }

  // A chunk's kj absolute indices (its first value at `first`, len values) that failed decode's test: the
  // first index outside the chunk or not above the one before, refused.
  [[noreturn]] void refuse_chunk(std::uint64_t j, const std::uint32_t* at, std::size_t kj,
                                 std::uint32_t first, std::uint32_t len) const {
    for (std::size_t q = 0; q < kj; ++q) {
      const std::uint32_t rel = at[q] - first;
      if (rel >= len)
        throw corrupt_data(commsgd::concat(what(), ": a message holds index ", rel, " in chunk ", j,
                                           ", outside [0, its length = ", len, ")"));
      if (q > 0 && rel <= at[q - 1] - first)
        throw corrupt_data(commsgd::concat(what(), ": a message holds index ", rel, " in chunk ", j,
                                           " after ", at[q - 1] - first, "; a chunk's indices rise"));
    }
    throw corrupt_data(commsgd::concat(what(), ": a message's chunk ", j, " failed its index test"));
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
  std::vector<std::byte> msg_, all_;
  std::vector<std::uint32_t> at_;                  // every rank's message decoded: its indices (k a rank) ...
  std::vector<float> sent_val_;                    // ... and values
  mutable std::vector<std::size_t> cursor_, from_; // sum_each_block: where each rank's entries stand
  mutable std::vector<std::uint32_t> senders_;     // sender_mean: the ranks that sent each value of a block
  detail::residual_split split_;                   // the new residual's low words at the sent values
  std::size_t coded_ = 0, coded_at_ = 0;           // code_chunks: the next chunk, where its entries start
  select::non_finite_scan sum_scan_;
  detail::input_verdict verdict_; // of p, formed by reduce() or code()
  std::size_t ranks_ = 0;         // of the last round
  bool bounded_ = false;          // reduce_coded: the sums are surely finite
};

static_assert(compressor<top_k_ef<>, comm::archetype>);
static_assert(summed_in_parts<top_k_ef<>, comm::archetype>);

} // namespace commsgd::inline v1::compress
