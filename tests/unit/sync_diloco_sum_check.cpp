// DiLoCo refuses a sum of the ranks' pseudo-gradients that holds NaN or inf (finite ones can overflow when
// summed). int8 and e3m0 count them while writing the sum (compress/block_quant.hpp, sum_non_finite) instead of
// the engine reading it again: the refusal must name the same count and first index as reading it does (dense,
// whose sum the engine reads, beside them). fp16 and bf16 refuse such a sum inside their ring.
#include <commsgd/comm/local.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sync/coded_diloco.hpp>
#include <commsgd/sync/diloco_codes.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

using namespace commsgd;

TEST_CASE("a sum that overflows is refused naming its count and first index, whatever the code") {
  const std::size_t d = 700;
  for (const char* name : {"int8", "e3m0", "dense"})
    for (const std::vector<std::size_t>& big : {std::vector<std::size_t>{5, 9}, {0}, {699, 300, 256}}) {
      CAPTURE(name);
      CAPTURE(big.size());
      std::size_t first = d;
      for (std::size_t i : big)
        first = std::min(first, i);
      const std::string want = commsgd::concat(
          "holds ", big.size(), " non-finite value(s) (NaN or inf), the first at index ", first);
      std::mutex mu;
      std::vector<std::string> what;
      comm::local_group(2).run([&](comm::local& c) {
        sync::coded_diloco<comm::local> s(c, {d}, {.sync_every = 1, .fragments = 1, .delay = 0},
                                          sync::diloco_code::parse(name));
        std::vector<float> x(d, 0.0f);
        s.start(x);
        // Each rank's pseudo-gradient 0 - x is finite; at `big` two ranks' 3e38 sum past the largest float.
        for (std::size_t i = 0; i < d; ++i)
          x[i] = 1e-3f * static_cast<float>(i % 7);
        for (std::size_t i : big)
          x[i] = -3e38f;
        std::string got = "not refused";
        try {
          s.advance(x);
        } catch (const non_finite& e) {
          got = e.what();
          CHECK(e.count() == big.size());
          CHECK(e.first_index() == first);
        }
        std::lock_guard lock(mu);
        what.push_back(got);
      });
      for (const auto& w : what) {
        CHECK_MESSAGE(w.find(want) != std::string::npos, w);
        CHECK_MESSAGE(w.find("the sum of the ranks' pseudo-gradients") != std::string::npos, w);
        CHECK_MESSAGE(w.find("this rank's own is finite") != std::string::npos, w);
      }
    }
}

TEST_CASE("fp16 and bf16 refuse an overflowing sum in their ring; the engine does not read the sum again") {
  const std::size_t d = 700;
  for (const char* name : {"fp16", "bf16"}) {
    CAPTURE(name);
    // Each rank's value is within the format's range; two of them sum past it.
    const float big = std::string(name) == "fp16" ? -40000.0f : -3e38f;
    std::mutex mu;
    std::vector<std::string> what;
    comm::local_group(2).run([&](comm::local& c) {
      sync::coded_diloco<comm::local> s(c, {d}, {.sync_every = 1, .fragments = 1, .delay = 0},
                                        sync::diloco_code::parse(name));
      std::vector<float> x(d, 0.0f);
      s.start(x);
      x[17] = big;
      x[400] = big;
      std::string got = "not refused";
      try {
        s.advance(x);
      } catch (const non_finite& e) {
        got = e.what();
        CHECK(e.count() == 2);
        CHECK(e.first_index() == 17);
      }
      std::lock_guard lock(mu);
      what.push_back(got);
    });
    for (const auto& w : what)
      CHECK_MESSAGE(w.find("the 16-bit sum") != std::string::npos, w);
  }
}
