// Fuzz target: the checkpoint loaders of the sync strategies and of data_parallel, on arbitrary bytes.
//
// The input picks a strategy (synchronous, local_sgd adaptive with every_step correction, partitioned,
// async_ps's server or worker) or a data_parallel with a top_k sparsifier, trains it a few steps so that
// its state is not trivial, and hands a fresh object of the same kind a stream that is one of
//   - the input bytes as they are (mostly refused by the frame checks),
//   - a saved stream with input-chosen damage (bytes overwritten, truncated, extended), with the total and
//     the checksum optionally repaired so that the damage reaches the body parser,
// through load(is) or, as the shared or the local half, load(shared, local). The only acceptable outcomes:
//   - success, and the object then saves back exactly the bytes it read (nothing was misread), or
//   - a commsgd::error, and the object then saves exactly what it saved before.
#include "fuzz_support.hpp"

#include <commsgd/comm/local.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/error.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/state/stream.hpp>
#include <commsgd/sync/async_ps.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/partitioned.hpp>
#include <commsgd/sync/synchronous.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace st = commsgd::state;
using commsgd::comm::local;
using commsgd_fuzz::byte_source;
using bytes = std::vector<std::byte>;

constexpr std::size_t dim = 7;

template <class S>
bytes save_of(const S& s, st::part p = st::part::all) {
  std::ostringstream os(std::ios::binary);
  s.save(os, p);
  const std::string str = std::move(os).str();
  const auto* b = reinterpret_cast<const std::byte*>(str.data());
  return bytes(b, b + str.size());
}

std::istringstream stream_of(const bytes& b) {
  return std::istringstream(std::string(reinterpret_cast<const char*>(b.data()), b.size()), std::ios::binary);
}

void repair(bytes& b) {
  if (b.size() < st::detail::state_prefix_bytes + 8) return;
  const std::uint64_t total = b.size();
  std::memcpy(b.data() + 16, &total, sizeof total);
  const std::uint64_t sum = st::detail::fnv1a(std::span<const std::byte>(b).first(b.size() - 8));
  std::memcpy(b.data() + b.size() - 8, &sum, sizeof sum);
}

bytes damaged(byte_source& in, bytes b) {
  const unsigned edits = in.u8() % 6;
  for (unsigned e = 0; e < edits && !b.empty(); ++e)
    b[in.below(b.size())] = static_cast<std::byte>(in.u8());
  const std::uint8_t resize = in.u8() % 4;
  if (resize == 1 && !b.empty()) b.resize(in.below(b.size()));
  if (resize == 2) b.resize(b.size() + 1 + in.below(16), static_cast<std::byte>(in.u8()));
  if (in.flag()) repair(b);
  return b;
}

// The bytes a stream reader takes from `b`: as many as its header claims, when it has that many.
bytes claimed_prefix(const bytes& b) {
  if (b.size() < st::detail::state_prefix_bytes) return b;
  std::uint64_t total;
  std::memcpy(&total, b.data() + 16, sizeof total);
  return total <= b.size() ? bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(total)) : b;
}

// `trained` has some state; `fresh` is loaded. `which`: 0 load(all), 1 damaged shared half, 2 damaged local.
template <class S>
void attack(byte_source& in, const S& trained, S& fresh) {
  const bytes all = save_of(trained), shared = save_of(trained, st::part::shared),
              mine = save_of(trained, st::part::local);
  const std::uint8_t which = in.u8() % 3;
  const std::uint8_t mode = in.u8() % 3;
  bytes blob;
  if (mode == 0) {
    const auto raw = in.rest();
    blob.assign(reinterpret_cast<const std::byte*>(raw.data()),
                reinterpret_cast<const std::byte*>(raw.data() + raw.size()));
  } else {
    blob = damaged(in, which == 0 ? all : which == 1 ? shared : mine);
  }
  const bytes before = save_of(fresh);
  bool ok = false;
  try {
    if (which == 0) {
      auto is = stream_of(blob);
      fresh.load(is);
    } else {
      auto a = stream_of(which == 1 ? blob : shared);
      auto b = stream_of(which == 1 ? mine : blob);
      fresh.load(a, b);
    }
    ok = true;
  } catch (const commsgd::error&) {
    FUZZ_CHECK_MSG(save_of(fresh) == before, "a refused load changed the state");
  }
  if (ok) {
    const bytes read = claimed_prefix(blob);
    const bytes now =
        which == 0 ? save_of(fresh) : save_of(fresh, which == 1 ? st::part::shared : st::part::local);
    FUZZ_CHECK_MSG(now == read, "an accepted stream does not save back to the bytes read");
  }
}

std::vector<float> gradient(int rank, unsigned t) {
  std::vector<float> g(dim);
  for (std::size_t i = 0; i < dim; ++i)
    g[i] = static_cast<float>((i * 7 + t * 3 + static_cast<unsigned>(rank)) % 11) * 0.125f - 0.6f;
  return g;
}

template <class Make>
void strategy_case(byte_source& in, Make make) {
  const unsigned steps = in.u8() % 5;
  commsgd::comm::local_group(1).run([&](local& c) {
    auto trained = make(c);
    std::vector<float> x(dim, 0.5f);
    trained.start(x);
    for (unsigned t = 0; t < steps; ++t)
      trained.step(x, gradient(0, t), {.loss = 1.0 + t});
    auto fresh = make(c);
    attack(in, trained, fresh);
  });
}

void async_case(byte_source& in) {
  const unsigned steps = in.u8() % 4;
  const int target = in.u8() % 2; // the rank whose loader is attacked
  commsgd::comm::local_group(2).run([&](local& c) {
    const commsgd::sync::async_ps_options o{.lr = 0.25f, .staleness_bound = 1};
    commsgd::sync::async_ps<local> trained(c, o);
    std::vector<float> x(dim, 0.5f);
    trained.start(x);
    if (trained.computes_gradients())
      for (unsigned t = 0; t < steps; ++t)
        trained.step(x, gradient(c.rank(), t));
    trained.finish(x);
    if (c.rank() != target) return;
    commsgd::sync::async_ps<local> fresh(c, o);
    attack(in, trained, fresh);
  });
}

void data_parallel_case(byte_source& in) {
  using dp =
      commsgd::data_parallel<commsgd::policy::uncoded<>, commsgd::policy::top_k<commsgd::select::exact>,
                             commsgd::policy::synchronous>;
  const unsigned steps = in.u8() % 4;
  commsgd::comm::local_group(1).run([&](local& c) {
    dp::options o{.lr = 0.25f};
    o.compression.top_k.density = 0.3;
    dp trained(c, dim, o);
    std::vector<float> x(dim, 0.5f);
    trained.start(x);
    for (unsigned t = 0; t < steps; ++t)
      trained.step(x, gradient(0, t));
    dp fresh(c, dim, o);
    attack(in, trained, fresh);
  });
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  byte_source in(data, size);
  switch (in.u8() % 5) {
  case 0:
    strategy_case(in, [](local& c) { return commsgd::sync::synchronous<local>(c, {.lr = 0.25f}); });
    break;
  case 1:
    strategy_case(in, [](local& c) {
      return commsgd::sync::local_sgd<local>(c, {.lr = 0.25f,
                                                 .period = 2,
                                                 .adaptive = true,
                                                 .max_period = 5,
                                                 .correction = commsgd::sync::correction_mode::every_step});
    });
    break;
  case 2:
    strategy_case(in, [](local& c) {
      return commsgd::sync::partitioned<local>(c, {3, 4},
                                               {.lr = 0.25f, .partition_elements = 2, .credit_bytes = 8});
    });
    break;
  case 3:
    async_case(in);
    break;
  default:
    data_parallel_case(in);
    break;
  }
  return 0;
}
