// sparsify::top_k and sparsify::none on one rank: error feedback conserves every bit, the options do what
// they say, state round-trips, and bad input raises the right error naming the argument.
#include "support/gradients.hpp"

#include <commsgd/select/exact.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sparsify/none.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

namespace sp = commsgd::sparsify;
namespace sel = commsgd::select;

using test_data::gradient;

namespace {

// A selector that is obviously right: sort indices by (magnitude descending, index ascending).
struct sorted_reference {
  static constexpr bool is_exact = true;
  static constexpr const char* name = "sorted_reference";
  sel::threshold select(std::span<const float> x, std::size_t k) {
    if (k == 0) return {};
    std::vector<std::size_t> order(x.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    const float t = std::fabs(x[order[k - 1]]);
    std::size_t above = 0;
    for (float v : x)
      above += std::fabs(v) > t;
    return {t, above, k - above};
  }
};
static_assert(sel::selector<sorted_reference>);

std::uint32_t bits(float x) {
  return std::bit_cast<std::uint32_t>(x);
}

// The error-feedback identity, position by position: p = g + e_old (once, in float); every p is either
// sent with its exact bits (and the residual is +0 there) or kept with its exact bits.
template <class S>
void check_conservation(const S& s, std::span<const float> g, const std::vector<float>& e_old,
                        const std::vector<float>& u_old, float m, bool mask) {
  const auto& sent = s.last();
  const auto e = s.residual();
  std::vector<char> is_sent(g.size(), 0);
  for (std::size_t j = 0; j < sent.size(); ++j) {
    REQUIRE(sent.indices()[j] < g.size());
    if (j > 0) REQUIRE(sent.indices()[j] > sent.indices()[j - 1]);
    is_sent[sent.indices()[j]] = 1;
  }
  std::size_t j = 0, bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float u = m > 0 ? m * u_old[i] + g[i] : g[i];
    const float p = e_old[i] + u;
    if (is_sent[i]) {
      bad += bits(sent.values()[j++]) != bits(p) || bits(e[i]) != 0u;
      // keep: u runs on, so sent + residual add up to momentum SGD's update u; dgc: u is masked.
      if (m > 0) bad += bits(s.momentum()[i]) != (mask ? 0u : bits(u));
    } else {
      bad += bits(e[i]) != bits(p);
      if (m > 0) bad += bits(s.momentum()[i]) != bits(u);
    }
  }
  CHECK(bad == 0);
}

template <class Sel>
void run_conservation(sp::top_k_options opt, Sel proto, std::size_t n, int steps) {
  sp::top_k<Sel> s(n, opt, proto);
  const float m = static_cast<float>(opt.momentum);
  for (int t = 0; t < steps; ++t) {
    const auto g = gradient(n, 100 + static_cast<std::uint64_t>(t));
    std::vector<float> e_old(s.residual().begin(), s.residual().end());
    std::vector<float> u_old(s.momentum().begin(), s.momentum().end());
    const auto msg = s.step(g);
    CHECK(msg.length == n);
    if (Sel::is_exact) CHECK(msg.size() == s.k_at(static_cast<std::uint64_t>(t)));
    check_conservation(s, g, e_old, u_old, m, opt.masking == sp::momentum_masking::dgc);
  }
  CHECK(s.steps() == static_cast<std::uint64_t>(steps));
}

} // namespace

TEST_CASE("conservation is bit-exact every step, for every selector and option") {
  const std::size_t n = 20000;
  for (double density : {1e-3, 1e-2, 0.3}) {
    CAPTURE(density);
    sp::top_k_options whole{.density = density};
    run_conservation(whole, sorted_reference{}, n, 6);
    run_conservation(whole, sel::exact{}, n, 12);
    run_conservation(whole, sel::laplace_bisect{}, n, 12);
    sp::top_k_options layered{.density = density, .layer_offsets = {0, 100, 100, 7000, n}};
    run_conservation(layered, sel::exact{}, n, 12);
    run_conservation(layered, sel::laplace_bisect{}, n, 12);
    sp::top_k_options kept{.density = density, .momentum = 0.9};
    run_conservation(kept, sel::exact{}, n, 12);
    run_conservation(kept, sel::laplace_bisect{}, n, 12);
    sp::top_k_options dgc{.density = density, .momentum = 0.9, .masking = sp::momentum_masking::dgc};
    run_conservation(dgc, sel::exact{}, n, 12);
    run_conservation(dgc, sel::laplace_bisect{}, n, 12);
  }
}

TEST_CASE("with momentum kept, what is sent plus what is held equals momentum SGD's updates") {
  // Sum over steps of the sent values, plus the residual, against the sum of dense momentum SGD's updates
  // u_t = m u_(t-1) + g_t, both accumulated in double: equal up to float rounding of the running sums.
  // Under DGC's masking the sent mass falls short wherever a coordinate is sent repeatedly.
  const std::size_t n = 3000;
  for (const auto masking : {sp::momentum_masking::keep, sp::momentum_masking::dgc}) {
    sp::top_k<sel::exact> s(n, {.density = 0.01, .momentum = 0.9, .masking = masking});
    std::vector<double> sent(n, 0.0), dense(n, 0.0);
    std::vector<float> u(n, 0.0f);
    for (int t = 0; t < 40; ++t) {
      const auto g = gradient(n, 500 + static_cast<std::uint64_t>(t));
      for (std::size_t i = 0; i < n; ++i) {
        u[i] = 0.9f * u[i] + g[i];
        dense[i] += u[i];
      }
      const auto msg = s.step(g);
      for (std::size_t j = 0; j < msg.size(); ++j)
        sent[msg.indices[j]] += msg.values[j];
    }
    double worst = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::abs(sent[i] + s.residual()[i] - dense[i]));
      scale = std::max(scale, std::abs(dense[i]));
    }
    if (masking == sp::momentum_masking::keep)
      CHECK(worst <= 1e-4 * scale);
    else
      CHECK(worst > 0.1 * scale);
  }
}

TEST_CASE("the exact selectors agree with the sorted reference") {
  const std::size_t n = 5000;
  sp::top_k<sorted_reference> a(n, {.density = 0.01});
  sp::top_k<sel::exact> b(n, {.density = 0.01});
  for (int t = 0; t < 8; ++t) {
    const auto g = gradient(n, 7 + static_cast<std::uint64_t>(t));
    a.step(g);
    b.step(g);
    CHECK(std::ranges::equal(a.last().indices(), b.last().indices()));
    CHECK(
        std::ranges::equal(a.residual(), b.residual(), [](float x, float y) { return bits(x) == bits(y); }));
  }
}

TEST_CASE("a value below the threshold accumulates and is eventually sent") {
  std::vector<float> g(100, 0.0f);
  g[0] = 1.0f;
  g[1] = 0.3f;
  sp::top_k<sel::exact> s(g.size(), {.k = 1});
  for (int t = 0; t < 3; ++t) {
    const auto m = s.step(g);
    REQUIRE(m.size() == 1);
    CHECK(m.indices[0] == 0);
  }
  CHECK(s.residual()[1] == 0.3f + 0.3f + 0.3f);
  const auto m = s.step(g); // 1.2 > 1.0
  REQUIRE(m.size() == 1);
  CHECK(m.indices[0] == 1);
  CHECK(m.values[0] == ((0.3f + 0.3f) + 0.3f) + 0.3f);
  CHECK(s.residual()[1] == 0.0f);
  CHECK(s.residual()[0] == 1.0f);
}

TEST_CASE("k = 0 keeps everything, density 1 sends everything") {
  const std::size_t n = 1000;
  const auto g = gradient(n, 3);
  sp::top_k<sel::exact> none_sent(n, {.k = 0});
  CHECK(none_sent.step(g).size() == 0);
  CHECK(none_sent.step(g).size() == 0);
  for (std::size_t i = 0; i < n; ++i)
    CHECK(bits(none_sent.residual()[i]) == bits(g[i] + g[i]));

  for (auto opt : {sp::top_k_options{.density = 1.0}, sp::top_k_options{.k = n}}) {
    sp::top_k<sel::exact> all(n, opt);
    const auto m = all.step(g);
    REQUIRE(m.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(m.indices[i] == i);
      CHECK(bits(m.values[i]) == bits(g[i]));
    }
    CHECK(std::ranges::all_of(all.residual(), [](float x) { return bits(x) == 0u; }));
  }
}

TEST_CASE("an empty model and empty layers are fine") {
  sp::top_k<sel::exact> s(0, {.density = 0.5});
  CHECK(s.step({}).size() == 0);
  sp::top_k<sel::exact> l(10, {.density = 0.5, .layer_offsets = {0, 0, 10, 10}});
  const auto g = gradient(10, 1);
  CHECK(l.step(g).size() == 5);
}

TEST_CASE("per-layer selection takes k per layer") {
  const std::size_t n = 10000;
  const std::vector<std::size_t> offs{0, 10, 1000, 4000, n};
  sp::top_k<sel::exact> s(n, {.density = 0.01, .layer_offsets = offs});
  // Scale layers differently: a whole-model top-k would take everything from the loud layer.
  auto g = gradient(n, 5);
  for (std::size_t i = 4000; i < n; ++i)
    g[i] *= 1000.0f;
  const auto m = s.step(g);
  for (std::size_t l = 0; l + 1 < offs.size(); ++l) {
    const auto c = std::count_if(m.indices.begin(), m.indices.end(),
                                 [&](std::uint32_t i) { return i >= offs[l] && i < offs[l + 1]; });
    CHECK(static_cast<std::size_t>(c) == sel::k_for_density(offs[l + 1] - offs[l], 0.01));
  }
}

TEST_CASE("density warm-up follows the schedule, then the final density") {
  const std::size_t n = 100000;
  sp::top_k<sel::exact> s(n, {.density = 0.001, .warmup = sp::dgc_warmup(2)});
  const double expect[] = {0.25,     0.25,       0.0625,     0.0625, 0.015625,
                           0.015625, 0.00390625, 0.00390625, 0.001,  0.001};
  for (std::uint64_t t = 0; t < 10; ++t) {
    CHECK(s.density_at(t) == expect[t]);
    const auto m = s.step(gradient(n, t));
    CHECK(m.size() == sel::k_for_density(n, expect[t]));
  }
}

TEST_CASE("clipping scales the gradient before error feedback") {
  std::vector<float> g{3.0f, 4.0f, 0.0f, 0.0f}; // norm 5
  sp::top_k<sel::exact> s(g.size(), {.density = 1.0, .clip_norm = 1.0});
  const auto m = s.step(g);
  REQUIRE(m.size() == 4);
  const float scale = static_cast<float>(1.0 / 5.0);
  CHECK(m.values[0] == 3.0f * scale);
  CHECK(m.values[1] == 4.0f * scale);
  sp::top_k<sel::exact> loose(g.size(), {.density = 1.0, .clip_norm = 10.0});
  CHECK(loose.step(g).values[1] == 4.0f);
}

TEST_CASE("NaN and inf are refused with the count and first index, and change nothing") {
  const std::size_t n = 1000;
  sp::top_k<sel::exact> s(n, {.density = 0.01});
  const auto sent_before = s.step(gradient(n, 1)).size();
  const std::vector<float> before(s.residual().begin(), s.residual().end());
  auto g = gradient(n, 2);
  g[17] = std::numeric_limits<float>::quiet_NaN();
  g[500] = -std::numeric_limits<float>::infinity();
  g[900] = std::numeric_limits<float>::quiet_NaN();
  try {
    s.step(g);
    FAIL("no exception");
  } catch (const commsgd::non_finite& e) {
    CHECK(e.count() == 3);
    CHECK(e.first_index() == 17);
    CHECK(std::string(e.what()).find("gradient") != std::string::npos);
  }
  CHECK(s.steps() == 1);
  CHECK(std::ranges::equal(s.residual(), before, [](float x, float y) { return bits(x) == bits(y); }));
  CHECK(s.last().size() == sent_before);

  // Overflow of g + e is caught too, though g alone is finite.
  sp::top_k<sel::exact> o(2, {.k = 0});
  o.step(std::vector<float>{3e38f, 1.0f});
  CHECK_THROWS_AS(o.step(std::vector<float>{3e38f, 1.0f}), commsgd::non_finite);

  // Opt-in: zero them instead; a NaN is never sent.
  sp::top_k<sel::exact> z(n, {.density = 0.5, .on_non_finite = sp::non_finite_policy::zero});
  const auto m = z.step(g);
  CHECK(std::ranges::all_of(m.values, [](float v) { return std::isfinite(v); }));
  CHECK(std::ranges::all_of(z.residual(), [](float v) { return std::isfinite(v); }));
  CHECK(bits(z.residual()[17]) == 0u);

  sp::none d(n);
  CHECK_THROWS_AS(d.step(g), commsgd::non_finite);
  sp::none dz(n, {.on_non_finite = sp::non_finite_policy::zero});
  CHECK(std::ranges::all_of(dz.step(g).values, [](float v) { return std::isfinite(v); }));
}

template <class Sel>
void check_round_trip(sp::top_k_options opt, bool via_stream) {
  const std::size_t n = 30000;
  sp::top_k<Sel> a(n, opt);
  for (int t = 0; t < 5; ++t)
    a.step(gradient(n, 50 + static_cast<std::uint64_t>(t)));
  sp::top_k<Sel> b(n, opt);
  if (via_stream) {
    std::stringstream ss;
    a.save(ss);
    b.load(ss);
  } else {
    std::vector<std::byte> blob;
    a.save(blob);
    b.load(blob);
  }
  CHECK(b.steps() == a.steps());
  for (int t = 5; t < 15; ++t) {
    const auto g = gradient(n, 50 + static_cast<std::uint64_t>(t));
    const auto ma = a.step(g);
    const auto mb = b.step(g);
    CHECK(std::ranges::equal(ma.indices, mb.indices));
    CHECK(std::ranges::equal(ma.values, mb.values, [](float x, float y) { return bits(x) == bits(y); }));
  }
  CHECK(std::ranges::equal(a.residual(), b.residual(), [](float x, float y) { return bits(x) == bits(y); }));
  CHECK(std::ranges::equal(a.momentum(), b.momentum(), [](float x, float y) { return bits(x) == bits(y); }));
}

TEST_CASE("save mid-training, load into a fresh sparsifier: the continuation is bit-identical") {
  for (bool stream : {false, true}) {
    check_round_trip<sel::exact>({.density = 0.01}, stream);
    check_round_trip<sel::exact>({.density = 0.01, .momentum = 0.9, .warmup = sp::dgc_warmup(3)}, stream);
    check_round_trip<sel::laplace_bisect>({.density = 0.001, .layer_offsets = {0, 10000, 30000}}, stream);
    check_round_trip<sel::laplace_bisect>({.density = 0.01, .momentum = 0.5}, stream);
  }
  // The warm-start threshold travels with the state.
  const std::size_t n = 30000;
  sp::top_k<sel::laplace_bisect> a(n, {.density = 0.01});
  a.step(gradient(n, 1));
  std::vector<std::byte> blob;
  a.save(blob);
  sp::top_k<sel::laplace_bisect> b(n, {.density = 0.01});
  b.load(blob);
  CHECK(b.selectors()[0].saved_state() == a.selectors()[0].saved_state());
  CHECK(a.selectors()[0].saved_state().threshold > 0.0f);

  // Several states in one stream, one after another.
  sp::none d(4);
  d.step(std::vector<float>{1, 2, 3, 4});
  std::stringstream ss;
  a.save(ss);
  d.save(ss);
  sp::top_k<sel::laplace_bisect> c(n, {.density = 0.01});
  sp::none e(4);
  c.load(ss);
  e.load(ss);
  CHECK(e.steps() == 1);
}

TEST_CASE("a truncated, corrupt or foreign stream is corrupt_data and changes nothing") {
  const std::size_t n = 2000;
  sp::top_k<sel::exact> a(n, {.density = 0.01});
  a.step(gradient(n, 1));
  std::vector<std::byte> blob;
  a.save(blob);

  sp::top_k<sel::exact> b(n, {.density = 0.01});
  b.step(gradient(n, 9));
  const std::vector<float> before(b.residual().begin(), b.residual().end());
  auto unchanged = [&] {
    CHECK(b.steps() == 1);
    CHECK(std::ranges::equal(b.residual(), before, [](float x, float y) { return bits(x) == bits(y); }));
  };

  for (std::size_t cut :
       {std::size_t{0}, std::size_t{5}, std::size_t{30}, blob.size() / 2, blob.size() - 1}) {
    CAPTURE(cut);
    CHECK_THROWS_AS(b.load(std::span(blob).first(cut)), commsgd::corrupt_data);
    std::stringstream ss(std::string(reinterpret_cast<const char*>(blob.data()), cut));
    CHECK_THROWS_AS(b.load(ss), commsgd::corrupt_data);
    unchanged();
  }
  for (std::size_t at : {std::size_t{0}, std::size_t{9}, std::size_t{40}, blob.size() / 2, blob.size() - 3}) {
    CAPTURE(at);
    auto bad = blob;
    bad[at] ^= std::byte{0x10};
    CHECK_THROWS_AS(b.load(bad), commsgd::corrupt_data);
    unchanged();
  }
  // Foreign: random bytes, another sparsifier's state, another length, another configuration.
  std::vector<std::byte> noise(blob.size());
  std::mt19937 rng(1);
  for (auto& x : noise)
    x = static_cast<std::byte>(rng());
  CHECK_THROWS_AS(b.load(noise), commsgd::corrupt_data);
  sp::none d(n);
  std::vector<std::byte> other;
  d.save(other);
  CHECK_THROWS_WITH_AS(b.load(other), doctest::Contains("'none'"), commsgd::corrupt_data);
  sp::top_k<sel::exact> shorter(n - 1, {.density = 0.01});
  shorter.save(other);
  CHECK_THROWS_WITH_AS(b.load(other), doctest::Contains("length"), commsgd::corrupt_data);
  sp::top_k<sel::exact> mom(n, {.density = 0.01, .momentum = 0.9});
  mom.save(other);
  CHECK_THROWS_WITH_AS(b.load(other), doctest::Contains("momentum"), commsgd::corrupt_data);
  sp::top_k<sel::exact, std::uint64_t> wide(n, {.density = 0.01});
  wide.save(other);
  CHECK_THROWS_AS(b.load(other), commsgd::corrupt_data);
  unchanged();
  b.load(blob);
  CHECK(std::ranges::equal(b.residual(), a.residual(), [](float x, float y) { return bits(x) == bits(y); }));
}

TEST_CASE("bad options and sizes name the argument") {
  using T = sp::top_k<sel::exact>;
  for (double d : {0.0, 1.5, -0.1, std::nan("")})
    CHECK_THROWS_WITH_AS(T(10, {.density = d}), doctest::Contains("'density'"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(T(10, {.warmup = {{5, 2.0}}}), doctest::Contains("warmup[0].density"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(T(10, {.momentum = 1.0}), doctest::Contains("'momentum'"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(T(10, {.momentum = 0.5, .masking = static_cast<sp::momentum_masking>(7)}),
                       doctest::Contains("'masking' = 7"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(T(10, {.clip_norm = -1.0}), doctest::Contains("'clip_norm'"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(T(10, {.k = 11}), doctest::Contains("'k'"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(T(10, {.k = 1, .layer_offsets = {0, 10}}), doctest::Contains("'k'"),
                       commsgd::invalid_argument);
  for (std::vector<std::size_t> offs :
       std::vector<std::vector<std::size_t>>{{0, 5}, {1, 10}, {0, 6, 4, 10}, {10}})
    CHECK_THROWS_WITH_AS(T(10, {.layer_offsets = offs}), doctest::Contains("'layer_offsets'"),
                         commsgd::invalid_argument);
  T s(10, {.density = 0.5});
  CHECK_THROWS_WITH_AS(s.step(std::vector<float>(9)), doctest::Contains("'gradient'"),
                       commsgd::size_mismatch);
  sp::none d(10);
  CHECK_THROWS_WITH_AS(d.step(std::vector<float>(11)), doctest::Contains("'gradient'"),
                       commsgd::size_mismatch);
  if constexpr (sizeof(std::size_t) > 4)
    CHECK_THROWS_WITH_AS(T((std::size_t{1} << 32) + 1), doctest::Contains("'length'"),
                         commsgd::invalid_argument);
  sp::sparse_vector v(4);
  v.push_back(1, 1.0f);
  CHECK_THROWS_WITH_AS(v.push_back(1, 1.0f), doctest::Contains("'index'"), commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(v.push_back(4, 1.0f), doctest::Contains("'index'"), commsgd::invalid_argument);
}

TEST_CASE("none sends the gradient as is") {
  const auto g = gradient(100, 4);
  sp::none d(100);
  const auto m = d.step(g);
  CHECK(m.values.data() == g.data());
  CHECK(d.steps() == 1);
  static_assert(sp::sparsifier<sp::none>);
  static_assert(sp::sparsifier<sp::top_k<sel::exact>>);
  static_assert(sp::sparsifier<sp::top_k<sel::laplace_bisect, std::uint64_t>>);
}

TEST_CASE("assign moves held-back state between sparsifiers: the next steps equal a loaded copy") {
  for (const double momentum : {0.0, 0.9}) {
    CAPTURE(momentum);
    sp::top_k_options o;
    o.density = 0.05;
    o.momentum = momentum;
    const std::size_t d = 1001;
    sp::top_k<sel::exact> source(d, o);
    for (std::uint64_t s = 0; s < 5; ++s)
      source.step(gradient(d, s));
    std::vector<std::byte> blob;
    source.save(blob);
    sp::top_k<sel::exact> loaded(d, o), assigned(d, o);
    loaded.load(std::span<const std::byte>(blob));
    assigned.assign(source.steps(), source.residual(), source.momentum());
    CHECK(assigned.steps() == source.steps());
    for (std::uint64_t s = 5; s < 9; ++s) {
      const auto g = gradient(d, s);
      const auto a = assigned.step(g);
      const auto b = loaded.step(g);
      REQUIRE(a.size() == b.size());
      CHECK(std::equal(a.indices.begin(), a.indices.end(), b.indices.begin()));
      CHECK(std::equal(a.values.begin(), a.values.end(), b.values.begin(), [](float x, float y) {
        return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
      }));
    }
  }
}

TEST_CASE("assign refuses a wrong size or a non-finite value and changes nothing") {
  sp::top_k_options o;
  o.density = 0.1;
  sp::top_k<sel::exact> t(10, o);
  t.step(gradient(10, 1));
  const std::vector<float> before(t.residual().begin(), t.residual().end());
  std::vector<float> short_r(9, 1.0f), bad(10, 1.0f), velocity(10, 0.0f);
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH_AS(t.assign(7, short_r), doctest::Contains("argument 'residual' holds 9"),
                       commsgd::size_mismatch);
  CHECK_THROWS_AS(t.assign(7, bad), commsgd::non_finite);
  CHECK_THROWS_WITH_AS(t.assign(7, std::vector<float>(10, 0.0f), velocity),
                       doctest::Contains("argument 'momentum' holds 10"), commsgd::size_mismatch);
  CHECK(t.steps() == 1);
  CHECK(std::equal(before.begin(), before.end(), t.residual().begin()));
}
