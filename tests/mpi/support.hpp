// The main() of a doctest program run under mpiexec. Include it once, in the program's one source file:
//
//   #include "mpi/support.hpp"
//   TEST_CASE("...") { auto c = commsgd::comm::mpi::world(); ... }
//
// Every rank runs every test case (collectives need all of them). Each rank's doctest report is captured;
// rank 0 prints its own, and the report of any other rank that failed, so a passing run reads like one
// process and a failing one says which rank saw what. The failure counts are summed over the ranks, so the
// exit code is nonzero on every rank when any rank failed: mpiexec and ctest see the failure even if rank 0
// passed.
//
// A test case that fails on one rank before a collective leaves the others waiting in it; keep REQUIREs
// that might differ between ranks out of the way of collectives (CHECK and continue instead).
//
// Define COMMSGD_MPI_TEST_NO_MAIN to write your own main() around commsgd::test::mpi_doctest_main().
#pragma once

#ifndef DOCTEST_CONFIG_IMPLEMENT
#define DOCTEST_CONFIG_IMPLEMENT
#endif
#include <doctest/doctest.h>

#include <boost/mpi/collectives/gather.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace commsgd::test {

// Runs doctest on every rank of MPI_COMM_WORLD (MPI must be initialised); returns the exit code for all.
inline int run_doctest_on_all_ranks(int argc, char** argv) {
  boost::mpi::communicator world;
  std::ostringstream report;
  doctest::Context context(argc, argv);
  context.setCout(&report);
  // Colour codes would end up in ctest logs as escape sequences.
  context.setOption("no-colors", true);
  const int failed_here = context.run();
  if (context.shouldExit()) { // --help, --list-test-cases and the like: rank 0 answers for all
    if (world.rank() == 0) std::cout << report.str() << std::flush;
    return failed_here;
  }
  int failed_ranks = 0;
  MPI_Allreduce(&failed_here, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  // One rank prints everything, in rank order: lines of several processes would interleave.
  const std::string mine = world.rank() == 0 || failed_here
                               ? "[rank " + std::to_string(world.rank()) + " of " +
                                     std::to_string(world.size()) + "]\n" + report.str()
                               : std::string();
  std::vector<std::string> reports;
  boost::mpi::gather(world, mine, reports, 0);
  if (world.rank() == 0) {
    for (const auto& r : reports)
      std::cout << r;
    std::cout << (failed_ranks ? "FAILED" : "passed") << " on " << world.size() << " rank(s)";
    if (failed_ranks) std::cout << " (" << failed_ranks << " rank(s) failed)";
    std::cout << std::endl;
  }
  return failed_ranks ? 1 : 0;
}

// Initialises MPI through Boost.MPI, runs the tests, and finalises MPI.
inline int mpi_doctest_main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  return run_doctest_on_all_ranks(argc, argv);
}

} // namespace commsgd::test

#ifndef COMMSGD_MPI_TEST_NO_MAIN
int main(int argc, char** argv) {
  return commsgd::test::mpi_doctest_main(argc, argv);
}
#endif
