// fp16 and bf16 on the wire: the conversions, and compress::fp16 / compress::bf16, the compressors that send
// every value in 16 bits.
//
// The conversions, one value at a time (shared with device code) and in bulk (AVX2/F16C where the CPU has them,
// the same bits), are in compress/half_convert.hpp: rounding to nearest, ties to even, subnormals kept; a
// finite float beyond the format's largest finite value plus half an ulp (fp16: |x| >= 65520) rounds to inf.
//
// The compressors refuse NaN and inf in p = g + e, and what would overflow: by default with
// commsgd::invalid_argument naming the value, its index and the finite range; with
// half_overflow::clamp, it is sent as the largest finite value of its sign (and, with error feedback, the
// excess stays in the residual). With error feedback, p, its verdict, its message and the new residual are
// made in one pass, 4,096 values at a time from cache (detail::half_encode_and_split).
//
// Exchange: a ring all-reduce with the 16-bit values on the wire and float sums (comm/narrow_ring.hpp, from the
// 16-bit messages themselves: no float copy of the whole vector is made): each
// rank's contribution is its values rounded to 16 bits (what error feedback keeps the rest of), the partial
// sums are rounded to 16 bits at every hop, and every rank ends with the same bits on every transport. A
// rank sends and receives half the bytes of a float ring all-reduce, as PyTorch's fp16 hook does. The first
// round also gathers every rank's verdict and parameters (compress/agree.hpp), so ranks built differently
// are refused before any payload moves; later rounds carry a refusal in the payload itself: a rank whose
// input is bad contributes NaN, which reaches every value of every rank's sum, and every rank raises (this
// rank with its own precise error). A partial sum beyond the format's range raises on every rank the same
// way, or with half_overflow::clamp saturates. cost/compress.hpp charges both kinds of round.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/narrow_ring.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/compressed_reducer.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/compress/difference.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/half_convert.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/validate.hpp>

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
#include <type_traits>
#include <vector>

namespace commsgd::inline v1::compress {

struct fp16_format {
  static constexpr const char* name = "fp16";
  static constexpr float max_finite = 65504.0f;
  static constexpr std::uint16_t max_finite_bits = 0x7bffu;
  static constexpr std::uint16_t inf_bits = 0x7c00u;
  COMMSGD_HOST_DEVICE static constexpr std::uint16_t encode(float f) noexcept {
    return float_to_fp16_bits(f);
  }
  COMMSGD_HOST_DEVICE static constexpr float decode(std::uint16_t h) noexcept {
    return fp16_bits_to_float(h);
  }
  // In bulk (comm::narrow_ring_sum and the compressor use these): the same bits, several values at a time.
  static std::size_t encode_n(std::span<const float> in, std::span<std::uint16_t> out, bool saturate) {
    return float_to_fp16_bits(in, out, saturate);
  }
  static std::size_t sum_n(std::span<const std::uint16_t> partial, std::span<const float> x,
                           std::span<std::uint16_t> out, bool saturate) {
    return fp16_sum_bits(partial, x, out, saturate);
  }
  static std::size_t sum_n(std::span<const std::uint16_t> partial, std::span<const std::uint16_t> x,
                           std::span<std::uint16_t> out, bool saturate) {
    return fp16_sum_bits(partial, x, out, saturate);
  }
  static void decode_n(std::span<const std::uint16_t> in, std::span<float> out) {
    fp16_bits_to_float(in, out);
  }
  // The values of p (a span, or a difference of two) encoded in one pass when all are ordinary: see
  // fp16_encode_finite.
  static bool encode_finite_n(const difference& p, std::span<std::uint16_t> out) noexcept {
    return fp16_encode_finite(p.a.data(), p.b, out.data(), p.size());
  }
};

struct bf16_format {
  static constexpr const char* name = "bf16";
  static constexpr float max_finite = 0x1.fep127f;
  static constexpr std::uint16_t max_finite_bits = 0x7f7fu;
  static constexpr std::uint16_t inf_bits = 0x7f80u;
  COMMSGD_HOST_DEVICE static constexpr std::uint16_t encode(float f) noexcept {
    return float_to_bf16_bits(f);
  }
  COMMSGD_HOST_DEVICE static constexpr float decode(std::uint16_t h) noexcept {
    return bf16_bits_to_float(h);
  }
  static std::size_t encode_n(std::span<const float> in, std::span<std::uint16_t> out, bool saturate) {
    return float_to_bf16_bits(in, out, saturate);
  }
  static std::size_t sum_n(std::span<const std::uint16_t> partial, std::span<const float> x,
                           std::span<std::uint16_t> out, bool saturate) {
    return bf16_sum_bits(partial, x, out, saturate);
  }
  static std::size_t sum_n(std::span<const std::uint16_t> partial, std::span<const std::uint16_t> x,
                           std::span<std::uint16_t> out, bool saturate) {
    return bf16_sum_bits(partial, x, out, saturate);
  }
  static void decode_n(std::span<const std::uint16_t> in, std::span<float> out) {
    bf16_bits_to_float(in, out);
  }
  static bool encode_finite_n(const difference& p, std::span<std::uint16_t> out) noexcept {
    return bf16_encode_finite(p.a.data(), p.b, out.data(), p.size());
  }
};

static_assert(fp16_format::decode(fp16_format::max_finite_bits) == fp16_format::max_finite);
static_assert(bf16_format::decode(bf16_format::max_finite_bits) == bf16_format::max_finite);

enum class half_overflow : std::uint8_t {
  refuse, // commsgd::invalid_argument on every rank (the default: nothing is changed silently)
  clamp,  // send the largest finite value of the value's sign
};

struct half_options {
  bool error_feedback = false;
  half_overflow overflow = half_overflow::refuse;
  // The first round gathers every rank's sizes and parameters and refuses a mismatch. A host that knows the
  // ranks agree (DDP rebuilding a bucket the same way on every rank) may skip it, so that every round moves
  // exactly the ring's bytes.
  bool verify_first_round = true;
};

namespace detail {

// p tested and encoded a stretch of 4,096 values at a time, each while it is in cache: form(i, m) returns
// p's values [i, i + m) as a compress::difference (a span, or two to subtract: formed then, or read where
// they lie) and coded(i, m) runs once a stretch is encoded whole. A stretch of ordinary values (the common case)
// is tested and encoded in one pass (Format::encode_finite_n); one that holds NaN, inf or an overflow is
// taken again, tested and then encoded. The verdict of testing all of p first: a NaN or inf anywhere outranks
// an overflow, and the first overflow is named; once there is either, the stretches left are only tested for
// NaN and inf.
template <class Format, class Form, class Coded>
input_verdict encode_stretches(std::size_t d, bool clamp, std::span<std::uint16_t> msg, Form&& form,
                               Coded&& coded) {
  constexpr std::size_t stretch = 4096;
  std::size_t bad = 0, first_bad = 0;
  input_verdict overflow;
  std::vector<float> formed; // a difference's values, for the careful pass only
  for (std::size_t i = 0; i < d; i += stretch) {
    const std::size_t m = std::min(stretch, d - i);
    const difference p = form(i, m);
    const bool clean = bad == 0 && overflow.problem == input_problem::none;
    if (clean && Format::encode_finite_n(p, msg.subspan(i, m))) {
      coded(i, m);
      continue;
    }
    std::span<const float> part = p.a;
    if (p.b) {
      formed.resize(m);
      for (std::size_t j = 0; j < m; ++j)
        formed[j] = p[j];
      part = formed;
    }
    const auto scan = select::find_non_finite(part);
    if (scan.count > 0 && bad == 0) first_bad = i + scan.first;
    bad += scan.count;
    if (bad > 0 || overflow.problem != input_problem::none) continue;
    // The stretch is finite, so a +-inf result is an overflow.
    if (const std::size_t over = Format::encode_n(part, msg.subspan(i, m), clamp); !clamp && over < m) {
      overflow = {input_problem::overflow, 1, i + over, static_cast<double>(part[over])};
      continue;
    }
    coded(i, m);
  }
  if (bad > 0) return {input_problem::non_finite, bad, first_bad, 0};
  return overflow;
}

// With error feedback, p = g + e (+ r), its verdict, its 16-bit message and the new residual p - decode split
// exactly, in encode_stretches' stretches: the bits of error_feedback::accumulate, of testing p and then
// encoding it, Format::decode_n and error_feedback::commit in turn. p's buffer ends holding e' and s the
// nonzero low words (a clamped value's), for error_feedback::commit_split once the round has succeeded; a
// round with a verdict commits nothing.
// The input g of d values may come a stretch at a time, from in(i, m) (g's values [i, i + m), called for
// adjacent stretches in rising order).
template <class Format, class In>
input_verdict half_encode_and_split(std::size_t d, In&& in, const error_feedback& ef, bool clamp,
                                    std::span<std::uint16_t> msg, std::span<float> p, residual_split& s) {
  std::size_t cursor = 0;
  s.clear_low();
  return encode_stretches<Format>(
      d, clamp, msg,
      [&](std::size_t i, std::size_t m) {
        ef.accumulate_part(stretch_of(in, i, m), p.subspan(i, m), i, cursor);
        return std::span<const float>(p).subspan(i, m);
      },
      [&](std::size_t i, std::size_t m) {
        Format::decode_n(msg.subspan(i, m), std::span<float>(s.stretch(m), m));
        s.split(p.data() + i, m, i);
      });
}
template <class Format>
input_verdict half_encode_and_split(std::span<const float> g, const error_feedback& ef, bool clamp,
                                    std::span<std::uint16_t> msg, std::span<float> p, residual_split& s) {
  return half_encode_and_split<Format>(
      g.size(), [&](std::size_t i, std::size_t m) { return g.subspan(i, m); }, ef, clamp, msg, p, s);
}

} // namespace detail

template <class Format>
class half_compressor : public detail::round_state {
public:
  static constexpr const char* name = Format::name;
  using format = Format;

  explicit half_compressor(std::size_t length, half_options o = {})
      : round_state(length, o.error_feedback, false), opt_(o), msg_(length), agreed_(!o.verify_first_round) {}

  const half_options& options() const noexcept { return opt_; }

  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    verdict_ = detail::check_sizes(g.size(), out.size(), length_);
    if (verdict_.problem == detail::input_problem::none)
      code([g](std::size_t i, std::size_t m) { return g.subspan(i, m); });
    // out may be g: it is written only after g has been read.
    return round(c, [&] { Format::decode_n(ring_.wire, out); });
  }

  // reduce() in two halves, its sum not written (compress::summed_in_parts). code(in) codes this rank's
  // input of length() values, which in(i, m) gives a stretch at a time (a span of the values [i, i + m),
  // formed then or read where they lie; called for adjacent stretches in rising order; or, where in answers
  // in(i, m, as_difference), the two operands of compress/difference.hpp, subtracted as they are encoded),
  // and keeps the verdict; no communication. reduce_coded(c) is the collective rest; for_each_sum_part()
  // then decodes the 16-bit sum a part at a time (until the next round), for a caller that uses each part
  // once while it is in cache (sync::diloco).
  template <class In>
  void code(In&& in) {
    // Without error feedback p is the input itself, encoded where it lies. With it, p, the message and the
    // new residual are made in one pass (detail::half_encode_and_split), the residual committed only once the
    // round has succeeded.
    const bool clamp = opt_.overflow == half_overflow::clamp;
    verdict_ = ef_.on() ? detail::half_encode_and_split<Format>(length_, in, ef_, clamp, msg_, p_, split_)
                        : detail::encode_stretches<Format>(
                              length_, clamp, msg_,
                              [&](std::size_t i, std::size_t m) { return stretch_of(in, i, m); },
                              [](std::size_t, std::size_t) {});
  }
  template <comm::communicator C>
  comm::exchange_report reduce_coded(C& c) {
    return round(c, [] {});
  }
  // Always: the round refuses a 16-bit sum with NaN or inf.
  bool sum_surely_finite() const noexcept { return true; }
  // After reduce_coded: calls f(first, part) for parts of the sum that cover [0, length()) in rising
  // order, part[j] the sum at first + j (reduce()'s bits), each decoded into `scratch`.
  static constexpr std::size_t part_values = 8192;
  template <class F>
  void for_each_sum_part(std::vector<float>& scratch, F&& f) const {
    const std::span<const std::uint16_t> w(ring_.wire);
    for (std::size_t lo = 0; lo < length_; lo += part_values) {
      const std::size_t m = std::min(part_values, length_ - lo);
      scratch.resize(std::max(scratch.size(), m));
      Format::decode_n(w.subspan(lo, m), std::span<float>(scratch.data(), m));
      f(lo, std::span<const float>(scratch.data(), m));
    }
  }

  // The NaN and infinities of the sum the last successful reduce wrote into out: none, as the round refuses
  // a sum with any (the ring counts them as it makes the sum); a caller that must refuse such a sum need not
  // read it again.
  select::non_finite_scan sum_non_finite() const noexcept { return {0, length_}; }

  void save(std::ostream& os) const { detail::save_state(os, kind(), params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "overflow policy (0 refuse, 1 clamp)"};
    detail::load_state(is, kind(), params(), names, length_, steps_, ef_);
  }

private:
  // The round; `decode` writes the checked 16-bit sum (ring_.wire) wherever the caller wants it.
  template <comm::communicator C, class Decode>
  comm::exchange_report round(C& c, Decode&& decode) {
    const detail::input_verdict v = verdict_;
    const bool first = !agreed_;
    if (first) {
      detail::agree(c, what(), length_, detail::fingerprint(config()), v, verdicts_, range());
      agreed_ = true;
    }
    // This rank's contribution: its message, or NaN to make every rank refuse the round. The ring sums the
    // 16-bit values as they are (each hop decodes, adds in float and rounds), so no float copy of the whole
    // message is made.
    if (v.problem != detail::input_problem::none)
      std::fill(msg_.begin(), msg_.end(),
                static_cast<std::uint16_t>(Format::inf_bits | (Format::inf_bits >> 1)));
    // The ring counts the sum's inf and NaN as it makes it (the same answer on every rank), so the sum is
    // not read again to check it.
    // A message that passed its encode holds no inf or NaN, so the ring sends from it without a copy.
    const comm::wire_scan bad = comm::narrow_ring_sum_wire<Format>(
        c, msg_, opt_.overflow == half_overflow::clamp, ring_, v.problem == detail::input_problem::none);
    if (v.problem != detail::input_problem::none) {
      const auto mine = detail::verdict_fields(length_, v, 0);
      detail::throw_verdict(what(), "this rank's", mine.data(), range());
    }
    if (bad.count > 0)
      throw non_finite(commsgd::concat(what(),
                                       ": the 16-bit sum (another rank refused its input, or "
                                       "a partial sum left the range ",
                                       range(), "; overflow clamp saturates instead)"),
                       bad.count, bad.first);
    decode();
    wire_ = cost::half_traffic(length_, c.size(), c.rank(), first).bytes_sent;
    return detail::finish_split_round(ef_, p_, split_, steps_, static_cast<std::size_t>(c.size()), length_,
                                      true);
  }

  static const char* what() noexcept { return Format::name[0] == 'f' ? "compress::fp16" : "compress::bf16"; }
  static const char* kind() noexcept { return what(); }
  static const char* range() noexcept {
    return Format::name[0] == 'f' ? "[-65504, 65504] (fp16)" : "[-3.3895314e38, 3.3895314e38] (bf16)";
  }
  std::array<std::uint64_t, 2> params() const noexcept {
    return {length_, static_cast<std::uint64_t>(opt_.overflow)};
  }
  std::array<std::uint64_t, 3> config() const noexcept {
    return {length_, static_cast<std::uint64_t>(opt_.overflow), ef_.on() ? 1u : 0u};
  }

  half_options opt_;
  std::vector<std::uint16_t> msg_;
  comm::narrow_ring_buffers ring_;
  detail::residual_split split_;
  detail::input_verdict verdict_; // code()'s
  bool agreed_ = false; // the first round's verdict (sizes and parameters alike on every rank) is behind us
};

using fp16 = half_compressor<fp16_format>;
using bf16 = half_compressor<bf16_format>;

} // namespace commsgd::inline v1::compress

namespace commsgd::inline v1::compress {
static_assert(compressor<fp16, comm::archetype>);
static_assert(summed_in_parts<fp16, comm::archetype>);
static_assert(compressor<bf16, comm::archetype>);
static_assert(summed_in_parts<bf16, comm::archetype>);
} // namespace commsgd::inline v1::compress
