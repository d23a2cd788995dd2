// comm::mpi's parts below the communicator (comm/mpi.hpp): MPI's error codes as commsgd errors, the MPI
// datatype of each element type the data path sends, the pieces a long message is cut into, and the deadline
// a bounded call polls against.
#pragma once

#include <commsgd/comm/poll.hpp>
#include <commsgd/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace commsgd::inline v1::comm {

namespace detail {

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return commsgd::concat("MPI error ", code);
  return std::string(text, static_cast<std::size_t>(len));
}

inline void mpi_check(int code, const char* call) {
  if (code != MPI_SUCCESS) throw comm_error(commsgd::concat(call, " failed: ", mpi_error_text(code)));
}

inline bool mpi_usable() noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// How T travels: the native MPI type for the reducible types (MPI_SUM needs them), bytes for the rest.
template <class T>
struct mpi_wire {
  static MPI_Datatype type() noexcept { return MPI_BYTE; }
  static constexpr std::size_t units = sizeof(T); // MPI elements per T
};
template <>
struct mpi_wire<float> {
  static MPI_Datatype type() noexcept { return MPI_FLOAT; }
  static constexpr std::size_t units = 1;
};
template <>
struct mpi_wire<double> {
  static MPI_Datatype type() noexcept { return MPI_DOUBLE; }
  static constexpr std::size_t units = 1;
};
template <>
struct mpi_wire<std::int32_t> {
  static MPI_Datatype type() noexcept { return MPI_INT32_T; }
  static constexpr std::size_t units = 1;
};
template <>
struct mpi_wire<std::uint32_t> {
  static MPI_Datatype type() noexcept { return MPI_UINT32_T; }
  static constexpr std::size_t units = 1;
};

// How many pieces a point-to-point message of n units takes under limit L: floor(n / L) full ones and the
// short final one (see the framing note at the top).
inline std::size_t mpi_pieces(std::size_t n, std::size_t limit) noexcept {
  return n / limit + 1;
}

// A deadline shared by a communicator and its requests: `seconds` <= 0 means none; `broken` is set once a
// bounded wait has run out, after which nothing on the communicator may wait again.
struct mpi_deadline {
  double seconds = 0.0;
  bool broken = false;
};

inline comm_error mpi_timed_out(const std::string& what, double seconds) {
  return comm_error(commsgd::concat(
      what, " did not complete within timeout_s = ", seconds,
      " s: a peer, or the link to it, stopped answering. MPI cannot cancel the call, so this communicator "
      "is unusable now: save this rank's own state, end the process and resume from the last checkpoint"));
}

inline void mpi_check_usable(const mpi_deadline& d) {
  if (d.broken)
    throw comm_error(commsgd::concat("this communicator timed out earlier (timeout_s = ", d.seconds,
                                     ") and cannot be used again: end the process and resume"));
}

// Polls until `done()` holds, or throws at the deadline (marking `d` broken). MPI_Test* drive MPI's
// progress engine as a blocking wait would; comm::poll_until backs off so that a wait that lasts (a slow
// link, a straggler) leaves the cores to ranks that share them.
template <class Done, class What>
void mpi_poll_bounded(mpi_deadline& d, Done&& done, What&& what) {
  const auto until = poll_clock::now() + std::chrono::duration_cast<poll_clock::duration>(
                                             std::chrono::duration<double>(d.seconds));
  if (!poll_until(done, until)) {
    d.broken = true;
    throw mpi_timed_out(what(), d.seconds);
  }
}

} // namespace detail

} // namespace commsgd::inline v1::comm
