// cuda::top_k against the host sparsifier and against the error-feedback identity, bit for bit. Part of
// the cuda_select_test program (main in cuda_tests.cu).
#include <doctest/doctest.h>

#include <commsgd/cuda.cuh>
#include <commsgd/select/exact.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace top_k_cases {

namespace cu = commsgd::cuda;

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Laplace-like gradients whose scale changes from step to step; with `ties`, values on a coarse grid so
// that many magnitudes tie at the threshold and the tie rule decides; signed zeros mixed in.
std::vector<float> gradient(std::size_t n, std::uint64_t seed, bool ties = false) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<float> expo(1.0f);
  std::uniform_int_distribution<int> small(-4, 4);
  const float scale = 1e-3f * static_cast<float>(1 + seed % 7);
  std::vector<float> g(n);
  for (auto& v : g) {
    if (rng() % 16 == 0)
      v = rng() & 1 ? -0.0f : 0.0f;
    else if (ties)
      v = 0.25f * static_cast<float>(small(rng));
    else
      v = (rng() & 1 ? 1.0f : -1.0f) * expo(rng) * scale;
  }
  return g;
}

commsgd::sparsify::top_k_options host_options(double density, float momentum) {
  commsgd::sparsify::top_k_options o;
  o.density = density;
  o.momentum = momentum;
  return o;
}

struct device_vector {
  cu::device_buffer<float> d;
  explicit device_vector(const std::vector<float>& x) : d(x.size()) {
    if (!x.empty())
      cu::check(cudaMemcpy(d.data(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice),
                "cudaMemcpy");
  }
};

template <class Index>
struct message {
  std::vector<Index> index;
  std::vector<float> value;
};

template <class Index>
message<Index> copy(commsgd::sparsify::sparse_view<Index> v) {
  return {std::vector<Index>(v.indices.begin(), v.indices.end()),
          std::vector<float>(v.values.begin(), v.values.end())};
}

template <class Index>
bool same(const message<Index>& a, const message<Index>& b) {
  if (a.index != b.index || a.value.size() != b.value.size()) return false;
  for (std::size_t j = 0; j < a.value.size(); ++j)
    if (bits_of(a.value[j]) != bits_of(b.value[j])) return false;
  return true;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (bits_of(a[i]) != bits_of(b[i])) return false;
  return true;
}

// One step, checked against the identity: every position of g + e (or e + (m u + g)) is either sent with
// its exact bits or kept in the residual with them; sent positions keep +0; indices rise and stay in range.
template <class Sparsifier>
message<typename Sparsifier::index_type> checked_step(Sparsifier& s, const std::vector<float>& g, float m) {
  using Index = typename Sparsifier::index_type;
  const std::size_t n = g.size();
  const std::vector<float> e = s.residual_to_host();
  const std::vector<float> u = s.momentum_to_host();
  device_vector dg(g);
  const auto view = s.step(dg.d.data());
  const message<Index> msg = copy(view);
  const std::vector<float> e_next = s.residual_to_host();
  const std::vector<float> u_next = s.momentum_to_host();
  REQUIRE(view.length == n);
  REQUIRE(view.indices.size() == view.values.size());
  std::vector<char> sent(n, 0);
  std::size_t bad_order = 0;
  for (std::size_t j = 0; j < msg.index.size(); ++j) {
    bad_order += msg.index[j] >= n || (j > 0 && msg.index[j] <= msg.index[j - 1]);
    if (msg.index[j] < n) sent[msg.index[j]] = 1;
  }
  CHECK(bad_order == 0);
  std::vector<float> value_at(n, 0.0f);
  for (std::size_t j = 0; j < msg.index.size(); ++j)
    if (msg.index[j] < n) value_at[msg.index[j]] = msg.value[j];
  std::size_t broken = 0, not_cleared = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float want;
    if (m > 0.0f) {
      volatile float mu = m * u[i]; // no contraction into an FMA on the host either
      const float ui = mu + g[i];
      want = e[i] + ui;
      if (sent[i])
        not_cleared += bits_of(u_next[i]) != 0;
      else
        broken += bits_of(u_next[i]) != bits_of(ui);
    } else {
      want = g[i] + e[i];
    }
    const float got = sent[i] ? value_at[i] : e_next[i];
    broken += bits_of(got) != bits_of(want);
    if (sent[i]) not_cleared += bits_of(e_next[i]) != 0;
  }
  CHECK(broken == 0);
  CHECK(not_cleared == 0);
  return msg;
}

} // namespace

TEST_CASE("cuda::top_k conserves every value bit for bit over several steps") {
  const std::size_t n = 100003;
  const double density = 0.01;
  const std::size_t k = commsgd::select::k_for_density(n, density);
  for (float m : {0.0f, 0.9f}) {
    INFO("momentum ", m);
    cu::top_k<> approx(n, {.density = density, .momentum = m});
    cu::top_k<cu::exact> exact(n, {.density = density, .momentum = m});
    cu::top_k<cu::radix, std::uint64_t> radix64(n, {.density = density, .momentum = m});
    for (std::uint64_t step = 0; step < 6; ++step) {
      const auto g = gradient(n, 100 + step, step % 3 == 2);
      const auto a = checked_step(approx, g, m);
      CHECK(a.index.size() >= k);
      CHECK(a.index.size() <= commsgd::select::count_limit(k, 0.01));
      CHECK(checked_step(exact, g, m).index.size() == k);
      CHECK(checked_step(radix64, g, m).index.size() == k);
    }
    CHECK(approx.steps() == 6);
  }
}

TEST_CASE("cuda::top_k with an exact selector sends the host top_k<select::exact>'s set") {
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{65536 * 3 + 17}})
    for (double density : {0.001, 0.05, 0.5})
      for (float m : {0.0f, 0.9f}) {
        INFO("n ", n, " density ", density, " momentum ", m);
        commsgd::sparsify::top_k<commsgd::select::exact> host(n, host_options(density, m));
        cu::top_k<cu::exact> dev(n, {.density = density, .momentum = m});
        cu::top_k<cu::radix> dev_radix(n, {.density = density, .momentum = m});
        cu::top_k<cu::laplace_bisect> dev_trim(n, {.density = density, .momentum = m},
                                               cu::laplace_bisect({.trim = true}));
        for (std::uint64_t step = 0; step < 4; ++step) {
          const auto g = gradient(n, 7 * n + step, step % 2 == 1);
          const auto want = copy(host.step(g));
          device_vector dg(g);
          CHECK(same(copy(dev.step(dg.d.data())), want));
          CHECK(same(copy(dev_radix.step(dg.d.data())), want));
          CHECK(same(copy(dev_trim.step(dg.d.data())), want));
          const std::vector<float> host_e(host.residual().begin(), host.residual().end());
          CHECK(same_bits(dev.residual_to_host(), host_e));
          CHECK(same_bits(dev_trim.residual_to_host(), host_e));
          if (m > 0.0f) {
            const std::vector<float> host_u(host.momentum().begin(), host.momentum().end());
            CHECK(same_bits(dev.momentum_to_host(), host_u));
          }
        }
      }
}

TEST_CASE("cuda::top_k refuses non-finite gradients with the count and first index, changing nothing") {
  const std::size_t n = 100000;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    cu::top_k<> s(n, {.density = 0.01});
    cu::top_k<cu::exact> e(n, {.density = 0.01, .momentum = 0.5});
    const auto g0 = gradient(n, 1);
    device_vector d0(g0);
    const auto first_s = copy(s.step(d0.d.data()));
    const auto first_e = copy(e.step(d0.d.data()));
    const auto residual_s = s.residual_to_host();
    const auto residual_e = e.residual_to_host();
    const auto momentum_e = e.momentum_to_host();
    auto g = gradient(n, 2);
    g[777] = bad;
    g[90000] = bad;
    device_vector d(g);
    auto expect_refusal = [&](auto& sparsifier) {
      try {
        sparsifier.step(d.d.data());
        FAIL("no exception");
      } catch (const commsgd::non_finite& x) {
        CHECK(x.count() == 2);
        CHECK(x.first_index() == 777);
      }
    };
    expect_refusal(s);
    expect_refusal(e);
    CHECK(s.steps() == 1);
    CHECK(e.steps() == 1);
    CHECK(same_bits(s.residual_to_host(), residual_s));
    CHECK(same_bits(e.residual_to_host(), residual_e));
    CHECK(same_bits(e.momentum_to_host(), momentum_e));
    // The previous message is still there, untouched by the refused step's staging.
    CHECK(same(copy(s.last()), first_s));
    CHECK(same(copy(e.last()), first_e));
    // And the sparsifier goes on as if the bad step never happened.
    const auto g2 = gradient(n, 3);
    checked_step(e, g2, 0.5f);
  }
}

TEST_CASE("cuda::top_k with density 1 sends everything and keeps nothing") {
  const std::size_t n = 70001;
  auto run = [&](auto s) {
    for (std::uint64_t step = 0; step < 3; ++step) {
      const auto g = gradient(n, 40 + step, step == 1);
      device_vector d(g);
      const auto msg = copy(s.step(d.d.data()));
      REQUIRE(msg.index.size() == n);
      // The residual is +0 everywhere, so what is sent is g + (+0): -0 in g goes out as +0.
      volatile float plus_zero = 0.0f;
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i)
        wrong += msg.index[i] != i || bits_of(msg.value[i]) != bits_of(g[i] + plus_zero);
      CHECK(wrong == 0);
      std::size_t kept = 0;
      for (float v : s.residual_to_host())
        kept += bits_of(v) != 0;
      CHECK(kept == 0);
    }
  };
  run(cu::top_k<cu::exact>(n, {.density = 1.0}));
  run(cu::top_k<cu::laplace_bisect>(n, {.density = 1.0}));
}

TEST_CASE("cuda::top_k state round-trips through save/load and continues bit-identically") {
  const std::size_t n = 50000;
  for (float m : {0.0f, 0.9f}) {
    INFO("momentum ", m);
    cu::top_k<cu::exact> a(n, {.density = 0.02, .momentum = m});
    for (std::uint64_t step = 0; step < 3; ++step) {
      device_vector d(gradient(n, 60 + step));
      a.step(d.d.data());
    }
    std::vector<std::byte> blob;
    a.save(blob);

    cu::top_k<cu::exact> b(n, {.density = 0.02, .momentum = m});
    b.load(blob);
    CHECK(b.steps() == 3);
    CHECK(same_bits(b.residual_to_host(), a.residual_to_host()));
    CHECK(same_bits(b.momentum_to_host(), a.momentum_to_host()));
    for (std::uint64_t step = 3; step < 6; ++step) {
      device_vector d(gradient(n, 60 + step, step == 4));
      const auto ma = copy(a.step(d.d.data()));
      const auto mb = copy(b.step(d.d.data()));
      CHECK(same(ma, mb));
      CHECK(same_bits(a.residual_to_host(), b.residual_to_host()));
    }

    // The format is the host sparsifier's: a host top_k<select::exact> picks up where the GPU left off.
    a.save(blob);
    commsgd::sparsify::top_k<commsgd::select::exact> host(n, host_options(0.02, m));
    host.load(blob);
    const std::vector<float> host_e(host.residual().begin(), host.residual().end());
    CHECK(same_bits(host_e, a.residual_to_host()));
    const auto g = gradient(n, 99);
    device_vector d(g);
    CHECK(same(copy(a.step(d.d.data())), copy(host.step(g))));

    // A damaged blob is refused and changes nothing.
    const auto before = b.residual_to_host();
    std::vector<std::byte> cut(blob.begin(), blob.begin() + static_cast<std::ptrdiff_t>(blob.size() / 2));
    CHECK_THROWS_AS(b.load(cut), commsgd::corrupt_data);
    cu::top_k<cu::exact> other_length(n + 1, {.density = 0.02, .momentum = m});
    CHECK_THROWS_AS(other_length.load(blob), commsgd::corrupt_data);
    CHECK(same_bits(b.residual_to_host(), before));
    CHECK(b.steps() == 6);
  }
}

TEST_CASE("cuda::top_k refuses arguments out of range") {
  CHECK_THROWS_AS(cu::top_k<cu::exact>(100, {.density = 0.0}), commsgd::invalid_argument);
  CHECK_THROWS_AS(cu::top_k<cu::exact>(100, {.density = 1.5}), commsgd::invalid_argument);
  CHECK_THROWS_AS(cu::top_k<cu::exact>(100, {.density = 0.1, .momentum = 1.0}), commsgd::invalid_argument);
  cu::top_k<cu::exact> s(100, {.density = 0.1});
  CHECK_THROWS_AS(s.step(nullptr), commsgd::invalid_argument);
  cu::top_k<cu::exact> empty(0, {.density = 0.5});
  CHECK(empty.step(nullptr).size() == 0);
}

} // namespace top_k_cases
