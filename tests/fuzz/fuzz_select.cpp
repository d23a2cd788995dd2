// Fuzz target: every host selector (exact, radix, hierarchical, laplace_bisect, sampled) on arbitrary
// floats -- NaN, inf, denormals, both zeros, heavy ties -- and arbitrary k, with input-chosen options (tiny
// segments and samples, trim, tolerances, threads) so that small inputs reach the multi-segment, multi-pass
// and threaded code.
//
// The contract of select/selector.hpp is checked against a sorted reference of magnitude keys:
//   k > N                    -> commsgd::invalid_argument
//   a NaN or inf in x        -> commsgd::non_finite with the right count and first index
//   k == 0                   -> value +inf, nothing selected
//   otherwise above == #{|x| > value}, at <= #{|x| == value}, and
//     exact methods and trim: count == k, value is the k-th largest magnitude
//     approximate methods:    at == #{|x| == value}, count in [k, ceil((1 + tol) k)]; or
//     commsgd::unsupported,
//                             allowed only when no threshold can land in that range (ties at the k-th key).
// laplace_bisect is called twice with warm start so the second call starts from the first's threshold.
#include "fuzz_support.hpp"

#include <commsgd/error.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/hierarchical.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/select/radix.hpp>
#include <commsgd/select/sampled.hpp>
#include <commsgd/select/selector.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <typeinfo>
#include <vector>

namespace {

namespace sel = commsgd::select;
using commsgd_fuzz::byte_source;

std::string describe(const sel::threshold& t, std::size_t k, std::size_t n) {
  return "value " + std::to_string(t.value) + " above " + std::to_string(t.above) + " at " +
         std::to_string(t.at) + " for k " + std::to_string(k) + " of " + std::to_string(n);
}

// Runs s.select(x, k) and checks the outcome; `exact` is whether the call must select exactly k.
template <class S>
void check_one(S& s, std::span<const float> x, std::size_t k, bool exact, double tol) {
  const std::size_t n = x.size();
  std::size_t bad = 0, first_bad = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (sel::magnitude_key(x[i]) >= sel::infinite_key && bad++ == 0) first_bad = i;

  sel::threshold t;
  try {
    t = s.select(x, k);
  } catch (const commsgd::non_finite& e) {
    FUZZ_CHECK_MSG(k <= n, std::string(S::name) + ": k > N must raise invalid_argument, got: " + e.what());
    FUZZ_CHECK_MSG(bad > 0, std::string(S::name) + ": non_finite on finite input: " + e.what());
    FUZZ_CHECK(e.count() == bad);
    FUZZ_CHECK(e.first_index() == first_bad);
    return;
  } catch (const commsgd::invalid_argument& e) {
    FUZZ_CHECK_MSG(k > n, std::string(S::name) + ": invalid_argument for a valid k: " + e.what());
    FUZZ_CHECK(typeid(e) == typeid(commsgd::invalid_argument));
    return;
  } catch (const commsgd::unsupported& e) {
    FUZZ_CHECK_MSG(!exact, std::string(S::name) + ": an exact call raised unsupported: " + e.what());
    FUZZ_CHECK(k <= n && bad == 0);
    // Justified only if selecting every key >= the k-th largest overshoots the allowed count.
    std::vector<std::uint32_t> keys(n);
    for (std::size_t i = 0; i < n; ++i)
      keys[i] = sel::magnitude_key(x[i]);
    std::sort(keys.begin(), keys.end(), std::greater<>{});
    const std::uint32_t kth = keys[k - 1];
    const auto ge =
        static_cast<std::size_t>(std::count_if(keys.begin(), keys.end(), [&](auto q) { return q >= kth; }));
    FUZZ_CHECK_MSG(ge > sel::count_limit(k, tol),
                   std::string(S::name) + ": unsupported although a valid threshold exists: " + e.what());
    return;
  } catch (const commsgd::error& e) {
    FUZZ_CHECK_MSG(false, std::string(S::name) + ": unexpected error: " + e.what());
  }
  FUZZ_CHECK_MSG(k <= n, std::string(S::name) + ": k > N was accepted");
  FUZZ_CHECK_MSG(bad == 0, std::string(S::name) + ": a NaN or inf was accepted");

  const std::string what = std::string(S::name) + ": " + describe(t, k, n);
  if (k == 0) {
    FUZZ_CHECK_MSG(t.count() == 0, what);
    FUZZ_CHECK_MSG(sel::magnitude_key(t.value) == sel::infinite_key && t.value > 0, what);
    return;
  }
  std::vector<std::uint32_t> keys(n);
  for (std::size_t i = 0; i < n; ++i)
    keys[i] = sel::magnitude_key(x[i]);
  FUZZ_CHECK_MSG(!(t.value < 0.0f) && sel::magnitude_key(t.value) < sel::infinite_key, what);
  const std::uint32_t tk = sel::magnitude_key(t.value);
  const auto above =
      static_cast<std::size_t>(std::count_if(keys.begin(), keys.end(), [&](auto q) { return q > tk; }));
  const auto equal = static_cast<std::size_t>(std::count(keys.begin(), keys.end(), tk));
  FUZZ_CHECK_MSG(t.above == above, what + " (true count above: " + std::to_string(above) + ")");
  FUZZ_CHECK_MSG(t.at <= equal, what + " (true count at: " + std::to_string(equal) + ")");
  std::sort(keys.begin(), keys.end(), std::greater<>{});
  if (exact) {
    FUZZ_CHECK_MSG(t.count() == k, what);
    FUZZ_CHECK_MSG(tk == keys[k - 1], what + " (k-th largest key differs)");
  } else {
    FUZZ_CHECK_MSG(t.at == equal, what + " (an approximate method must take every tie)");
    FUZZ_CHECK_MSG(t.count() >= k && t.count() <= sel::count_limit(k, tol), what);
  }
}

sel::parallel_options parallel(byte_source& in) {
  sel::parallel_options p;
  if (in.u8() % 4 == 0) { // threads on tiny inputs
    p.threads = 2;
    p.min_parallel_n = 1 + in.below(64);
  }
  return p;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  byte_source in(data, size);
  const std::uint8_t method = in.u8() % 5;
  const std::uint8_t opt_byte = in.u8();
  const bool trim = (opt_byte & 1) != 0;
  const double tol = (opt_byte >> 1) % 4 == 0 ? 0.0 : 0.01 * ((opt_byte >> 1) % 64);
  const auto par = parallel(in);

  const std::size_t n = in.below(300);
  std::vector<float> x(n);
  const bool clean = in.u8() % 4 != 0;
  for (auto& v : x) {
    v = in.awkward_float();
    if (clean && sel::magnitude_key(v) >= sel::infinite_key) v = -0.0f;
  }
  // k: mostly in range, sometimes the ends, sometimes past N.
  const std::uint8_t kc = in.u8();
  std::size_t k = kc < 200 ? in.below(n + 1) : (kc < 220 ? 0 : (kc < 240 ? n : n + 1 + in.below(4)));

  switch (method) {
  case 0: {
    sel::exact s;
    check_one(s, x, k, true, 0.0);
    break;
  }
  case 1: {
    sel::radix s(sel::radix::options{par});
    check_one(s, x, k, true, 0.0);
    break;
  }
  case 2: {
    sel::hierarchical::options o;
    o.segment = 1 + in.below(48);
    o.slack = static_cast<double>(in.u8() % 8) * 0.5;
    o.parallel = par;
    sel::hierarchical s(o);
    check_one(s, x, k, true, 0.0);
    break;
  }
  case 3: {
    sel::laplace_bisect::options o;
    o.tol = tol;
    o.trim = trim;
    o.center = in.flag() ? sel::laplace_bisect::location::sample_median : sel::laplace_bisect::location::zero;
    o.warm_start = in.flag();
    o.scale_sample = in.below(80);
    o.collect_limit = in.below(40);
    o.parallel = par;
    sel::laplace_bisect s(o);
    check_one(s, x, k, trim, tol);
    // Again, warm; and once more on a perturbed copy so the warm threshold is stale.
    check_one(s, x, k, trim, tol);
    if (!x.empty()) x[in.below(n)] = in.awkward_float();
    check_one(s, x, std::min(k, n), trim, tol);
    break;
  }
  default: {
    sel::sampled::options o;
    o.tol = tol;
    o.trim = trim;
    o.fraction = 1.0 / static_cast<double>(1 + in.below(64));
    o.min_sample = in.below(64);
    o.parallel = par;
    sel::sampled s(o);
    check_one(s, x, k, trim, tol);
    break;
  }
  }
  return 0;
}
