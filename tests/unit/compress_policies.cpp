// The compressors as data_parallel policies: each composes with policy::uncoded<> and synchronous, takes its
// own options type in the compression slot of data_parallel's options, keeps every replica identical, and fp16 on
// values fp16 holds exactly trains exactly as the dense all-reduce does.
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/compress.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <type_traits>
#include <vector>

using namespace commsgd;

namespace {

// Runs 5 steps on n ranks; gradients are small multiples of 1/8, which fp16 holds exactly.
template <class Policy>
std::vector<std::vector<float>> train(int n, const typename policy::compression_traits<Policy>::options& o,
                                      std::size_t d) {
  using dp = data_parallel<policy::uncoded<>, Policy, policy::synchronous>;
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(n));
  comm::local_group(n).run([&](comm::local& c) {
    dp trainer(c, d, {.lr = 0.1f, .compression = o});
    std::vector<float> x(d, 1.0f), g(d);
    trainer.start(x);
    for (int t = 0; t < 5; ++t) {
      for (std::size_t i = 0; i < d; ++i)
        g[i] = static_cast<float>((static_cast<int>(i * 7) + c.rank() * 3 + t) % 11 - 5) * 0.125f;
      trainer.step(x, g);
      if constexpr (!policy::is_dense<Policy>) {
        CHECK(trainer.last_exchange().counts.size() == static_cast<std::size_t>(n));
        CHECK(trainer.compression().steps() == static_cast<std::uint64_t>(t + 1));
      }
    }
    trainer.finish(x);
    finals[static_cast<std::size_t>(c.rank())] = x;
  });
  return finals;
}

} // namespace

TEST_CASE("every compressor policy composes through data_parallel and keeps the replicas identical") {
  const std::size_t d = 50;
  const compress::random_k_options random_k{.k = 7, .seed = 4};
  const compress::qsgd_options qsgd{.levels = 4, .seed = 9};
  const compress::sign_options sign{.layer_offsets = {0, 20, 50}};
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    const auto dense = train<policy::dense>(n, {}, d);
    const auto half = train<policy::fp16>(n, {}, d);
    for (int r = 0; r < n; ++r)
      CHECK(half[static_cast<std::size_t>(r)] == dense[0]);
    auto same = [&](const std::vector<std::vector<float>>& f) {
      for (const auto& x : f)
        CHECK(x == f[0]);
      CHECK(f[0] != std::vector<float>(d, 1.0f));
    };
    same(train<policy::bf16>(n, {}, d));
    same(train<policy::random_k>(n, random_k, d));
    same(train<policy::sign>(n, sign, d));
    same(train<policy::qsgd>(n, qsgd, d));
  }
  // The options reach the compressor.
  comm::local_group(1).run([&](comm::local& c) {
    data_parallel<policy::uncoded<>, policy::random_k, policy::synchronous> t(
        c, d, {.lr = 0.1f, .compression = random_k});
    CHECK(t.compression().k() == 7);
    data_parallel<policy::uncoded<>, policy::qsgd, policy::synchronous> q(c, d,
                                                                          {.lr = 0.1f, .compression = qsgd});
    CHECK(q.compression().levels() == 4);
    // Without them the defaults apply.
    data_parallel<policy::uncoded<>, policy::qsgd, policy::synchronous> plain(c, d, {.lr = 0.1f});
    CHECK(plain.compression().levels() == compress::qsgd_options{}.levels);
  });
}
