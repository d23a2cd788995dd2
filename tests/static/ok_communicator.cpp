// What satisfies the communicator concept, and what does not.
#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>

namespace comm = commsgd::comm;

static_assert(comm::communicator<comm::archetype>);
static_assert(comm::communicator<comm::local>);
static_assert(comm::communicator<comm::metered<comm::local>>);
static_assert(comm::communicator<comm::metered<comm::metered<comm::local>>>);
static_assert(comm::request<comm::local_request>);

static_assert(!comm::communicator<int>);
static_assert(!comm::reducible<std::int64_t>); // no native 64-bit integer sums: say so at compile time
static_assert(!comm::reducible<char>);
static_assert(!comm::transferable<std::vector<int>>);

namespace {
struct index_value {
  std::uint32_t index;
  float value;
};
static_assert(comm::transferable<index_value>);

// Everything but split: not a communicator.
struct no_split : comm::archetype {
  void split(int, int) = delete;
};
// A request without test(): not a request.
struct wait_only {
  void wait();
};
// rank() returning the wrong type.
struct wrong_rank : comm::archetype {
  long rank() const;
};
} // namespace

static_assert(!comm::communicator<no_split>);
static_assert(!comm::request<wait_only>);
static_assert(!comm::communicator<wrong_rank>);
