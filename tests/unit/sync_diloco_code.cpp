// The codes of DiLoCo named at run time (sync/diloco_codes.hpp, sync/coded_diloco.hpp): names round-trip and bad
// ones are refused; the sizes cost/ gives are the compressors' own; sync::coded_diloco is the engine of that
// code bit for bit; the bytes the engine counts are those its rounds hand the transport (comm::over_messages
// runs every collective out of point-to-point messages, comm::metered counts them) and those cost/ predicts;
// its rounds, finish()'s included, are those of the schedule written out here.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/over_messages.hpp>
#include <commsgd/sync/coded_diloco.hpp>
#include <commsgd/sync/diloco_codes.hpp>
#include <support/least_squares.hpp>
#include <support/train_ranks.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <vector>

using namespace commsgd;
using sync::diloco_code;
using sync::diloco_format;

namespace {

const std::vector<std::size_t> layers = {5, 17, 3, 9};
const char* const codes[] = {"dense",
                             "fp16",
                             "bf16",
                             "int8",
                             "e3m0",
                             "topk-0.25",
                             "topk-0.3-c4-2bit-b0.95",
                             "topk-0.3-c4-b0.95-shared",
                             "topk-0.3-c4-b0.95-regions"};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Fragment p of P's rounds over `steps` inner steps and a finish(), from the schedule as docs/diloco.md
// states it rather than the engine's own: a start after each step s >= max(1, t_p) with (s - t_p) mod H = 0,
// t_p = p H / P, applied `delay` steps later; then finish() exchanges once more a fragment that moved since
// its last exchange was applied: every one when the merge keeps local values (alpha > 0), otherwise all but
// those whose last exchange was applied at the last step or in finish() itself.
std::uint64_t expected_rounds(int p, int P, const sync::diloco_options& o, int steps) {
  const int H = o.sync_every, t = p * H / P;
  std::uint64_t k = 0;
  int last = 0;
  for (int s = std::max(1, t); s <= steps; ++s)
    if ((s - t) % H == 0) {
      ++k;
      last = s;
    }
  const bool keeps_local = o.alpha != 0.0f || (o.keep_delay_steps && o.delay > 0);
  const bool applied_at_end = k > 0 && last + o.delay >= steps;
  return k + (keeps_local || !applied_at_end ? 1 : 0);
}

// The exchanges and bytes a rank should count over `steps` inner steps and a finish(), fragment p holding
// `lengths[p]` values: each exchange a round of its code, the first one's verdict included.
struct traffic_expected {
  std::uint64_t rounds = 0, bytes = 0;
};
traffic_expected expected_traffic(const diloco_code& code, const std::vector<std::size_t>& lengths,
                                  const sync::diloco_options& o, int steps, int n, int rank) {
  traffic_expected out;
  const int P = static_cast<int>(lengths.size());
  for (int p = 0; p < P; ++p) {
    const auto k = expected_rounds(p, P, o, steps);
    for (std::uint64_t i = 0; i < k; ++i)
      out.bytes += code.round_traffic(lengths[static_cast<std::size_t>(p)], n, rank, i == 0).bytes_sent;
    out.rounds += k;
  }
  return out;
}

} // namespace

TEST_CASE("code names round-trip; anything else is refused naming the argument and the allowed codes") {
  for (const char* name : codes)
    CHECK(diloco_code::parse(name).name() == name);
  CHECK(diloco_code::parse("topk-0.001").density == 0.001);
  CHECK(diloco_code::parse("topk-1e-3").density == 0.001);
  const auto s = diloco_code::parse("topk-0.01-c4096-2bit-b0.95");
  CHECK((s.density == 0.01 && s.chunk == 4096 && s.two_bit && s.decay == 0.95));
  CHECK(s.name() == "topk-0.01-c4096-2bit-b0.95");
  // Parts in any order, written back in one; a decay of 1 is the default and not written.
  CHECK(diloco_code::parse("topk-0.02-b0.5-2bit-c64").name() == "topk-0.02-c64-2bit-b0.5");
  CHECK(diloco_code::parse("topk-0.02-b1").name() == "topk-0.02");
  CHECK(diloco_code::parse("topk-0.02-b0").decay == 0.0);
  CHECK(diloco_code::parse("topk-0.01-senders-c4096").name() == "topk-0.01-c4096-senders");
  CHECK(diloco_code::parse("topk-0.01-senders").sender_mean);
  CHECK(!diloco_code::parse("topk-0.01").sender_mean);
  for (const char* bad : {"",
                          "none",
                          "fp4",
                          "int8_block",
                          "topk:0.1",
                          "topk-",
                          "topk-0",
                          "topk-1.5",
                          "topk-0.1x",
                          "topk-nan",
                          "FP16",
                          "e3m0 ",
                          "topk-0.1-c0",
                          "topk-0.1-c-3",
                          "topk-0.1-c4294967296",
                          "topk-0.1-b1.5",
                          "topk-0.1-b-0.5",
                          "topk-0.1-bnan",
                          "topk-0.1-2bit-2bit",
                          "topk-0.1-c4-c8",
                          "topk-0.1-",
                          "topk-0.1-3bit",
                          "topk-0.1-senders-senders",
                          "topk-0.1-sender"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(diloco_code::parse(bad), doctest::Contains("argument 'compression'"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(diloco_code::parse(bad),
                         doctest::Contains("'topk-<density>[-c<chunk>][-2bit][-b<decay>][-senders]'"),
                         invalid_argument);
  }
}

TEST_CASE("the sizes in cost/ are the compressors' messages, for every length") {
  for (std::size_t d : {0u, 1u, 2u, 255u, 256u, 257u, 1000u, 65537u}) {
    CAPTURE(d);
    CHECK(diloco_code::parse("dense").message_bytes(d) == 4 * d);
    CHECK(diloco_code::parse("bf16").message_bytes(d) == 2 * d);
    CHECK(diloco_code::parse("int8").message_bytes(d) == compress::int8::message_bytes(d, 256));
    CHECK(diloco_code::parse("e3m0").message_bytes(d) == compress::e3m0::message_bytes(d, 256));
    CHECK(diloco_code::parse("e3m0").message_bytes(d) == 4 * ((d + 255) / 256) + (d + 1) / 2);
    for (const char* name : {"topk-0.1", "topk-0.01-c4096-2bit-b0.95", "topk-0.3-c7", "topk-0.5-c1-2bit"}) {
      CAPTURE(name);
      const auto code = diloco_code::parse(name);
      const compress::top_k_ef_options o{.density = code.density,
                                         .two_bit = code.two_bit,
                                         .chunk = static_cast<std::size_t>(code.chunk),
                                         .decay = static_cast<float>(code.decay)};
      CHECK(code.message_bytes(d) == compress::top_k_ef<>::message_bytes(d, o));
      // Counted from first principles: each chunk's k values, a scale per chunk when 2-bit, b-bit indices.
      const std::size_t size = code.chunk == 0 || code.chunk > d ? d : code.chunk;
      std::size_t k = 0, chunks = 0;
      for (std::size_t first = 0; first < d; first += size, ++chunks)
        k += cost::top_k_count(std::min(size, d - first), code.density);
      const std::size_t bits = size <= 1 ? 0 : static_cast<std::size_t>(std::bit_width(size - 1));
      CHECK(compress::top_k_ef<>(d, o).k() == k);
      CHECK(code.message_bytes(d) ==
            (code.two_bit ? 4 * chunks + (2 * k + 7) / 8 : 4 * k) + (bits * k + 7) / 8);
    }
  }
}

TEST_CASE("coded_diloco is the engine of its code bit for bit, with the settings it documents") {
  const toy::least_squares prob({.samples = 240, .dim = 34, .seed = 5});
  const sync::diloco_options o{.lr = 0.05f, .sync_every = 3, .fragments = 2, .delay = 1, .alpha = 0.5f};
  const int n = 3, steps = 17;
  auto coded = [&](const char* name) {
    return toy::train_ranks(prob, n, steps, [&](comm::local& c) {
      return sync::coded_diloco<comm::local>(c, layers, o, diloco_code::parse(name));
    });
  };
  auto typed = [&](auto make) {
    return toy::train_ranks(prob, n, steps, [&](comm::local& c) {
      using X = decltype(make(std::size_t{1}));
      return sync::diloco<comm::local, X>(c, layers, o, make);
    });
  };
  const auto dense = toy::train_ranks(
      prob, n, steps, [&](comm::local& c) { return sync::diloco<comm::local>(c, layers, o); });
  const auto got_dense = coded("dense");
  const auto e3m0 =
      typed([](std::size_t d) { return compress::e3m0(d, {.block_size = 256, .error_feedback = false}); });
  const auto got_e3m0 = coded("e3m0");
  const auto int8 =
      typed([](std::size_t d) { return compress::int8(d, {.block_size = 256, .error_feedback = false}); });
  const auto got_int8 = coded("int8");
  const auto fp16 = typed([](std::size_t d) { return compress::fp16(d, {.error_feedback = false}); });
  const auto got_fp16 = coded("fp16");
  const auto topk = typed([](std::size_t d) { return compress::top_k_ef<>(d, {.density = 0.25}); });
  const auto got_topk = coded("topk-0.25");
  const auto sparse = typed([](std::size_t d) {
    return compress::top_k_ef<>(d, {.density = 0.3, .two_bit = true, .chunk = 4, .decay = 0.95f});
  });
  const auto got_sparse = coded("topk-0.3-c4-2bit-b0.95");
  select::laplace_bisect::options warm;
  warm.trim = true;
  warm.warm_start = true;
  const auto shared = typed([&](std::size_t d) {
    return compress::shared_top_k<select::laplace_bisect>(d, {.density = 0.3, .chunk = 4, .decay = 0.95f},
                                                          select::laplace_bisect(warm));
  });
  const auto got_shared = coded("topk-0.3-c4-b0.95-shared");
  const auto regions = typed([&](std::size_t d) {
    return compress::region_top_k<select::laplace_bisect>(d, {.density = 0.3, .chunk = 4, .decay = 0.95f},
                                                          select::laplace_bisect(warm));
  });
  const auto got_regions = coded("topk-0.3-c4-b0.95-regions");
  for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
    CHECK(same_bits(got_dense[r], dense[r]));
    CHECK(same_bits(got_e3m0[r], e3m0[r]));
    CHECK(same_bits(got_int8[r], int8[r]));
    CHECK(same_bits(got_fp16[r], fp16[r]));
    CHECK(same_bits(got_topk[r], topk[r]));
    CHECK(same_bits(got_sparse[r], sparse[r]));
    CHECK(same_bits(got_shared[r], shared[r]));
    CHECK_FALSE(same_bits(got_shared[r], sparse[r]));
    CHECK(same_bits(got_regions[r], regions[r]));
    CHECK_FALSE(same_bits(got_regions[r], got_shared[r]));
    CHECK_FALSE(same_bits(got_sparse[r], topk[r]));
    CHECK_FALSE(same_bits(got_e3m0[r], dense[r])); // the code does change what travels
  }
}

TEST_CASE("the bytes the engine counts are those its messages carried and those cost/ predicts, every code") {
  const toy::least_squares prob({.samples = 240, .dim = 34, .seed = 5});
  const sync::diloco_options o{.lr = 0.05f, .sync_every = 3, .fragments = 2, .delay = 1, .alpha = 0.5f};
  for (const char* name : codes)
    for (int n : {1, 2, 3}) {
      CAPTURE(name);
      CAPTURE(n);
      const auto code = diloco_code::parse(name);
      const int steps = 17;
      comm::local_group(n).run([&](comm::local& base) {
        // Every collective as point-to-point messages, which comm::metered beneath counts as they are.
        comm::over_messages<comm::metered<comm::local>> c{comm::metered<comm::local>(base)};
        sync::coded_diloco<comm::over_messages<comm::metered<comm::local>>> s(c, layers, o, code);
        std::vector<float> x(prob.dim(), 0.0f), g(x.size());
        s.start(x);
        const auto& wire = c.inner().counters();
        CHECK(wire.total().bytes_sent == wire[comm::op_kind::point_to_point].bytes_sent);
        const auto broadcast = wire.total().bytes_sent;
        for (int t = 0; t < steps; ++t) {
          prob.gradient(x, prob.batch(c.rank(), n, t, 8), g);
          s.step(x, g);
        }
        s.finish(x);
        CHECK(s.bytes_sent() == wire.total().bytes_sent - broadcast);
        // Layers {5, 17, 3, 9} strided over 2 fragments: 5 + 3 and 17 + 9 values.
        const auto want = expected_traffic(code, {8, 26}, o, steps, n, c.rank());
        CHECK(s.exchanges_started() == want.rounds);
        CHECK(s.exchanges_applied() == want.rounds);
        CHECK(s.bytes_sent() == want.bytes);
        if (n > 1) CHECK(want.bytes > 0);
      });
    }
}

TEST_CASE(
    "the engine starts and applies the rounds of the written schedule, finish() included, alpha 0 or not") {
  for (int H : {1, 3, 4})
    for (int P = 1; P <= 3; ++P)
      for (int delay = 0; delay < H; ++delay)
        for (const float alpha : {0.0f, 0.5f})
          for (int steps : {0, 1, 5, 11}) {
            CAPTURE(H);
            CAPTURE(P);
            CAPTURE(delay);
            CAPTURE(alpha);
            CAPTURE(steps);
            const sync::diloco_options o{.sync_every = H, .fragments = P, .delay = delay, .alpha = alpha};
            comm::local_group(1).run([&](comm::local& c) {
              sync::coded_diloco<comm::local> s(c, layers, o, diloco_code::parse("dense"));
              std::vector<float> x(34, 1.0f);
              s.start(x);
              for (int t = 0; t < steps; ++t) {
                x[static_cast<std::size_t>(t) % x.size()] += 0.5f;
                s.advance(x);
              }
              s.finish(x);
              std::uint64_t want = 0;
              for (int p = 0; p < P; ++p)
                want += expected_rounds(p, P, o, steps);
              CHECK(s.exchanges_started() == want);
              CHECK(s.exchanges_applied() == want);
            });
          }
}

TEST_CASE(
    "a layer of no values (an empty shard) keeps its fragment's turns and changes no other bit, every code") {
  // The engine over layers {5, 0, 3, 9}, one fragment each, against the same over {5, 1, 3, 9} whose extra
  // value never moves: fragments 0, 2 and 3 hold the same bits after every step, the empty fragment is
  // exchanged on its turns (its verdict travels) and the bytes are cost/'s for its length, 0.
  const std::vector<std::size_t> empty = {5, 0, 3, 9}, padded = {5, 1, 3, 9};
  const sync::diloco_options o{.sync_every = 4, .fragments = 4, .delay = 1, .alpha = 0.25f};
  const int steps = 19;
  for (const char* name : codes)
    for (int n : {1, 2, 3}) {
      CAPTURE(name);
      CAPTURE(n);
      const auto code = diloco_code::parse(name);
      // Rank r's local values after step t: a fixed walk, different on every rank and value.
      auto walk = [](int r, int t, std::size_t i) {
        return 0.01f * static_cast<float>((r + 1) * (t + 1)) + 0.003f * static_cast<float>(i * i % 7);
      };
      auto run = [&](const std::vector<std::size_t>& sizes, comm::local& c,
                     std::vector<std::vector<float>>& out, std::uint64_t& sent) {
        comm::metered<comm::local> m(c);
        sync::coded_diloco<comm::metered<comm::local>> s(m, sizes, o, code);
        std::size_t total = 0;
        for (auto l : sizes)
          total += l;
        std::vector<float> x(total, 0.0f);
        s.start(x);
        for (int t = 0; t < steps; ++t) {
          // Inner steps move every value but the padding's (layer 1 when it has one).
          for (std::size_t i = 0, at = 0; i < sizes.size(); at += sizes[i++])
            if (i != 1)
              for (std::size_t j = 0; j < sizes[i]; ++j)
                x[at + j] += walk(c.rank(), t, at + j - (sizes[1] && at > 5 ? 1 : 0));
          s.advance(x);
          for (std::size_t p : {0u, 2u, 3u}) {
            const auto g = s.global_model(p);
            out.emplace_back(g.begin(), g.end());
          }
          CHECK(s.global_model(1).size() == sizes[1]);
        }
        s.finish(x);
        sent = s.bytes_sent();
        if (sizes[1] == 0) {
          // Every fragment's turns, the empty one's too.
          const auto want = expected_traffic(code, sizes, o, steps, n, c.rank());
          CHECK(s.exchanges_applied() == want.rounds);
          CHECK(s.bytes_sent() == want.bytes);
          CHECK(m.counters().total().bytes_sent >= want.bytes);
        }
      };
      comm::local_group(n).run([&](comm::local& c) {
        std::vector<std::vector<float>> a, b;
        std::uint64_t sent_a = 0, sent_b = 0;
        run(empty, c, a, sent_a);
        run(padded, c, b, sent_b);
        REQUIRE(a.size() == b.size());
        for (std::size_t i = 0; i < a.size(); ++i)
          CHECK(same_bits(a[i], b[i]));
        CHECK(sent_a <= sent_b);
      });
    }
}

TEST_CASE("a rank that holds no values at all takes every turn of every code") {
  const sync::diloco_options o{.sync_every = 2, .fragments = 2, .delay = 1};
  for (const char* name : codes)
    for (int n : {1, 2, 3}) {
      CAPTURE(name);
      CAPTURE(n);
      comm::local_group(n).run([&](comm::local& c) {
        sync::coded_diloco<comm::local> s(c, {0, 0}, o, diloco_code::parse(name));
        std::vector<float> x;
        s.start(x);
        for (int t = 0; t < 7; ++t)
          s.advance(x);
        s.finish(x);
        // Fragment 0 starts after steps 2, 4, 6 and fragment 1 after 1, 3, 5, 7; the last exchanges land at
        // step 7 and in finish(), so with alpha = 0 finish() starts none: 7 in all.
        CHECK(expected_rounds(0, 2, o, 7) + expected_rounds(1, 2, o, 7) == 7);
        CHECK(s.exchanges_started() == 7);
        CHECK(s.exchanges_applied() == 7);
        CHECK(s.global_model(0).empty());
      });
    }
}

TEST_CASE("parts cut at the code's unit are coded in the whole's sizes, for every code and cut") {
  CHECK(diloco_code::parse("dense").unit() == 1);
  CHECK(diloco_code::parse("bf16").unit() == 1);
  CHECK(diloco_code::parse("int8").unit() == 256);
  CHECK(diloco_code::parse("e3m0").unit() == 256);
  CHECK(diloco_code::parse("topk-0.1").unit() == 0);
  CHECK(diloco_code::parse("topk-0.01-c4096-2bit-b0.95").unit() == 4096);
  for (const char* name : {"dense", "fp16", "int8", "e3m0", "topk-0.1-c7", "topk-0.3-c64-2bit", "topk-0.5-c1",
                           "topk-0.1-c7-shared"})
    for (std::size_t d : {0u, 1u, 255u, 257u, 1000u, 4099u})
      for (std::size_t parts : {1u, 2u, 3u, 8u}) {
        CAPTURE(name);
        CAPTURE(d);
        CAPTURE(parts);
        const auto code = diloco_code::parse(name);
        const std::size_t u = code.unit(), units = (d + u - 1) / u;
        std::uint64_t sum = 0;
        for (std::size_t i = 0; i < parts; ++i) {
          const std::size_t a = std::min(d, i * units / parts * u),
                            b = std::min(d, (i + 1) * units / parts * u);
          sum += code.message_bytes(b - a);
        }
        // Whole blocks and chunks cost the same wherever they are cut: the block codes' sums are exact; a
        // top-k part packs its values and its indices apart, each rounded up to a byte (and a last part
        // shorter than a chunk may need fewer index bits).
        if (code.format == sync::diloco_format::top_k) {
          CHECK(sum <= code.message_bytes(d) + 2 * (parts - 1));
          CHECK(sum + 8 >= code.message_bytes(d));
        } else {
          CHECK(sum == code.message_bytes(d));
        }
      }
}
