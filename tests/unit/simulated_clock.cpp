// comm::simulated: what each operation charges, compute time, alignment, and clocks shared with splits.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/simulated.hpp>

#include <doctest/doctest.h>

#include <vector>

namespace comm = commsgd::comm;
using comm::local;
using comm::local_group;

TEST_CASE("simulated charges each operation by its documented rule") {
  const auto net = comm::network_model::gigabit();
  local_group(3).run([&](local& c) {
    comm::simulated<local> s(c, net);
    std::vector<float> v(1000, 1.0f);
    s.all_reduce_sum(std::span<float>(v));
    CHECK(v[0] == 3.0f);
    CHECK(s.load() == comm::load::all_reduce(1000, 4, 3, s.rank()));
    const double t_ring = s.now();
    CHECK(t_ring == comm::busy_seconds(comm::load::all_reduce(1000, 4, 3, s.rank()), net));
    // 4 messages each way of about 333 floats: 4 alpha + 2 * 2/3 * 4000 bytes / B.
    CHECK(t_ring == doctest::Approx(4 * 50e-6 + (2 * 4000 - 1332) / 125e6).epsilon(1e-3));

    s.reset();
    s.broadcast(std::span<float>(v), 0);
    CHECK(s.load() == comm::traffic{s.rank() == 0 ? 2u : 0u, s.rank() == 0 ? 8000u : 0u,
                                    s.rank() == 0 ? 0u : 1u, s.rank() == 0 ? 0u : 4000u});

    s.reset();
    if (s.rank() == 0) s.send(std::span<const float>(v), 1, 5);
    if (s.rank() == 1) s.recv(std::span<float>(v), 0, 5);
    CHECK(s.now() == (s.rank() == 2 ? 0.0 : net.seconds(1, 4000)));

    // Compute starts after the exchange and the link starts idle again.
    s.advance(0.5);
    CHECK(s.now() == (s.rank() == 2 ? 0.5 : net.seconds(1, 4000) + 0.5));
    CHECK(s.load() == comm::traffic{});
    CHECK_THROWS_AS(s.advance(-1.0), commsgd::invalid_argument);

    // Everyone waits for the slowest rank.
    s.advance(0.1 * s.rank());
    const double slowest = s.align_to_slowest();
    CHECK(slowest == doctest::Approx(0.7)); // rank 2: 0.5 + 0.2 beats rank 1: 0.5 + 82 us + 0.1
    CHECK(s.now() == slowest);

    // A split shares the rank's clock.
    s.reset();
    auto sub = s.split(s.rank() % 2, s.rank());
    s.reset();
    std::vector<float> w(10, 1.0f);
    sub.all_gather(std::span<const float>(w).first(5),
                   std::span<float>(w).first(5 * static_cast<std::size_t>(sub.size())));
    CHECK(s.load() == comm::load::all_gather(20, sub.size(), comm::medium::switched));
  });
}

TEST_CASE("broadcast load by algorithm and medium") {
  comm::network_model net;
  net.broadcast = comm::broadcast_algorithm::binomial_tree;
  // Tree of 8 rooted at 2: relative rank 0 sends 3, 1 sends 2, 2 and 3... total sends 7 = p - 1.
  std::uint64_t sends = 0;
  for (int i = 0; i < 8; ++i)
    sends += comm::load::broadcast(100, 8, 2, i, net).messages_sent;
  CHECK(sends == 7);
  CHECK(comm::load::broadcast(100, 8, 2, 2, net).messages_sent == 3);
  CHECK(comm::load::broadcast(100, 8, 2, 3, net).messages_sent == 2);
  net.medium = comm::medium::multicast;
  CHECK(comm::load::broadcast(100, 8, 2, 2, net) == comm::traffic{1, 100, 0, 0});
  CHECK(comm::load::broadcast(100, 8, 2, 5, net) == comm::traffic{0, 0, 1, 100});
  CHECK_THROWS_AS(comm::network_model({0, 0}).validate(), commsgd::invalid_argument);
}

TEST_CASE("network_model::tcp_link: TCP's share of a framed link, and its arguments checked") {
  const auto veth = comm::network_model::tcp_link(100e6);
  CHECK(veth.bandwidth_bytes_per_s == doctest::Approx(100e6 / 8 * 1448.0 / 1514.0).epsilon(1e-12));
  CHECK(veth.latency_s == 50e-6);
  const auto wire = comm::network_model::tcp_link(10e9, 5e-6, 1500, 38);
  CHECK(wire.bandwidth_bytes_per_s == doctest::Approx(10e9 / 8 * 1448.0 / 1538.0).epsilon(1e-12));
  CHECK(wire.latency_s == 5e-6);
  // Jumbo frames waste less.
  CHECK(comm::network_model::tcp_link(1e9, 0, 9000).bandwidth_bytes_per_s >
        comm::network_model::tcp_link(1e9, 0, 1500).bandwidth_bytes_per_s);
  CHECK_THROWS_WITH_AS(comm::network_model::tcp_link(1e9, 0, 52), doctest::Contains("'mtu' = 52"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(comm::network_model::tcp_link(1e9, 0, 1500, -1), doctest::Contains("'framing' = -1"),
                       commsgd::invalid_argument);
  CHECK_THROWS_WITH_AS(comm::network_model::tcp_link(0), doctest::Contains("'bandwidth_bytes_per_s'"),
                       commsgd::invalid_argument);
  CHECK_THROWS_AS(comm::network_model::tcp_link(1e9, -1), commsgd::invalid_argument);
}
