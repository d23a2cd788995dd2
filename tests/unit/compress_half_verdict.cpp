// fp16 and bf16 test their input for NaN and inf and encode it a chunk at a time (compress/half.hpp,
// check_and_encode): the verdict must be the one of testing all of the input first and then encoding it.
// A NaN or inf anywhere outranks an overflow before it; counts and the first index run across chunks.
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/validate.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

using namespace commsgd;

namespace {

// The error a one-rank round raises on g, as "type: message", or "" when it succeeds.
template <class X>
std::string raised(X x, const std::vector<float>& g) {
  std::string what;
  comm::local_group(1).run([&](comm::local& c) {
    std::vector<float> out(g.size());
    try {
      x.reduce(c, g, out);
    } catch (const non_finite& e) {
      what = std::string("non_finite: ") + e.what();
    } catch (const invalid_argument& e) {
      what = std::string("invalid_argument: ") + e.what();
    }
  });
  return what;
}

// What the round raised before the test and the encoding were fused: all of p tested, then encoded, the
// first value whose 16-bit code is an infinity being the overflow.
template <class Format>
std::string expected(const char* name, const char* range, const std::vector<float>& p) {
  const auto bad = select::find_non_finite(p);
  const std::string who = commsgd::concat(name, ": this rank's gradient (plus its residual)");
  if (bad.count > 0) return std::string("non_finite: ") + non_finite(who, bad.count, bad.first).what();
  for (std::size_t i = 0; i < p.size(); ++i)
    if (std::isinf(Format::decode(Format::encode(p[i]))))
      return std::string("invalid_argument: ") +
             invalid_argument(commsgd::concat(who, " value ", static_cast<double>(p[i]), " at index ", i,
                                              " is outside the allowed range ", range))
                 .what();
  return "";
}

} // namespace

TEST_CASE("fp16 and bf16: the verdict on NaN, inf and overflow across chunks is that of testing first") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float too_big_fp16 = 70000.0f, too_big_bf16 = std::numeric_limits<float>::max();
  for (std::size_t d : {std::size_t{5000}, std::size_t{4096}, std::size_t{12289}})
    // Where the values go: in the first chunk, at its last and the next one's first value, in a later chunk.
    for (const std::vector<std::pair<std::size_t, int>>& put :
         {std::vector<std::pair<std::size_t, int>>{{100, 0}, {4500, 1}},
          {{4095, 0}, {4096, 1}},
          {{4095, 1}, {4096, 0}, {d - 1, 2}},
          {{7, 0}},
          {{4097, 0}, {d - 1, 0}},
          {{3, 2}, {4099, 1}, {4100, 1}}}) {
      CAPTURE(d);
      for (bool fp : {true, false}) {
        CAPTURE(fp);
        std::vector<float> g(d, 0.5f);
        for (const auto& [at, kind] : put)
          if (at < d) g[at] = kind == 0 ? (fp ? too_big_fp16 : too_big_bf16) : kind == 1 ? nan : -inf;
        const auto want =
            fp ? expected<compress::fp16_format>("compress::fp16", "[-65504, 65504] (fp16)", g)
               : expected<compress::bf16_format>("compress::bf16", "[-3.3895314e38, 3.3895314e38] (bf16)", g);
        CHECK(!want.empty());
        if (fp) {
          CHECK(raised(compress::fp16(d), g) == want);
          CHECK(raised(compress::fp16(d, {.error_feedback = true}), g) == want);
        } else {
          CHECK(raised(compress::bf16(d), g) == want);
          CHECK(raised(compress::bf16(d, {.error_feedback = true}), g) == want);
        }
      }
    }
}
