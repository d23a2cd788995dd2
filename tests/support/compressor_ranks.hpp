// A pseudo-gradient compressor's reduce on n thread ranks under comm::metered, for the tests that check what
// every rank sums, what each message decodes to alone and what the meter counts.
#pragma once

#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace commsgd::inline v1::toy {

// One rank's reduce of `g`: what its message decodes to (alone in the group, the sum is its message).
template <class X>
std::vector<float> decoded(X& x, const std::vector<float>& g) {
  std::vector<float> out(g.size());
  comm::local_group(1).run([&](comm::local& c) { x.reduce(c, g, out); });
  return out;
}

struct rank_reduces {
  std::vector<std::vector<float>> sums; // what each rank's reduce returned
  std::vector<std::vector<float>> mine; // what each rank's own message decodes to
  std::vector<std::uint64_t> sent;      // bytes each rank's meter counted
  std::vector<std::uint64_t> wire;      // bytes each compressor says it sent
};

// make() builds a fresh compressor; rank r reduces g_i = sin(7 i + 13 r).
template <class Make>
rank_reduces reduce_on_ranks(int n, std::size_t d, Make make) {
  const auto ranks = static_cast<std::size_t>(n);
  rank_reduces out{std::vector<std::vector<float>>(ranks), std::vector<std::vector<float>>(ranks),
                   std::vector<std::uint64_t>(ranks), std::vector<std::uint64_t>(ranks)};
  std::mutex mu;
  comm::local_group(n).run([&](comm::local& base) {
    comm::metered c(base);
    auto x = make();
    std::vector<float> g(d), sum(d);
    for (std::size_t i = 0; i < d; ++i)
      g[i] = std::sin(static_cast<float>(i * 7 + static_cast<std::size_t>(c.rank()) * 13));
    x.reduce(c, g, sum);
    auto alone = make();
    const auto own = decoded(alone, g);
    std::lock_guard lock(mu);
    const auto r = static_cast<std::size_t>(c.rank());
    out.sums[r] = sum;
    out.mine[r] = own;
    out.sent[r] = c.counters().total().bytes_sent;
    out.wire[r] = x.wire_bytes();
  });
  return out;
}

} // namespace commsgd::inline v1::toy
