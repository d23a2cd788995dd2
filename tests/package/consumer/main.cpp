// Sums ranks over four threads through the installed or vendored commsgd.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>

#include <atomic>
#include <cstdio>

int main() {
  std::atomic<int> wrong{0};
  commsgd::comm::local_group(4).run([&](commsgd::comm::local& c) {
    commsgd::comm::metered<commsgd::comm::local> m(std::move(c));
    std::int32_t v[1] = {m.rank() + 1};
    m.all_reduce_sum(std::span<std::int32_t>(v));
    if (v[0] != 10) ++wrong;
  });
  std::printf("consumer: %s\n", wrong == 0 ? "ok" : "wrong sum");
  return wrong == 0 ? 0 : 1;
}
