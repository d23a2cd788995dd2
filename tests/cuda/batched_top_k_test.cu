// cuda::batched_top_k against a host reference of exact top-k with error feedback (ties to the lowest
// index), bit for bit: many tensors, odd and empty ones, thresholds that jump (so both the candidate path
// and the re-read path run), ties, signed zeros, momentum, 16-bit gradients, graph capture, refused steps and
// checkpoints. Part of the cuda_select_test program (main in cuda_tests.cu).
#include <doctest/doctest.h>

#include <commsgd/cuda.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

namespace batched_top_k_cases {

namespace cu = commsgd::cuda;

namespace {

std::uint32_t bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// The host's arithmetic and selection rule, tensor by tensor.
struct reference {
  std::vector<std::size_t> lengths, ks;
  float m;
  bool dgc;
  std::vector<float> e, u;
  reference(std::vector<std::size_t> l, std::vector<std::size_t> k, float momentum, bool mask)
      : lengths(std::move(l)), ks(std::move(k)), m(momentum), dgc(mask) {
    const std::size_t n = std::accumulate(lengths.begin(), lengths.end(), std::size_t{0});
    e.assign(n, 0.0f);
    u.assign(n, 0.0f);
  }
  // Returns the sent (index, value) pairs, sorted by index.
  std::vector<std::pair<std::uint32_t, float>> step(const std::vector<float>& g) {
    std::vector<float> p(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (m > 0) {
        const float prod = m * u[i];
        u[i] = prod + g[i];
        p[i] = e[i] + u[i];
      } else {
        p[i] = g[i] + e[i];
      }
    }
    std::vector<std::pair<std::uint32_t, float>> sent;
    std::size_t begin = 0;
    for (std::size_t t = 0; t < lengths.size(); ++t) {
      std::vector<std::uint32_t> idx(lengths[t]);
      std::iota(idx.begin(), idx.end(), static_cast<std::uint32_t>(begin));
      auto key = [&](std::uint32_t i) { return bits(p[i]) & 0x7fffffffu; };
      std::sort(idx.begin(), idx.end(),
                [&](std::uint32_t a, std::uint32_t b) { return key(a) != key(b) ? key(a) > key(b) : a < b; });
      for (std::size_t j = 0; j < ks[t]; ++j)
        sent.emplace_back(idx[j], p[idx[j]]);
      begin += lengths[t];
    }
    for (auto& [i, v] : sent) {
      p[i] = 0.0f;
      if (m > 0 && dgc) u[i] = 0.0f;
    }
    e = p;
    std::sort(sent.begin(), sent.end());
    return sent;
  }
};

// Laplace-like values whose scale jumps by `scale`; a few signed zeros; with `ties`, a coarse grid.
std::vector<float> draw(std::size_t n, std::mt19937_64& rng, float scale, bool ties) {
  std::exponential_distribution<float> expo(1.0f);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<float> g(n);
  for (auto& v : g) {
    if (rng() % 16 == 0)
      v = rng() & 1 ? -0.0f : 0.0f;
    else if (ties)
      v = 0.5f * scale * static_cast<float>(small(rng));
    else
      v = (rng() & 1 ? 1.0f : -1.0f) * expo(rng) * scale;
  }
  return g;
}

template <class G>
G from_float(float x) {
  if constexpr (std::is_same_v<G, float>)
    return x;
  else if constexpr (std::is_same_v<G, __half>)
    return __float2half_rn(x);
  else
    return __float2bfloat16_rn(x);
}
template <class G>
float to_float_host(G x) {
  if constexpr (std::is_same_v<G, float>)
    return x;
  else if constexpr (std::is_same_v<G, __half>)
    return __half2float(x);
  else
    return __bfloat162float(x);
}

template <class G>
struct device_grad {
  cu::device_buffer<G> d;
  std::vector<float> as_float; // what the device sees, as float
  explicit device_grad(std::size_t n) : d(n) {}
  void set(const std::vector<float>& g) {
    std::vector<G> h(g.size());
    as_float.resize(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      h[i] = from_float<G>(g[i]);
      as_float[i] = to_float_host(h[i]);
    }
    if (!h.empty())
      cu::check(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(G), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
};

template <class G>
std::vector<std::pair<std::uint32_t, float>> message(const cu::batched_top_k<G>& s) {
  std::vector<std::uint32_t> idx(s.total_k());
  std::vector<float> val(s.total_k());
  if (!idx.empty()) {
    cu::check(cudaMemcpy(idx.data(), s.index(), idx.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    cu::check(cudaMemcpy(val.data(), s.value(), val.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  // Each tensor's pairs lie in its own range and index into that tensor.
  for (std::size_t t = 0; t < s.tensors(); ++t)
    for (std::size_t j = s.message_offset(t); j < s.message_offset(t) + s.k(t); ++j) {
      REQUIRE(idx[j] >= s.offset(t));
      REQUIRE(idx[j] < s.offset(t) + s.length(t));
    }
  std::vector<std::pair<std::uint32_t, float>> m;
  for (std::size_t j = 0; j < idx.size(); ++j)
    m.emplace_back(idx[j], val[j]);
  std::sort(m.begin(), m.end());
  return m;
}

void same_pairs(const std::vector<std::pair<std::uint32_t, float>>& a,
                const std::vector<std::pair<std::uint32_t, float>>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t j = 0; j < a.size(); ++j) {
    REQUIRE(a[j].first == b[j].first);
    REQUIRE(bits(a[j].second) == bits(b[j].second));
  }
}

void same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i])) FAIL("entry ", i, ": ", a[i], " != ", b[i]);
}

std::vector<std::size_t> ks_for(const std::vector<std::size_t>& lengths, double density) {
  std::vector<std::size_t> ks;
  for (auto n : lengths)
    ks.push_back(commsgd::select::k_for_density(n, density));
  return ks;
}

// Steps a device step and the reference through `steps` gradients; scales jump now and then, so the warm
// floor misses (and overflows) as well as hits.
template <class G>
cu::batched_top_k_report run_against_reference(const std::vector<std::size_t>& lengths,
                                               cu::batched_top_k_options o, int steps, std::uint64_t seed,
                                               bool ties) {
  const std::vector<std::size_t> ks = o.k.empty() ? ks_for(lengths, o.density) : o.k;
  const bool dgc = o.masking == commsgd::sparsify::momentum_masking::dgc;
  cu::batched_top_k<G> s(lengths, o);
  reference ref(lengths, ks, static_cast<float>(o.momentum), dgc);
  device_grad<G> g(s.length());
  std::mt19937_64 rng(seed);
  const float scales[] = {1.0f, 1.0f, 1.0f, 0.7f, 0.7f, 1.3f, 1.3f, 1.3f, 1e-3f, 1e3f, 1.0f, 1.0f};
  for (int step = 0; step < steps; ++step) {
    g.set(draw(s.length(), rng, scales[step % std::size(scales)], ties));
    s.step(g.d.data());
    const auto want = ref.step(g.as_float);
    same_pairs(message(s), want);
    same_bits(s.residual_to_host(), ref.e);
    if (o.momentum > 0) same_bits(s.momentum_to_host(), ref.u);
  }
  s.check_refused();
  return s.report();
}

} // namespace

TEST_CASE("batched_top_k equals exact top-k with error feedback, bit for bit, on many tensor lists") {
  const std::vector<std::vector<std::size_t>> lists = {
      {1}, {7}, {0, 5, 0}, {4096}, {4097, 1, 33}, {100000}, {3, 70000, 12345, 4095, 4096, 1, 999}};
  for (std::size_t l = 0; l < lists.size(); ++l)
    for (double density : {1e-3, 0.01, 0.3, 1.0}) {
      CAPTURE(l);
      CAPTURE(density);
      const auto r = run_against_reference<float>(lists[l], {.density = density}, 12, 100 + l, false);
      CHECK(r.committed == 12);
    }
}

TEST_CASE("batched_top_k: the candidates serve a steady sequence, and misses and overflows still give the "
          "exact set") {
  const std::vector<std::size_t> lengths = {1 << 20, 50000, 3000};
  cu::batched_top_k<float> s(lengths, {.density = 1e-3});
  reference ref(lengths, ks_for(lengths, 1e-3), 0.0f, true);
  device_grad<float> g(s.length());
  std::mt19937_64 rng(7);
  cu::batched_top_k_report at10, at20;
  for (int step = 0; step < 30; ++step) {
    // Steady law for 20 steps (the residual builds up over the first few, so the threshold rises), then a
    // fall to a fifth (a miss) and a rise of 50x (an overflow).
    const float scale = step == 20 ? 0.2f : step == 25 ? 50.0f : 1.0f;
    g.set(draw(s.length(), rng, scale, false));
    s.step(g.d.data());
    same_pairs(message(s), ref.step(g.as_float));
    if (step == 9) at10 = s.report();
    if (step == 19) at20 = s.report();
  }
  same_bits(s.residual_to_host(), ref.e);
  const auto r = s.report();
  for (std::size_t t = 0; t < lengths.size(); ++t) {
    CAPTURE(t);
    // Steps 10 to 19 are steady: each one served by the candidates alone.
    CHECK(at20.full_steps[t] == at10.full_steps[t]);
    CHECK(at20.fast_steps[t] == at10.fast_steps[t] + 10);
    // The fall and the rise each cost the big tensor a second read.
    if (t == 0) CHECK(r.full_steps[t] >= at20.full_steps[t] + 2);
    CHECK(r.fast_steps[t] + r.full_steps[t] == 30);
  }
}

TEST_CASE("batched_top_k: ties on a coarse grid and signed zeros go to the lowest indices") {
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    run_against_reference<float>({5000, 1, 20000}, {.density = 0.01}, 6, seed, true);
    run_against_reference<float>({5000, 1, 20000}, {.density = 0.3}, 6, seed, true);
  }
  // All zeros: every magnitude ties at +0 (and -0).
  const std::vector<std::size_t> lengths = {1000, 17};
  cu::batched_top_k<float> s(lengths, {.density = 0.05});
  reference ref(lengths, ks_for(lengths, 0.05), 0.0f, true);
  device_grad<float> g(s.length());
  std::vector<float> z(s.length(), 0.0f);
  for (std::size_t i = 0; i < z.size(); i += 3)
    z[i] = -0.0f;
  for (int step = 0; step < 3; ++step) {
    g.set(z);
    s.step(g.d.data());
    same_pairs(message(s), ref.step(g.as_float));
  }
}

TEST_CASE("batched_top_k with momentum correction (DGC masking and keep) and with k given per tensor") {
  for (auto mask : {commsgd::sparsify::momentum_masking::dgc, commsgd::sparsify::momentum_masking::keep})
    run_against_reference<float>({3000, 40000, 5}, {.density = 0.01, .momentum = 0.9, .masking = mask}, 10, 3,
                                 false);
  run_against_reference<float>({3000, 40000, 5, 8}, {.k = {0, 17, 5, 1}}, 8, 4, false);
}

TEST_CASE("batched_top_k takes fp16 and bf16 gradients (residual in float)") {
  run_against_reference<__half>({4097, 30000}, {.density = 0.01}, 8, 5, false);
  run_against_reference<__nv_bfloat16>({4097, 30000}, {.density = 0.01}, 8, 6, false);
  run_against_reference<__nv_bfloat16>({4097, 30000}, {.density = 0.01, .momentum = 0.9}, 8, 7, true);
}

TEST_CASE("batched_top_k: a step captured in a CUDA graph and replayed equals stepping directly") {
  const std::vector<std::size_t> lengths = {70000, 333, 4096};
  cu::batched_top_k<float> direct(lengths, {.density = 0.01, .momentum = 0.5});
  cu::batched_top_k<float> graphed(lengths, {.density = 0.01, .momentum = 0.5});
  device_grad<float> g(direct.length());
  cudaStream_t stream;
  cu::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::mt19937_64 rng(11);
  // One ordinary step first, so the graph is captured with warm state.
  g.set(draw(direct.length(), rng, 1.0f, false));
  direct.step(g.d.data());
  graphed.step(g.d.data());
  cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaGraph_t graph;
  cu::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  graphed.step(g.d.data(), stream);
  cu::check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec;
  cu::check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int step = 0; step < 6; ++step) {
    g.set(draw(direct.length(), rng, step == 3 ? 0.3f : 1.0f, false));
    direct.step(g.d.data());
    cu::check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    cu::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    same_pairs(message(graphed), message(direct));
    same_bits(graphed.residual_to_host(stream), direct.residual_to_host());
    same_bits(graphed.momentum_to_host(stream), direct.momentum_to_host());
  }
  CHECK(graphed.steps(stream) == 7);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE(
    "batched_top_k refuses a step with NaN or inf: NaN message, state unchanged, reported a step late") {
  const std::vector<std::size_t> lengths = {5000, 64};
  cu::batched_top_k<float> s(lengths, {.density = 0.01});
  device_grad<float> g(s.length());
  std::mt19937_64 rng(3);
  g.set(draw(s.length(), rng, 1.0f, false));
  s.step(g.d.data());
  const auto before = s.residual_to_host();
  auto bad = draw(s.length(), rng, 1.0f, false);
  bad[5003] = std::nanf("");
  bad[4000] = INFINITY;
  g.set(bad);
  s.step(g.d.data());
  cu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (const auto& [i, v] : message(s))
    CHECK(std::isnan(v));
  same_bits(s.residual_to_host(), before);
  CHECK(s.steps() == 1);
  // The next step learns of it (the refused step has finished) and throws before enqueuing anything.
  g.set(draw(s.length(), rng, 1.0f, false));
  try {
    s.step(g.d.data());
    FAIL("a refused step was not reported");
  } catch (const commsgd::non_finite& e) {
    CHECK(e.count() == 2);
    CHECK(e.first_index() == 4000);
  }
  // Reported once; stepping goes on from the unchanged state.
  s.step(g.d.data());
  s.check_refused();
  CHECK(s.steps() == 2);
  // check_refused() waits and reports at once; an overflowing sum is refused too.
  std::vector<float> huge(s.length(), 3e38f);
  g.set(huge);
  s.step(g.d.data());
  s.step(g.d.data()); // e = 3e38 where not sent: 3e38 + 3e38 overflows
  CHECK_THROWS_AS(s.check_refused(), commsgd::non_finite);
}

TEST_CASE("batched_top_k checkpoints in the host top_k's format and resumes bit for bit") {
  const std::vector<std::size_t> lengths = {20000, 7, 4096};
  const cu::batched_top_k_options o{.density = 0.01, .momentum = 0.9};
  cu::batched_top_k<float> a(lengths, o);
  device_grad<float> g(a.length());
  std::mt19937_64 rng(21);
  for (int step = 0; step < 4; ++step) {
    g.set(draw(a.length(), rng, 1.0f, false));
    a.step(g.d.data());
  }
  std::stringstream blob;
  a.save(blob);
  cu::batched_top_k<float> b(lengths, o);
  b.load(blob);
  CHECK(b.steps() == 4);
  same_bits(b.residual_to_host(), a.residual_to_host());
  for (int step = 0; step < 3; ++step) {
    g.set(draw(a.length(), rng, 1.0f, false));
    a.step(g.d.data());
    b.step(g.d.data());
    same_pairs(message(b), message(a));
  }
  same_bits(b.momentum_to_host(), a.momentum_to_host());
  // A blob of another layout is refused and changes nothing.
  std::stringstream other;
  cu::batched_top_k<float>(std::vector<std::size_t>{20000, 7}, o).save(other);
  const auto kept = b.residual_to_host();
  CHECK_THROWS_AS(b.load(other), commsgd::error);
  same_bits(b.residual_to_host(), kept);
}

TEST_CASE("batched_top_k refuses bad settings with the argument named") {
  const std::vector<std::size_t> none;
  CHECK_THROWS_WITH_AS([&] { cu::batched_top_k<float> s(none); }(), doctest::Contains("lengths"),
                       commsgd::invalid_argument);
  const std::vector<std::size_t> l = {10, 20};
  CHECK_THROWS_WITH_AS(cu::batched_top_k<float>(l, {.density = 0.0}), doctest::Contains("density"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(cu::batched_top_k<float>(l, {.momentum = 1.0}), doctest::Contains("momentum"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(cu::batched_top_k<float>(l, {.k = {1}}), doctest::Contains("'k'"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(cu::batched_top_k<float>(l, {.k = {1, 21}}), doctest::Contains("k[1]"),
                       commsgd::invalid_argument);
  cu::batched_top_k<float> s(l);
  CHECK_THROWS_WITH_AS(s.step(nullptr), doctest::Contains("grad"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(s.k(2), doctest::Contains("'t' = 2"), commsgd::invalid_argument);
}

} // namespace batched_top_k_cases
