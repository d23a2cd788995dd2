// The outer step from a sum held a part at a time (compress::summed_in_parts: int8, e3m0, fp16, bf16,
// top_k_ef).
// The compressors' parts are reduce()'s sum bit for bit, rising and covering the length once, the round's
// residual, bytes and steps as reduce() leaves them; a sum said surely finite holds no NaN or inf, and one
// that overflows is never said to be. The engine over such a compressor gives the bits of the engine that
// reads the sum whole (the same compressor with its parts hidden) over random layouts whose fragments' runs
// cross the parts' edges, every merge, with and without outer momentum and delay, a rank's weight, a
// checkpoint taken with an exchange in flight, and sums that overflow (refused alike).
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/block_quant.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/top_k_ef.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/chunked.hpp>
#include <commsgd/sync/diloco.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace commsgd;

namespace {

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// X with its parts hidden: the engine then sums whole, through reduce().
template <class X>
struct whole_sum : X {
  explicit whole_sum(X x) : X(std::move(x)) {}
  template <class... A>
  void reduce_coded(A&&...) = delete;
};
static_assert(compress::summed_in_parts<compress::int8, comm::local>);
static_assert(compress::summed_in_parts<compress::e3m0, comm::local>);
static_assert(compress::summed_in_parts<compress::fp16, comm::local>);
static_assert(compress::summed_in_parts<compress::bf16, comm::local>);
static_assert(compress::summed_in_parts<compress::top_k_ef<select::chunked>, comm::local>);
static_assert(!compress::summed_in_parts<whole_sum<compress::int8>, comm::local>);
static_assert(compress::compressor<whole_sum<compress::int8>, comm::local>);

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
  for (std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{8192},
                        std::size_t{8193}, std::size_t{20011}})
    for (int n : {1, 2, 3})
      for (bool huge : {false, true})
        for (bool ef : {false, true}) {
          for (std::size_t b :
               {std::size_t{1}, std::size_t{7}, std::size_t{256}, std::size_t{257}, std::size_t{8193}}) {
            CAPTURE(b);
            CAPTURE(ef);
            const compress::block_quant_options o{.block_size = b, .error_feedback = ef};
            parts_are_the_sum<compress::int8>("int8", d, n, huge,
                                              [&](std::size_t m) { return compress::int8(m, o); });
            parts_are_the_sum<compress::e3m0>("e3m0", d, n, huge,
                                              [&](std::size_t m) { return compress::e3m0(m, o); });
          }
          CAPTURE(ef);
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

namespace {

// Every rank's common and local models after each step of `steps`, with random moves between the steps, for
// engine type S made by make(c); with `save_at`, the engine is saved after that step and a fresh one loaded
// from it carries on.
template <class S, class Make>
std::vector<std::vector<float>> trace(const std::vector<std::size_t>& sizes, int n, int steps, int save_at,
                                      bool huge_at_3, Make make) {
  std::size_t dim = 0;
  for (auto l : sizes)
    dim += l;
  std::vector<std::vector<float>> out(static_cast<std::size_t>(n));
  comm::local_group(n).run([&](comm::local& c) {
    std::mt19937 rng(static_cast<unsigned>(131 * c.rank() + dim));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(dim);
    for (auto& v : x)
      v = normal(rng);
    // Rank 1 of several weighs its pseudo-gradients (a membership engine's weighted mean).
    const float w = c.size() > 1 && c.rank() == 1 ? 0.75f : 1.0f;
    auto s = std::make_unique<S>(make(c));
    s->start(x);
    s->set_weight(w);
    auto& o = out[static_cast<std::size_t>(c.rank())];
    for (int t = 1; t <= steps; ++t) {
      for (auto& v : x)
        v = v - 0.01f * normal(rng);
      if (huge_at_3 && t == 3 && dim > 0) x[dim / 2] = 0.9f * 3.0e38f; // every rank alike: the sum overflows
      try {
        s->advance(x);
        o.push_back(1.0f);
      } catch (const non_finite& e) {
        o.push_back(static_cast<float>(e.count()));
        o.push_back(static_cast<float>(e.first_index()));
        if (huge_at_3) x[dim / 2] = 0.0f;
      } catch (const error& e) {
        o.push_back(-static_cast<float>(std::string(e.what()).size()));
        if (huge_at_3) x[dim / 2] = 0.0f;
      }
      o.insert(o.end(), x.begin(), x.end());
      for (std::size_t p = 0; p < s->num_fragments(); ++p) {
        const auto g = s->global_model(p);
        o.insert(o.end(), g.begin(), g.end());
      }
      if (t == save_at) {
        std::stringstream ss;
        s->save(ss);
        s.reset();
        s = std::make_unique<S>(make(c));
        s->load(ss);
        s->start(x);
        s->set_weight(w);
      }
    }
    s->finish(x);
    o.insert(o.end(), x.begin(), x.end());
  });
  return out;
}

template <class X, class MakeX>
void engine_alike(const char* what, MakeX make_x) {
  const std::vector<std::vector<std::size_t>> shapes = {
      {0}, {1}, {3, 9000, 0, 257, 12000, 1}, {8192, 8192, 5}, {20000}};
  int cases = 0;
  for (const auto& sizes : shapes)
    for (int frags = 1; frags <= std::min<int>(3, static_cast<int>(sizes.size())); ++frags)
      for (int variant = 0; variant < 4; ++variant) {
        sync::diloco_options o{.sync_every = 2, .fragments = frags};
        o.layout = variant % 2 ? sync::fragment_layout::contiguous : sync::fragment_layout::strided;
        if (variant == 1) o.alpha = 0.5f;
        if (variant == 2) o.delay = 1;
        if (variant == 3) {
          o.delay = 1;
          o.keep_delay_steps = true;
          o.outer = {.lr = 1.0f, .momentum = 0.0f};
        }
        for (int n : {1, 3}) {
          CAPTURE(what);
          CAPTURE(sizes.size());
          CAPTURE(frags);
          CAPTURE(variant);
          CAPTURE(n);
          const bool huge = variant == 0 && n == 3;
          const int save_at = variant >= 2 ? 5 : 0;
          auto parts = trace<sync::diloco<comm::local, X>>(sizes, n, 8, save_at, huge, [&](comm::local& c) {
            return sync::diloco<comm::local, X>(c, sizes, o, make_x);
          });
          auto whole =
              trace<sync::diloco<comm::local, whole_sum<X>>>(sizes, n, 8, save_at, huge, [&](comm::local& c) {
                return sync::diloco<comm::local, whole_sum<X>>(
                    c, sizes, o, [&](std::size_t m) { return whole_sum<X>(make_x(m)); });
              });
          for (std::size_t r = 0; r < parts.size(); ++r)
            CHECK(same_bits(parts[r], whole[r]));
          ++cases;
        }
      }
  CHECK(cases > 40);
}

} // namespace

TEST_CASE("the engine's outer step from a sum in parts is the outer step from the whole sum, bit for bit") {
  engine_alike<compress::int8>(
      "int8", [](std::size_t m) { return compress::int8(m, {.block_size = 256, .error_feedback = false}); });
  engine_alike<compress::e3m0>(
      "e3m0", [](std::size_t m) { return compress::e3m0(m, {.block_size = 256, .error_feedback = false}); });
  engine_alike<compress::e3m0>("e3m0 odd", [](std::size_t m) {
    return compress::e3m0(m, {.block_size = 257, .error_feedback = true});
  });
  engine_alike<compress::fp16>("fp16", [](std::size_t m) { return compress::fp16(m); });
  engine_alike<compress::bf16>("bf16", [](std::size_t m) { return compress::bf16(m); });
  using top_k = compress::top_k_ef<select::chunked>;
  engine_alike<top_k>("top-k", [](std::size_t m) { return top_k(m, {.density = 0.01, .chunk = 4096}); });
  engine_alike<top_k>("top-k 2-bit senders", [](std::size_t m) {
    return top_k(m, {.density = 0.03, .two_bit = true, .chunk = 4096, .decay = 0.95f, .sender_mean = true});
  });
  engine_alike<top_k>("top-k one chunk", [](std::size_t m) { return top_k(m, {.density = 0.2}); });
}
