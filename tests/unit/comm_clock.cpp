// comm::clock_of: the simulated layer's clock wherever it sits in the stack, the wall clock where there is
// none; comm::innermost: the communicator beneath every layer.
#include <commsgd/comm/clock.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/simulated.hpp>

#include <doctest/doctest.h>

#include <concepts>
#include <span>
#include <type_traits>
#include <vector>

namespace comm = commsgd::comm;
using comm::local;
using comm::local_group;
using comm::metered;
using comm::simulated;

namespace {

// A wrapper of the user's own: it only passes calls down and exposes its inner communicator.
template <comm::communicator C>
struct passthrough : C {
  explicit passthrough(C c) : C(std::move(c)) {}
  C& inner() noexcept { return *this; }
  passthrough split(int color, int key) { return passthrough(C::split(color, key)); }
};

} // namespace

static_assert(std::same_as<comm::clock_type<local>, comm::wall_clock>);
static_assert(std::same_as<comm::clock_type<metered<local>>, comm::wall_clock>);
static_assert(std::same_as<comm::clock_type<simulated<local>>, simulated<local>>);
static_assert(std::same_as<comm::clock_type<metered<simulated<local>>>, simulated<local>>);
static_assert(std::same_as<comm::clock_type<simulated<metered<local>>>, simulated<metered<local>>>);
static_assert(std::same_as<comm::clock_type<passthrough<metered<simulated<local>>>>, simulated<local>>);
static_assert(!comm::runs_on_virtual_time<local> && !comm::runs_on_virtual_time<metered<local>>);
static_assert(comm::runs_on_virtual_time<metered<metered<simulated<local>>>>);
// The outermost simulated layer owns the stack's time.
static_assert(std::same_as<comm::clock_type<simulated<simulated<local>>>, simulated<simulated<local>>>);

TEST_CASE("clock_of: the simulated layer's clock in either nesting, by reference") {
  const auto net = comm::network_model::gigabit();
  local_group(2).run([&](local& c) {
    metered<simulated<local>> outer_meter(simulated<local>(c, net));
    simulated<metered<local>> inner_meter(metered<local>(c), net);
    simulated<local> plain(c, net);
    CHECK(&comm::clock_of(outer_meter) == &outer_meter.inner());
    CHECK(&comm::clock_of(inner_meter) == &inner_meter);
    CHECK(&comm::clock_of(plain) == &plain);
    // The clock is the one the layer charges: a collective through the outer layer moves it.
    std::vector<float> v(1000, 1.0f);
    outer_meter.all_reduce_sum(std::span<float>(v));
    inner_meter.all_reduce_sum(std::span<float>(v));
    CHECK(comm::clock_of(outer_meter).now() > 0);
    CHECK(comm::clock_of(outer_meter).now() == comm::clock_of(inner_meter).now());
    comm::clock_of(inner_meter).advance(1.5);
    CHECK(inner_meter.now() > 1.5);
  });
}

TEST_CASE("clock_of: the wall clock for comm::local and metered<local>; innermost sees through layers") {
  local_group(2).run([&](local& c) {
    metered<local> m(c);
    const comm::timekeeper auto wall = comm::clock_of(m);
    const double t0 = wall.now();
    c.barrier();
    CHECK(comm::clock_of(c).now() >= t0);
    CHECK(&comm::innermost(m) == &m.inner());
    CHECK(&comm::innermost(c) == &c);
    simulated<metered<local>> s(metered<local>(c), comm::network_model::gigabit());
    CHECK(&comm::innermost(s) == &s.inner().inner());
    passthrough<simulated<local>> p(simulated<local>(c, comm::network_model::gigabit()));
    CHECK(&comm::clock_of(p) == static_cast<simulated<local>*>(&p));
    CHECK(&comm::innermost(p) == &p.inner().inner());
  });
}
