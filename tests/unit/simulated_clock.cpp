// comm::simulated: what each operation charges, compute time, alignment, and clocks shared with splits.
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/simulated.hpp>

#include <doctest/doctest.h>

#include <algorithm>
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

TEST_CASE("network_model::duplex: full is the default and unchanged; half charges both sides one after the other") {
  const comm::traffic l{2, 3000, 1, 1000};
  comm::network_model net{1e-3, 1e6};
  CHECK(net.duplex == comm::duplex::full);
  // full: the longer side, bit for bit the formula before the field existed.
  CHECK(comm::busy_seconds(l, net) == std::max(net.seconds(2, 3000), net.seconds(1, 1000)));
  CHECK(comm::busy_seconds(l, net) == doctest::Approx(2e-3 + 3e-3));
  net.duplex = comm::duplex::half;
  CHECK(comm::busy_seconds(l, net) == net.seconds(2, 3000) + net.seconds(1, 1000));
  CHECK(comm::busy_seconds(l, net) == doctest::Approx(5e-3 + 2e-3));
  // Sending alone or receiving alone costs the same either way.
  CHECK(comm::busy_seconds(comm::load::send(3000), net) == net.seconds(1, 3000));

  // The measured case it describes: 2 ranks, 16 MiB of float32 summed at 100 Mbit/s (TCP payload) over Open
  // MPI's default TCP protocol took 2.81 s, twice the full-duplex figure.
  auto tcp = comm::network_model::tcp_link(100e6);
  const auto ring = comm::load::all_reduce(16u << 18, 4, 2, 0);
  const double full = comm::busy_seconds(ring, tcp);
  tcp.duplex = comm::duplex::half;
  CHECK(comm::busy_seconds(ring, tcp) == doctest::Approx(2 * full).epsilon(1e-12));
  CHECK(comm::busy_seconds(ring, tcp) == doctest::Approx(2.81).epsilon(0.01));

  // simulated<C>'s clock charges through the same rule.
  local_group(2).run([&](local& c) {
    comm::simulated<local> s(c, tcp);
    std::vector<float> v(1000, 1.0f);
    s.all_reduce_sum(std::span<float>(v));
    CHECK(v[0] == 2.0f);
    CHECK(s.now() == comm::busy_seconds(comm::load::all_reduce(1000, 4, 2, s.rank()), tcp));
    CHECK(s.now() == tcp.seconds(2, 4000) + tcp.seconds(2, 4000)); // half of 1000 floats each way, twice
  });

  net.duplex = static_cast<comm::duplex>(7);
  CHECK_THROWS_WITH_AS(net.validate(), doctest::Contains("'duplex' = 7"), commsgd::invalid_argument);
}
