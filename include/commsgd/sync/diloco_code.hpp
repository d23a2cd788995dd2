// sync::coded_diloco: sync::diloco with its pseudo-gradient code named at run time ("dense", "fp16", "bf16",
// "int8", "e3m0", "topk-<density>"; cost/diloco.hpp), for hosts that choose it from a flag or a Python
// argument: commsgd_torch.DiLoCo, the benchmarks, the examples. Each code is the compressor of compress/
// with the settings DiLoCo uses:
//   fp16, bf16    the 16-bit ring all-reduce, no error feedback
//   int8, e3m0    blocks of 256 values (cost::diloco_block_size), no error feedback: a pseudo-gradient is a
//                 whole round's progress, and what its code drops is not owed to the next round
//   topk-<d>...   top_k_ef, per chunk when the name has -c<chunk>, 2-bit values with -2bit, its residual
//                 carried from round to round (decayed by -b<decay>; the error feedback is the method). Each
//                 chunk's k largest are found by laplace_bisect warm-started from that chunk's threshold of
//                 the last round and trimmed to exactly k (ties to the lowest index): the set exact selection
//                 gives, bit for bit (its speed on DiLoCo's real accumulators: docs/diloco.md, top-k)
//   topk-...-shared  shared_top_k, the same selection by each chunk's leader of the round, the values summed
//                 by a bf16 ring (bytes a rank flat in n)
//   topk-...-regions  region_top_k, each rank's picks summed by the chunk's owner, the means over the
//                 senders cut to k and all-gathered (bytes a rank flat in n)
// Every call forwards to the engine of that code; see sync/diloco.hpp for what they do.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/block_quant.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/region_top_k.hpp>
#include <commsgd/compress/shared_top_k.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/cost/diloco.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sync/diloco.hpp>
#include <commsgd/sync/strategy.hpp>

#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace commsgd::inline v1::sync {

template <comm::communicator C>
class coded_diloco {
public:
  using engine =
      std::variant<diloco<C>, diloco<C, compress::fp16>, diloco<C, compress::bf16>, diloco<C, compress::int8>,
                   diloco<C, compress::e3m0>, diloco<C, compress::top_k_ef<select::laplace_bisect>>,
                   diloco<C, compress::shared_top_k<select::laplace_bisect>>,
                   diloco<C, compress::region_top_k<select::laplace_bisect>>>;

  coded_diloco(C& c, std::vector<std::size_t> layer_sizes, diloco_options o, cost::diloco_code code)
      : code_(code), e_(make(c, std::move(layer_sizes), o, code)) {}

  const cost::diloco_code& code() const noexcept { return code_; }

  void start(std::span<float> params, bool broadcast = true) {
    visit([&](auto& s) { s.start(params, broadcast); });
  }
  step_result step(std::span<float> params, std::span<const float> grad, const step_info& info = {}) {
    return visit([&](auto& s) { return s.step(params, grad, info); });
  }
  bool computes_gradients() const { return true; }
  step_result advance(std::span<float> params) {
    return visit([&](auto& s) { return s.advance(params); });
  }
  void finish(std::span<float> params) {
    visit([&](auto& s) { s.finish(params); });
  }
  void set_weight(float w) {
    visit([&](auto& s) { s.set_weight(w); });
  }
  float weight() const {
    return visit([](const auto& s) { return s.weight(); });
  }

  void drain() noexcept {
    visit([](auto& s) { s.drain(); });
  }
  void rebind(C& c) {
    visit([&](auto& s) { s.rebind(c); });
  }
  bool starts_after(std::size_t p, std::int64_t s) const {
    return visit([&](const auto& e) { return e.starts_after(p, s); });
  }
  std::vector<std::size_t> touched_next() const {
    return visit([](const auto& s) { return s.touched_next(); });
  }
  std::vector<std::size_t> applied_next() const {
    return visit([](const auto& s) { return s.applied_next(); });
  }
  std::int64_t steps() const {
    return visit([](const auto& s) { return s.steps(); });
  }
  std::uint64_t bytes_sent() const {
    return visit([](const auto& s) { return s.bytes_sent(); });
  }
  std::uint64_t exchanges_started() const {
    return visit([](const auto& s) { return s.exchanges_started(); });
  }
  std::uint64_t exchanges_applied() const {
    return visit([](const auto& s) { return s.exchanges_applied(); });
  }
  std::size_t num_fragments() const {
    return visit([](const auto& s) { return s.num_fragments(); });
  }
  std::span<const std::pair<std::size_t, std::size_t>> fragment_runs(std::size_t p) const {
    return visit([&](const auto& s) { return s.fragment_runs(p); });
  }
  std::size_t fragment_length(std::size_t p) const {
    return visit([&](const auto& s) { return s.fragment_length(p); });
  }
  std::span<const float> global_model(std::size_t p) const {
    return visit([&](const auto& s) { return s.global_model(p); });
  }
  std::span<const float> outer_velocity(std::size_t p) const {
    return visit([&](const auto& s) { return s.outer(p).velocity(); });
  }
  bool in_flight(std::size_t p) const {
    return visit([&](const auto& s) { return s.in_flight(p); });
  }
  // Fragment p's residual (top-k: what it has not sent yet); empty for the other codes.
  std::span<const float> residual(std::size_t p) const {
    return visit([&](const auto& s) -> std::span<const float> {
      if constexpr (std::decay_t<decltype(s)>::compressed)
        return s.compressor(p).residual();
      else
        return {};
    });
  }
  const diloco_options& opts() const {
    return visit([](const auto& s) -> const diloco_options& { return s.opts(); });
  }

  void save(std::ostream& os, state::part p = state::part::all) const {
    visit([&](const auto& s) { s.save(os, p); });
  }
  void load(std::istream& is) {
    visit([&](auto& s) { s.load(is); });
  }
  void load(std::istream& shared, std::istream& local) {
    visit([&](auto& s) { s.load(shared, local); });
  }

private:
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), e_);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), e_);
  }

  // laplace_bisect trimmed to exactly k and warm-started from a chunk's last threshold: exact selection's set.
  static select::laplace_bisect::options exact_warm() {
    select::laplace_bisect::options o;
    o.trim = true;
    o.warm_start = true;
    return o;
  }

  // The factory of a flat-in-n top-k code (shared_top_k, region_top_k): the same options, the same selector.
  template <class X>
  static auto flat_top_k(const cost::diloco_code& code) {
    return [code](std::size_t n) {
      return X(n,
               {.density = code.density,
                .chunk = static_cast<std::size_t>(code.chunk),
                .decay = static_cast<float>(code.decay)},
               select::laplace_bisect(exact_warm()));
    };
  }

  static engine make(C& c, std::vector<std::size_t> layers, diloco_options o, cost::diloco_code code) {
    using cost::diloco_format;
    switch (code.format) {
    case diloco_format::dense:
      return engine(std::in_place_index<0>, c, std::move(layers), o);
    case diloco_format::fp16:
      return engine(std::in_place_index<1>, c, std::move(layers), o,
                    [](std::size_t n) { return compress::fp16(n, {.error_feedback = false}); });
    case diloco_format::bf16:
      return engine(std::in_place_index<2>, c, std::move(layers), o,
                    [](std::size_t n) { return compress::bf16(n, {.error_feedback = false}); });
    case diloco_format::int8:
      return engine(std::in_place_index<3>, c, std::move(layers), o, [](std::size_t n) {
        return compress::int8(n, {.block_size = cost::diloco_block_size, .error_feedback = false});
      });
    case diloco_format::e3m0:
      return engine(std::in_place_index<4>, c, std::move(layers), o, [](std::size_t n) {
        return compress::e3m0(n, {.block_size = cost::diloco_block_size, .error_feedback = false});
      });
    case diloco_format::top_k:
      if (code.shared)
        return engine(std::in_place_index<6>, c, std::move(layers), o,
                      flat_top_k<compress::shared_top_k<select::laplace_bisect>>(code));
      if (code.regions)
        return engine(std::in_place_index<7>, c, std::move(layers), o,
                      flat_top_k<compress::region_top_k<select::laplace_bisect>>(code));
      return engine(std::in_place_index<5>, c, std::move(layers), o, [code](std::size_t n) {
        return compress::top_k_ef<select::laplace_bisect>(n,
                                                          {.density = code.density,
                                                           .two_bit = code.two_bit,
                                                           .chunk = static_cast<std::size_t>(code.chunk),
                                                           .decay = static_cast<float>(code.decay),
                                                           .sender_mean = code.sender_mean},
                                                          select::laplace_bisect(exact_warm()));
      });
    }
    throw invalid_argument(commsgd::concat("argument 'code' has format ", static_cast<int>(code.format),
                                           ", outside the allowed codes ", cost::diloco_codes_allowed()));
  }

  cost::diloco_code code_;
  engine e_;
};

static_assert(sync_strategy<coded_diloco<comm::archetype>>);

} // namespace commsgd::inline v1::sync
