// radix: exact radix select on the magnitude keys, in the manner of torch.topk's radixSelect with AIR
// top-k's candidate buffer. Pass 1 histograms the top 11 bits of every key; pass 2 reads x once more but
// keeps only the keys in the bucket holding the k-th largest (a small fraction of N), and the remaining
// digits are resolved on that buffer, which fits in cache.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/scan.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/select/validate.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace commsgd::inline v1::select {

class radix {
public:
  static constexpr bool is_exact = true;
  static constexpr const char* name = "radix";
  struct options {
    parallel_options parallel{};
  };

  radix() = default;
  explicit radix(options opt) : opt_(opt) {}

  threshold select(std::span<const float> x, std::size_t k) {
    check_k(k, x.size());
    const std::size_t n = x.size();
    if (n == 0) return threshold{};

    // Pass 1: top-digit histogram. Several copies of the histogram per thread keep runs of equal digits
    // (typical: most of a gradient shares a few exponents) from serialising on one counter.
    constexpr std::uint32_t digits = 2048;
    constexpr int top_shift = 20;
    constexpr std::size_t copies = 4;
    const unsigned chunks = detail::thread_count(n, opt_.parallel);
    hist_.assign(static_cast<std::size_t>(chunks) * copies * digits, 0u);
    detail::for_chunks(n, chunks, [&](std::size_t b, std::size_t e, unsigned c) {
      std::uint32_t* h = hist_.data() + static_cast<std::size_t>(c) * copies * digits;
      const float* p = x.data();
      std::size_t i = b;
      for (; i + copies <= e; i += copies)
        for (std::size_t j = 0; j < copies; ++j)
          ++h[j * digits + (detail::key_at(p + i + j) >> top_shift)];
      for (; i < e; ++i)
        ++h[detail::key_at(p + i) >> top_shift];
    });
    std::vector<std::size_t> total(digits, 0);
    for (std::size_t c = 0; c < static_cast<std::size_t>(chunks) * copies; ++c)
      for (std::uint32_t d = 0; d < digits; ++d)
        total[d] += hist_[c * digits + d];

    // Non-finite keys all have a top digit of at least infinite_key >> 20: no extra pass to refuse them.
    for (std::uint32_t d = infinite_key >> top_shift; d < digits; ++d)
      if (total[d] != 0) check_finite(x);
    if (k == 0) return threshold{};

    std::size_t above = 0;
    std::uint32_t digit = digits - 1;
    for (; above + total[digit] < k; --digit)
      above += total[digit];
    const std::uint32_t lo = digit << top_shift;
    const std::uint32_t hi = (digit + 1) << top_shift;

    // Pass 2: the candidates. Blocks wholly below the bucket are skipped after a vectorised test.
    std::vector<std::uint32_t> cand = detail::collect_keys(x, lo, hi, opt_.parallel, total[digit]);
    const detail::finish f = detail::finish_among(cand, above, k);
    return detail::exact_result(f.key, f.above, k);
  }

private:
  options opt_{};
  std::vector<std::uint32_t> hist_;
};

static_assert(selector<radix>);

} // namespace commsgd::inline v1::select
