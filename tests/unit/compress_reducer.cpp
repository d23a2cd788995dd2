// The compressor seam: a compressor written here composes through data_parallel via compress::reducer and
// policy::compressor_traits, and its reports reach the trainer.
#include <commsgd/comm/local.hpp>
#include <commsgd/compress/compress.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <vector>

using namespace commsgd;

namespace user {

// Scales the gradient by a power of two before the all-reduce and back after: exact, so the sum equals the
// plain all-reduce bit for bit, and it counts its rounds.
class scaled_sum {
public:
  static constexpr const char* name = "scaled_sum";
  explicit scaled_sum(std::size_t length) : length_(length), buf_(length) {}
  std::size_t length() const noexcept { return length_; }
  std::uint64_t steps() const noexcept { return steps_; }
  std::uint64_t wire_bytes() const noexcept { return steps_ ? length_ * sizeof(float) : 0; }
  template <comm::communicator C>
  comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    std::transform(g.begin(), g.end(), buf_.begin(), [](float x) { return x * 4.0f; });
    c.all_reduce_sum(std::span<float>(buf_));
    std::transform(buf_.begin(), buf_.end(), out.begin(), [](float x) { return x * 0.25f; });
    ++steps_;
    comm::exchange_report r;
    r.dense = true;
    r.total = length_ * static_cast<std::uint64_t>(c.size());
    return r;
  }
  void save(std::ostream&) const {}
  void load(std::istream&) {}

private:
  std::size_t length_;
  std::vector<float> buf_;
  std::uint64_t steps_ = 0;
};

struct scaled_sum_policy {};

} // namespace user

template <>
struct commsgd::policy::compression_traits<user::scaled_sum_policy>
    : policy::compressor_traits<compression_traits<user::scaled_sum_policy>, user::scaled_sum> {
  using options = policy::no_options;
  static user::scaled_sum make(std::size_t length, const options&) { return user::scaled_sum(length); }
};

static_assert(compress::compressor<user::scaled_sum, comm::local>);

TEST_CASE("a compressor composes through data_parallel and equals the dense all-reduce") {
  using coded = data_parallel<policy::uncoded<>, user::scaled_sum_policy, policy::synchronous>;
  using plain = data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>;
  static_assert(std::is_same_v<coded::reducer_type::compressor_type, user::scaled_sum>);
  constexpr std::size_t d = 37;
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    std::vector<std::vector<float>> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
    auto run = [&](auto tag, std::vector<std::vector<float>>& finals) {
      using dp = typename decltype(tag)::type;
      comm::local_group(n).run([&](comm::local& c) {
        dp trainer(c, d, {.lr = 0.1f});
        std::vector<float> x(d, 1.0f), g(d);
        trainer.start(x);
        for (int t = 0; t < 5; ++t) {
          for (std::size_t i = 0; i < d; ++i)
            g[i] =
                static_cast<float>((i * 7 + static_cast<std::size_t>(c.rank()) * 3 + t) % 11) - 5.0f + x[i];
          trainer.step(x, g);
        }
        trainer.finish(x);
        if constexpr (requires { trainer.compression(); }) {
          CHECK(trainer.compression().steps() == 5);
          CHECK(trainer.last_exchange().dense);
          CHECK(trainer.last_exchange().total == d * static_cast<std::uint64_t>(n));
        }
        finals[static_cast<std::size_t>(c.rank())] = x;
      });
    };
    run(std::type_identity<coded>{}, a);
    run(std::type_identity<plain>{}, b);
    for (int r = 0; r < n; ++r)
      CHECK(a[static_cast<std::size_t>(r)] == b[static_cast<std::size_t>(r)]);
  }
}
