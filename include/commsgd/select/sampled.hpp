// sampled: DGC's threshold. The top-k of a strided sample (1 % of x) gives t; if the true count is short of
// k, t is lowered by 0.8 and recounted (DGC lowers below 0.8 k; the contract here needs at least k); if it is
// over the tolerance (DGC: over 1.3 k), the k-th key is selected exactly among the candidates >= t.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/scan.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/select/validate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace commsgd::inline v1::select {

class sampled {
public:
  static constexpr bool is_exact = false; // not for every options: see exact()
  static constexpr const char* name = "sampled";
  struct options {
    double fraction = 0.01;        // share of x in the sample
    std::size_t min_sample = 4096; // a smaller sample would make t too noisy to be worth a pass
    double tol = 0.01;             // count lands in [k, ceil((1 + tol) k)]
    bool trim = false;             // select exactly k (ties at the threshold to the lowest indices)
    parallel_options parallel{};
  };

  sampled() = default;
  explicit sampled(options opt) : opt_(opt) {
    commsgd::check_range("fraction", opt.fraction, std::nextafter(0.0, 1.0), 1.0, "(0, 1]");
    check_tolerance(opt.tol);
  }

  // With trim every call selects exactly k.
  bool exact() const noexcept { return opt_.trim; }

  unsigned last_passes() const noexcept { return passes_; }

  threshold select(std::span<const float> x, std::size_t k) {
    check_k(k, x.size());
    passes_ = 0;
    const std::size_t n = x.size();
    if (const auto trivial = detail::trivial_result(x, k)) {
      passes_ = 1;
      return *trivial;
    }
    const std::size_t limit = opt_.trim ? k : count_limit(k, opt_.tol);

    std::size_t stride = static_cast<std::size_t>(std::max(1.0, std::round(1.0 / opt_.fraction)));
    if (n / stride < opt_.min_sample) stride = std::max<std::size_t>(1, n / opt_.min_sample);
    std::vector<std::uint32_t> sample;
    sample.reserve(n / stride + 1);
    for (std::size_t i = stride / 2; i < n; i += stride)
      sample.push_back(magnitude_key(x[i]));
    const double share = static_cast<double>(k) * static_cast<double>(sample.size()) / static_cast<double>(n);
    const std::size_t ks =
        std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(share)), 1, sample.size());
    std::uint32_t t = detail::radix_select_keys(sample, ks).key;

    detail::key_counts c;
    for (int lowered = 0;; ++lowered) {
      c = detail::count_keys(x, t, opt_.parallel);
      ++passes_;
      if (c.non_finite != 0) check_finite(x);
      if (c.greater + c.equal >= k) break;
      // Past a few lowerings the sample was useless (say, mostly zeros): take every key as a candidate.
      t = lowered >= 4 ? 0u : magnitude_key(key_magnitude(t) * 0.8f);
    }
    const std::size_t count = c.greater + c.equal;
    if (!opt_.trim && count <= limit) return threshold{key_magnitude(t), c.greater, c.equal};
    if (c.greater < k) return settle(t, c.greater, c.equal, k, limit);

    std::vector<std::uint32_t> cand = detail::collect_keys(x, t, infinite_key, opt_.parallel, count);
    ++passes_;
    const detail::finish f = detail::finish_among(cand, 0, k);
    return settle(f.key, f.above, f.equal, k, limit);
  }

private:
  threshold settle(std::uint32_t key, std::size_t above, std::size_t equal, std::size_t k,
                   std::size_t limit) const {
    if (opt_.trim) return detail::exact_result(key, above, k);
    if (above + equal > limit)
      throw unsupported(commsgd::concat("sampled cannot land in [k, ceil((1 + tol) k)] = [", k, ", ", limit,
                                        "] with tol = ", opt_.tol, ": ", equal,
                                        " entries tie at |x| = ", key_magnitude(key), " with ", above,
                                        " above it; use options.trim to select exactly k, or a larger tol"));
    return threshold{key_magnitude(key), above, equal};
  }

  options opt_{};
  unsigned passes_ = 0;
};

static_assert(selector<sampled>);

} // namespace commsgd::inline v1::select
