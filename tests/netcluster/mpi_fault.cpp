// A rank that loses its link fails within comm::mpi's timeout instead of hanging: the netcluster test runs this
// on two ranks, pulls one rank's cable mid-run and checks both logs.
//
//   mpi_fault LOG_PATTERN TIMEOUT_S [STEPS]
//
// Every rank all-reduces 1 MiB of floats again and again (STEPS times, default: until it fails), checking the
// sum, and appends "step K" to its log (LOG_PATTERN with %r replaced by the rank) after each call. A comm_error
// appends "failed after S s: MESSAGE" and ends the process with exit code 3 without MPI_Finalize (which would
// wait for the lost peer).
#include <commsgd/comm/mpi.hpp>

#include <boost/mpi/environment.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: mpi_fault LOG_PATTERN TIMEOUT_S [STEPS]\n");
    return 2;
  }
  boost::mpi::environment env(argc, argv);
  auto comm = commsgd::comm::mpi::world();
  std::string path = argv[1];
  if (const auto at = path.find("%r"); at != std::string::npos)
    path.replace(at, 2, std::to_string(comm.rank()));
  std::FILE* log = std::fopen(path.c_str(), "w");
  if (!log) return 2;
  comm.set_timeout(std::atof(argv[2]));
  const long steps = argc > 3 ? std::atol(argv[3]) : -1;
  std::vector<float> x(1 << 18);
  auto last = std::chrono::steady_clock::now();
  try {
    for (long k = 0; steps < 0 || k < steps; ++k) {
      std::fill(x.begin(), x.end(), 1.0f);
      last = std::chrono::steady_clock::now();
      comm.all_reduce_sum(std::span<float>(x));
      if (x.front() != static_cast<float>(comm.size()) || x.back() != x.front()) {
        std::fprintf(log, "wrong sum %g at step %ld\n", static_cast<double>(x.front()), k);
        return 1;
      }
      std::fprintf(log, "step %ld\n", k);
      std::fflush(log);
    }
  } catch (const commsgd::comm_error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count();
    std::fprintf(log, "failed after %.2f s: %s\n", s, e.what());
    std::fclose(log);
    std::_Exit(3);
  }
  std::fprintf(log, "done\n");
  std::fclose(log);
  return 0;
}
