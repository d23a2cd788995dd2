// hierarchical, a baseline: split x into segments, keep each segment's top k * len / N + slack keys, then
// select exactly among those candidates.
//
// The answer is exact when every truncated segment's cut-off key lies strictly below the candidates'
// k-th key: then no key at or above it was left out. When a segment holds far more than its share of the
// large entries that check fails and the method falls back to radix select on the whole input.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/radix.hpp>
#include <commsgd/select/scan.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/select/validate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <thread>
#include <vector>

namespace commsgd::inline v1::select {

class hierarchical {
public:
  static constexpr bool is_exact = true;
  static constexpr const char* name = "hierarchical";
  struct options {
    std::size_t segment = std::size_t{1} << 15; // entries per segment; a segment's keys stay in L2
    double slack = 3.0;                         // extra candidates per segment, in standard deviations
    parallel_options parallel{};
  };

  hierarchical() = default;
  explicit hierarchical(options opt) : opt_(opt) {
    commsgd::check_range("segment", opt.segment, std::size_t{1}, static_cast<std::size_t>(-1),
                         "[1, SIZE_MAX]");
  }

  // Whether the last call had to fall back to a whole-input radix select.
  bool last_fell_back() const noexcept { return fell_back_; }

  threshold select(std::span<const float> x, std::size_t k) {
    check_k(k, x.size());
    fell_back_ = false;
    const std::size_t n = x.size();
    if (const auto trivial = detail::trivial_result(x, k)) return *trivial;
    const std::size_t seg = opt_.segment;
    const std::size_t segments = (n + seg - 1) / seg;
    const unsigned chunks =
        static_cast<unsigned>(std::min<std::size_t>(detail::thread_count(n, opt_.parallel), segments));

    struct part {
      std::vector<std::uint32_t> cand;
      std::uint32_t cutoff = 0; // largest cut-off key of a truncated segment
      bool truncated = false;
      bool non_finite = false;
    };
    std::vector<part> parts(chunks);
    const std::size_t per = (segments + chunks - 1) / chunks;
    auto work = [&](unsigned c) {
      part& p = parts[c];
      std::vector<std::uint32_t> keys;
      const std::size_t s_end = std::min(segments, per * (c + 1));
      for (std::size_t s = per * c; s < s_end; ++s) {
        const std::size_t b = s * seg;
        const std::size_t len = std::min(seg, n - b);
        keys.resize(len);
        std::uint32_t top = 0;
        for (std::size_t i = 0; i < len; ++i) {
          keys[i] = magnitude_key(x[b + i]);
          top = std::max(top, keys[i]);
        }
        p.non_finite |= top >= infinite_key;
        const double share = static_cast<double>(k) * static_cast<double>(len) / static_cast<double>(n);
        const std::size_t want =
            static_cast<std::size_t>(std::ceil(share + opt_.slack * std::sqrt(share) + 8.0));
        if (want >= len) {
          p.cand.insert(p.cand.end(), keys.begin(), keys.end());
          continue;
        }
        const auto cut = keys.begin() + static_cast<std::ptrdiff_t>(want - 1);
        std::nth_element(keys.begin(), cut, keys.end(), std::greater<>{});
        p.cand.insert(p.cand.end(), keys.begin(), cut + 1);
        p.cutoff = p.truncated ? std::max(p.cutoff, *cut) : *cut;
        p.truncated = true;
      }
    };
    {
      std::vector<std::thread> pool;
      std::vector<std::exception_ptr> errors(chunks);
      for (unsigned c = 1; c < chunks; ++c)
        pool.emplace_back([&, c] {
          try {
            work(c);
          } catch (...) {
            errors[c] = std::current_exception();
          }
        });
      work(0);
      for (auto& t : pool)
        t.join();
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
    }

    std::vector<std::uint32_t> cand;
    bool truncated = false, bad = false;
    std::uint32_t cutoff = 0;
    for (auto& p : parts) {
      bad |= p.non_finite;
      if (p.truncated) cutoff = truncated ? std::max(cutoff, p.cutoff) : p.cutoff;
      truncated |= p.truncated;
      if (cand.empty())
        cand = std::move(p.cand);
      else
        cand.insert(cand.end(), p.cand.begin(), p.cand.end());
    }
    if (bad) check_finite(x);
    const detail::finish f = detail::radix_select_keys(cand, k);
    if (truncated && cutoff >= f.key) {
      fell_back_ = true;
      return radix(radix::options{opt_.parallel}).select(x, k);
    }
    return detail::exact_result(f.key, f.above, k);
  }

private:
  options opt_{};
  bool fell_back_ = false;
};

static_assert(selector<hierarchical>);

} // namespace commsgd::inline v1::select
