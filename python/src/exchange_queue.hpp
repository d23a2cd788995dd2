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

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR < 2
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/python/python_ivalue.h>
#endif

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

// A torch.futures.Future. The queue completes it through its Python methods (set_result, set_exception), the
// interface torch keeps stable; torch's C++ future wrapper lives in JIT headers whose symbols torch 2.x no
// longer exports to extensions.
using python_future = pybind11::object;

// Under the GIL: the Python exception that the module's translators make of `error` (commsgd::invalid_argument
// becomes InvalidArgument, and so on). Calling a throwaway function that rethrows it runs pybind11's own
// translation, whatever its version.
inline pybind11::object python_exception(std::exception_ptr error) {
  try {
    pybind11::cpp_function([error] { std::rethrow_exception(error); })();
  } catch (pybind11::error_already_set& raised) {
    return raised.value();
  }
  return pybind11::reinterpret_steal<pybind11::object>(
      PyObject_CallFunction(PyExc_RuntimeError, "s", "commsgd: an exchange failed without an error"));
}

// The one place a hook's future is completed: with what `round` returns, as the Python object DDP's Python
// hooks must hand back, or with the error `round` threw. `fut` is a reference the caller hands over; it is
// dropped here, under the GIL, so no Python object is left for another thread to release after the
// interpreter has begun to exit (see docs/pytorch.md, Ending a script).
inline void settle(PyObject* fut, const std::function<at::Tensor()>& round) {
  at::Tensor out;
  std::exception_ptr error;
  try {
    out = round();
  } catch (...) {
    error = std::current_exception();
  }
  pybind11::gil_scoped_acquire locked;
  auto f = pybind11::reinterpret_steal<pybind11::object>(fut);
#if TORCH_VERSION_MAJOR < 2
  // torch 1.x's set_result lets go of the GIL while the future's callbacks run and takes it back after: by
  // then DDP's waiter may have let the script end, and a thread that asks for the GIL while the interpreter
  // exits is ended by CPython mid-call (an abort, seen in the endings suite). So the future underneath is
  // completed here, the GIL held throughout, and this thread never asks for it again.
  const auto underlying = f.cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>()->fut;
  if (error)
    underlying->setError(error);
  else
    underlying->markCompleted(c10::IValue(c10::ivalue::ConcretePyObjectHolder::create(pybind11::cast(out))));
#else
  try {
    if (error)
      f.attr("set_exception")(python_exception(error));
    else
      f.attr("set_result")(pybind11::cast(out));
  } catch (pybind11::error_already_set& e) {
    // A callback chained with then() raised: the chained future holds that error for whoever waits on it.
    e.discard_as_unraisable("commsgd_torch: completing an exchange's future");
  }
#endif
}

// A new torch.futures.Future. Called with the GIL.
inline python_future new_future() {
  return pybind11::module_::import("torch.futures").attr("Future")();
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

  // Queues `round`, which returns the bucket's result, and returns its future at once. Called with the GIL.
  python_future post(std::function<at::Tensor()> round) {
    python_future fut = new_future();
    PyObject* owned = fut.inc_ref().ptr();
    enqueue([round = std::move(round), owned] { settle(owned, round); });
    return fut;
  }

  // A future already holding `value`, for a bucket that needs no exchange (it stays local). Called with the GIL.
  static python_future ready(const at::Tensor& value) {
    python_future fut = new_future();
    settle(fut.inc_ref().ptr(), [&] { return value; });
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
    auto slot = std::make_shared<std::pair<at::Tensor, std::exception_ptr>>();
    enqueue([round = std::move(round), slot] {
      try {
        slot->first = round();
      } catch (...) {
        slot->second = std::current_exception();
      }
    });
    drain();
    if (slot->second) std::rethrow_exception(slot->second);
    return slot->first;
  }

  std::size_t pending() const {
    std::lock_guard lock(mutex_);
    return pending_;
  }

private:
  void enqueue(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      if (!worker_.joinable()) worker_ = std::thread([this] { serve(); });
      jobs_.push_back(std::move(job));
      ++pending_;
    }
    wake_.notify_all();
  }

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

} // namespace commsgd_torch
