// Every CUDA selector and the compaction against a sorted CPU reference written here, independent of the
// host selectors: exact methods must give the same (value, above, at) and the same pairs; approximate ones
// must land in [k, ceil((1 + tol) k)] with a threshold consistent with the input.
#include <doctest/doctest.h>

#include <commsgd/cuda.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace select_cases {

namespace cu = commsgd::cuda;
using commsgd::select::magnitude_key;
using commsgd::select::threshold;

namespace {

threshold reference_threshold(const std::vector<float>& x, std::size_t k) {
  if (k == 0) return threshold{};
  std::vector<std::uint32_t> keys(x.size());
  std::transform(x.begin(), x.end(), keys.begin(), [](float v) { return magnitude_key(v); });
  std::sort(keys.begin(), keys.end(), std::greater<>());
  const std::uint32_t t = keys[k - 1];
  const auto above =
      static_cast<std::size_t>(std::count_if(keys.begin(), keys.end(), [&](auto v) { return v > t; }));
  return threshold{commsgd::select::key_magnitude(t), above, k - above};
}

std::vector<std::uint64_t> reference_indices(const std::vector<float>& x, const threshold& t) {
  std::vector<std::uint64_t> out;
  const std::uint32_t tk = magnitude_key(t.value);
  std::size_t ties = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::uint32_t key = magnitude_key(x[i]);
    if (key > tk || (key == tk && ties++ < t.at)) out.push_back(i);
  }
  return out;
}

enum class shape { laplace, gaussian, relu_like, ties, zeros, signed_zeros };

std::vector<float> make(std::size_t n, shape s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  std::exponential_distribution<float> expo(1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-3, 3);
  for (auto& v : x) {
    switch (s) {
    case shape::laplace:
      v = (rng() & 1 ? 1.0f : -1.0f) * expo(rng) * 1e-3f;
      break;
    case shape::gaussian:
      v = normal(rng);
      break;
    case shape::relu_like:
      v = (rng() % 8 == 0) ? 0.0f : (rng() & 1 ? 1.0f : -1.0f) * expo(rng) * expo(rng);
      break;
    case shape::ties:
      v = 0.5f * static_cast<float>(small(rng));
      break;
    case shape::zeros:
      v = 0.0f;
      break;
    case shape::signed_zeros:
      v = (rng() % 4 == 0) ? 1.0f : (rng() & 1 ? -0.0f : 0.0f);
      break;
    }
  }
  return x;
}

struct device_input {
  cu::device_buffer<float> d;
  explicit device_input(const std::vector<float>& x) : d(x.size()) {
    if (!x.empty())
      cu::check(cudaMemcpy(d.data(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice),
                "cudaMemcpy");
  }
};

// The count an approximate method claims must be what its threshold really selects.
void check_approximate(const std::vector<float>& x, std::size_t k, const threshold& t, double tol) {
  const std::uint32_t tk = magnitude_key(t.value);
  std::size_t above = 0, at = 0;
  for (float v : x) {
    above += magnitude_key(v) > tk;
    at += magnitude_key(v) == tk;
  }
  if (k == 0) {
    CHECK(t.count() == 0);
    return;
  }
  CHECK(t.above == above);
  CHECK(t.at == at);
  CHECK(t.count() >= k);
  CHECK(t.count() <= static_cast<std::size_t>(std::ceil((1.0 + tol) * static_cast<double>(k))));
  CHECK(t.count() <= commsgd::select::count_limit(k, tol));
}

// The host-device functions evaluated on the device, to be compared with the host's answers.
__global__ void shared_functions_kernel(const unsigned long long* k, const double* tol, int n,
                                        unsigned long long* limit, int* selected) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  limit[i] = commsgd::select::count_limit(k[i], tol[i]);
  selected[i] = commsgd::select::is_selected(static_cast<std::uint32_t>(k[i] % 7), 3, k[i] % 5, 2) ? 1 : 0;
}

template <class Method>
threshold run(Method& m, const std::vector<float>& x, std::size_t k) {
  device_input in(x);
  return m.select(in.d.data(), x.size(), k);
}

// Exact methods, and the approximate ones with trim: the reference threshold, bit for bit.
template <class Method>
void check_exact(Method m, const std::vector<float>& x, std::size_t k) {
  const threshold want = reference_threshold(x, k);
  const threshold got = run(m, x, k);
  INFO("method ", Method::name, " n ", x.size(), " k ", k);
  CHECK(got.value == want.value);
  CHECK(got.above == want.above);
  CHECK(got.at == want.at);
}

void check_all_exact(const std::vector<float>& x, std::size_t k) {
  check_exact(cu::exact{}, x, k);
  check_exact(cu::radix{}, x, k);
  check_exact(cu::hierarchical{}, x, k);
  check_exact(cu::laplace_bisect{{.trim = true, .warm_start = false}}, x, k);
  check_exact(cu::sampled{{.trim = true}}, x, k);
}

std::vector<std::size_t> ks_for(std::size_t n) {
  std::vector<std::size_t> ks{0, 1, n / 2, n, (n + 999) / 1000, (n + 99) / 100};
  std::erase_if(ks, [&](std::size_t k) { return k > n; });
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

} // namespace

TEST_CASE("count_limit and is_selected give the host's answers on the device") {
  std::vector<unsigned long long> ks;
  std::vector<double> tols;
  std::mt19937_64 rng(17);
  for (double tol : {0.0, 0.01, 0.1, 1.0, 0.3333333333333333, 1e9})
    for (unsigned long long k : {0ull, 1ull, 100ull, 1ull << 40, (1ull << 40) + 5, ~0ull}) {
      ks.push_back(k);
      tols.push_back(tol);
    }
  for (int i = 0; i < 4000; ++i) {
    ks.push_back(rng() >> (rng() % 64));
    tols.push_back(std::ldexp(static_cast<double>(rng() % 100000), -static_cast<int>(rng() % 24)));
  }
  const int n = static_cast<int>(ks.size());
  cu::device_buffer<unsigned long long> d_k(n), d_limit(n);
  cu::device_buffer<double> d_tol(n);
  cu::device_buffer<int> d_selected(n);
  cu::check(cudaMemcpy(d_k.data(), ks.data(), n * sizeof(ks[0]), cudaMemcpyHostToDevice), "cudaMemcpy");
  cu::check(cudaMemcpy(d_tol.data(), tols.data(), n * sizeof(tols[0]), cudaMemcpyHostToDevice), "cudaMemcpy");
  shared_functions_kernel<<<(n + 255) / 256, 256>>>(d_k.data(), d_tol.data(), n, d_limit.data(),
                                                    d_selected.data());
  cu::check_launch("shared_functions_kernel");
  std::vector<unsigned long long> limit(n);
  std::vector<int> selected(n);
  cu::check(cudaMemcpy(limit.data(), d_limit.data(), n * sizeof(limit[0]), cudaMemcpyDeviceToHost),
            "cudaMemcpy");
  cu::check(cudaMemcpy(selected.data(), d_selected.data(), n * sizeof(int), cudaMemcpyDeviceToHost),
            "cudaMemcpy");
  std::size_t differ = 0;
  for (int i = 0; i < n; ++i) {
    differ += limit[i] != commsgd::select::count_limit(ks[i], tols[i]);
    differ += (selected[i] != 0) !=
              commsgd::select::is_selected(static_cast<std::uint32_t>(ks[i] % 7), 3, ks[i] % 5, 2);
  }
  CHECK(differ == 0);
  CHECK(commsgd::select::count_limit(100, 0.1) == 110);
}

TEST_CASE("the engine's internal-inconsistency flag reads as internal_error, not as a tolerance refusal") {
  cu::device_result r{1.0f, cu::internal_inconsistency, 0, 0, 0, 0};
  CHECK_THROWS_AS(cu::to_threshold(r), commsgd::internal_error);
  r.flags = cu::ties_exceed_tolerance;
  CHECK_THROWS_AS(cu::to_threshold(r), commsgd::unsupported);
  r.flags = 0;
  CHECK(cu::to_threshold(r) == threshold{1.0f, 0, 0});
}

TEST_CASE("exact methods match the sorted reference on random inputs") {
  const std::size_t sizes[] = {0, 1, 2, 7, 1001, 4096, 4097, 65537, 300001};
  const shape shapes[] = {shape::laplace, shape::gaussian, shape::relu_like,
                          shape::ties,    shape::zeros,    shape::signed_zeros};
  for (std::size_t n : sizes)
    for (shape s : shapes)
      for (std::uint64_t seed = 1; seed <= (n < 5000 ? 6u : 2u); ++seed) {
        const auto x = make(n, s, seed * 7919 + n);
        for (std::size_t k : ks_for(n))
          check_all_exact(x, k);
      }
}

TEST_CASE("exact methods at 2^24") {
  const std::size_t n = std::size_t{1} << 24;
  for (shape s : {shape::laplace, shape::relu_like, shape::ties}) {
    const auto x = make(n, s, 42);
    for (std::size_t k : {std::size_t{1}, n / 10000, n / 1000, n / 100, n})
      check_all_exact(x, k);
  }
}

TEST_CASE("approximate methods land within tolerance") {
  for (std::size_t n : {std::size_t{1000}, std::size_t{65536}, std::size_t{1} << 20})
    for (shape s : {shape::laplace, shape::gaussian, shape::relu_like})
      for (std::uint64_t seed = 1; seed <= 3; ++seed) {
        const auto x = make(n, s, seed);
        for (std::size_t k : ks_for(n)) {
          INFO("n ", n, " k ", k, " shape ", static_cast<int>(s));
          cu::laplace_bisect cold({.warm_start = false});
          check_approximate(x, k, run(cold, x, k), 0.01);
          cu::sampled sm;
          check_approximate(x, k, run(sm, x, k), 0.01);
          // Warm start: the previous threshold of a similar gradient centres the window.
          cu::laplace_bisect warm;
          run(warm, make(n, s, seed + 100), k);
          CHECK(warm.warm() == (k > 0));
          check_approximate(x, k, run(warm, x, k), 0.01);
        }
      }
}

// Error-feedback accumulators p = g + e, as top-k training feeds its selector: the residual keeps every
// unsent entry, so mass piles up just below each step's threshold.
struct feedback {
  std::vector<float> residual;
  std::uint64_t seed;
  feedback(std::size_t n, std::uint64_t s) : residual(n, 0.0f), seed(s) {}

  std::vector<float> next(shape s) {
    std::vector<float> p = make(residual.size(), s, seed++);
    for (std::size_t i = 0; i < p.size(); ++i)
      p[i] += residual[i];
    return p;
  }
  void sent(const std::vector<float>& p, float t) {
    for (std::size_t i = 0; i < p.size(); ++i)
      residual[i] = std::fabs(p[i]) >= t ? 0.0f : p[i];
  }
};

TEST_CASE("laplace_bisect warm through a threshold that falls 20 % and rises 20 %") {
  for (shape s : {shape::laplace, shape::gaussian, shape::relu_like})
    for (std::size_t n : {std::size_t{3001}, std::size_t{1} << 17, std::size_t{1} << 20})
      for (double density : {1e-3, 1e-2})
        for (bool trim : {false, true}) {
          INFO("shape ", static_cast<int>(s), " n ", n, " density ", density, " trim ", trim);
          const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(density * n));
          cu::laplace_bisect warm({.trim = trim});
          feedback fb(n, 7 + n);
          const float factors[4] = {0.8f, 1.0f, 1.2f, 1.0f};
          float previous = 0.0f, factor = 1.0f;
          for (int step = 0; step < 22; ++step) {
            INFO("step ", step);
            // Six steps at one scale build the pile-up; then the whole accumulator is scaled by 0.8, 1, 1.2,
            // 1, ...: the threshold falls 20 %, rises 25 %, rises 20 % and falls 17 % in turn.
            const float before = factor;
            factor = step < 6 ? 1.0f : factors[(step - 6) % 4];
            const std::vector<float> u = fb.next(s);
            std::vector<float> p(u);
            for (float& v : p)
              v *= factor;
            CHECK(warm.warm() == (step > 0));
            const threshold t = run(warm, p, k);
            const threshold ref = reference_threshold(p, k);
            if (trim) {
              CHECK(t.value == ref.value);
              CHECK(t.above == ref.above);
              CHECK(t.at == ref.at);
            } else {
              check_approximate(p, k, t, 0.01);
            }
            // The setup really moves the threshold: the test is vacuous otherwise.
            if (n > 100000 && step >= 6 && factor != before && previous > 0.0f)
              CHECK(std::fabs(static_cast<double>(ref.value) / previous - 1.0) > 0.1);
            previous = ref.value;
            fb.sent(u, t.value / factor);
          }
        }
}

TEST_CASE("laplace_bisect restored off the threshold either way still selects right") {
  for (shape s : {shape::laplace, shape::gaussian, shape::relu_like})
    for (std::size_t n : {std::size_t{1000}, std::size_t{65537}, std::size_t{1} << 20})
      for (double density : {1e-3, 1e-2, 0.3}) {
        const auto x = make(n, s, 99 + n);
        const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(density * n));
        const threshold ref = reference_threshold(x, k);
        for (float factor : {0.8f, 1.2f, 0.5f, 1.9f, 1e-6f, 1e6f}) {
          INFO("shape ", static_cast<int>(s), " n ", n, " k ", k, " factor ", factor);
          cu::laplace_bisect exact_one({.trim = true});
          exact_one.restore(ref.value * factor);
          CHECK(exact_one.warm());
          const threshold t = run(exact_one, x, k);
          CHECK(t.value == ref.value);
          CHECK(t.above == ref.above);
          CHECK(t.at == ref.at);
          cu::laplace_bisect approx;
          approx.restore(ref.value * factor);
          check_approximate(x, k, run(approx, x, k), 0.01);
        }
      }
  // Ties, zeros and -0 on the warm path, from states around them.
  std::mt19937_64 rng(5);
  for (int round = 0; round < 200; ++round) {
    INFO("round ", round);
    const std::size_t n = 1 + rng() % 700;
    std::vector<float> x(n);
    const int levels = 1 + static_cast<int>(rng() % 6);
    for (auto& v : x) {
      const int l = static_cast<int>(rng() % static_cast<unsigned>(levels));
      v = l == 0 ? ((rng() & 1) ? 0.0f : -0.0f) : ((rng() & 1) ? 1.0f : -1.0f) * std::ldexp(1.0f, l);
    }
    const std::size_t k = 1 + rng() % n;
    cu::laplace_bisect m({.trim = true});
    m.restore(std::ldexp(1.0f, static_cast<int>(rng() % 9) - 2));
    check_exact(std::move(m), x, k);
  }
  cu::laplace_bisect m;
  CHECK_THROWS_AS(m.restore(-1.0f), commsgd::invalid_argument);
  CHECK_THROWS_AS(m.restore(std::numeric_limits<float>::infinity()), commsgd::invalid_argument);
  CHECK_THROWS_AS(m.restore(std::numeric_limits<float>::quiet_NaN()), commsgd::invalid_argument);
  m.restore(0.0f);
  CHECK(!m.warm());
}

TEST_CASE("laplace_bisect refuses non-finite input on every warm window level") {
  auto x = make(100000, shape::laplace, 3);
  x[777] = std::numeric_limits<float>::quiet_NaN();
  x[90000] = -std::numeric_limits<float>::infinity();
  // A hit, a miss that widens once, and one that widens to everything below.
  for (float state : {7e-3f, 1.2e-2f, 1e6f}) {
    INFO("state ", state);
    cu::laplace_bisect m;
    m.restore(state);
    try {
      run(m, x, 100);
      FAIL("no exception");
    } catch (const commsgd::non_finite& e) {
      CHECK(e.count() == 2);
      CHECK(e.first_index() == 777);
    }
  }
}

TEST_CASE("approximate methods refuse when ties exceed the tolerance") {
  const auto x = make(10000, shape::zeros, 1);
  cu::laplace_bisect m({.warm_start = false});
  CHECK_THROWS_AS(run(m, x, 10), commsgd::unsupported);
  cu::sampled s;
  CHECK_THROWS_AS(run(s, x, 10), commsgd::unsupported);
}

TEST_CASE("a laplace_bisect call refused for ties leaves the warm start where the last good call put it") {
  const auto good = make(100000, shape::laplace, 4);
  cu::laplace_bisect m;
  const threshold t = run(m, good, 100);
  float before = 0.0f;
  CHECK(cudaMemcpy(&before, m.previous_threshold(), sizeof before, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(before == t.value);
  // All zeros: every entry ties at 0, far beyond the tolerance.
  CHECK_THROWS_AS(run(m, make(100000, shape::zeros, 1), 100), commsgd::unsupported);
  float after = -1.0f;
  CHECK(cudaMemcpy(&after, m.previous_threshold(), sizeof after, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(after == before);
  // The next call starts warm from that threshold and selects within the contract.
  const auto next = make(100000, shape::laplace, 5);
  check_approximate(next, 100, run(m, next, 100), 0.01);
}

TEST_CASE("exactness follows trim: selects_exactly and cuda::top_k's pair buffers") {
  CHECK(commsgd::select::selects_exactly(cu::radix{}));
  CHECK(!commsgd::select::selects_exactly(cu::laplace_bisect{}));
  CHECK(commsgd::select::selects_exactly(cu::laplace_bisect({.trim = true})));
  CHECK(!commsgd::select::selects_exactly(cu::sampled{}));
  CHECK(commsgd::select::selects_exactly(cu::sampled({.trim = true})));
  const std::size_t n = 100000;
  cu::top_k<cu::laplace_bisect> trimmed(n, {.density = 0.01}, cu::laplace_bisect({.trim = true}));
  CHECK(trimmed.pair_capacity() == trimmed.k());
  cu::top_k<cu::laplace_bisect> approx(n, {.density = 0.01});
  CHECK(approx.pair_capacity() > approx.k());
}

TEST_CASE("no non-finite value reads as no_nonfinite_index, never as index 0") {
  const auto x = make(1000, shape::laplace, 6);
  cu::device_buffer<float> d(x.size());
  CHECK(cudaMemcpy(d.data(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  cu::radix m;
  std::size_t bytes = 0;
  m.select(nullptr, bytes, d.data(), x.size(), 10, nullptr);
  cu::device_buffer<char> ws(bytes);
  cu::device_buffer<cu::device_result> out(1);
  m.select(ws.data(), bytes, d.data(), x.size(), 10, out.data());
  cu::device_result r{};
  CHECK(cudaMemcpy(&r, out.data(), sizeof r, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(r.nonfinite_count == 0);
  CHECK(r.first_nonfinite == cu::no_nonfinite_index);
}

TEST_CASE("non-finite input is refused with the count and the first index") {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    auto x = make(100000, shape::laplace, 3);
    x[777] = bad;
    x[90000] = bad;
    auto expect = [&](auto method, std::size_t k) {
      INFO("method ", decltype(method)::name, " k ", k);
      try {
        run(method, x, k);
        FAIL("no exception");
      } catch (const commsgd::non_finite& e) {
        CHECK(e.count() == 2);
        CHECK(e.first_index() == 777);
      }
    };
    for (std::size_t k : {std::size_t{0}, std::size_t{100}}) {
      expect(cu::exact{}, k);
      expect(cu::radix{}, k);
      expect(cu::hierarchical{}, k);
      expect(cu::laplace_bisect{}, k);
      expect(cu::sampled{}, k);
    }
    device_input in(x);
    CHECK_THROWS_AS(cu::check_finite(in.d.data(), x.size()), commsgd::non_finite);
  }
}

TEST_CASE("arguments out of range are refused") {
  const auto x = make(10, shape::laplace, 1);
  device_input in(x);
  CHECK_THROWS_AS(cu::radix{}.select(in.d.data(), 10, 11), commsgd::invalid_argument);
  std::size_t bytes = 0;
  cu::radix{}.select(nullptr, bytes, in.d.data(), 10, 5, nullptr);
  CHECK(bytes > 0);
  cu::device_buffer<char> ws(bytes);
  cu::device_buffer<cu::device_result> out(1);
  std::size_t small = bytes - 1;
  CHECK_THROWS_AS(cu::radix{}.select(ws.data(), small, in.d.data(), 10, 5, out.data()),
                  commsgd::invalid_argument);
}

template <class Index>
void check_compaction(const std::vector<float>& x, std::size_t k) {
  device_input in(x);
  std::size_t bytes = 0;
  cu::radix r;
  r.select(nullptr, bytes, in.d.data(), x.size(), k, nullptr);
  cu::device_buffer<char> ws(bytes);
  cu::device_buffer<cu::device_result> thr(1);
  r.select(ws.data(), bytes, in.d.data(), x.size(), k, thr.data());
  const std::size_t capacity = std::max<std::size_t>(k, 1);
  cu::device_buffer<Index> idx(capacity);
  cu::device_buffer<float> val(capacity);
  cu::device_buffer<unsigned long long> count(1);
  cu::compact<Index>(in.d.data(), x.size(), thr.data(), idx.data(), val.data(), capacity, count.data());
  const threshold t = cu::read_result(thr.data(), nullptr);
  unsigned long long got_count = 0;
  std::vector<Index> got_idx(capacity);
  std::vector<float> got_val(capacity);
  cu::check(cudaMemcpy(&got_count, count.data(), sizeof got_count, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cu::check(cudaMemcpy(got_idx.data(), idx.data(), capacity * sizeof(Index), cudaMemcpyDeviceToHost),
            "cudaMemcpy");
  cu::check(cudaMemcpy(got_val.data(), val.data(), capacity * sizeof(float), cudaMemcpyDeviceToHost),
            "cudaMemcpy");
  const auto want = reference_indices(x, reference_threshold(x, k));
  INFO("n ", x.size(), " k ", k);
  REQUIRE(want.size() == k);
  REQUIRE(got_count == k);
  CHECK(t.count() == k);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < k; ++i) {
    wrong += got_idx[i] != want[i];
    wrong += std::memcmp(&got_val[i], &x[want[i]], sizeof(float)) != 0;
  }
  CHECK(wrong == 0);
}

TEST_CASE("compaction writes the reference set in index order") {
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{5000}, std::size_t{65537}, std::size_t{1} << 20})
    for (shape s : {shape::laplace, shape::ties, shape::signed_zeros, shape::zeros})
      for (std::size_t k : ks_for(n)) {
        const auto x = make(n, s, n + k);
        check_compaction<std::uint32_t>(x, k);
        check_compaction<std::uint64_t>(x, k);
      }
  const std::size_t n = std::size_t{1} << 24;
  const auto x = make(n, shape::relu_like, 9);
  check_compaction<std::uint32_t>(x, n / 1000);
}

} // namespace select_cases
