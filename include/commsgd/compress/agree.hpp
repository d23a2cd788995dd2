// How the compressors in compress/ refuse bad input without leaving a rank blocked: every rank checks its
// own input first, then all ranks all_gather a small verdict (compress_header_fields u64 each: length, a
// problem code with its count, the position, the offending value, a fingerprint of the compressor's
// parameters), and every rank raises the same error for the first rank that has a problem, before any
// payload moves. Ranks built with different parameters (k, seed, levels, layers) would otherwise exchange
// messages of different sizes or meanings, so they are refused too. The same shape as the header of the
// sparse exchange (sparsify/sparse_exchange.hpp); cost/compress.hpp charges it.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/random.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/error.hpp>
#include <commsgd/mix.hpp>
#include <commsgd/select/validate.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace commsgd::inline v1::compress::detail {

enum class input_problem : std::uint64_t {
  none = 0,
  gradient_size = 1, // g.size() != length; `where` holds g.size()
  output_size = 2,   // out.size() != length; `where` holds out.size()
  non_finite = 3,    // p = g + e holds NaN or inf; `count` of them, the first at `where`
  overflow = 4,      // a finite value does not fit the wire format; the first at `where`, its `value`
  part_size = 5,     // a reduce-scatter's out.size() != length / ranks; `where` holds it, `value` the allowed
};

struct input_verdict {
  input_problem problem = input_problem::none;
  std::uint64_t count = 0;
  std::uint64_t where = 0;
  double value = 0;
};

// The verdict on sizes: checked first, since nothing else can be read when they are wrong.
inline input_verdict check_sizes(std::size_t g, std::size_t out, std::size_t length) {
  if (g != length) return {input_problem::gradient_size, 0, g, 0};
  if (out != length) return {input_problem::output_size, 0, out, 0};
  return {};
}

// The verdict on p's values: the count of NaN and inf and where the first is.
inline input_verdict check_finite(std::span<const float> p) {
  const auto bad = select::find_non_finite(p);
  if (bad.count == 0) return {};
  return {input_problem::non_finite, bad.count, bad.first, 0};
}

// A fingerprint of the parameters every rank's compressor must share.
template <class Range>
std::uint64_t fingerprint(const Range& params) noexcept {
  std::uint64_t h = std::size(params);
  for (auto v : params)
    h = commsgd::mix64(h ^ commsgd::mix64(static_cast<std::uint64_t>(v)));
  return h;
}

// Raises the error a gathered verdict `o` (the header's fields) stands for, if any; `who` names the rank.
inline void throw_verdict(const char* what, const std::string& who, const std::uint64_t* o,
                          const char* range) {
  switch (static_cast<input_problem>(o[1] & 0xff)) {
  case input_problem::none:
    break;
  case input_problem::gradient_size:
    throw size_mismatch(commsgd::concat(what, ": ", who, " argument 'gradient' has ", o[2],
                                        " elements, the compressor's length is ", o[0]));
  case input_problem::output_size:
    throw size_mismatch(commsgd::concat(what, ": ", who, " argument 'out' has ", o[2],
                                        " elements, the compressor's length is ", o[0]));
  case input_problem::non_finite:
    throw non_finite(commsgd::concat(what, ": ", who, " gradient (plus its residual)"), o[1] >> 8, o[2]);
  case input_problem::part_size:
    throw size_mismatch(commsgd::concat(what, ": ", who, " argument 'out' has ", o[2],
                                        " elements, the allowed size is the length over the ranks, ",
                                        static_cast<std::uint64_t>(std::bit_cast<double>(o[3]))));
  case input_problem::overflow:
    throw invalid_argument(commsgd::concat(what, ": ", who, " gradient (plus its residual) value ",
                                           std::bit_cast<double>(o[3]), " at index ", o[2],
                                           " is outside the allowed range ", range));
  default:
    throw corrupt_data(commsgd::concat(what, ": ", who, " verdict has an unknown code ", o[1] & 0xff));
  }
}

// The header fields of this rank's verdict.
inline std::array<std::uint64_t, cost::compress_header_fields>
verdict_fields(std::size_t length, const input_verdict& v, std::uint64_t config) {
  return {length, static_cast<std::uint64_t>(v.problem) | (v.count << 8), v.where,
          std::bit_cast<std::uint64_t>(v.value), config};
}

// `what` names the compressor in messages; `range` says what `overflow` refuses ("[-65504, 65504]");
// `config` is fingerprint() of the compressor's parameters.
template <comm::communicator C>
void agree(C& c, const char* what, std::size_t length, std::uint64_t config, const input_verdict& mine,
           std::vector<std::uint64_t>& buf, const char* range = "") {
  const auto h = verdict_fields(length, mine, config);
  const auto n = static_cast<std::size_t>(c.size());
  buf.resize(h.size() * n);
  c.all_gather(std::span<const std::uint64_t>(h), std::span<std::uint64_t>(buf));
  for (std::size_t r = 0; r < n; ++r) {
    const std::uint64_t* o = buf.data() + h.size() * r;
    const std::string who =
        static_cast<int>(r) == c.rank() ? std::string("this rank's") : commsgd::concat("rank ", r, "'s");
    throw_verdict(what, who, o, range);
    if (o[0] != buf[0])
      throw size_mismatch(commsgd::concat(what, ": ranks disagree on the compressor's 'length' (rank 0 has ",
                                          buf[0], ", rank ", r, " has ", o[0], ")"));
    if (o[4] != buf[4])
      throw invalid_argument(commsgd::concat(
          what,
          ": ranks disagree on the compressor's parameters (k, seed, levels, layers, error feedback or "
          "overflow policy): rank ",
          r, "'s differ from rank 0's"));
  }
}

} // namespace commsgd::inline v1::compress::detail
