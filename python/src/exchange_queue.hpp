// commsgd_torch::exchange_queue: runs one hook state's exchanges on a thread of its own, one at a time, in the
// order the hook posted them, and hands DDP a future at once.
//
// DDP calls a communication hook as soon as a bucket is full and goes on with the rest of backward only when
// the hook returns; its own allreduce returns a future of work still under way. A hook that exchanged inline
// would hold backward for the whole exchange. Here the hook posts the exchange and returns its future; the
// queue's thread runs it without the GIL (the exchange touches no Python object), then takes the GIL only to
// complete the future with the bucket's result as a Python object (what DDP's Python hooks must return), or
// completes it with the exchange's own error, so DDP's wait raises it and a script's fut.wait() raises the
// library's exception type. One thread per state keeps the collectives of a state in bucket order on every rank, which
// is the order DDP launches buckets in. Every call that reads or replaces a state's contents drains the
// queue first, so it never sees a half-done round.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/ivalue_inl.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/python/python_ivalue.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace commsgd_torch {

using future_ptr = c10::intrusive_ptr<c10::ivalue::Future>;
using python_future = std::shared_ptr<torch::jit::PythonFutureWrapper>;

// The one place a hook's future is completed: with what `round` returns, as the Python object DDP's Python
// hooks must hand back, or with the error `round` threw. No Python callable is involved, so nothing is left
// for the completing thread to release once DDP has the result (see docs/pytorch.md, Ending a script).
inline void settle(const future_ptr& fut, const std::function<at::Tensor()>& round) {
  at::Tensor out;
  try {
    out = round();
  } catch (...) {
    fut->setError(std::current_exception());
    return;
  }
  pybind11::gil_scoped_acquire locked;
  fut->markCompleted(c10::IValue(c10::ivalue::ConcretePyObjectHolder::create(pybind11::cast(out))));
}

class exchange_queue {
public:
  exchange_queue() = default;
  exchange_queue(const exchange_queue&) = delete;
  exchange_queue& operator=(const exchange_queue&) = delete;

  ~exchange_queue() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (worker_.joinable()) {
      // The destructor may run with the GIL held (the state's Python object is collected), and the thread
      // takes the GIL to complete a round's future.
      if (PyGILState_Check()) {
        pybind11::gil_scoped_release unlocked;
        worker_.join();
      } else {
        worker_.join();
      }
    }
  }

  // Queues `round`, which returns the bucket's result, and returns its future at once.
  future_ptr post(std::function<at::Tensor()> round) {
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::PyObjectType::get());
    {
      std::lock_guard lock(mutex_);
      if (!worker_.joinable()) worker_ = std::thread([this] { serve(); });
      jobs_.push_back([round = std::move(round), fut] { settle(fut, round); });
      ++pending_;
    }
    wake_.notify_all();
    return fut;
  }

  // A future already holding `value`, for a bucket that needs no exchange (it stays local).
  static future_ptr ready(const at::Tensor& value) {
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::PyObjectType::get());
    settle(fut, [&] { return value; });
    return fut;
  }

  // Waits until every posted round has finished. The GIL is let go meanwhile: a Python callback chained
  // to a round's future takes it on this queue's thread.
  void drain() {
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release unlocked;
      wait_idle();
    } else {
      wait_idle();
    }
  }

  // Runs `round` in order after everything posted before it and waits for it; its error is rethrown here.
  at::Tensor run(std::function<at::Tensor()> round) {
    auto fut = post(std::move(round));
    drain();
    const auto v = fut->value(); // rethrows the round's error
    pybind11::gil_scoped_acquire locked;
    return pybind11::cast<at::Tensor>(torch::jit::toPyObject(v));
  }

  std::size_t pending() const {
    std::lock_guard lock(mutex_);
    return pending_;
  }

private:
  void wait_idle() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return pending_ == 0; });
  }

  void serve() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return; // stopping, and nothing left to run
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
      {
        std::lock_guard lock(mutex_);
        --pending_;
      }
      idle_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> jobs_;
  std::size_t pending_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

inline python_future to_python(future_ptr fut) {
  return std::make_shared<torch::jit::PythonFutureWrapper>(std::move(fut));
}

} // namespace commsgd_torch
