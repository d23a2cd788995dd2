// comm::mpi's request (comm/mpi.hpp): what isend and irecv return.
#pragma once

#include <commsgd/comm/mpi/detail.hpp>
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

class mpi;

// Result of comm::mpi isend/irecv: one MPI request per piece of the message.
//
// A receive is checked piece by piece, in order: a piece of the wrong length is a comm_error and the pieces
// after it are cancelled. Destroying (or assigning over) a request that was not completed cancels its
// pending receives and waits for its pending sends: a send cannot be cancelled portably, and letting it
// finish in the background could read a buffer the caller frees next. Errors met there are dropped.
class mpi_request {
public:
  mpi_request() = default;
  mpi_request(const mpi_request&) = delete;
  mpi_request& operator=(const mpi_request&) = delete;
  mpi_request(mpi_request&& o) noexcept { take(o); }
  mpi_request& operator=(mpi_request&& o) noexcept {
    if (this != &o) {
      abandon();
      take(o);
    }
    return *this;
  }
  ~mpi_request() { abandon(); }

  // With a timeout on the communicator: throws comm_error once it has passed (the communicator is broken).
  void wait() {
    if (deadline_ && deadline_->seconds > 0) {
      detail::mpi_check_usable(*deadline_);
      detail::mpi_poll_bounded(
          *deadline_, [&] { return test(); },
          [&] {
            return commsgd::concat(receive_ ? "irecv from rank " : "isend to rank ", peer_, " with tag ",
                                   tag_);
          });
      return;
    }
    while (next_ < parts_.size()) {
      MPI_Status status;
      const int rc = MPI_Wait(&parts_[next_].handle, &status);
      complete(rc, status);
    }
  }

  bool test() {
    while (next_ < parts_.size()) {
      int flag = 0;
      MPI_Status status;
      const int rc = MPI_Test(&parts_[next_].handle, &flag, &status);
      if (rc == MPI_SUCCESS && !flag) return false;
      complete(rc, status);
    }
    return true;
  }

private:
  friend class mpi;

  struct part {
    MPI_Request handle = MPI_REQUEST_NULL;
    int expected = 0; // MPI elements a receive piece must carry
  };

  mpi_request(bool receive, MPI_Datatype type, int peer, int tag, std::size_t units, std::size_t limit,
              std::shared_ptr<detail::mpi_deadline> deadline)
      : deadline_(std::move(deadline)), type_(type), peer_(peer), tag_(tag), units_(units), limit_(limit),
        receive_(receive) {
    parts_.reserve(detail::mpi_pieces(units, limit));
  }

  void take(mpi_request& o) noexcept {
    parts_ = std::move(o.parts_);
    o.parts_.clear();
    deadline_ = std::move(o.deadline_);
    next_ = std::exchange(o.next_, 0);
    type_ = o.type_;
    peer_ = o.peer_;
    tag_ = o.tag_;
    units_ = o.units_;
    limit_ = o.limit_;
    receive_ = o.receive_;
  }

  // Finishes the current piece; on any failure abandons the rest and throws.
  void complete(int rc, const MPI_Status& status) {
    const std::size_t i = next_++;
    parts_[i].handle = MPI_REQUEST_NULL; // MPI frees a completed (or failed) non-persistent request
    if (rc != MPI_SUCCESS) {
      abandon();
      int cls = 0;
      MPI_Error_class(rc, &cls);
      throw comm_error(commsgd::concat(
          receive_ ? "irecv from rank " : "isend to rank ", peer_, " with tag ", tag_,
          cls == MPI_ERR_TRUNCATE ? ": the message is longer than the receive buffer of " : ": ",
          cls == MPI_ERR_TRUNCATE ? std::to_string(units_) + " MPI element(s): " : std::string(),
          detail::mpi_error_text(rc)));
    }
    if (!receive_) return;
    int got = 0;
    MPI_Get_count(&status, type_, &got);
    if (got != parts_[i].expected) {
      abandon();
      throw comm_error(commsgd::concat("irecv from rank ", peer_, " with tag ", tag_,
                                       ": the message ended after ", i * limit_ + got,
                                       " MPI element(s), the receive buffer holds ", units_));
    }
  }

  // With a timeout, a send is waited for only until it runs out; then (or on a communicator already
  // broken) the pieces are left to MPI (MPI_Request_free), since waiting could last forever.
  void abandon() noexcept {
    if (next_ >= parts_.size()) return;
    if (detail::mpi_usable()) {
      const bool bounded = deadline_ && deadline_->seconds > 0;
      const auto until =
          poll_clock::now() + std::chrono::duration_cast<poll_clock::duration>(
                                  std::chrono::duration<double>(bounded ? deadline_->seconds : 0.0));
      for (std::size_t i = next_; i < parts_.size(); ++i) {
        auto& h = parts_[i].handle;
        if (h == MPI_REQUEST_NULL) continue;
        if (receive_) MPI_Cancel(&h);
        if (!bounded) {
          MPI_Wait(&h, MPI_STATUS_IGNORE);
          continue;
        }
        // An error from MPI_Test ends the wait too: the request is freed below, as one never done.
        int done = 0;
        if (!deadline_->broken &&
            !poll_until([&] { return MPI_Test(&h, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done != 0; },
                        until))
          deadline_->broken = true;
        if (!done && h != MPI_REQUEST_NULL) MPI_Request_free(&h);
      }
    }
    next_ = parts_.size();
  }

  std::vector<part> parts_;
  std::shared_ptr<detail::mpi_deadline> deadline_; // the communicator's timeout, null for none
  std::size_t next_ = 0;                           // first piece not yet completed
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  int peer_ = -1;
  int tag_ = 0;
  std::size_t units_ = 0;
  std::size_t limit_ = 1;
  bool receive_ = false;
};

} // namespace commsgd::inline v1::comm
