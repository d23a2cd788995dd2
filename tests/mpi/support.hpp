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
// Fail fast: the first failed assertion (or exception escaping a test case) on any rank prints itself to
// stderr with the rank, the test case and the expression, and calls MPI_Abort, so that mpiexec ends the whole
// job at once instead of leaving the other ranks waiting in a collective until ctest's timeout. Set
// COMMSGD_MPI_TEST_NO_ABORT=1 in the environment to run on after failures and read every rank's report at the
// end (what a failing rank that returns normally still gets).
//
// Define COMMSGD_MPI_TEST_NO_MAIN to write your own main() around commsgd::test::mpi_doctest_main().
#pragma once

#ifndef DOCTEST_CONFIG_IMPLEMENT
#define DOCTEST_CONFIG_IMPLEMENT
#endif
#include <doctest/doctest.h>
#include <support/source_filter.hpp>

#include <boost/mpi/collectives/gather.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace commsgd::test {

// Aborts the MPI job on the first failure of any rank (see above).
class mpi_abort_on_failure : public doctest::IReporter {
public:
  explicit mpi_abort_on_failure(const doctest::ContextOptions&) {}

  void log_assert(const doctest::AssertData& a) override {
    if (!a.m_failed || (a.m_at & doctest::assertType::is_warn) || !enabled()) return;
    std::ostringstream out;
    out << a.m_file << ":" << a.m_line << ": " << a.m_expr;
    if (a.m_threw)
      out << " threw " << a.m_exception.c_str();
    else if (a.m_decomp.size() != 0)
      out << " is " << a.m_decomp.c_str();
    abort_job(out.str());
  }
  void test_case_exception(const doctest::TestCaseException& e) override {
    // SIGTERM is mpiexec ending this rank because another one aborted: nothing to add.
    if (e.is_crash && std::string(e.error_string.c_str()).find("SIGTERM") != std::string::npos) return;
    if (enabled()) abort_job(std::string("exception escaped: ") + e.error_string.c_str());
  }
  void test_case_start(const doctest::TestCaseData& t) override { test_case_ = t.m_name; }

  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}

private:
  static bool enabled() {
    const char* v = std::getenv("COMMSGD_MPI_TEST_NO_ABORT");
    return !(v && *v && std::string(v) != "0");
  }

  void abort_job(const std::string& what) const {
    int rank = 0, size = 1, initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised) {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    std::cerr << "[rank " << rank << " of " << size << "] test case \"" << (test_case_ ? test_case_ : "?")
              << "\" FAILED: " << what << "\n[rank " << rank << " of " << size
              << "] aborting the MPI job (COMMSGD_MPI_TEST_NO_ABORT=1 runs on instead)" << std::endl;
    if (initialised) MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }

  const char* test_case_ = nullptr;
};

REGISTER_LISTENER("mpi_abort_on_failure", 1, mpi_abort_on_failure);

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
  if (source_filter_matched_nothing(argc, argv)) { // the same answer on every rank
    if (world.rank() == 0) std::cerr << "no test case matched the --source-file filter" << std::endl;
    return 1;
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

// Initialises MPI through Boost.MPI, runs the tests, and finalises MPI. Serialized threads: a strategy's
// exchange thread (sync::diloco) calls MPI while the test's own thread does not.
inline int mpi_doctest_main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv, boost::mpi::threading::serialized);
  return run_doctest_on_all_ranks(argc, argv);
}

} // namespace commsgd::test

#ifndef COMMSGD_MPI_TEST_NO_MAIN
int main(int argc, char** argv) {
  return commsgd::test::mpi_doctest_main(argc, argv);
}
#endif
