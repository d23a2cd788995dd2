// sync::diloco's outer step from a sum held a part at a time (compress::summed_in_parts: int8, e3m0, fp16,
// bf16, top_k_ef; the compressors' own parts are tests/unit/compress_sum_parts.cpp's): the engine over such a
// compressor gives the bits of the engine that reads the sum whole (the same compressor with its parts
// hidden) over layouts whose fragments' runs cross the parts' edges, every merge, with and without outer
// momentum and delay, a rank's weight, a checkpoint taken with an exchange in flight, and sums that overflow
// (refused alike).
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

using top_k = compress::top_k_ef<select::chunked>;

template <class X, class MakeX>
void engine_alike(const char* what, MakeX make_x) {
  // Runs that cross the parts' edges (8,192 values; top-k 4,096), an empty layer, one fragment of nothing.
  const std::vector<std::vector<std::size_t>> shapes = {{0}, {3, 9000, 0, 257, 1}, {8192, 5}};
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
        {
          const int n = variant == 1 ? 1 : 3;
          CAPTURE(what);
          CAPTURE(sizes.size());
          CAPTURE(frags);
          CAPTURE(variant);
          CAPTURE(n);
          const bool huge = variant == 0 && n == 3;
          const int save_at = variant >= 2 ? 4 : 0; // fragment 0 in flight then (delay 1)
          auto parts = trace<sync::diloco<comm::local, X>>(sizes, n, 6, save_at, huge, [&](comm::local& c) {
            return sync::diloco<comm::local, X>(c, sizes, o, make_x);
          });
          auto whole =
              trace<sync::diloco<comm::local, whole_sum<X>>>(sizes, n, 6, save_at, huge, [&](comm::local& c) {
                return sync::diloco<comm::local, whole_sum<X>>(
                    c, sizes, o, [&](std::size_t m) { return whole_sum<X>(make_x(m)); });
              });
          for (std::size_t r = 0; r < parts.size(); ++r)
            CHECK(same_bits(parts[r], whole[r]));
          ++cases;
        }
      }
  CHECK(cases == 24);
}

} // namespace

// One code of each exchange path the engine takes (a gathered block code, the 16-bit ring, a gathered top-k
// code) here; the others below walk the same paths with their threads.
TEST_CASE("the engine's outer step from a sum in parts is the outer step from the whole sum, bit for bit") {
  engine_alike<compress::int8>(
      "int8", [](std::size_t m) { return compress::int8(m, {.block_size = 256, .error_feedback = false}); });
  engine_alike<compress::fp16>("fp16", [](std::size_t m) { return compress::fp16(m); });
  engine_alike<top_k>("top-k 2-bit senders", [](std::size_t m) {
    return top_k(m, {.density = 0.03, .two_bit = true, .chunk = 4096, .decay = 0.95f, .sender_mean = true});
  });
}

TEST_CASE("the outer step from a sum in parts is that of the whole sum for the other codes too" *
          doctest::test_suite("threads_seen")) {
  engine_alike<compress::e3m0>("e3m0 odd", [](std::size_t m) {
    return compress::e3m0(m, {.block_size = 257, .error_feedback = true});
  });
  engine_alike<compress::bf16>("bf16", [](std::size_t m) { return compress::bf16(m); });
  engine_alike<top_k>("top-k", [](std::size_t m) { return top_k(m, {.density = 0.01, .chunk = 4096}); });
}
