// commsgd_torch::exchange_queue: runs one hook state's exchanges on a thread of its own (sync::exchange_thread),
// one at a time, in the order the hook posted them, and hands DDP a future at once.
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

#include <commsgd/sync/exchange_thread.hpp>

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_set>
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

// The hooks' side of sync::exchange_thread, the one exchange thread of the library (the DiLoCo engine runs
// its exchanges on one too): a round posted here returns a future at once and completes it on the thread.
class exchange_queue {
public:
  exchange_queue() : thread_(std::make_unique<commsgd::sync::exchange_thread>()) {
    std::lock_guard lock(registry().mutex);
    registry().live.insert(this);
  }
  exchange_queue(const exchange_queue&) = delete;
  exchange_queue& operator=(const exchange_queue&) = delete;

  // Runs what is queued, then joins. The destructor may run with the GIL held (the state's Python object is
  // collected), and the thread takes the GIL to complete a round's future: it is let go meanwhile.
  ~exchange_queue() {
    {
      std::lock_guard lock(registry().mutex);
      registry().live.erase(this);
    }
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release unlocked;
      thread_.reset();
    } else {
      thread_.reset();
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
      wait_last();
    } else {
      wait_last();
    }
  }

  // Runs `round` in order after everything posted before it and waits for it; its error is rethrown here.
  at::Tensor run(std::function<at::Tensor()> round) {
    auto result = std::make_shared<at::Tensor>();
    auto mine = enqueue([round = std::move(round), result] { *result = round(); });
    std::exception_ptr error;
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release unlocked;
      error = mine.wait();
    } else {
      error = mine.wait();
    }
    if (error) std::rethrow_exception(error);
    return *result;
  }

  // Waits until every live queue's posted rounds have finished; the module runs it at the interpreter's exit
  // (atexit, before finalization begins). torch 2's set_result lets go of the GIL while the future's callbacks
  // run and takes it back after; DDP's waiter is woken before that, so the script may end meanwhile, and a
  // thread that asks for the GIL once the interpreter is finalizing is ended by CPython inside a destructor,
  // which aborts the process. Called with the GIL; lets it go while it waits. The tickets are taken under the
  // registry's lock and waited for without it, so that a queue may come or go meanwhile (a callback chained
  // to a future may make or drop a state).
  static void drain_all() {
    pybind11::gil_scoped_release unlocked;
    std::vector<commsgd::sync::exchange_thread::ticket> last;
    {
      std::lock_guard lock(registry().mutex);
      for (exchange_queue* q : registry().live) {
        std::lock_guard own(q->mutex_);
        last.push_back(q->last_);
      }
    }
    for (auto& t : last)
      t.wait();
  }

private:
  // Every live queue, for drain_all. Leaked on purpose: a queue may be destroyed after static destructors ran.
  struct queue_registry {
    std::mutex mutex;
    std::unordered_set<exchange_queue*> live;
  };
  static queue_registry& registry() {
    static auto* r = new queue_registry;
    return *r;
  }

  // The thread runs in order: once a round has run, every round posted before it has.
  commsgd::sync::exchange_thread::ticket enqueue(std::function<void()> job) {
    std::lock_guard lock(mutex_);
    last_ = thread_->submit(std::move(job));
    return last_;
  }

  // Waits for the last round queued (a posted round completes its future rather than throwing).
  void wait_last() {
    commsgd::sync::exchange_thread::ticket last;
    {
      std::lock_guard lock(mutex_);
      last = last_;
    }
    last.wait();
  }

  std::mutex mutex_;
  commsgd::sync::exchange_thread::ticket last_;
  std::unique_ptr<commsgd::sync::exchange_thread> thread_;
};

} // namespace commsgd_torch
