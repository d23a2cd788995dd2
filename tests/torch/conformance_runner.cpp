// The conformance suite on comm::process_group over gloo. `conformance_torch N` forks N processes on this
// machine; they meet through a FileStore in a fresh temporary folder and talk over 127.0.0.1 only. Rank 0
// prints its doctest report and the report of any rank that failed; the exit code is nonzero when any rank
// failed, timed out or died.
#define DOCTEST_CONFIG_IMPLEMENT
#include "conformance/cases.hpp"
#include "support/narrow_ring_cases.hpp"

#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/process_group.hpp>
#include <commsgd/comm/send_recv.hpp>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

// The cases are written against the concept; this runner only makes sense for a model of it, and so does
// the metered wrapper the metered_counts case builds around it.
static_assert(commsgd::comm::communicator<commsgd::comm::process_group>);
static_assert(commsgd::comm::communicator<commsgd::comm::metered<commsgd::comm::process_group>>);
// The ring's hops go through send_recv_sized, plain and metered (the hooks' communicator).
static_assert(commsgd::comm::sized_exchange<commsgd::comm::process_group, std::uint16_t>);
static_assert(
    commsgd::comm::sized_exchange<commsgd::comm::metered<commsgd::comm::process_group>, std::uint16_t>);

namespace {
std::optional<commsgd::comm::process_group> world;
}

#define COMMSGD_TORCH_CASE(name)                                                                             \
  TEST_CASE("conformance/torch/" #name) {                                                                    \
    conformance::name(*world);                                                                               \
  }
COMMSGD_CONFORMANCE_CASES(COMMSGD_TORCH_CASE)

TEST_CASE("torch/process_group: a receive abandoned before its message arrives does not disturb the next") {
  auto& c = *world;
  if (c.size() < 2) return;
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  std::vector<float> first(5, 1.0f), second(3, 2.0f), in(3);
  {
    std::vector<float> dropped(5);
    auto r = c.irecv(std::span<float>(dropped), prev, 11); // destroyed before the message comes
  }
  c.barrier();
  c.send(std::span<const float>(first), next, 11);
  c.send(std::span<const float>(second), next, 11);
  c.recv(std::span<float>(in), prev, 11);
  CHECK(in == second);
  c.barrier();
}

TEST_CASE("torch/process_group: receives on one channel complete in posting order whatever the wait order") {
  auto& c = *world;
  if (c.size() < 2) return;
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  std::vector<std::int32_t> a{1, 2}, b{3, 4, 5}, ina(2), inb(3);
  auto ra = c.irecv(std::span<std::int32_t>(ina), prev, 4);
  auto rb = c.irecv(std::span<std::int32_t>(inb), prev, 4);
  auto sa = c.isend(std::span<const std::int32_t>(a), next, 4);
  auto sb = c.isend(std::span<const std::int32_t>(b), next, 4);
  rb.wait();
  ra.wait();
  sa.wait();
  sb.wait();
  CHECK(ina == a);
  CHECK(inb == b);
  CHECK_THROWS_AS(c.send(std::span<const std::int32_t>(a), c.rank(), 0), commsgd::unsupported);
  // A longer message than the buffer is drained and reported; the channel still works afterwards.
  if (c.rank() == 0) c.send(std::span<const std::int32_t>(b), 1, 6);
  if (c.rank() == 1) CHECK_THROWS_AS(c.recv(std::span<std::int32_t>(ina), 0, 6), commsgd::comm_error);
  if (c.rank() == 0) c.send(std::span<const std::int32_t>(a), 1, 6);
  if (c.rank() == 1) {
    c.recv(std::span<std::int32_t>(ina), 0, 6);
    CHECK(ina == a);
  }
  c.barrier();
}

TEST_CASE("torch/process_group: the 16-bit ring over sized exchanges gives the reference's bits") {
  auto& c = *world;
  narrow_ring_cases::check_all<commsgd::compress::fp16_format>(c);
  narrow_ring_cases::check_all<commsgd::compress::bf16_format>(c);
}

TEST_CASE(
    "torch/process_group: sized exchanges around the ring, empty ones and framed traffic between them") {
  auto& c = *world;
  if (c.size() < 2) return;
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  for (std::size_t m :
       {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{100000}, std::size_t{5}}) {
    CAPTURE(m);
    std::vector<std::int32_t> out(m), in(m, -1);
    for (std::size_t i = 0; i < m; ++i)
      out[i] = static_cast<std::int32_t>(1000003 * c.rank() + i);
    c.send_recv_sized(std::span<const std::int32_t>(out), next, std::span<std::int32_t>(in), prev, 77);
    bool same = true;
    for (std::size_t i = 0; i < m; ++i)
      same = same && in[i] == static_cast<std::int32_t>(1000003 * prev + i);
    CHECK(same);
    // Framed messages on another tag are untouched by the sized ones.
    std::vector<float> f{static_cast<float>(c.rank())}, g(1);
    auto r = c.irecv(std::span<float>(g), prev, 78);
    c.send(std::span<const float>(f), next, 78);
    r.wait();
    CHECK(g[0] == static_cast<float>(prev));
  }
  // The metered communicator counts them as a send and a receive.
  commsgd::comm::metered<commsgd::comm::process_group> m(std::move(c));
  std::vector<std::uint16_t> out(9, 1), in(9);
  commsgd::comm::send_recv(m, std::span<const std::uint16_t>(out), next, std::span<std::uint16_t>(in), prev,
                           79);
  const auto& p2p = m.counters()[commsgd::comm::op_kind::point_to_point];
  CHECK(p2p.bytes_sent == 18);
  CHECK(p2p.bytes_received == 18);
  CHECK(in == out);
  c = std::move(m.inner());
}

TEST_CASE("torch/process_group: ranks that disagree on a size all raise instead of hanging") {
  auto& c = *world;
  if (c.size() < 2) return;
  std::vector<float> v(static_cast<std::size_t>(10 + c.rank()));
  CHECK_THROWS_AS(c.all_reduce_sum(std::span<float>(v)), commsgd::size_mismatch);
  CHECK_THROWS_AS(c.broadcast(std::span<float>(v), 0), commsgd::size_mismatch);
  CHECK_THROWS_AS(c.broadcast(std::span<float>(v.data(), 3), c.rank()), commsgd::invalid_argument);
  c.barrier();
}

TEST_CASE("torch/process_group: set_timeout takes seconds in [0, one year], 0 restoring the group's own") {
  auto& c = *world;
  const double own = c.timeout();
  CHECK(own >= 0.0);
  c.set_timeout(2.5);
  CHECK(c.timeout() == 2.5);
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e9})
    CHECK_THROWS_AS(c.set_timeout(bad), commsgd::invalid_argument);
  CHECK(c.timeout() == 2.5); // a refused value changes nothing
  c.set_timeout(0.0);
  CHECK(c.timeout() == own);
  c.barrier();
}

namespace {

int run_rank(int rank, int n, const std::string& dir, int argc, char** argv) {
  alarm(240); // a hung rank dies instead of outliving the test
  std::ofstream log(dir + "/rank" + std::to_string(rank) + ".log");
  try {
    auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", n);
    auto opt = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(
        std::getenv("COMMSGD_TEST_TIMEOUT_S") ? std::atoi(std::getenv("COMMSGD_TEST_TIMEOUT_S")) : 120));
    opt->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    auto pg = commsgd::comm::make_gloo_group(store, rank, n, opt);
    world.emplace(pg, store);
    doctest::Context ctx(argc, argv);
    ctx.setCout(&log);
    const int failed = ctx.run();
    world->barrier();
    world.reset();
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    log << "rank " << rank << ": " << e.what() << "\n";
    return 2;
  }
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: conformance_torch <processes> [doctest options]\n";
    return 2;
  }
  const int n = std::atoi(argv[1]);
  if (n < 1 || n > 16) {
    std::cerr << "processes = " << argv[1] << " is outside the allowed range [1, 16]\n";
    return 2;
  }
  char tmpl[] = "/tmp/commsgd-torch-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 2;
  }
  const std::string dir = tmpl;
  argv[1] = argv[0];
  std::vector<pid_t> children;
  for (int r = 1; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) std::_Exit(run_rank(r, n, dir, argc - 1, argv + 1));
    children.push_back(pid);
  }
  int status = run_rank(0, n, dir, argc - 1, argv + 1);
  auto print = [&](int r) {
    std::ifstream in(dir + "/rank" + std::to_string(r) + ".log");
    std::cout << "---- rank " << r << " ----\n" << in.rdbuf() << std::flush;
  };
  print(0);
  for (int r = 1; r < n; ++r) {
    int ws = 0;
    waitpid(children[static_cast<std::size_t>(r - 1)], &ws, 0);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
      status = 1;
      std::cout << "rank " << r << (WIFEXITED(ws) ? " failed" : " died (signal)") << "\n";
      print(r);
    }
  }
  std::filesystem::remove_all(dir);
  return status;
}
