// PowerSGD's side of the compressor contract: metered bytes equal cost/powersgd.hpp, save/load continues bit
// for bit, bad input raises on every rank and changes nothing, and it composes through data_parallel.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/compress.hpp>
#include <commsgd/cost/powersgd.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

using namespace commsgd;
using compress::layer_shape;
using compress::powersgd;
using compress::powersgd_options;

namespace {

const std::vector<layer_shape> shapes{{24, 16}, {16, 1}, {3, 3}, {40, 9}, {1, 1}, {9, 40}, {100, 7}};
constexpr std::size_t length = 24 * 16 + 16 + 9 + 360 + 1 + 360 + 700;

std::vector<float> gradient(int rank, int t) {
  std::vector<float> g(length);
  compress::detail::standard_normals(static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(rank), 3, g);
  return g;
}

powersgd_options options(std::size_t rank) {
  powersgd_options o;
  o.rank = rank;
  o.layers = shapes;
  o.seed = 5;
  return o;
}

} // namespace

TEST_CASE("metered bytes equal the cost model exactly, n = 1..4") {
  for (int n = 1; n <= 4; ++n)
    for (std::size_t r : {1u, 2u, 5u}) {
      CAPTURE(n);
      CAPTURE(r);
      comm::local_group(n).run([&](comm::local& c) {
        comm::metered<comm::local> m(c);
        powersgd x(length, options(r));
        std::vector<float> out(length);
        for (int t = 0; t < 2; ++t) {
          m.reset();
          x.reduce(m, gradient(c.rank(), t), out);
          const auto want = cost::powersgd_traffic(x.plan(), n, c.rank());
          const auto got = m.counters().total();
          CHECK(got.bytes_sent == want.bytes_sent);
          CHECK(got.bytes_received == want.bytes_received);
          CHECK(x.wire_bytes() == want.bytes_sent);
          // The payload, what PyTorch's hook hands its all-reduces for the same bucket.
          const auto& p = x.plan();
          CHECK(cost::powersgd_payload_bytes(p) == 4 * (p.dense_size + p.p_size + p.q_size));
          std::size_t payload = 0;
          for (const auto& mx : p.matrices)
            payload += mx.rank * (mx.rows + mx.cols);
          for (const auto& v : p.vectors)
            payload += v.size;
          CHECK(cost::powersgd_payload_bytes(p) == 4 * payload);
          // One all-reduce per non-empty buffer (with r = 5 no layer here gains, so all go dense).
          CHECK(got.calls == (p.dense_size > 0) + (p.p_size > 0) + (p.q_size > 0));
          CHECK((r == 5) == p.matrices.empty());
        }
      });
    }
}

TEST_CASE("save and load continue bit-identically; a foreign or damaged stream changes nothing") {
  for (bool warm : {true, false})
    for (int n : {1, 3}) {
      CAPTURE(warm);
      CAPTURE(n);
      comm::local_group(n).run([&](comm::local& c) {
        auto o = options(2);
        o.warm_start = warm;
        powersgd a(length, o);
        std::vector<float> out(length), out2(length);
        for (int t = 0; t < 3; ++t)
          a.reduce(c, gradient(c.rank(), t), out);
        std::stringstream saved;
        a.save(saved);
        const std::string blob = saved.str();
        std::vector<std::vector<float>> first;
        for (int t = 3; t < 6; ++t) {
          a.reduce(c, gradient(c.rank(), t), out);
          first.push_back(out);
        }
        powersgd b(length, o);
        std::istringstream in(blob);
        b.load(in);
        CHECK(b.steps() == 3);
        for (int t = 3; t < 6; ++t) {
          b.reduce(c, gradient(c.rank(), t), out2);
          CHECK(out2 == first[static_cast<std::size_t>(t - 3)]);
        }
        CHECK(std::vector<float>(a.residual().begin(), a.residual().end()) ==
              std::vector<float>(b.residual().begin(), b.residual().end()));

        // Another layout: rank, seed, shapes.
        const std::vector<float> before(b.residual().begin(), b.residual().end());
        for (int which = 0; which < 3; ++which) {
          auto other = o;
          if (which == 0) other.rank = 3;
          if (which == 1) other.seed = 6;
          if (which == 2) other.layers[0] = {16, 24};
          powersgd z(length, other);
          std::istringstream in2(blob);
          CHECK_THROWS_AS(z.load(in2), corrupt_data);
        }
        // Damaged and truncated.
        std::string bad = blob;
        bad[bad.size() / 2] ^= 1;
        std::istringstream in3(bad);
        CHECK_THROWS_AS(b.load(in3), corrupt_data);
        std::istringstream in4(blob.substr(0, blob.size() - 5));
        CHECK_THROWS_AS(b.load(in4), corrupt_data);
        CHECK(b.steps() == 6);
        CHECK(std::vector<float>(b.residual().begin(), b.residual().end()) == before);
      });
    }
}

TEST_CASE("bad arguments raise commsgd errors naming them") {
  auto o = options(0);
  CHECK_THROWS_WITH_AS(powersgd(length, o), doctest::Contains("'rank' = 0"), invalid_argument);
  o = options(1);
  o.min_compression_rate = 0.0;
  CHECK_THROWS_WITH_AS(powersgd(length, o), doctest::Contains("'min_compression_rate'"), invalid_argument);
  o = options(1);
  o.orthogonalization_epsilon = -1.0f;
  CHECK_THROWS_WITH_AS(powersgd(length, o), doctest::Contains("'orthogonalization_epsilon'"),
                       invalid_argument);
  o = options(1);
  CHECK_THROWS_WITH_AS(powersgd(length + 1, o), doctest::Contains("'layers' describes"), size_mismatch);
  o.layers.clear();
  CHECK_THROWS_AS(powersgd(length, o), size_mismatch);
  CHECK_NOTHROW(powersgd(0, o));
  o = options(1);
  o.initial_q = {1.0f, 2.0f};
  CHECK_THROWS_WITH_AS(powersgd(length, o), doctest::Contains("'initial_q'"), size_mismatch);
  o.initial_q.assign(compress::make_powersgd_plan(length, shapes, 1, 2.0).q_size, 1.0f);
  o.initial_q[3] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(powersgd(length, o), non_finite);
}

TEST_CASE("a non-finite gradient or a wrong size on one rank raises on every rank and changes nothing") {
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max()};
  for (int n : {1, 2, 4})
    for (std::size_t where : {std::size_t{0}, std::size_t{16 * 24 + 3}, length - 1})
      for (int kind = 0; kind < 5; ++kind) {
        CAPTURE(n);
        CAPTURE(where);
        CAPTURE(kind);
        comm::local_group(n).run([&](comm::local& c) {
          powersgd x(length, options(2));
          std::vector<float> out(length);
          x.reduce(c, gradient(c.rank(), 0), out);
          const std::vector<float> e(x.residual().begin(), x.residual().end());
          const std::vector<float> q(x.q().begin(), x.q().end());
          auto g = gradient(c.rank(), 1);
          const bool me = c.rank() == n - 1;
          std::vector<float> small(length - 1);
          std::span<const float> arg = g;
          if (me && kind < 4) {
            g[where] = bad_values[kind];
            // float max twice overflows in M = g + e on the largest positions: add it to the residual's scale
            if (kind == 3) g[where] = bad_values[kind], g[where == 0 ? 1 : 0] = bad_values[kind];
          }
          if (me && kind == 4) arg = small;
          bool threw = false;
          try {
            x.reduce(c, arg, out);
          } catch (const non_finite&) {
            threw = true;
          } catch (const size_mismatch&) {
            threw = me && kind == 4;
          }
          // float max alone is finite: it may pass if nothing overflows; everything else must raise.
          if (kind != 3) CHECK(threw);
          if (threw) {
            CHECK(x.steps() == 1);
            CHECK(std::vector<float>(x.residual().begin(), x.residual().end()) == e);
            CHECK(std::vector<float>(x.q().begin(), x.q().end()) == q);
          }
        });
      }
}

TEST_CASE("policy::powersgd composes through data_parallel") {
  using dp = data_parallel<policy::uncoded<>, policy::powersgd, policy::synchronous>;
  static_assert(std::is_same_v<dp::reducer_type::compressor_type, compress::powersgd>);
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    std::vector<std::vector<float>> finals(static_cast<std::size_t>(n));
    comm::local_group(n).run([&](comm::local& c) {
      dp trainer(c, length, {.lr = 0.05f, .compression = options(2)});
      std::vector<float> x(length, 0.5f);
      trainer.start(x);
      for (int t = 0; t < 4; ++t)
        trainer.step(x, gradient(c.rank(), t));
      trainer.finish(x);
      CHECK(trainer.compression().steps() == 4);
      CHECK(trainer.last_exchange().dense);
      finals[static_cast<std::size_t>(c.rank())] = x;
    });
    for (int w = 1; w < n; ++w)
      CHECK(finals[static_cast<std::size_t>(w)] == finals[0]);
  }
}

TEST_CASE("out may be the gradient itself") {
  for (bool ef : {true, false})
    for (int n : {1, 3}) {
      CAPTURE(ef);
      CAPTURE(n);
      comm::local_group(n).run([&](comm::local& c) {
        auto o = options(2);
        o.error_feedback = ef;
        powersgd a(length, o), b(length, o);
        std::vector<float> out(length);
        for (int t = 0; t < 3; ++t) {
          auto g = gradient(c.rank(), t);
          a.reduce(c, g, out);
          b.reduce(c, g, g);
          CHECK(g == out);
        }
      });
    }
}
