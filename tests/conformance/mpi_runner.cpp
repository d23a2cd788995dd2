// The conformance suite on comm::mpi, under mpiexec with 1 to 4 ranks. Each case runs on a duplicate of
// MPI_COMM_WORLD, and again with a small chunk limit so the same cases check the chunked paths.
#include "mpi/support.hpp"

#include "conformance/cases.hpp"

#include <commsgd/comm/mpi.hpp>

// A prime: pieces never line up with the suite's sizes, so the last piece of a transfer is ragged.
inline constexpr std::size_t small_chunk = 4093;

// The cases are written against the concept; this runner only makes sense for a model of it, and so does
// the metered wrapper the metered_counts case builds around it.
static_assert(commsgd::comm::communicator<commsgd::comm::mpi>);
static_assert(commsgd::comm::communicator<commsgd::comm::metered<commsgd::comm::mpi>>);

#define COMMSGD_MPI_CASE(name)                                                                               \
  TEST_CASE("conformance/mpi/" #name) {                                                                      \
    auto c = commsgd::comm::mpi::world();                                                                    \
    SUBCASE("one call per transfer") {                                                                       \
      conformance::name(c);                                                                                  \
    }                                                                                                        \
    SUBCASE("chunked") {                                                                                     \
      c.set_max_chunk_elements(small_chunk);                                                                 \
      conformance::name(c);                                                                                  \
    }                                                                                                        \
  }
COMMSGD_CONFORMANCE_CASES(COMMSGD_MPI_CASE)
