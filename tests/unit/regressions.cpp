// Inputs that once broke the library, found by the fuzz targets in tests/fuzz/.
#include <commsgd/select/exact.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

using namespace commsgd;

TEST_CASE("laplace_bisect with a tiny scale sample on a small input stays inside x") {
  // scale_sample in [1, 3] with 4 * scale_sample < N < 16 used to sample pieces longer than x.
  for (std::size_t sample = 1; sample <= 3; ++sample)
    for (std::size_t n = 1; n <= 40; ++n)
      for (std::size_t k = 0; k <= n; ++k) {
        CAPTURE(sample);
        CAPTURE(n);
        CAPTURE(k);
        std::vector<float> x(n);
        for (std::size_t i = 0; i < n; ++i)
          x[i] = static_cast<float>((i * 7919) % 31) - 15.0f;
        select::laplace_bisect::options o;
        o.scale_sample = sample;
        o.warm_start = false;
        o.trim = true;
        select::laplace_bisect s(o);
        CHECK(s.select(x, k) == select::exact{}.select(x, k));
      }
}

TEST_CASE("a state stream whose header claims a huge size is refused as corrupt, without allocating it") {
  // The magic, 8 bytes of anything, then a claimed total of 2^40 bytes, and nothing more.
  std::string bytes("csgdspst", 8);
  bytes.append(8, '\0');
  const std::uint64_t claim = std::uint64_t{1} << 40;
  bytes.append(reinterpret_cast<const char*>(&claim), sizeof claim);
  bytes.append(64, 'x');
  std::istringstream is(bytes, std::ios::binary);
  sparsify::top_k<select::exact> sp(16, {.density = 0.25});
  CHECK_THROWS_AS(sp.load(is), corrupt_data);
}
