// The communicator conformance suite: one set of test bodies, run on comm::local (local_runner.cpp) and on
// comm::mpi under mpiexec (mpi_runner.cpp). Every case is a template over the communicator and is called on
// every rank at once. Data are a pure function of (seed, rank, index), so any rank can compute what every
// other rank contributed and check the result by itself.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/over_messages.hpp>
#include <commsgd/error.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

namespace conformance {

// The all-reduce's large case: past any transport's segment size. ThreadSanitizer sees a race in the order of
// the accesses, not in their number, and at its slowdown a million values on 7 ranks cost most of a minute;
// under it the large case is smaller and still spans several of comm::local's blocks per rank.
#if defined(__SANITIZE_THREAD__)
inline constexpr std::size_t large_all_reduce = 100003;
#else
inline constexpr std::size_t large_all_reduce = 1000003;
#endif

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
T value(std::uint64_t seed, int rank, std::size_t i) {
  const std::uint64_t h = mix(seed * 1000003u + static_cast<std::uint64_t>(rank) * 7919u + mix(i));
  if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return static_cast<std::int32_t>(static_cast<std::int64_t>(h % 2000001) - 1000000);
  else
    return static_cast<T>(h);
}

template <class T>
std::vector<T> data(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = value<T>(seed, rank, i);
  return v;
}

// Every rank must hold the same bits: gather them and compare.
template <class C, class T>
void check_identical_everywhere(C& c, const std::vector<T>& v) {
  std::vector<T> all(v.size() * static_cast<std::size_t>(c.size()));
  c.all_gather(std::span<const T>(v), std::span<T>(all));
  for (int r = 0; r < c.size(); ++r)
    CHECK((v.empty() || std::memcmp(all.data() + static_cast<std::size_t>(r) * v.size(), v.data(),
                                    v.size() * sizeof(T)) == 0));
}

template <class C>
void identity(C& c) {
  REQUIRE(c.size() >= 1);
  CHECK(c.rank() >= 0);
  CHECK(c.rank() < c.size());
  c.barrier();
  std::vector<std::int32_t> ranks{c.rank()};
  std::vector<std::int32_t> all(static_cast<std::size_t>(c.size()));
  c.all_gather(std::span<const std::int32_t>(ranks), std::span<std::int32_t>(all));
  for (int r = 0; r < c.size(); ++r)
    CHECK(all[static_cast<std::size_t>(r)] == r);
}

template <class C, class T>
void all_reduce_typed(C& c, std::size_t n, std::uint64_t seed) {
  auto mine = data<T>(seed, c.rank(), n);
  c.all_reduce_sum(std::span<T>(mine));
  // Rank 0 checks the sum; check_identical_everywhere then holds every other rank to rank 0's bits. Each rank
  // checking its own sum would cost n * size^2 reference values, minutes at 7 ranks under ThreadSanitizer.
  for (std::size_t i = 0; i < (c.rank() == 0 ? n : 0); ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      double expect = 0, scale = 0;
      for (int r = 0; r < c.size(); ++r) {
        expect += static_cast<double>(value<T>(seed, r, i));
        scale += std::abs(static_cast<double>(value<T>(seed, r, i)));
      }
      // Reduction order is the transport's choice; the error bound is that of any order.
      const double bound = (std::is_same_v<T, float> ? 1.2e-7 : 2.3e-16) * c.size() * (scale + 1e-30);
      if (std::abs(static_cast<double>(mine[i]) - expect) > bound) {
        FAIL_CHECK("all_reduce_sum wrong at " << i << ": " << mine[i] << " vs " << expect);
        break;
      }
    } else {
      std::uint32_t expect = 0; // wrap-around, as the transports sum integers
      for (int r = 0; r < c.size(); ++r)
        expect += static_cast<std::uint32_t>(value<T>(seed, r, i));
      if (static_cast<std::uint32_t>(mine[i]) != expect) {
        FAIL_CHECK("all_reduce_sum wrong at " << i);
        break;
      }
    }
  }
  check_identical_everywhere(c, mine);
}

template <class C>
void all_reduce(C& c) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, large_all_reduce}) {
    all_reduce_typed<C, float>(c, n, 1 + n);
    all_reduce_typed<C, double>(c, n, 2 + n);
    all_reduce_typed<C, std::int32_t>(c, n, 3 + n);
    all_reduce_typed<C, std::uint32_t>(c, n, 4 + n);
  }
}

template <class C>
void all_gather(C& c) {
  for (std::size_t m : {std::size_t{0}, std::size_t{1}, std::size_t{37}, std::size_t{100001}}) {
    const auto mine = data<double>(10 + m, c.rank(), m);
    std::vector<double> all(m * static_cast<std::size_t>(c.size()));
    c.all_gather(std::span<const double>(mine), std::span<double>(all));
    for (int r = 0; r < c.size(); ++r)
      CHECK(std::equal(all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * m),
                       all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * m),
                       data<double>(10 + m, r, m).begin()));
  }
}

template <class C>
void all_gather_v(C& c) {
  // Uneven contributions, several of them empty; then all empty.
  for (int round = 0; round < 2; ++round) {
    auto count_of = [&](int r) {
      return round == 0 ? static_cast<std::size_t>((r * 3) % 5) * 1001 : std::size_t{0};
    };
    const auto mine = data<std::uint32_t>(20, c.rank(), count_of(c.rank()));
    std::vector<std::uint32_t> all{1, 2, 3}; // stale contents must be replaced
    const auto counts = c.all_gather_v(std::span<const std::uint32_t>(mine), all);
    REQUIRE(counts.size() == static_cast<std::size_t>(c.size()));
    std::vector<std::uint32_t> expect;
    for (int r = 0; r < c.size(); ++r) {
      CHECK(counts[static_cast<std::size_t>(r)] == count_of(r));
      const auto part = data<std::uint32_t>(20, r, count_of(r));
      expect.insert(expect.end(), part.begin(), part.end());
    }
    CHECK(all == expect);
  }
}

template <class C>
void broadcast(C& c) {
  for (int root = 0; root < c.size(); ++root)
    for (std::size_t m : {std::size_t{0}, std::size_t{100}}) {
      auto buf = c.rank() == root ? data<float>(30 + m, root, m) : std::vector<float>(m, -1.0f);
      c.broadcast(std::span<float>(buf), root);
      CHECK(buf == data<float>(30 + m, root, m));
    }
}

template <class C>
void split(C& c) {
  // Two colours, keys reversing the order: ranks of each group are ordered by key.
  const int color = c.rank() % 2;
  auto sub = c.split(color, c.size() - c.rank());
  std::vector<int> members;
  for (int r = 0; r < c.size(); ++r)
    if (r % 2 == color) members.push_back(r);
  std::reverse(members.begin(), members.end());
  REQUIRE(sub.size() == static_cast<int>(members.size()));
  CHECK(members[static_cast<std::size_t>(sub.rank())] == c.rank());
  std::vector<std::int32_t> v{c.rank()};
  sub.all_reduce_sum(std::span<std::int32_t>(v));
  CHECK(v[0] == std::accumulate(members.begin(), members.end(), 0));
  // A sub-communicator can be split again, and the parent still works afterwards.
  auto single = sub.split(sub.rank(), 0);
  CHECK(single.size() == 1);
  CHECK(single.rank() == 0);
  c.barrier();
}

template <class C>
void point_to_point(C& c) {
  if (c.size() < 2) return;
  const int next = (c.rank() + 1) % c.size();
  const int prev = (c.rank() + c.size() - 1) % c.size();
  // Interleave two tags; the receiver drains tag 1 first: order must hold per tag.
  constexpr int messages = 5;
  std::vector<std::vector<std::int32_t>> out;
  for (int m = 0; m < messages; ++m)
    for (int tag = 0; tag < 2; ++tag)
      out.push_back({c.rank(), tag, m, 100 * m + tag});
  std::vector<decltype(c.isend(std::span<const std::byte>{}, 0, 0))> sends;
  for (auto& msg : out)
    sends.push_back(c.isend(std::span<const std::int32_t>(msg), next, msg[1]));
  for (int tag : {1, 0})
    for (int m = 0; m < messages; ++m) {
      std::vector<std::int32_t> in(4);
      if (m % 2 == 0) {
        c.recv(std::span<std::int32_t>(in), prev, tag);
      } else {
        auto r = c.irecv(std::span<std::int32_t>(in), prev, tag);
        while (!r.test()) {
        }
        r.wait(); // waiting on a completed request is allowed
      }
      CHECK(in == std::vector<std::int32_t>{prev, tag, m, 100 * m + tag});
    }
  for (auto& s : sends)
    s.wait();
  // Zero-length messages are messages too.
  c.send(std::span<const float>{}, next, 7);
  c.recv(std::span<float>{}, prev, 7);
  c.barrier();
}

template <class C>
void invalid_arguments(C& c) {
  std::vector<float> buf(4);
  CHECK_THROWS_AS(c.send(std::span<const float>(buf), c.size(), 0), commsgd::invalid_argument);
  CHECK_THROWS_AS(c.send(std::span<const float>(buf), -1, 0), commsgd::invalid_argument);
  CHECK_THROWS_AS(c.recv(std::span<float>(buf), c.size(), 0), commsgd::invalid_argument);
  CHECK_THROWS_AS(c.send(std::span<const float>(buf), 0, -3), commsgd::invalid_argument);
  // Collective misuse: every rank passes the same bad root, and every rank gets the error.
  CHECK_THROWS_AS(c.broadcast(std::span<float>(buf), c.size()), commsgd::invalid_argument);
  CHECK_THROWS_AS(c.split(-1, 0), commsgd::invalid_argument);
  std::vector<float> wrong(3);
  CHECK_THROWS_AS(c.all_gather(std::span<const float>(buf), std::span<float>(wrong)), commsgd::error);
  c.barrier();
  // A message shorter than the receive buffer is an error, not a silently half-filled buffer.
  if (c.size() >= 2) {
    if (c.rank() == 0) c.send(std::span<const float>(buf.data(), 3), 1, 9);
    if (c.rank() == 1) CHECK_THROWS_AS(c.recv(std::span<float>(buf), 0, 9), commsgd::comm_error);
  }
  c.barrier();
}

template <class C>
void metered_counts(C& c) {
  commsgd::comm::metered<C> m(std::move(c));
  const int n = m.size(), r = m.rank();
  const auto peers = static_cast<std::uint64_t>(n - 1);
  using commsgd::comm::op_kind;

  std::vector<float> f(1001, 1.0f);
  m.all_reduce_sum(std::span<float>(f));
  CHECK(f[0] == static_cast<float>(n));
  const auto ring = commsgd::comm::ring_all_reduce_share(1001, n, r);
  CHECK(m.counters()[op_kind::all_reduce].bytes_sent == ring.sent * 4);
  CHECK(m.counters()[op_kind::all_reduce].bytes_received == ring.received * 4);
  // Summed over ranks, a ring sends 2(n-1)/n of the buffer per rank.
  std::vector<double> sent{static_cast<double>(m.counters()[op_kind::all_reduce].bytes_sent)};
  m.inner().all_reduce_sum(std::span<double>(sent));
  CHECK(sent[0] == static_cast<double>(2 * peers * 1001 * 4));

  std::vector<double> block(13), all(13 * static_cast<std::size_t>(n));
  m.all_gather(std::span<const double>(block), std::span<double>(all));
  CHECK(m.counters()[op_kind::all_gather].bytes_sent == peers * 13 * 8);
  CHECK(m.counters()[op_kind::all_gather].bytes_received == peers * 13 * 8);

  std::vector<std::int32_t> part(static_cast<std::size_t>(r)), gathered;
  m.all_gather_v(std::span<const std::int32_t>(part), gathered);
  const std::uint64_t others =
      (static_cast<std::uint64_t>(n) * (n - 1) / 2 - static_cast<std::uint64_t>(r)) * 4;
  CHECK(m.counters()[op_kind::all_gather_v].bytes_received == others + peers * 8);
  CHECK(m.counters()[op_kind::all_gather_v].bytes_sent == peers * (static_cast<std::uint64_t>(r) * 4 + 8));

  m.broadcast(std::span<float>(f), 0);
  CHECK(m.counters()[op_kind::broadcast].bytes_sent == (r == 0 ? peers * 1001 * 4 : 0));
  CHECK(m.counters()[op_kind::broadcast].bytes_received == (r == 0 ? 0 : 1001 * 4));

  if (n >= 2) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<std::uint32_t> out(r + 1), in(prev + 1);
    auto s = m.isend(std::span<const std::uint32_t>(out), next, 3);
    m.recv(std::span<std::uint32_t>(in), prev, 3);
    s.wait();
    const auto& p2p = m.counters()[op_kind::point_to_point];
    CHECK(p2p.bytes_sent == static_cast<std::uint64_t>(r + 1) * 4);
    CHECK(p2p.bytes_received == static_cast<std::uint64_t>(prev + 1) * 4);
    CHECK(p2p.messages_sent == 1);
    CHECK(p2p.messages_received == 1);
  }
  // Traffic of a sub-communicator lands in the same counters.
  const auto before = m.counters().total().bytes_sent;
  auto sub = m.split(0, r);
  std::vector<float> one(10, 1.0f);
  sub.all_reduce_sum(std::span<float>(one));
  CHECK(m.counters().total().bytes_sent - before == commsgd::comm::ring_all_reduce_share(10, n, r).sent * 4);
  m.reset();
  CHECK(m.counters().total() == commsgd::comm::traffic{});
  c = std::move(m.inner());
}

// comm::over_messages over this communicator, with comm::metered between them counting each message as it is
// handed to the communicator: each collective run out of messages gives what the communicator's own gives,
// and the bytes its messages carry are those comm/traffic.hpp's rules (cost/'s, and comm::metered's charge
// for a collective) predict, for the ring all-reduce, the gathers the codes use and the broadcast. Summed over
// ranks, the ring's bytes are also held to 2 (n - 1) m values, worked out here from the ring alone.
template <class C>
void over_messages_measures(C& c) {
  using commsgd::comm::metered;
  using commsgd::comm::op_kind;
  commsgd::comm::over_messages<metered<C>> w{metered<C>(std::move(c))};
  const int n = w.size(), r = w.rank();
  const auto peers = static_cast<std::uint64_t>(n - 1);
  auto wire = [&] { return w.inner().counters()[op_kind::point_to_point]; };

  for (const std::size_t m : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1001}}) {
    CAPTURE(m);
    w.inner().reset();
    std::vector<float> f(m), want(m);
    for (std::size_t i = 0; i < m; ++i) {
      f[i] = static_cast<float>(value<std::int32_t>(41, r, i) % 1000);
      for (int q = 0; q < n; ++q)
        want[i] += static_cast<float>(value<std::int32_t>(41, q, i) % 1000);
    }
    w.all_reduce_sum(std::span<float>(f));
    CHECK(f == want); // small whole numbers: exact in any order
    const auto ring = commsgd::comm::ring_all_reduce_traffic(m, sizeof(float), n, r);
    CHECK(wire().bytes_sent == ring.bytes_sent);
    CHECK(wire().bytes_received == ring.bytes_received);
    CHECK(wire().messages_sent == ring.messages_sent);
    std::vector<double> total{static_cast<double>(wire().bytes_sent)};
    w.inner().inner().all_reduce_sum(std::span<double>(total));
    CHECK(total[0] == static_cast<double>(2 * peers * m * sizeof(float)));
  }
  // Every rank holds the summing ranks' bits; a signed sum wraps.
  std::vector<std::int32_t> ints(7, std::numeric_limits<std::int32_t>::max());
  w.all_reduce_sum(std::span<std::int32_t>(ints));
  std::vector<std::int32_t> gathered(7 * static_cast<std::size_t>(n));
  w.inner().inner().all_gather(std::span<const std::int32_t>(ints), std::span<std::int32_t>(gathered));
  for (int q = 0; q < n; ++q)
    CHECK(std::equal(ints.begin(), ints.end(), gathered.begin() + 7 * q));

  w.inner().reset();
  std::vector<double> block(13), all(13 * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < 13; ++i)
    block[i] = static_cast<double>(r * 100 + static_cast<int>(i));
  w.all_gather(std::span<const double>(block), std::span<double>(all));
  for (int q = 0; q < n; ++q)
    CHECK(all[static_cast<std::size_t>(q) * 13 + 12] == static_cast<double>(q * 100 + 12));
  CHECK(wire().bytes_sent == commsgd::comm::all_gather_traffic(13 * 8, n).bytes_sent);
  CHECK(wire().bytes_received == peers * 13 * 8);

  w.inner().reset();
  std::vector<std::uint32_t> part(static_cast<std::size_t>(r), static_cast<std::uint32_t>(r)), got;
  const auto counts = w.all_gather_v(std::span<const std::uint32_t>(part), got);
  CHECK(counts.size() == static_cast<std::size_t>(n));
  CHECK(got.size() == static_cast<std::size_t>(n) * (n - 1) / 2);
  for (std::size_t q = 0, at = 0; q < counts.size(); at += counts[q++])
    CHECK((counts[q] == q && std::all_of(got.begin() + static_cast<std::ptrdiff_t>(at),
                                         got.begin() + static_cast<std::ptrdiff_t>(at + q),
                                         [&](std::uint32_t v) { return v == q; })));
  const std::uint64_t others =
      (static_cast<std::uint64_t>(n) * (n - 1) / 2 - static_cast<std::uint64_t>(r)) * 4;
  const auto v = commsgd::comm::all_gather_v_traffic(static_cast<std::uint64_t>(r) * 4, others, n);
  CHECK(wire().bytes_sent == v.bytes_sent);
  CHECK(wire().bytes_received == v.bytes_received);

  w.inner().reset();
  std::vector<float> b(33, static_cast<float>(r));
  w.broadcast(std::span<float>(b), n - 1);
  CHECK(std::all_of(b.begin(), b.end(), [&](float x) { return x == static_cast<float>(n - 1); }));
  CHECK(wire().bytes_sent == (r == n - 1 ? peers * 33 * 4 : 0));
  CHECK(wire().bytes_received == (r == n - 1 ? 0 : 33 * 4));
  CHECK_THROWS_WITH_AS(w.broadcast(std::span<float>(b), n), doctest::Contains("argument 'root'"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(
      w.all_gather(std::span<const double>(block), std::span<double>(all).first(all.size() - 1)),
      doctest::Contains("argument 'all'"), commsgd::size_mismatch);

  // A sub-communicator's collectives run out of messages too.
  w.inner().reset();
  auto sub = w.split(r % 2, r);
  std::vector<float> ten(10, 1.0f);
  sub.all_reduce_sum(std::span<float>(ten));
  CHECK(ten[0] == static_cast<float>(sub.size()));
  CHECK(wire().bytes_sent ==
        commsgd::comm::ring_all_reduce_traffic(10, sizeof(float), sub.size(), sub.rank()).bytes_sent);
  c = std::move(w.inner().inner());
}

} // namespace conformance

// The list every runner instantiates.
#define COMMSGD_CONFORMANCE_CASES(X)                                                                         \
  X(identity)                                                                                                \
  X(all_reduce)                                                                                              \
  X(all_gather)                                                                                              \
  X(all_gather_v)                                                                                            \
  X(broadcast)                                                                                               \
  X(split)                                                                                                   \
  X(point_to_point)                                                                                          \
  X(invalid_arguments)                                                                                       \
  X(metered_counts)                                                                                          \
  X(over_messages_measures)
