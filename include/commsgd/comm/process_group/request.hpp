// comm::process_group's request (comm/process_group.hpp): what isend and irecv return.
#pragma once

#include <commsgd/comm/process_group/c10d.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <utility>

namespace commsgd::inline v1::comm {

class process_group;

// Result of comm::process_group isend/irecv.
class process_group_request {
public:
  process_group_request() = default;
  process_group_request(const process_group_request&) = delete;
  process_group_request& operator=(const process_group_request&) = delete;
  process_group_request(process_group_request&& o) noexcept = default;
  process_group_request& operator=(process_group_request&& o) noexcept {
    if (this != &o) {
      abandon();
      recv_ = std::move(o.recv_);
      done_ = std::move(o.done_);
    }
    return *this;
  }
  ~process_group_request() { abandon(); }

  void wait() {
    if (done_.valid()) done_.get();
  }

  bool test() {
    if (done_.valid() && done_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    wait();
    return true;
  }

private:
  friend class process_group;

  // Never leaves the backend writing into memory the caller may free next (see the note at the top).
  void abandon() noexcept {
    if (!done_.valid()) return;
    if (recv_) {
      std::lock_guard<std::mutex> lock(recv_->mutex);
      if (!recv_->payload_posted) {
        recv_->abandoned = true;
        recv_->data = nullptr;
        return;
      }
    }
    done_.wait();
  }

  std::shared_ptr<detail::pg_recv_op> recv_; // null for a send
  std::future<void> done_;
};

} // namespace commsgd::inline v1::comm
