// The registry of the codes a DiLoCo pseudo-gradient travels in: their one set of names, their message sizes,
// the bytes a rank sends a round, and the engine each one runs (sync::diloco over its compressor of compress/).
// sync::coded_diloco (sync/coded_diloco.hpp) runs a code named at run time from here; commsgd_torch reads the
// names and sizes through its extension, so a code added here reaches Python with no binding edit. How a
// top-k message is laid out is cost/top_k_plan.hpp's; this file only adds its sizes up per code.
// The names are those of the exchanges in cost/candidate.hpp ("dense", "fp16", "topk-<density>", ...).
//
//   name            compressor (compress/)         message (d values)                    the round
//   dense           (uncompressed floats)          4 d                                   ring all-reduce
//   fp16, bf16      fp16, bf16                     2 d                                   16-bit ring all-reduce
//   int8            int8 (blocks of 256)           4 ceil(d / 256) + d                   all-gather
//   e3m0            e3m0 (blocks of 256)           4 ceil(d / 256) + ceil(d / 2)         all-gather
//   topk-<density>  top_k_ef (error feedback)      4 k + ceil(b k / 8)                   all-gather
//     [-c<chunk>]   top-k per chunk of <chunk> values (default: the whole fragment is one chunk), k per
//                   chunk = ceil(density * its length); indices relative to their chunk, b = the bits a
//                   chunk's largest index needs (12 for 4096)
//     [-2bit]       values in 2 bits against a float scale per chunk: 4 chunks + ceil(2 k / 8) + ceil(b k / 8)
//     [-b<decay>]   the residual decayed by <decay> in [0, 1] each round before the pseudo-gradient is added
//                   (default 1: kept whole); SparseLoCo's recipe is topk-0.01-c4096-2bit-b0.95 with plain
//                   outer SGD (outer lr 1, momentum 0), its error feedback in place of the outer momentum
//     [-senders]    each value's mean over the ranks that sent it rather than over all n (the bytes as
//                   without): a value one rank of n sends is not diluted n-fold by the ranks that did not
//     [-shared]     shared_top_k: one set of indices for every rank, chunk j's chosen by rank (j + t) mod n
//                   in round t, the slots of indices all-gathered, the k values summed by a bf16 ring; a
//                   rank's bytes a round do not grow with n while the chunks are at least n (not with -2bit
//                   or -senders: every rank sends every shared index, and the ring sums 16-bit values)
//     [-regions]    region_top_k: each rank's own top-k of a chunk to the chunk's owner (rank c mod n), who
//                   sums them, takes the mean over the ranks that sent each value (as -senders) and cuts it
//                   to the chunk's k; the cut sums all-gathered, bf16 values both ways; what a cut drops
//                   stays in the residuals of the ranks that picked it (not with -2bit, -senders or -shared)
//     [-fit<x>]     the exchange chosen per n by cost/: the gathered -2bit -senders code while the ranks of a
//                   round send in all at least x times fewer bytes than float32's ring would, past that the
//                   region sums (-regions), and a refusal naming what each reaches when neither does (x >= 1;
//                   not with the parts above, which it picks). The gathered code keeps the loss better (docs/
//                   diloco.md) and its bytes grow with n, the region sums' do not: this takes the better code
//                   for as long as a budget allows. chosen(d, n) names the code taken; the engine decides it
//                   once, for the sum of its layers over its ranks, so every rank takes the same one
//
// A shared or regions code's "message" is its round's payload, the k values in 16 bits and their indices:
// 2 k + ceil(b k / 8).
//
// Every gathered code, and the shared one, also gathers the 40-byte verdict of compress/agree.hpp each round (fp16 and bf16 only
// in their first): a refusal (NaN, inf, ranks built differently) reaches every rank with the payload.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/compress/block_quant.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/region_top_k.hpp>
#include <commsgd/compress/shared_top_k.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/cost/top_k_plan.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/chunked.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sync/diloco.hpp>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace commsgd::inline v1::sync {

enum class diloco_format : std::uint8_t { dense, fp16, bf16, int8, e3m0, top_k };

// The codes whose name is a single word.
struct diloco_word {
  diloco_format format;
  std::string_view name;
};
inline constexpr diloco_word diloco_words[] = {{diloco_format::dense, "dense"},
                                               {diloco_format::fp16, "fp16"},
                                               {diloco_format::bf16, "bf16"},
                                               {diloco_format::int8, "int8"},
                                               {diloco_format::e3m0, "e3m0"}};

// The forms a top-k code's name takes, and the ranges of their numbers.
inline constexpr std::string_view diloco_top_k_forms[] = {
    "topk-<density>[-c<chunk>][-2bit][-b<decay>][-senders]", "topk-<density>[-c<chunk>][-b<decay>]-shared",
    "topk-<density>[-c<chunk>][-b<decay>]-regions", "topk-<density>[-c<chunk>][-b<decay>]-fit<fit>"};
inline constexpr std::string_view diloco_top_k_ranges =
    "a density in (0, 1], a chunk in [1, 2^32 - 1], a decay in [0, 1] and a fit of at least 1";

// Every form a code's name takes, the words first: the list a refusal gives and Python's COMPRESSIONS.
inline std::vector<std::string_view> diloco_code_forms() {
  std::vector<std::string_view> out;
  for (const auto& w : diloco_words)
    out.push_back(w.name);
  for (const auto f : diloco_top_k_forms)
    out.push_back(f);
  return out;
}

// What a refusal says is allowed: "'dense', ..., or 'topk-...-regions' with a density in (0, 1], ...".
inline std::string diloco_codes_allowed() {
  const auto forms = diloco_code_forms();
  std::string out;
  for (std::size_t i = 0; i < forms.size(); ++i)
    out += commsgd::concat(i == 0 ? "" : (i + 1 == forms.size() ? " or " : ", "), "'", forms[i], "'");
  return commsgd::concat(out, " with ", diloco_top_k_ranges);
}

// A double in the fewest digits that read back as the same double (0.95, not 0.94999999999999996).
inline std::string shortest(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

struct diloco_code {
  diloco_format format = diloco_format::dense;
  double density = 0.0;     // top_k: the fraction of values sent, (0, 1]
  std::uint64_t chunk = 0;  // top_k: values a chunk, [1, 2^32 - 1]; 0 for one chunk of the whole fragment
  bool two_bit = false;     // top_k: values in 2 bits against a scale per chunk
  double decay = 1.0;       // top_k: the residual's decay each round, [0, 1]
  bool sender_mean = false; // top_k: each value the mean over the ranks that sent it
  bool shared = false;      // top_k: one set of indices for all ranks, the values summed by a bf16 ring
  bool regions = false;     // top_k: each chunk's picks summed by its owner and cut to k (region_top_k)
  double fit = 0.0; // top_k: gathered -2bit -senders or regions, chosen per n (chosen()); 0: not chosen

  // From its name; anything else is refused with the allowed names.
  static diloco_code parse(std::string_view text) {
    auto bad = [&] {
      return invalid_argument(commsgd::concat("argument 'compression' = '", text,
                                              "' is not a code; the allowed codes are ",
                                              diloco_codes_allowed()));
    };
    for (const auto& w : diloco_words)
      if (text == w.name) return {w.format};
    constexpr std::string_view prefix = "topk-";
    if (!text.starts_with(prefix)) throw bad();
    std::string_view rest = text.substr(prefix.size());
    diloco_code c{diloco_format::top_k};
    // A number at the front of `rest` (from_chars stops at the '-' of the next part, and reads 1e-3 whole).
    auto number = [&](auto& out) {
      const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), out);
      if (ec != std::errc()) throw bad();
      rest.remove_prefix(static_cast<std::size_t>(end - rest.data()));
    };
    number(c.density);
    if (!(c.density > 0.0 && c.density <= 1.0)) throw bad();
    bool seen_c = false, seen_b = false;
    while (!rest.empty()) {
      if (rest.starts_with("-2bit") && !c.two_bit) {
        c.two_bit = true;
        rest.remove_prefix(5);
      } else if (rest.starts_with("-c") && !seen_c) {
        rest.remove_prefix(2);
        number(c.chunk);
        if (c.chunk < 1 || c.chunk > 0xffffffffu) throw bad();
        seen_c = true;
      } else if (rest.starts_with("-senders") && !c.sender_mean) {
        c.sender_mean = true;
        rest.remove_prefix(8);
      } else if (rest.starts_with("-shared") && !c.shared) {
        c.shared = true;
        rest.remove_prefix(7);
      } else if (rest.starts_with("-regions") && !c.regions) {
        c.regions = true;
        rest.remove_prefix(8);
      } else if (rest.starts_with("-fit") && c.fit == 0.0) {
        rest.remove_prefix(4);
        number(c.fit);
        if (!(c.fit >= 1.0 && c.fit <= std::numeric_limits<double>::max())) throw bad();
      } else if (rest.starts_with("-b") && !seen_b) {
        rest.remove_prefix(2);
        number(c.decay);
        if (!(c.decay >= 0.0 && c.decay <= 1.0)) throw bad();
        seen_b = true;
      } else {
        throw bad();
      }
    }
    if ((c.shared || c.regions) && (c.two_bit || c.sender_mean)) throw bad();
    if (c.shared && c.regions) throw bad();
    if (c.fit != 0.0 && (c.two_bit || c.sender_mean || c.shared || c.regions)) throw bad();
    return c;
  }

  std::string name() const {
    if (format == diloco_format::top_k)
      return commsgd::concat("topk-", shortest(density), chunk ? commsgd::concat("-c", chunk) : "",
                             two_bit ? "-2bit" : "", decay != 1.0 ? "-b" + shortest(decay) : "",
                             sender_mean ? "-senders" : "", shared ? "-shared" : "",
                             regions ? "-regions" : "", fit != 0.0 ? "-fit" + shortest(fit) : "");
    for (const auto& w : diloco_words)
      if (w.format == format) return std::string(w.name);
    return "?";
  }

  bool gathered() const noexcept {
    return format == diloco_format::int8 || format == diloco_format::e3m0 ||
           (format == diloco_format::top_k && !shared && !regions && fit == 0.0);
  }

  // The code a -fit code takes for d values over n ranks (any other code: itself). Both candidates are
  // judged by the bytes all n ranks send in a steady round (cost/), which every rank computes alike.
  diloco_code chosen(std::uint64_t d, int n) const {
    if (fit == 0.0) return *this;
    diloco_code gathered_code = *this, regions_code = *this;
    gathered_code.fit = regions_code.fit = 0.0;
    gathered_code.two_bit = gathered_code.sender_mean = true;
    regions_code.regions = true;
    auto sent = [&](const diloco_code& c) {
      std::uint64_t s = 0;
      for (int r = 0; r < n; ++r)
        s += c.round_traffic(d, n, r, false).bytes_sent;
      return static_cast<double>(s);
    };
    double ring = 0;
    for (int r = 0; r < n; ++r)
      ring += static_cast<double>(comm::ring_all_reduce_traffic(d, sizeof(float), n, r).bytes_sent);
    const double g = sent(gathered_code), s = sent(regions_code);
    if (g * fit <= ring) return gathered_code;
    if (s * fit <= ring) return regions_code;
    auto times = [&](double b) { return b > 0 ? shortest(ring / b) : std::string("inf"); };
    throw invalid_argument(
        commsgd::concat("argument 'compression' = '", name(), "' asks for ", shortest(fit),
                        "x fewer bytes a round than float32's ring; over ", n, " ranks of ", d, " values ",
                        gathered_code.name(), " sends ", times(g), "x fewer and ", regions_code.name(), " ",
                        times(s), "x fewer: the allowed fit here is at most ", times(std::min(g, s))));
  }

  // The values this code cuts a fragment by (a block's scale, a chunk's k): a part of a fragment that starts
  // at a multiple of it is coded as the same values are in the whole fragment, so a replica whose ranks each
  // exchange one part sends the whole fragment's bits. 0: the fragment is one unit (top-k without chunks).
  std::uint64_t unit() const noexcept {
    switch (format) {
    case diloco_format::int8:
    case diloco_format::e3m0:
      return cost::diloco_block_size;
    case diloco_format::top_k:
      return chunk;
    default:
      return 1;
    }
  }

  // Bytes of one rank's message for d values.
  std::uint64_t message_bytes(std::uint64_t d) const {
    switch (format) {
    case diloco_format::dense:
      return 4 * d;
    case diloco_format::fp16:
    case diloco_format::bf16:
      return 2 * d;
    case diloco_format::int8:
      return cost::block_quant_message_bytes(d, cost::diloco_block_size, 8);
    case diloco_format::e3m0:
      return cost::block_quant_message_bytes(d, cost::diloco_block_size, 4);
    case diloco_format::top_k:
      if (fit != 0.0) // a fragment's size would choose otherwise than the engine's whole model does
        throw invalid_argument(commsgd::concat("argument 'compression' = '", name(),
                                               "' has no message size before its choice: take chosen(d, n)"));
      if (shared || regions)
        return cost::top_k_16_bit_payload_bytes(cost::top_k_chunks::of(d, chunk, density));
      return cost::top_k_plan::of(d, chunk, density, two_bit).bytes;
    }
    return 0;
  }

  // What `rank` of n sends and receives in one round of d values (first_round: fp16 and bf16 also gather
  // the verdict then).
  comm::traffic round_traffic(std::uint64_t d, int n, int rank, bool first_round) const {
    switch (format) {
    case diloco_format::dense:
      return comm::ring_all_reduce_traffic(d, sizeof(float), n, rank);
    case diloco_format::fp16:
    case diloco_format::bf16:
      return cost::half_traffic(d, n, rank, first_round);
    case diloco_format::top_k:
      if (fit != 0.0)
        throw invalid_argument(commsgd::concat("argument 'compression' = '", name(),
                                               "' has no round before its choice: take chosen(d, n)"));
      if (shared) return cost::shared_top_k_traffic(cost::top_k_chunks::of(d, chunk, density), n, rank);
      if (regions) return cost::region_top_k_traffic(cost::top_k_chunks::of(d, chunk, density), n);
      [[fallthrough]];
    default:
      return cost::compress_header_traffic(n) + comm::all_gather_traffic(message_bytes(d), n);
    }
  }
};

// The engine of each code: sync::diloco over the compressor of compress/ with the settings DiLoCo uses:
//   fp16, bf16    the 16-bit ring all-reduce, no error feedback
//   int8, e3m0    blocks of 256 values (cost::diloco_block_size), no error feedback: a pseudo-gradient is a
//                 whole round's progress, and what its code drops is not owed to the next round
//   topk-<d>...   top_k_ef, per chunk when the name has -c<chunk>, 2-bit values with -2bit, its residual
//                 carried from round to round (decayed by -b<decay>; the error feedback is the method). Every
//                 chunk's k largest are found in one call of select::chunked, each chunk warm-started from its
//                 own threshold of the last round (a chunk of more than 65,536 values by laplace_bisect,
//                 trimmed): the set exact selection gives, bit for bit (its speed on DiLoCo's real
//                 accumulators: docs/diloco.md, top-k)
//   -shared, -regions  shared_top_k (each led chunk by laplace_bisect, warm and trimmed), region_top_k (its picks
//                 and its cuts each in one call of select::chunked): their rounds as in the table above
template <comm::communicator C>
using diloco_engine =
    std::variant<diloco<C>, diloco<C, compress::fp16>, diloco<C, compress::bf16>, diloco<C, compress::int8>,
                 diloco<C, compress::e3m0>, diloco<C, compress::top_k_ef<select::chunked>>,
                 diloco<C, compress::shared_top_k<select::laplace_bisect>>,
                 diloco<C, compress::region_top_k<select::chunked>>>;

namespace detail {

// laplace_bisect trimmed to exactly k and warm-started from a chunk's last threshold: exact selection's set.
inline select::laplace_bisect::options diloco_exact_warm() {
  select::laplace_bisect::options o;
  o.trim = true;
  o.warm_start = true;
  return o;
}

// The factory of a flat-in-n top-k code (shared_top_k, region_top_k): the same options; `sel`, its selector.
template <class X, class S>
auto diloco_flat_top_k(const diloco_code& code, S sel) {
  return [code, sel](std::size_t n) {
    return X(n,
             {.density = code.density,
              .chunk = static_cast<std::size_t>(code.chunk),
              .decay = static_cast<float>(code.decay)},
             sel);
  };
}

} // namespace detail

template <comm::communicator C>
diloco_engine<C> make_diloco_engine(C& c, std::vector<std::size_t> layers, diloco_options o,
                                    const diloco_code& named) {
  using engine = diloco_engine<C>;
  const diloco_code code =
      named.chosen(std::accumulate(layers.begin(), layers.end(), std::uint64_t{0}), c.size());
  // The engine over the compressor `make_x` makes for a fragment of n values (its type picks the alternative).
  auto coded = [&](auto make_x) {
    using X = std::invoke_result_t<decltype(make_x), std::size_t>;
    return engine(std::in_place_type<diloco<C, X>>, c, std::move(layers), o, std::move(make_x));
  };
  switch (code.format) {
  case diloco_format::dense:
    return engine(std::in_place_type<diloco<C>>, c, std::move(layers), o);
  case diloco_format::fp16:
    return coded([](std::size_t n) { return compress::fp16(n, {.error_feedback = false}); });
  case diloco_format::bf16:
    return coded([](std::size_t n) { return compress::bf16(n, {.error_feedback = false}); });
  case diloco_format::int8:
    return coded([](std::size_t n) {
      return compress::int8(n, {.block_size = cost::diloco_block_size, .error_feedback = false});
    });
  case diloco_format::e3m0:
    return coded([](std::size_t n) {
      return compress::e3m0(n, {.block_size = cost::diloco_block_size, .error_feedback = false});
    });
  case diloco_format::top_k:
    if (code.shared)
      return coded(detail::diloco_flat_top_k<compress::shared_top_k<select::laplace_bisect>>(
          code, select::laplace_bisect(detail::diloco_exact_warm())));
    if (code.regions)
      return coded(
          detail::diloco_flat_top_k<compress::region_top_k<select::chunked>>(code, select::chunked{}));
    return coded([code](std::size_t n) {
      return compress::top_k_ef<select::chunked>(n, {.density = code.density,
                                                     .two_bit = code.two_bit,
                                                     .chunk = static_cast<std::size_t>(code.chunk),
                                                     .decay = static_cast<float>(code.decay),
                                                     .sender_mean = code.sender_mean});
    });
  }
  throw invalid_argument(commsgd::concat("argument 'code' has format ", static_cast<int>(code.format),
                                         ", outside the allowed codes ", diloco_codes_allowed()));
}

} // namespace commsgd::inline v1::sync
