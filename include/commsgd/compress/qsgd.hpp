// compress::qsgd: QSGD with s levels, stochastic rounding, unbiased.
//
// Per layer of p (p = g + e with error feedback, else g): norm = ||p||_2 (summed in double, rounded once
// to float); value i becomes a sign bit and a level xi_i in [0, s]: with x = |p_i| (s / norm) (in double),
// xi_i = floor(x) + 1 with probability x - floor(x), else floor(x), so E[xi_i] = x and the decoded value
//   sign_i * float(norm * xi_i / s)        (in double, rounded once)
// is an unbiased estimate of p_i up to that final rounding. The uniform draw of value i is draw i of the
// counter stream keyed by (seed, step, rank + 1) (compress/random.hpp): reproducible, different on every
// rank and step, and nothing but the step counter to save.
//
// Wire, plain fixed-width packing (no Elias coding): L float norms, then value i in bits
// [i w, (i + 1) w) with w = 1 + bit_width(s): bit 0 the sign (1 negative), bits 1.. the level
// (compress/bit_pack.hpp). All gathered; each rank decodes every rank's message and sums in rank order from
// +0. Error feedback is optional (off by default: QSGD is unbiased without it).
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/compress/agree.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/compressed_reducer.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/compressor_round.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/layers.hpp>
#include <commsgd/compress/random.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <vector>

namespace commsgd::inline v1::compress {

struct qsgd_options {
  std::uint32_t levels = 8;               // s, in [1, max_levels]
  std::vector<std::size_t> layer_offsets; // one norm per layer; empty: one for the whole vector
  std::uint64_t seed = 0;
  bool error_feedback = false;
  static constexpr std::uint32_t max_levels = 65535;
};

class qsgd : public detail::round_state {
public:
  static constexpr const char* name = "qsgd";

  explicit qsgd(std::size_t length, qsgd_options o = {})
      : round_state(length, o.error_feedback), bounds_(detail::layer_bounds(length, o.layer_offsets)),
        opt_(checked(std::move(o))), width_(static_cast<unsigned>(cost::qsgd_value_bits(opt_.levels))),
        msg_(cost::qsgd_message_bytes(length, layers(), opt_.levels)) {}

  std::size_t layers() const noexcept { return bounds_.size() - 1; }
  std::uint32_t levels() const noexcept { return opt_.levels; }

  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    auto v = detail::take_input(g, out.size(), length_, ef_, p_);
    if (v.problem == detail::input_problem::none) v = norms();
    detail::agree(c, "compress::qsgd", length_, config(), v, verdicts_,
                  "[0, 3.4028235e38] of a layer's L2 norm (the index is the layer's)");
    encode(static_cast<std::uint64_t>(c.rank()));
    detail::gather_and_sum(c, msg_, all_, out, d_, [&](auto m, auto&& sink) { decode(m, sink); });
    wire_ = cost::qsgd_traffic(length_, layers(), opt_.levels, c.size()).bytes_sent;
    return detail::finish_round(ef_, p_, d_, steps_, static_cast<std::size_t>(c.size()), length_, false);
  }

  void save(std::ostream& os) const { detail::save_state(os, kind, params(), steps_, ef_); }
  void load(std::istream& is) {
    static constexpr const char* names[] = {"length", "layer count", "levels", "seed"};
    detail::load_state(is, kind, params(), names, length_, steps_, ef_);
  }

private:
  static constexpr const char* kind = "compress::qsgd";
  std::array<std::uint64_t, 4> params() const noexcept { return {length_, layers(), opt_.levels, opt_.seed}; }
  // The layer boundaries themselves, not only their count, must agree.
  std::uint64_t config() const noexcept {
    const std::array<std::uint64_t, 6> p{length_,   layers(),           opt_.levels,
                                         opt_.seed, ef_.on() ? 1u : 0u, detail::fingerprint(bounds_)};
    return detail::fingerprint(p);
  }

  static qsgd_options checked(qsgd_options o) {
    commsgd::check_range("levels", o.levels, 1u, qsgd_options::max_levels, "[1, 65535]");
    return o;
  }

  // Each layer's norm into the message head; a norm beyond float's range is refused.
  detail::input_verdict norms() {
    for (std::size_t l = 0; l < layers(); ++l) {
      double sum = 0;
      for (std::size_t i = bounds_[l]; i < bounds_[l + 1]; ++i)
        sum += static_cast<double>(p_[i]) * static_cast<double>(p_[i]);
      const double norm = std::sqrt(sum);
      // Checked in double: narrowing a value beyond float's range is undefined behaviour.
      if (norm > static_cast<double>(std::numeric_limits<float>::max()))
        return {detail::input_problem::overflow, 1, l, norm};
      const auto f = static_cast<float>(norm);
      std::memcpy(msg_.data() + 4 * l, &f, 4);
    }
    return {};
  }

  void encode(std::uint64_t rank) {
    const std::uint64_t key = detail::stream_key(opt_.seed, steps_, rank + 1);
    const double s = opt_.levels;
    std::size_t l = 0;
    double norm = norm_of(msg_, 0);
    double per_norm = norm > 0 ? s / norm : 0;
    detail::pack_bits(std::span<std::byte>(msg_).subspan(4 * layers()), length_, width_, [&](std::size_t i) {
      while (i >= bounds_[l + 1]) {
        norm = norm_of(msg_, ++l);
        per_norm = norm > 0 ? s / norm : 0;
      }
      std::uint32_t level = 0;
      if (norm > 0) {
        // |p_i| <= norm (the sum of squares and its roundings are monotone), so x exceeds s by at most a
        // rounding, and the level is clamped to s.
        const double x = std::fabs(static_cast<double>(p_[i])) * per_norm;
        const auto lo = static_cast<std::uint32_t>(x); // floor: x >= 0, and x <= s + a rounding fits
        level = lo + (detail::unit_double(detail::draw(key, i)) < x - lo ? 1u : 0u);
        level = std::min(level, opt_.levels);
      }
      return (level << 1) | (std::signbit(p_[i]) ? 1u : 0u);
    });
  }

  static double norm_of(std::span<const std::byte> m, std::size_t l) {
    float f;
    std::memcpy(&f, m.data() + 4 * l, 4);
    return f;
  }

  // Magnitudes come from a table of the s + 1 possible values per layer when that is cheaper than a
  // multiplication and division per value; both compute the same float(norm * level / s).
  template <class Sink>
  void decode(std::span<const std::byte> m, Sink&& sink) const {
    const double s = opt_.levels;
    const auto packed = m.subspan(4 * layers());
    for (std::size_t l = 0; l < layers(); ++l) {
      const double norm = norm_of(m, l);
      const std::size_t size = bounds_[l + 1] - bounds_[l];
      // The sign bit goes straight into the float's: -mag exactly, with no branch on a random sign.
      auto value = [&](std::uint32_t field, float mag) {
        return std::bit_cast<float>(std::bit_cast<std::uint32_t>(mag) ^ (field << 31));
      };
      if (opt_.levels <= size) {
        table_.resize(opt_.levels + 1);
        for (std::uint32_t k = 0; k <= opt_.levels; ++k)
          table_[k] = static_cast<float>(norm * static_cast<double>(k) / s);
        detail::unpack_bits(packed, bounds_[l], size, width_, [&](std::size_t i, std::uint32_t field) {
          sink(i, value(field, table_[field >> 1]));
        });
      } else {
        detail::unpack_bits(packed, bounds_[l], size, width_, [&](std::size_t i, std::uint32_t field) {
          sink(i, value(field, static_cast<float>(norm * static_cast<double>(field >> 1) / s)));
        });
      }
    }
  }

  std::vector<std::size_t> bounds_;
  qsgd_options opt_;
  unsigned width_;
  std::vector<std::byte> msg_, all_;
  mutable std::vector<float> table_;
};

static_assert(compressor<qsgd, comm::archetype>);

} // namespace commsgd::inline v1::compress
