// The compressors' sums in parts (compress::summed_in_parts: int8, e3m0, fp16, bf16, top_k_ef) against their
// reduce(): the parts are reduce()'s sum bit for bit, rising and covering the length once; the round's
// residual, bytes and steps are as reduce() leaves them; code() asks for its input in adjacent rising
// stretches and reads none of it once it returns; a sum said surely finite holds no NaN or inf, and sums
// that overflow occur and are never said to be. The engine that reads them is
// tests/unit/sync_diloco_sum_parts.cpp's.
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/block_quant.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/chunked.hpp>
#include <commsgd/select/validate.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <vector>

using namespace commsgd;

namespace {

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Values of mixed magnitudes, with exact zeros, -0, ties of magnitude and, when `huge`, a few near the largest
// float (sums of those overflow).
std::vector<float> mixed(std::mt19937& rng, std::size_t d, bool huge) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 39), expo(-30, 10);
  std::vector<float> v(d);
  for (auto& x : v) {
    const int k = pick(rng);
    x = k == 0 ? 0.0f : k == 1 ? -0.0f : k == 2 ? 0.5f : k == 3 ? -0.5f : std::ldexp(normal(rng), expo(rng));
  }
  if (huge)
    for (std::size_t i = 0; i < d; i += 97)
      v[i] = (i % 2 ? -1.0f : 1.0f) * 0.9f * std::numeric_limits<float>::max();
  return v;
}

// Rounds of reduce() on one compressor and of code() and reduce_coded() on a twin, on n thread ranks: the
// same sum, residual, bytes and steps, the twin's input given in the stretches it asks for (checked to be
// adjacent and rising) from a copy overwritten once code() returns.
template <class X>
void parts_are_the_sum(const char* what, std::size_t d, int n, bool huge, auto make) {
  CAPTURE(what);
  CAPTURE(d);
  CAPTURE(n);
  CAPTURE(huge);
  std::mutex mu;
  std::vector<std::string> failures;
  std::size_t overflowed = 0;
  comm::local_group(n).run([&](comm::local& c) {
    X whole = make(d), parts = make(d);
    std::mt19937 rng(static_cast<unsigned>(977 * d + 31 * c.rank() + (huge ? 7 : 0)));
    std::vector<float> out(d), got(d, 1.0f), scratch;
    auto fail = [&](const std::string& f) {
      std::lock_guard lock(mu);
      failures.push_back("rank " + std::to_string(c.rank()) + ": " + f);
    };
    for (int round = 0; round < 3; ++round) {
      const auto g = mixed(rng, d, huge && round == 1);
      bool whole_ok = true, parts_ok = true;
      std::string whole_why, parts_why;
      try {
        whole.reduce(c, g, out);
      } catch (const error& e) {
        whole_ok = false;
        whole_why = e.what();
      }
      try {
        std::vector<float> copy = g;
        std::size_t asked = 0;
        parts.code([&](std::size_t first, std::size_t m) {
          if (first != asked || first + m > d) fail("code() asked for a stretch out of turn");
          asked = first + m;
          return std::span<const float>(copy).subspan(first, m);
        });
        if (asked != d) fail("code() read " + std::to_string(asked) + " values");
        std::fill(copy.begin(), copy.end(), std::numeric_limits<float>::quiet_NaN());
        parts.reduce_coded(c);
      } catch (const error& e) {
        parts_ok = false;
        parts_why = e.what();
      }
      if (whole_why != parts_why) fail("refused differently: " + whole_why + " / " + parts_why);
      if (whole_ok != parts_ok) fail("one round refused, its twin not");
      if (!whole_ok) continue;
      std::size_t next = 0;
      parts.for_each_sum_part(scratch, [&](std::size_t first, std::span<const float> part) {
        if (first != next || part.empty() || first + part.size() > d)
          fail("the parts do not tile the sum");
        else
          std::copy(part.begin(), part.end(), got.begin() + static_cast<std::ptrdiff_t>(first));
        next = first + part.size();
      });
      if (next != d) fail("the parts end at " + std::to_string(next));
      if (!same_bits(got, out)) fail("round " + std::to_string(round) + ": the parts differ from the sum");
      const auto bad = select::find_non_finite(std::span<const float>(out));
      if (bad.count > 0 && parts.sum_surely_finite()) fail("a sum with NaN or inf said surely finite");
      if (bad.count > 0) {
        std::lock_guard lock(mu);
        ++overflowed;
      }
      if (!same_bits(whole.residual(), parts.residual())) fail("the residuals differ");
      if (whole.wire_bytes() != parts.wire_bytes() || whole.steps() != parts.steps()) fail("bytes or steps");
    }
  });
  for (const auto& f : failures)
    FAIL_CHECK(f);
  // int8 and e3m0 pass every finite sum on; fp16 and bf16 refuse one that leaves their range.
  if (huge && d > 200 && (std::string(what) == "int8" || std::string(what) == "e3m0") && n > 1)
    CHECK(overflowed > 0);
}

} // namespace

TEST_CASE("a compressor's sum in parts is reduce()'s sum, its round's state the same, every length") {
  // Lengths across the parts' edges (8,192 values; top-k 4,096); inputs near the largest float on 3 ranks.
  for (std::size_t d :
       {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{8193}, std::size_t{17011}})
    for (int n : {1, 3})
      for (bool huge : {false, true})
        for (bool ef : {false, true}) {
          if (huge && n == 1) continue;
          CAPTURE(ef);
          for (std::size_t b : {std::size_t{1}, std::size_t{256}, std::size_t{8193}}) {
            CAPTURE(b);
            const compress::block_quant_options o{.block_size = b, .error_feedback = ef};
            parts_are_the_sum<compress::int8>("int8", d, n, huge,
                                              [&](std::size_t m) { return compress::int8(m, o); });
          }
          for (std::size_t b : {std::size_t{7}, std::size_t{257}, std::size_t{8193}}) {
            CAPTURE(b);
            const compress::block_quant_options o{.block_size = b, .error_feedback = ef};
            parts_are_the_sum<compress::e3m0>("e3m0", d, n, huge,
                                              [&](std::size_t m) { return compress::e3m0(m, o); });
          }
          for (const compress::top_k_ef_options& o :
               {compress::top_k_ef_options{.density = 0.05},
                compress::top_k_ef_options{.density = 0.3, .two_bit = true, .chunk = 64, .decay = 0.95f},
                compress::top_k_ef_options{.density = 0.01, .chunk = 4096, .sender_mean = true},
                compress::top_k_ef_options{.density = 1.0, .chunk = 7, .decay = 0.0f, .sender_mean = ef}}) {
            CAPTURE(o.density);
            parts_are_the_sum<compress::top_k_ef<select::chunked>>("top-k", d, n, huge, [&](std::size_t m) {
              return compress::top_k_ef<select::chunked>(m, o);
            });
          }
          parts_are_the_sum<compress::fp16>(
              "fp16", d, n, huge, [&](std::size_t m) { return compress::fp16(m, {.error_feedback = ef}); });
          parts_are_the_sum<compress::bf16>(
              "bf16", d, n, huge, [&](std::size_t m) { return compress::bf16(m, {.error_feedback = ef}); });
        }
}

TEST_CASE("sum_bound finds each rank's largest magnitude and any NaN or inf wherever they lie") {
  // The bound takes each rank's values in 16 lanes and a tail: a largest value, or a NaN or inf, at every
  // position of lengths around the lanes must still decide it. Two ranks, each with its largest magnitude
  // among small values, the holder's at `at`: (top + top) (1 + 2^-24)^2 below the largest float holds, so
  // tops of half of it fail the bound and tops just under half hold, whichever rank, sign and position (a
  // bound that missed the holder's top would hold where it must not).
  const float half = std::numeric_limits<float>::max() / 2.0f;
  const float under = half * (1.0f - 0x1p-20f);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int cases = 0;
  for (std::size_t count : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
                            std::size_t{31}, std::size_t{32}, std::size_t{33}, std::size_t{100}})
    for (std::size_t at = 0; at < count; ++at)
      for (int holder : {0, 1}) {
        CAPTURE(count);
        CAPTURE(at);
        CAPTURE(holder);
        auto ranks = [&](float top, float other) {
          std::vector<std::vector<float>> v(2, std::vector<float>(count));
          for (auto& r : v)
            for (auto& x : r)
              x = rng() % 7 == 0 ? -0.0f : normal(rng);
          v[static_cast<std::size_t>(holder)][at] = rng() % 2 ? top : -top;
          v[static_cast<std::size_t>(1 - holder)][rng() % count] = other; // the other rank's own largest
          return v;
        };
        auto holds = [&](const std::vector<std::vector<float>>& v) {
          compress::detail::sum_bound b;
          for (const auto& r : v)
            b.add(reinterpret_cast<const std::byte*>(r.data()), r.size());
          return b.holds(2);
        };
        CHECK_FALSE(holds(ranks(half, half)));
        CHECK(holds(ranks(under, under)));
        for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
          auto v = ranks(1.0f, 1.0f);
          v[static_cast<std::size_t>(holder)][at] = bad;
          CHECK_FALSE(holds(v));
        }
        ++cases;
      }
  CHECK(cases == 490);
}
