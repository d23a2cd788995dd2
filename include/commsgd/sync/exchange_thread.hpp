// sync::exchange_thread: one thread that runs a strategy's exchanges, in the order they were submitted,
// while the trainer goes on with local steps.
//
//   sync::exchange_thread t;
//   auto done = t.submit([&] { comm.all_reduce_sum(buffer); });  // returns at once
//   ... local steps, which must not use comm ...
//   done.get();                                                   // waits; rethrows what the exchange threw
//
// One thread, first in first out: collectives submitted in the same order on every rank run in that order,
// and a communicator is used by one thread at a time (what comm::local and MPI_THREAD_SERIALIZED allow). The
// destructor runs what is queued, then joins: a strategy destroyed with exchanges in flight waits for them
// rather than leaving a thread on a communicator that is about to go.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

namespace commsgd::inline v1::sync {

class exchange_thread {
public:
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

  // Queues `work`; its future is ready when it has run, and holds what it threw. The thread starts with the
  // first submission.
  std::future<void> submit(std::function<void()> work) {
    std::packaged_task<void()> task(std::move(work));
    auto done = task.get_future();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    wake_.notify_one();
    return done;
  }

private:
  void run() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task(); // an exception lands in the task's future
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

} // namespace commsgd::inline v1::sync
