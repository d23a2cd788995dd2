// compress::block_reduce_scatter<Code>: a reduce-scatter whose messages are int8 or e3m0 blocks, for sharded
// training (FSDP2's gradient reduce-scatter): each value is coded once and summed in float, where a ring
// would round every partial sum again (the reason of ZeRO++'s qgZ).
//
//   compress::int8_reduce_scatter x(length);     // length = n parts of length / n values
//   x.reduce_scatter(c, g, out);                  // out: part `rank` of the sum over ranks
//
// Each round: p = g + e (the residual, with error feedback, the default); p is cut into n equal parts, part j
// coded with a scale per block of block_size values counted from the part's start (compress/block_quant.hpp's
// codes and message); part j goes to rank j through an all-to-all (comm/all_to_all.hpp), and each rank
// decodes the n parts it holds and sums them in float, in rank order from +0. This rank's own part is coded
// too, so every part of the sum is what its n messages decode to, whoever holds it. What the codes do not
// carry stays in the residual, exactly (compress/error_feedback.hpp): sent + new residual == p. With error
// feedback, p, the parts' codes and the new residual are made in one pass over g and e, a stretch of blocks
// at a time from cache (block_quant.hpp's detail::encode_and_split).
// Before any payload moves, every rank's 40-byte verdict is gathered (compress/agree.hpp), so a wrong size, a
// NaN or inf, or ranks built differently raise the same error on every rank.
// Bytes a rank sends a round: cost::block_reduce_scatter_traffic, the verdict to each of the n - 1 others and
// a part's message to each.
#pragma once

#include <commsgd/comm/all_to_all.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/block_quant.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <vector>

namespace commsgd::inline v1::compress {

// The all-to-all's tag: one of the fixed tags (comm/tags.hpp) that no component of this library posts
// receives on while a reduce-scatter runs.
inline constexpr int block_reduce_scatter_tag = 31101;

template <class Code>
class block_reduce_scatter : public detail::round_state {
public:
  static constexpr const char* name = Code::name;

  // `length`: the whole input, every rank's parts; it must divide into the ranks of the communicator.
  explicit block_reduce_scatter(std::size_t length, block_quant_options o = {})
      : round_state(length, o.error_feedback, false), opt_(o) {
    commsgd::check_range("block_size", opt_.block_size, std::size_t{1},
                         std::numeric_limits<std::size_t>::max(), "[1, inf)");
  }

  const block_quant_options& options() const noexcept { return opt_; }

  // out (length / n values) receives part `rank` of the sum over ranks of what their messages decode to.
  template <comm::communicator C>
  comm::exchange_report reduce_scatter(C& c, std::span<const float> g, std::span<float> out) {
    const auto n = static_cast<std::size_t>(c.size());
    const std::size_t part = length_ / n;
    detail::input_verdict v = detail::check_scatter_sizes(g.size(), out.size(), length_, n);
    if (v.problem == detail::input_problem::none) {
      if (length_ % n == 0) {
        // The parts are coded now: their pass is the finiteness test. Without error feedback p is g itself,
        // read where it lies; with it, p, the parts' messages and the new residual are made in one pass
        // (detail::encode_and_split), the residual committed only once the round has succeeded.
        msg_.resize(n * part_bytes(part));
        v = {};
        std::size_t cursor = 0;
        split_.clear_low();
        for (std::size_t j = 0; j < n; ++j) {
          const auto m = std::span<std::byte>(msg_).subspan(j * part_bytes(part), part_bytes(part));
          const auto gj = g.subspan(j * part, part);
          const auto bad =
              ef_.on()
                  ? detail::encode_and_split<Code>(gj, ef_, j * part, cursor, opt_.block_size, scales_, m,
                                                   std::span<float>(p_).subspan(j * part, part), split_)
                  : detail::encode_blocks<Code>(gj, opt_.block_size, scales_, m);
          if (bad.count > 0 && v.problem == detail::input_problem::none)
            v = {detail::input_problem::non_finite, 0, j * part + bad.first, 0};
          v.count += bad.count;
        }
      } else {
        v = detail::check_finite(g); // refused below whatever it holds
      }
    }
    detail::agree(c, what(), length_, config(), v, verdicts_);
    detail::require_parts(what(), length_, n);

    const std::size_t bytes = part_bytes(part);
    inbox_.resize(n * bytes);
    comm::all_to_all(c, std::span<const std::byte>(msg_), std::span<std::byte>(inbox_),
                     block_reduce_scatter_tag);

    const std::size_t blocks = (part + opt_.block_size - 1) / opt_.block_size;
    detail::sum_blocks<Code>(inbox_, bytes, n, part, opt_.block_size, 0, blocks, out);
    wire_ = cost::block_reduce_scatter_traffic(length_, c.size(), opt_.block_size, Code::bits).bytes_sent;
    return detail::finish_split_round(ef_, p_, split_, steps_, n, part, false);
  }

  // One part's message: its scales, then its codes.
  std::size_t part_bytes(std::size_t part) const noexcept {
    return static_cast<std::size_t>(cost::block_quant_message_bytes(part, opt_.block_size, Code::bits));
  }

  void save(std::ostream& os) const { detail::save_state(os, what(), params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "block size"};
    detail::load_state(is, what(), params(), names, length_, steps_, ef_);
  }

private:
  static const char* what() noexcept {
    return Code::bits == 8 ? "compress::int8_reduce_scatter" : "compress::e3m0_reduce_scatter";
  }
  std::array<std::uint64_t, 2> params() const noexcept { return {length_, opt_.block_size}; }
  std::uint64_t config() const noexcept {
    const std::array<std::uint64_t, 5> p{length_, opt_.block_size, ef_.on() ? 1u : 0u, Code::bits, 0x525343u};
    return detail::fingerprint(p);
  }

  block_quant_options opt_;
  std::vector<float> scales_;
  std::vector<std::byte> msg_, inbox_;
  detail::split_scratch split_;
};

using int8_reduce_scatter = block_reduce_scatter<int8_code>;
using e3m0_reduce_scatter = block_reduce_scatter<e3m0_code>;

} // namespace commsgd::inline v1::compress
