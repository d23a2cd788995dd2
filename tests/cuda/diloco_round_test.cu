// DiLoCo's round on device parameters (cuda/diloco/) against the host: the messages byte for byte (int8,
// e3m0, and top-k with its residual, against host encodings written here from the codes' public parts), and
// over whole runs against the host engine (sync::diloco with sync::coded_diloco's settings) on the same ranks
// and the same local steps, the parameters, the common model, the outer momentum and the residual bit for
// bit, for every code (fp16 and bf16 through their host compressor), with the model cut into strided
// fragments, weighted ranks, a merge that keeps part of the local model and no momentum; refusals (a rank's
// NaN, a sum that overflows, a corrupt index) with nothing changed; bad arguments named.
#include <doctest/doctest.h>

#include <commsgd/comm/local.hpp>
#include <commsgd/compress/bit_pack.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/cuda.cuh>
#include <commsgd/select/compact.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/sync/diloco.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace diloco_round_cases {

using namespace commsgd;
namespace cu = commsgd::cuda;
using runs_t = std::vector<std::pair<std::size_t, std::size_t>>;

namespace {

std::vector<float> download(const float* d, std::size_t n) {
  std::vector<float> h(n);
  if (n) cu::check(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return h;
}
std::vector<std::byte> download_bytes(const std::byte* d, std::size_t n) {
  std::vector<std::byte> h(n);
  if (n) cu::check(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return h;
}
void upload(float* d, const std::vector<float>& h) {
  if (!h.empty()) cu::check(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
}
bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

enum class shape { normal, zeros, signed_zeros, ties, wide };

std::vector<float> make(std::size_t n, shape s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (s) {
    case shape::normal:
      x[i] = nd(rng);
      break;
    case shape::zeros:
      x[i] = 0.0f;
      break;
    case shape::signed_zeros:
      x[i] = (rng() & 1) ? -0.0f : 0.0f;
      break;
    case shape::ties:
      x[i] = 0.25f * static_cast<float>(static_cast<int>(rng() % 9) - 4);
      break;
    case shape::wide:
      x[i] = std::ldexp(nd(rng), static_cast<int>(rng() % 40) - 20);
      break;
    }
  }
  return x;
}

// The host's message of a block code for pseudo-gradient p: compress/block_quant.hpp's layout.
template <class Code>
std::vector<std::byte> host_message(const std::vector<float>& p, std::size_t b) {
  const std::size_t blocks = (p.size() + b - 1) / b;
  std::vector<std::byte> m(compress::block_quantizer<Code>::message_bytes(p.size(), b));
  std::vector<float> s(blocks, 0.0f);
  for (std::size_t i = 0; i < p.size(); ++i)
    s[i / b] = std::max(s[i / b], std::fabs(p[i]));
  std::memcpy(m.data(), s.data(), 4 * blocks);
  compress::detail::pack_bits(std::span<std::byte>(m).subspan(4 * blocks), p.size(), Code::bits,
                              [&](std::size_t i) { return compress::block_code<Code>(p[i], s[i / b]); });
  return m;
}

template <class Code>
void check_messages(const runs_t& runs, std::size_t total, shape sh, float weight, std::size_t b,
                    unsigned seed) {
  cu::diloco_fragment<Code> f(runs, {.block_size = b});
  const std::size_t len = f.length();
  const auto global = make(len, sh, seed),
             params = make(total, sh == shape::zeros ? shape::signed_zeros : sh, seed + 1);
  f.load(global, {});
  cu::device_buffer<float> x(total);
  upload(x.data(), params);
  f.encode(x.data(), weight, nullptr);
  REQUIRE(f.verdict(nullptr).own == 0);
  std::vector<float> p;
  for (const auto& [off, n] : runs)
    for (std::size_t j = 0; j < n; ++j)
      p.push_back(sync::math::pseudo_gradient(global[p.size()], params[off + j], weight));
  const auto want = host_message<Code>(p, b);
  const auto got = download_bytes(f.message(), f.message_bytes());
  REQUIRE(got.size() == want.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    wrong += got[i] != want[i];
  CHECK(wrong == 0);
}

// The host's top-k message for p (compress/top_k_ef.hpp's encode, from its public parts), and the residual
// (e, r) it leaves.
std::vector<std::byte> host_top_k(const std::vector<float>& p, const compress::top_k_ef_options& o,
                                  std::vector<float>& e, std::vector<float>& r) {
  const auto ch = cost::top_k_chunks::of(p.size(), o.chunk, o.density);
  const std::size_t k = ch.k();
  std::vector<std::uint32_t> idx(k);
  std::vector<float> val(k), scale(ch.count), d(p.size(), 0.0f);
  select::exact sel;
  for (std::uint64_t j = 0, at = 0; j < ch.count; at += ch.k_of(j), ++j) {
    const auto x = std::span<const float>(p).subspan(ch.first(j), ch.length(j));
    select::compact<std::uint32_t>(x, sel.select(x, ch.k_of(j)),
                                   std::span<std::uint32_t>(idx).subspan(at, ch.k_of(j)),
                                   std::span<float>(val).subspan(at, ch.k_of(j)));
  }
  std::vector<std::byte> msg(cost::top_k_message_bytes(ch, o.two_bit));
  std::byte* out = msg.data();
  std::vector<std::uint64_t> chunk_of(k);
  for (std::uint64_t j = 0, at = 0; j < ch.count; at += ch.k_of(j), ++j) {
    double sum = 0.0;
    for (std::size_t i = at; i < at + ch.k_of(j); ++i) {
      sum += std::fabs(static_cast<double>(val[i]));
      chunk_of[i] = j;
    }
    scale[j] = ch.k_of(j) == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(ch.k_of(j)));
  }
  if (o.two_bit) {
    std::memcpy(out, scale.data(), 4 * ch.count);
    out += 4 * ch.count;
    compress::detail::pack_bits(
        std::span<std::byte>(out, compress::detail::packed_bytes(k, 2)), k, 2,
        [&](std::size_t i) { return compress::two_bit_code::encode(val[i], scale[chunk_of[i]]); });
    out += compress::detail::packed_bytes(k, 2);
  } else if (k != 0) {
    std::memcpy(out, val.data(), 4 * k);
    out += 4 * k;
  }
  compress::detail::pack_bits(std::span<std::byte>(out, compress::detail::packed_bytes(k, ch.index_bits)), k,
                              ch.index_bits, [&](std::size_t i) { return idx[i]; });
  for (std::size_t i = 0; i < k; ++i) {
    const float s = scale[chunk_of[i]];
    d[ch.first(chunk_of[i]) + idx[i]] =
        o.two_bit ? compress::two_bit_code::decode(compress::two_bit_code::encode(val[i], s), s) : val[i];
  }
  e.resize(p.size());
  r.resize(p.size());
  for (std::size_t i = 0; i < p.size(); ++i)
    compress::split_difference(p[i], d[i], e[i], r[i]);
  return msg;
}

void check_top_k_message(std::size_t len, shape sh, const compress::top_k_ef_options& o, unsigned seed) {
  cu::diloco_fragment<cu::top_k_code> f(runs_t{{0, len}}, {.top_k = o});
  const auto global = make(len, sh, seed),
             params = make(len, sh == shape::zeros ? shape::signed_zeros : sh, seed + 1);
  auto e0 = make(len, sh, seed + 7), r0 = make(len, shape::wide, seed + 9);
  for (auto& v : r0)
    v *= 1e-9f; // a low part, as two-sums leave it
  f.load(global, {}, e0, r0);
  cu::device_buffer<float> x(len);
  upload(x.data(), params);
  f.encode(x.data(), 1.0f, nullptr);
  REQUIRE(f.verdict(nullptr).own == 0);
  std::vector<float> p(len), e, r;
  for (std::size_t i = 0; i < len; ++i)
    p[i] = compress::accumulate_value(sync::math::pseudo_gradient(global[i], params[i], 1.0f), e0[i], r0[i],
                                      o.decay);
  const auto want = host_top_k(p, o, e, r);
  const auto got = download_bytes(f.message(), want.size());
  CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
  f.commit();
  CHECK(same_bits(e, download(f.residual(), len)));
  CHECK(same_bits(r, download(f.residual_low(), len)));
}

// Strided runs of a model cut into layers of the given sizes: fragment 0 of P.
runs_t strided(const std::vector<std::size_t>& layers, std::size_t P, std::size_t& total) {
  runs_t r;
  total = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (l % P == 0) r.emplace_back(total, layers[l]);
    total += layers[l];
  }
  return r;
}

// The host engine of each device code, with sync::coded_diloco's settings for it (top-k: exact selection,
// the set coded_diloco's warm-started selector finds too).
template <class Code>
struct host_engine {
  using type = sync::diloco<comm::local, compress::block_quantizer<Code>>;
  static type make(comm::local& c, const std::vector<std::size_t>& layers, const sync::diloco_options& o,
                   const compress::top_k_ef_options&) {
    return type(c, layers, o, [](std::size_t n) {
      return compress::block_quantizer<Code>(
          n, {.block_size = cost::diloco_block_size, .error_feedback = false});
    });
  }
};
template <>
struct host_engine<cu::dense_code> {
  using type = sync::diloco<comm::local>;
  static type make(comm::local& c, const std::vector<std::size_t>& layers, const sync::diloco_options& o,
                   const compress::top_k_ef_options&) {
    return type(c, layers, o);
  }
};
// fp16, bf16: the device runs the dense fragment, the host compressor the sum.
template <class X>
struct host_reduced {};
template <class X>
struct host_engine<host_reduced<X>> {
  using type = sync::diloco<comm::local, X>;
  static type make(comm::local& c, const std::vector<std::size_t>& layers, const sync::diloco_options& o,
                   const compress::top_k_ef_options&) {
    return type(c, layers, o, [](std::size_t n) { return X(n, {.error_feedback = false}); });
  }
};
template <class Code>
struct device_side {
  using code = Code;
  using exchange = cu::diloco_exchange<Code>;
  static exchange make(const cu::diloco_fragment<Code>& f) { return exchange(f); }
};
template <class X>
struct device_side<host_reduced<X>> {
  using code = cu::dense_code;
  using exchange = cu::diloco_exchange<cu::dense_code, X>;
  static exchange make(const cu::diloco_fragment<cu::dense_code>& f) {
    return exchange(f, X(f.length(), {.error_feedback = false}));
  }
};
template <>
struct host_engine<cu::top_k_code> {
  using type = sync::diloco<comm::local, compress::top_k_ef<>>;
  static type make(comm::local& c, const std::vector<std::size_t>& layers, const sync::diloco_options& o,
                   const compress::top_k_ef_options& t) {
    return type(c, layers, o, [t](std::size_t n) { return compress::top_k_ef<>(n, t); });
  }
};

struct run_case {
  int ranks = 3, steps = 13, H = 2, P = 2;
  float alpha = 0.0f, momentum = 0.9f;
  bool weighted = false;
  unsigned seed = 1;
  compress::top_k_ef_options top_k = {
      .density = 0.1, .two_bit = true, .chunk = 64, .decay = 0.95f, .sender_mean = true};
};

// Every rank runs the host engine and the device fragments side by side on the same local steps (a random
// walk of its own), and after each step their parameters must hold the same bits; at the end the common
// models and the momenta too.
template <class Code>
void check_run(const run_case& rc) {
  const std::vector<std::size_t> layers = {300, 7, 513, 64, 1, 290};
  std::size_t total = 0;
  for (auto l : layers)
    total += l;
  std::vector<std::size_t> mismatched(static_cast<std::size_t>(rc.ranks), 0);
  comm::local_group(rc.ranks).run([&](comm::local& c) {
    const sync::diloco_options o{.sync_every = rc.H,
                                 .fragments = rc.P,
                                 .alpha = rc.alpha,
                                 .outer = {.lr = 0.7f, .momentum = rc.momentum}};
    auto host = host_engine<Code>::make(c, layers, o, rc.top_k);
    using device = device_side<Code>;
    std::vector<cu::diloco_fragment<typename device::code>> frags;
    std::vector<typename device::exchange> ex;
    for (std::size_t p = 0; p < host.num_fragments(); ++p) {
      const auto r = host.fragment_runs(p);
      frags.emplace_back(runs_t(r.begin(), r.end()),
                         cu::diloco_fragment_options{
                             .lr = 0.7f, .momentum = rc.momentum, .alpha = rc.alpha, .top_k = rc.top_k});
    }
    for (auto& f : frags)
      ex.push_back(device::make(f));
    auto xh = make(total, shape::normal, rc.seed); // every rank alike: start() broadcasts rank 0's anyway
    host.start(xh);
    cu::device_buffer<float> xd(total);
    upload(xd.data(), xh);
    for (auto& f : frags)
      f.start(xd.data(), nullptr);
    const float w =
        rc.weighted ? static_cast<float>(c.rank() + 1) * 2.0f / static_cast<float>(rc.ranks + 1) : 1.0f;
    host.set_weight(w);
    std::mt19937 rng(rc.seed * 1000 + static_cast<unsigned>(c.rank()));
    std::normal_distribution<float> step(0.0f, 0.01f);
    auto& bad = mismatched[static_cast<std::size_t>(c.rank())];
    for (int s = 1; s <= rc.steps; ++s) {
      auto xs = download(xd.data(), total);
      for (std::size_t i = 0; i < total; ++i) {
        const float d = step(rng);
        xh[i] += d;
        xs[i] += d;
      }
      upload(xd.data(), xs);
      host.advance(xh);
      for (std::size_t p = 0; p < frags.size(); ++p)
        if (host.starts_after(p, s)) ex[p].run(c, frags[p], xd.data(), w, nullptr);
      bad += !same_bits(xh, download(xd.data(), total));
    }
    for (std::size_t p = 0; p < frags.size(); ++p) {
      bad += !same_bits(host.global_model(p), download(frags[p].global(), frags[p].length()));
      if (rc.momentum != 0.0f)
        bad += !same_bits(host.outer(p).velocity(), download(frags[p].velocity(), frags[p].length()));
      if constexpr (std::is_same_v<Code, cu::top_k_code>)
        bad += !same_bits(host.compressor(p).residual(), download(frags[p].residual(), frags[p].length())) +
               !same_bits(host.compressor(p).residual_low(),
                          download(frags[p].residual_low(), frags[p].length()));
    }
  });
  for (auto m : mismatched)
    CHECK(m == 0);
}

} // namespace

TEST_CASE_TEMPLATE("the device message is the host code's, byte for byte", Code, compress::int8_code,
                   compress::e3m0_code) {
  for (std::size_t len : {std::size_t{1}, std::size_t{31}, std::size_t{256}, std::size_t{257},
                          std::size_t{1000}, std::size_t{65539}})
    for (shape sh : {shape::normal, shape::zeros, shape::signed_zeros, shape::ties, shape::wide})
      for (float w : {1.0f, 0.5f, 3.0f})
        for (std::size_t b : {std::size_t{256}, std::size_t{32}, std::size_t{1024}}) {
          CAPTURE(len);
          CAPTURE(static_cast<int>(sh));
          CAPTURE(w);
          CAPTURE(b);
          check_messages<Code>({{0, len}}, len, sh, w, b, static_cast<unsigned>(len + b));
        }
  // A fragment in several runs of the flat model.
  std::size_t total = 0;
  const auto runs = strided({300, 7, 513, 64, 1, 290, 5}, 3, total);
  check_messages<Code>(runs, total, shape::normal, 1.0f, 256, 7);
}

TEST_CASE("the device top-k message and residual are the host code's, byte for byte") {
  using T = compress::top_k_ef_options;
  for (const T& o :
       {T{.density = 0.01, .two_bit = true, .chunk = 4096, .decay = 0.95f},
        T{.density = 0.1, .two_bit = true, .chunk = 64, .decay = 1.0f},
        T{.density = 0.25, .two_bit = false, .chunk = 0, .decay = 0.5f},
        T{.density = 1.0, .two_bit = true, .chunk = 7}, T{.density = 0.2, .two_bit = false, .chunk = 1},
        T{.density = 0.03, .two_bit = true, .chunk = 4095, .decay = 0.0f}})
    for (std::size_t len :
         {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{4096}, std::size_t{20001}})
      for (shape sh : {shape::normal, shape::zeros, shape::signed_zeros, shape::ties, shape::wide}) {
        if (o.chunk == 0 && len > 4096) continue; // one chunk of the fragment: at most 4096 on the device
        CAPTURE(o.density);
        CAPTURE(o.chunk);
        CAPTURE(len);
        CAPTURE(static_cast<int>(sh));
        check_top_k_message(len, sh, o, static_cast<unsigned>(len + o.chunk));
      }
}

TEST_CASE("a top-k message whose indices leave their chunk or do not rise is refused, with nothing changed") {
  const std::size_t len = 60;
  cu::diloco_fragment<cu::top_k_code> f(runs_t{{0, len}}, {.top_k = {.density = 0.25}}); // k = 15, 6-bit
  const std::size_t bytes = f.message_bytes(), values = 4 * 15;
  auto x = make(len, shape::normal, 3);
  cu::device_buffer<float> xd(len);
  upload(xd.data(), x);
  f.start(xd.data(), nullptr);
  for (auto& v : x)
    v += 0.5f;
  upload(xd.data(), x);
  const auto global = download(f.global(), len);
  f.encode(xd.data(), 1.0f, nullptr);
  for (unsigned char fill : {0xffu, 0x00u}) { // every index 63 (outside the chunk), or every index 0
    CAPTURE(static_cast<int>(fill));
    auto two = download_bytes(f.message(), bytes);
    two.insert(two.end(), two.begin(), two.end());
    std::fill(two.begin() + static_cast<std::ptrdiff_t>(bytes + values), two.end(), std::byte{fill});
    cu::device_buffer<std::byte> in(two.size() + 8);
    cu::check(cudaMemcpy(in.data(), two.data(), two.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    f.apply(in.data(), 2, xd.data(), nullptr);
    CHECK(f.verdict(nullptr).corrupt > 0);
    CHECK(same_bits(global, download(f.global(), len)));
    CHECK(same_bits(x, download(xd.data(), len)));
  }
}

TEST_CASE("a device top-k round is the host engine's, bit for bit, for every shape of the code") {
  using T = compress::top_k_ef_options;
  const T cases[] = {
      {.density = 0.1,
       .two_bit = true,
       .chunk = 64,
       .decay = 0.95f,
       .sender_mean = true}, // SparseLoCo's, small
      {.density = 0.03, .two_bit = true, .chunk = 4096, .decay = 0.95f, .sender_mean = true},
      {.density = 0.25, .two_bit = false, .chunk = 0, .decay = 1.0f},
      {.density = 0.01, .two_bit = true, .chunk = 16, .decay = 0.0f}, // k = 1 a chunk, no error feedback
      {.density = 1.0, .two_bit = false, .chunk = 100, .decay = 0.5f, .sender_mean = true},
      {.density = 0.2, .two_bit = true, .chunk = 7, .decay = 1.0f}, // chunks of 7: 3-bit indices
  };
  for (const auto& t : cases)
    for (unsigned seed : {1u, 2u}) {
      CAPTURE(t.density);
      CAPTURE(t.chunk);
      CAPTURE(seed);
      check_run<cu::top_k_code>({.seed = seed, .top_k = t});
      check_run<cu::top_k_code>(
          {.ranks = 4, .P = 3, .alpha = 0.25f, .weighted = true, .seed = seed, .top_k = t});
    }
}

TEST_CASE_TEMPLATE("a device round is the host engine's, bit for bit", Code, cu::dense_code,
                   compress::int8_code, compress::e3m0_code, cu::top_k_code, host_reduced<compress::fp16>,
                   host_reduced<compress::bf16>) {
  for (unsigned seed : {1u, 2u}) {
    CAPTURE(seed);
    check_run<Code>({.seed = seed});
    check_run<Code>({.ranks = 2, .H = 3, .P = 1, .seed = seed});
    check_run<Code>({.alpha = 0.5f, .seed = seed});
    check_run<Code>({.momentum = 0.0f, .seed = seed});
    check_run<Code>({.ranks = 4, .P = 3, .weighted = true, .seed = seed});
    check_run<Code>({.ranks = 1, .seed = seed});
  }
}

TEST_CASE_TEMPLATE("a rank's NaN, or a sum that overflows, is refused on every rank with nothing changed",
                   Code, cu::dense_code, compress::int8_code, compress::e3m0_code, cu::top_k_code) {
  for (int which : {0, 1}) { // 0: rank 1's pseudo-gradient holds a NaN; 1: the sum overflows
    CAPTURE(which);
    const std::size_t len = 700;
    std::vector<int> refused(3, 0), unchanged(3, 0);
    comm::local_group(3).run([&](comm::local& c) {
      cu::diloco_fragment<Code> f(runs_t{{0, len}}, {.top_k = {.density = 0.1, .chunk = 64}});
      cu::diloco_exchange<Code> ex(f);
      auto x = make(len, shape::normal, 5);
      cu::device_buffer<float> xd(len);
      upload(xd.data(), x);
      f.start(xd.data(), nullptr);
      if (which == 0 && c.rank() == 1) x[123] = std::numeric_limits<float>::quiet_NaN();
      if (which == 1) x[400] = -FLT_MAX * 0.9f; // every rank's pseudo-gradient near +FLT_MAX at 400
      upload(xd.data(), x);
      const auto before = download(f.global(), len);
      const auto residual_before = f.residual() ? download(f.residual(), len) : std::vector<float>();
      try {
        ex.run(c, f, xd.data(), 1.0f, nullptr);
      } catch (const non_finite&) {
        refused[static_cast<std::size_t>(c.rank())] = 1;
      }
      unchanged[static_cast<std::size_t>(c.rank())] =
          same_bits(before, download(f.global(), len)) && same_bits(x, download(xd.data(), len)) &&
          (!f.residual() || same_bits(residual_before, download(f.residual(), len)));
    });
    for (int r = 0; r < 3; ++r) {
      CHECK(refused[static_cast<std::size_t>(r)] == 1);
      CHECK(unchanged[static_cast<std::size_t>(r)] == 1);
    }
  }
}

TEST_CASE("bad arguments are refused, naming them") {
  using f8 = cu::diloco_fragment<compress::int8_code>;
  const runs_t one{{0, 100}};
  CHECK_THROWS_WITH_AS(f8(one, {.block_size = 48}), doctest::Contains("'block_size' = 48"), invalid_argument);
  CHECK_THROWS_WITH_AS(f8(one, {.block_size = 2048}), doctest::Contains("'block_size' = 2048"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(f8(runs_t{}, {}), doctest::Contains("'runs'"), invalid_argument);
  CHECK_THROWS_WITH_AS(f8(runs_t{{0, 0}}, {}), doctest::Contains("'runs'"), invalid_argument);
  CHECK_THROWS_WITH_AS(f8(one, {.alpha = 1.5f}), doctest::Contains("'alpha'"), invalid_argument);
  CHECK_THROWS_WITH_AS(f8(one, {.momentum = 1.0f}), doctest::Contains("'outer.momentum'"), invalid_argument);
  using fk = cu::diloco_fragment<cu::top_k_code>;
  const runs_t big{{0, 20000}};
  CHECK_THROWS_WITH_AS(fk(big, {.top_k = {.chunk = 10000}}), doctest::Contains("'top_k.chunk' = 10000"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(fk(big, {.top_k = {.chunk = 0}}), doctest::Contains("'top_k.chunk' = 0"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(fk(one, {.top_k = {.density = 0.0}}), doctest::Contains("'density' = 0"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(fk(one, {.top_k = {.decay = 2.0f}}), doctest::Contains("'top_k.decay' = 2"),
                       invalid_argument);
  f8 f(one, {});
  cu::device_buffer<float> x(100);
  CHECK_THROWS_WITH_AS(f.apply(f.message(), 0, x.data(), nullptr), doctest::Contains("'n' = 0"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(f.load(std::vector<float>(99), {}), doctest::Contains("'global'"), invalid_argument);
  f8 still(one, {.momentum = 0.0f});
  CHECK_THROWS_WITH_AS(still.load(std::vector<float>(100), std::vector<float>(100)),
                       doctest::Contains("'velocity'"), invalid_argument);
}

} // namespace diloco_round_cases
