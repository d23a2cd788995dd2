// comm::mpi beyond the conformance suite: handle ownership, chunked transfers, agreement checks, MPI errors.
#include "mpi/support.hpp"

#include <commsgd/comm/mpi.hpp>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <thread>
#include <vector>

using commsgd::comm::mpi;

namespace {

// Counts MPI_Comm_free calls on a handle through an attribute's delete callback: the one portable way to see
// that a communicator was freed.
struct free_counter {
  int keyval = MPI_KEYVAL_INVALID;
  int frees = 0;

  free_counter() { MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &on_delete, &keyval, nullptr); }
  ~free_counter() { MPI_Comm_free_keyval(&keyval); }
  void watch(MPI_Comm c) { MPI_Comm_set_attr(c, keyval, &frees); }

  static int on_delete(MPI_Comm, int, void* attr, void*) {
    ++*static_cast<int*>(attr);
    return MPI_SUCCESS;
  }
};

MPI_Comm dup_world() {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return c;
}

// Values whose sums are exact in any order (multiples of 1/8 well inside float's 24 bits), so chunked and
// one-call reductions can be compared bit for bit whatever algorithm MPI picks.
template <class T>
std::vector<T> exact_data(std::size_t n, int rank, unsigned seed) {
  std::mt19937 gen(seed * 7919u + static_cast<unsigned>(rank));
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_floating_point_v<T>)
      x = static_cast<T>(d(gen)) / 8;
    else
      x = static_cast<T>(d(gen));
  }
  return v;
}

// A non-arithmetic type of 12 bytes: travels as MPI_BYTE, so a small chunk limit cuts elements in two.
struct triple {
  std::int32_t a, b, c;
  friend bool operator==(const triple&, const triple&) = default;
};

std::vector<triple> triples(std::size_t n, int rank) {
  std::vector<triple> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = {rank, static_cast<std::int32_t>(i), static_cast<std::int32_t>(i * 31 + 7)};
  return v;
}

// Still usable after an error: every rank got it, so none is stuck in a collective.
void still_works(mpi& c) {
  std::vector<std::int32_t> one{1};
  c.all_reduce_sum(std::span<std::int32_t>(one));
  CHECK(one[0] == c.size());
}

} // namespace

TEST_CASE("mpi/ownership: attach neither duplicates nor frees") {
  free_counter counter;
  MPI_Comm handle = dup_world();
  counter.watch(handle);
  {
    mpi c(handle, boost::mpi::comm_attach);
    CHECK(c.native() == handle);
    CHECK(c.rank() == boost::mpi::communicator().rank());
    still_works(c);
  }
  CHECK(counter.frees == 0);
  MPI_Comm_free(&handle);
  CHECK(counter.frees == 1);
}

TEST_CASE("mpi/ownership: duplicate is congruent, distinct, returns errors and is freed") {
  free_counter counter;
  MPI_Comm handle = dup_world();
  counter.watch(handle);
  MPI_Comm inner = MPI_COMM_NULL;
  {
    mpi c(handle, boost::mpi::comm_duplicate);
    inner = c.native();
    CHECK(inner != handle);
    int result = MPI_UNEQUAL;
    MPI_Comm_compare(inner, handle, &result);
    CHECK(result == MPI_CONGRUENT);
    MPI_Errhandler eh;
    MPI_Comm_get_errhandler(inner, &eh);
    CHECK(eh == MPI_ERRORS_RETURN);
    MPI_Errhandler_free(&eh);
    counter.watch(inner);
    still_works(c);
  }
  CHECK(counter.frees == 1); // the duplicate, not the caller's handle
  MPI_Comm_free(&handle);
  CHECK(counter.frees == 2);

  auto w = mpi::world();
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(w.native(), MPI_COMM_WORLD, &result);
  CHECK(result == MPI_CONGRUENT);
}

TEST_CASE("mpi/ownership: take ownership frees on destruction; moves transfer it") {
  free_counter counter;
  MPI_Comm handle = dup_world();
  counter.watch(handle);
  {
    mpi c(handle, boost::mpi::comm_take_ownership);
    CHECK(c.native() == handle);
    mpi moved(std::move(c));
    CHECK(moved.native() == handle);
    CHECK(c.native() == MPI_COMM_NULL);
    CHECK(counter.frees == 0);
    mpi other = mpi::world();
    other = std::move(moved); // the world duplicate is freed, the taken handle lives on in `other`
    CHECK(counter.frees == 0);
    still_works(other);
  }
  CHECK(counter.frees == 1);

  // A split owns its handle.
  {
    auto w = mpi::world();
    auto sub = w.split(0, w.rank());
    counter.watch(sub.native());
    CHECK(sub.size() == w.size());
  }
  CHECK(counter.frees == 2);
}

TEST_CASE("mpi/ownership: from a boost::mpi::communicator, sharing it") {
  boost::mpi::communicator b(MPI_COMM_WORLD, boost::mpi::comm_duplicate);
  mpi c(b);
  CHECK(c.native() == static_cast<MPI_Comm>(b));
  CHECK(c.size() == b.size());
  still_works(c);
  CHECK_THROWS_AS(mpi(MPI_COMM_NULL, boost::mpi::comm_attach), commsgd::invalid_argument);
}

TEST_CASE("mpi/chunked: collectives are exact with a tiny chunk limit") {
  auto big = mpi::world();
  auto tiny = mpi::world();
  CHECK_THROWS_AS(tiny.set_max_chunk_elements(0), commsgd::invalid_argument);
  const int r = tiny.rank(), p = tiny.size();
  for (std::size_t limit : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{64}}) {
    CAPTURE(limit);
    tiny.set_max_chunk_elements(limit);
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{1001}}) {
      // At most 64 pieces a call: every collective here is a round among all ranks, and oversubscribed
      // ranks (more ranks than cores) take a scheduler slice a round. Partial and whole last pieces are
      // still both covered (7 and 64 by 1, 3 and 7; 1001 by 64).
      if (n > 64 * limit) continue;
      CAPTURE(n);
      // all_reduce_sum against the one-call result on the same data.
      auto f = exact_data<float>(n, r, 1), f_ref = f;
      tiny.all_reduce_sum(std::span<float>(f));
      big.all_reduce_sum(std::span<float>(f_ref));
      CHECK(f == f_ref); // exact: every partial sum is representable
      auto d = exact_data<double>(n, r, 2), d_ref = d;
      tiny.all_reduce_sum(std::span<double>(d));
      big.all_reduce_sum(std::span<double>(d_ref));
      CHECK(d == d_ref);
      auto i = exact_data<std::int32_t>(n, r, 3), i_ref = i;
      tiny.all_reduce_sum(std::span<std::int32_t>(i));
      big.all_reduce_sum(std::span<std::int32_t>(i_ref));
      CHECK(i == i_ref);
      auto u = exact_data<std::uint32_t>(n, r, 4), u_ref = u;
      tiny.all_reduce_sum(std::span<std::uint32_t>(u));
      big.all_reduce_sum(std::span<std::uint32_t>(u_ref));
      CHECK(u == u_ref);

      // all_gather of doubles and of 12-byte records (cut mid-record when the limit is below 12 bytes).
      const auto mine = exact_data<double>(n, r, 5);
      std::vector<double> all(n * static_cast<std::size_t>(p));
      tiny.all_gather(std::span<const double>(mine), std::span<double>(all));
      for (int q = 0; q < p; ++q) {
        const auto theirs = exact_data<double>(n, q, 5);
        CHECK(std::equal(theirs.begin(), theirs.end(),
                         all.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(q))));
      }
      const auto recs = triples(n, r);
      std::vector<triple> all_recs(n * static_cast<std::size_t>(p));
      tiny.all_gather(std::span<const triple>(recs), std::span<triple>(all_recs));
      std::vector<triple> expect_recs;
      for (int q = 0; q < p; ++q) {
        const auto part = triples(n, q);
        expect_recs.insert(expect_recs.end(), part.begin(), part.end());
      }
      CHECK(all_recs == expect_recs);

      // all_gather_v with uneven parts (rank q gives (q + 1) * n / 2 records, rank 0 may give none).
      auto count_of = [&](int q) { return static_cast<std::size_t>(q) * n / 2; };
      const auto part = triples(count_of(r), r);
      std::vector<triple> gathered{{-1, -1, -1}};
      const auto counts = tiny.all_gather_v(std::span<const triple>(part), gathered);
      std::vector<triple> expect_v;
      for (int q = 0; q < p; ++q) {
        CHECK(counts[static_cast<std::size_t>(q)] == count_of(q));
        const auto t = triples(count_of(q), q);
        expect_v.insert(expect_v.end(), t.begin(), t.end());
      }
      CHECK(gathered == expect_v);

      // broadcast from every root.
      for (int root = 0; root < p; ++root) {
        auto buf = r == root ? exact_data<float>(n, root, 6) : std::vector<float>(n, -7.0f);
        tiny.broadcast(std::span<float>(buf), root);
        CHECK(buf == exact_data<float>(n, root, 6));
      }
    }
  }
}

TEST_CASE("mpi/chunked: point-to-point is exact, including exact multiples of the limit") {
  auto c = mpi::world();
  const int r = c.rank(), p = c.size();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  for (std::size_t limit : {std::size_t{1}, std::size_t{4}, std::size_t{5}}) {
    CAPTURE(limit);
    c.set_max_chunk_elements(limit);
    for (std::size_t n :
         {std::size_t{0}, std::size_t{3}, std::size_t{4}, std::size_t{20}, std::size_t{333}}) {
      if (limit == 1 && n > 20) continue; // as above: a piece a message; 333 still goes by 4 and by 5
      CAPTURE(n);
      const auto out = exact_data<std::int32_t>(n, r, 10);
      std::vector<std::int32_t> in(n, -1);
      if (r % 2 == 0) { // even ranks send first; odd ranks receive first: no deadlock on rendezvous sends
        c.send(std::span<const std::int32_t>(out), next, 1);
        c.recv(std::span<std::int32_t>(in), prev, 1);
      } else {
        c.recv(std::span<std::int32_t>(in), prev, 1);
        c.send(std::span<const std::int32_t>(out), next, 1);
      }
      CHECK(in == exact_data<std::int32_t>(n, prev, 10));

      // Non-blocking, polled with test(); records cut into bytes.
      const auto recs = triples(n, r);
      std::vector<triple> got(n);
      auto rq = c.irecv(std::span<triple>(got), prev, 2);
      auto sq = c.isend(std::span<const triple>(recs), next, 2);
      while (!rq.test()) {
        std::this_thread::yield(); // a peer short of a core gets it sooner
      }
      sq.wait();
      CHECK(got == triples(n, prev));
    }
  }
}

TEST_CASE("mpi/chunked: a length mismatch is found at the first differing piece, never a hang") {
  auto c = mpi::world();
  c.set_max_chunk_elements(4);
  const int r = c.rank();
  std::vector<float> eight(8, 1.0f), twelve(12, 2.0f);
  // 8 elements = two full pieces and an empty one; the receiver of 12 expects a third full piece.
  if (r == 0) c.send(std::span<const float>(eight), 1, 3);
  if (r == 1) {
    CHECK_THROWS_AS(c.recv(std::span<float>(twelve), 0, 3), commsgd::comm_error);
  }
  c.barrier();
  if (r == 0) c.send(std::span<const float>(eight), 1, 4);
  if (r == 1) {
    auto req = c.irecv(std::span<float>(twelve), 0, 4);
    CHECK_THROWS_AS(req.wait(), commsgd::comm_error);
  }
  c.barrier();
  // 12 into 8: the third piece is full where an empty one was expected, so MPI reports truncation.
  if (r == 0) c.send(std::span<const float>(twelve), 1, 5);
  if (r == 1) {
    try {
      c.recv(std::span<float>(eight), 0, 5);
      FAIL_CHECK("a longer message was accepted");
    } catch (const commsgd::comm_error& e) {
      CHECK(std::string(e.what()).find("longer") != std::string::npos);
    }
  }
  c.barrier();
  still_works(c);
}

TEST_CASE("mpi/agreement: size disagreement is size_mismatch on every rank") {
  auto c = mpi::world();
  const int r = c.rank();
  std::vector<float> v(10 + (r == 1 ? 1 : 0), 1.0f);
  CHECK_THROWS_AS(c.all_reduce_sum(std::span<float>(v)), commsgd::size_mismatch);
  CHECK_THROWS_AS(c.broadcast(std::span<float>(v), 0), commsgd::size_mismatch);
  std::vector<float> all(v.size() * static_cast<std::size_t>(c.size()));
  CHECK_THROWS_AS(c.all_gather(std::span<const float>(v), std::span<float>(all)), commsgd::size_mismatch);
  // Equal contributions, but one rank's output buffer is wrong: every rank must still hear of it.
  std::vector<float> same(5, 1.0f), out(5 * static_cast<std::size_t>(c.size()) + (r == 1 ? 1 : 0));
  CHECK_THROWS_AS(c.all_gather(std::span<const float>(same), std::span<float>(out)), commsgd::size_mismatch);
  still_works(c);
}

TEST_CASE("mpi/agreement: roots and colours are checked on every rank") {
  auto c = mpi::world();
  const int r = c.rank();
  std::vector<float> v(4, 1.0f);
  // Ranks disagree on the root.
  CHECK_THROWS_AS(c.broadcast(std::span<float>(v), r == 1 ? 1 : 0), commsgd::invalid_argument);
  // One rank passes a root out of range.
  CHECK_THROWS_AS(c.broadcast(std::span<float>(v), r == 1 ? c.size() : 0), commsgd::invalid_argument);
  // One rank passes a negative colour.
  CHECK_THROWS_AS(c.split(r == 1 ? -1 : 0, 0), commsgd::invalid_argument);
  // Tags beyond MPI_TAG_UB (Open MPI allows up to INT_MAX, leaving nothing above to try).
  void* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  REQUIRE(flag);
  if (*static_cast<int*>(ub) < INT_MAX)
    CHECK_THROWS_AS(c.send(std::span<const float>(v), 0, *static_cast<int*>(ub) + 1),
                    commsgd::invalid_argument);
  CHECK_THROWS_AS(c.isend(std::span<const float>(v), 0, -1), commsgd::invalid_argument);
  CHECK_THROWS_AS(c.irecv(std::span<float>(v), -1, 0), commsgd::invalid_argument);
  still_works(c);
}

TEST_CASE("mpi/errors: MPI failures are comm_error with MPI's text") {
  auto c = mpi::world();
  const int r = c.rank();
  std::vector<double> five(5, 1.0), four(4);
  if (r == 0) c.send(std::span<const double>(five), 1, 6);
  if (r == 1) {
    try {
      c.recv(std::span<double>(four), 0, 6);
      FAIL_CHECK("truncation was not reported");
    } catch (const commsgd::comm_error& e) {
      CHECK(std::string(e.what()).find("MPI_ERR_TRUNCATE") != std::string::npos);
    }
  }
  c.barrier();
  // The same through irecv.
  if (r == 0) c.send(std::span<const double>(five), 1, 7);
  if (r == 1) {
    auto req = c.irecv(std::span<double>(four), 0, 7);
    CHECK_THROWS_AS(req.wait(), commsgd::comm_error);
  }
  c.barrier();
  still_works(c);
}

TEST_CASE("mpi/requests: dropping an unfinished request neither hangs nor leaks") {
  auto c = mpi::world();
  const int r = c.rank();
  {
    // Nobody ever sends this: the destructor cancels it.
    std::vector<float> never(100);
    auto req = c.irecv(std::span<float>(never), (r + 1) % c.size(), 40);
    CHECK_FALSE(req.test());
  }
  {
    c.set_max_chunk_elements(16);
    std::vector<float> buf(100, 3.0f), in(100);
    // Dropping a send waits for it, so the buffer may be freed right after.
    if (r == 0) {
      auto s = c.isend(std::span<const float>(buf), 1, 41);
    }
    if (r == 1) {
      c.recv(std::span<float>(in), 0, 41);
      CHECK(in == buf);
    }
    // Move-assigning over a pending receive cancels it; the new one completes.
    std::vector<float> a(8), b(8);
    auto q = c.irecv(std::span<float>(a), (r + 1) % c.size(), 42);
    q = c.irecv(std::span<float>(b), (r + c.size() - 1) % c.size(), 43);
    std::vector<float> eight(8, static_cast<float>(r));
    c.send(std::span<const float>(eight), (r + 1) % c.size(), 43);
    q.wait();
    CHECK(b == std::vector<float>(8, static_cast<float>((r + c.size() - 1) % c.size())));
  }
  c.barrier();
  still_works(c);
}

TEST_CASE("mpi/verify_sizes(false) still reduces correctly") {
  auto c = mpi::world();
  c.set_verify_sizes(false);
  CHECK_FALSE(c.verify_sizes());
  std::vector<double> v(1000, 0.5);
  c.all_reduce_sum(std::span<double>(v));
  CHECK(v == std::vector<double>(1000, 0.5 * c.size()));
  auto sub = c.split(c.rank() % 2, 0);
  CHECK_FALSE(sub.verify_sizes());
}
