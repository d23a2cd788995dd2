// sync::exchange_thread: one thread that runs a strategy's exchanges, in the order they were submitted,
// while the trainer goes on with local steps.
//
//   sync::exchange_thread t;
//   auto done = t.submit([&] { comm.all_reduce_sum(buffer); });  // returns at once
//   ... local steps, which must not use comm ...
//   if (auto error = done.wait()) std::rethrow_exception(error);  // waits; what the exchange threw, if any
//
// One thread, first in first out: collectives submitted in the same order on every rank run in that order,
// and a communicator is used by one thread at a time (what comm::local and MPI_THREAD_SERIALIZED allow). The
// destructor runs what is queued, then joins: a strategy destroyed with exchanges in flight waits for them
// rather than leaving a thread on a communicator that is about to go. The hand-over from the thread to the
// waiter is a mutex and a condition variable (not std::future, whose wait ThreadSanitizer cannot follow in
// libstdc++), so the exchange's writes, and an exception it threw, are seen whole by the waiter.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace commsgd::inline v1::sync {

class exchange_thread {
  struct slot {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::exception_ptr error;
  };

public:
  // One submitted piece of work, to wait for.
  class ticket {
  public:
    ticket() = default;
    // Whether there is something to wait for: false for a default ticket and after wait().
    bool valid() const noexcept { return slot_ != nullptr; }
    // Blocks until the work has run; returns what it threw (null when it returned).
    std::exception_ptr wait() {
      if (!slot_) return nullptr;
      std::exception_ptr error;
      {
        std::unique_lock lock(slot_->mutex);
        slot_->done_cv.wait(lock, [&] { return slot_->done; });
        error = std::move(slot_->error);
      }
      slot_.reset();
      return error;
    }

  private:
    friend class exchange_thread;
    explicit ticket(std::shared_ptr<slot> s) : slot_(std::move(s)) {}
    std::shared_ptr<slot> slot_;
  };

  exchange_thread() = default;
  exchange_thread(const exchange_thread&) = delete;
  exchange_thread& operator=(const exchange_thread&) = delete;
  ~exchange_thread() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  // Queues `work`; the ticket tells when it has run. The thread starts with the first submission.
  ticket submit(std::function<void()> work) {
    auto s = std::make_shared<slot>();
    {
      std::lock_guard lock(mutex_);
      queue_.emplace_back(std::move(work), s);
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    wake_.notify_one();
    return ticket(std::move(s));
  }

private:
  void run() {
    for (;;) {
      std::pair<std::function<void()>, std::shared_ptr<slot>> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        job.first();
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(job.second->mutex);
        job.second->error = std::move(error);
        job.second->done = true;
      }
      job.second->done_cv.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<slot>>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

} // namespace commsgd::inline v1::sync
