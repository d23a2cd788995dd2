// comm::process_group's parts below the communicator (comm/process_group.hpp): the c10d headers and the
// torch-version switches (COMMSGD_TORCH_GLOO, COMMSGD_TORCH_AT_LEAST), make_gloo_group on every supported
// torch, the tensor types of the data path, waiting on c10d's work, and the receive that posts its payload
// only once its header has said how long it is.
#pragma once

#include <commsgd/error.hpp>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>
// gloo's own headers come with a source build of torch or a system package, not with pip's wheels: without
// them a gloo group can still be used, but split() needs a group_factory.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#define COMMSGD_TORCH_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#else
#define COMMSGD_TORCH_GLOO 0
#endif

// c10d's ProcessGroup/Backend split (torch 2.0) and the ProcessGroup constructor without options (2.5).
#define COMMSGD_TORCH_AT_LEAST(major, minor)                                                                 \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
static_assert(COMMSGD_TORCH_AT_LEAST(1, 13), "commsgd's process_group needs torch 1.13 or newer");

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace commsgd::inline v1::comm {

#if COMMSGD_TORCH_GLOO
// A gloo process group on `store`, as a c10d::ProcessGroup whatever the torch version (see the note above).
inline c10::intrusive_ptr<c10d::ProcessGroup>
make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> options) {
#if COMMSGD_TORCH_AT_LEAST(2, 0)
  const auto timeout = options->timeout;
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, std::move(options));
#if COMMSGD_TORCH_AT_LEAST(2, 5)
  (void)timeout;
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
#else
  auto group = c10::make_intrusive<c10d::ProcessGroup>(
      store, rank, size, c10::make_intrusive<c10d::ProcessGroup::Options>("gloo", timeout));
#endif
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO,
                    c10::intrusive_ptr<c10d::Backend>(backend));
  return group;
#else
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, std::move(options));
#endif
}
#endif

namespace detail {

#if COMMSGD_TORCH_GLOO
// The gloo backend carrying `group`'s CPU traffic, or null.
inline c10::intrusive_ptr<c10d::ProcessGroupGloo>
gloo_backend_of(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
#if COMMSGD_TORCH_AT_LEAST(2, 0)
  c10::intrusive_ptr<c10d::Backend> cpu;
  try {
    cpu = group->getBackend(c10::DeviceType::CPU);
  } catch (const c10::Error&) { // no backend for the CPU
    return {};
  }
  return c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupGloo>(cpu);
#else
  return c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupGloo>(group);
#endif
}
#endif

template <class T>
inline at::ScalarType pg_scalar_type() noexcept {
  if constexpr (std::same_as<T, float>)
    return at::kFloat;
  else if constexpr (std::same_as<T, double>)
    return at::kDouble;
  else // int32 and uint32 (same bits under a wrapping sum)
    return at::kInt;
}

// A tensor over caller memory; the caller keeps it alive until the work completes.
inline at::Tensor pg_bytes(const void* data, std::size_t bytes) {
  return at::from_blob(const_cast<void*>(data), {static_cast<std::int64_t>(bytes)},
                       at::TensorOptions().dtype(at::kByte));
}

template <class T>
at::Tensor pg_typed(std::span<T> data) {
  return at::from_blob(const_cast<std::remove_const_t<T>*>(data.data()),
                       {static_cast<std::int64_t>(data.size())},
                       at::TensorOptions().dtype(pg_scalar_type<std::remove_const_t<T>>()));
}

template <class Backend>
std::chrono::milliseconds pg_backend_timeout(Backend& b) {
  if constexpr (requires { b.getBackendOptions()->timeout; }) {
    if (auto o = b.getBackendOptions()) return o->timeout;
  }
  return std::chrono::milliseconds{0};
}

// The timeout the group was made with, 0 where torch does not say (before 2.0; gloo applies it anyway): what
// process_group::timeout() reports until set_timeout() changes it.
inline std::chrono::milliseconds pg_group_timeout(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
#if COMMSGD_TORCH_AT_LEAST(2, 0)
  try {
    auto backend = group->getBackend(c10::DeviceType::CPU);
    if (backend) return pg_backend_timeout(*backend);
  } catch (const std::exception&) { // no CPU backend, or options it does not report
  }
#else
  (void)group;
#endif
  return std::chrono::milliseconds{0};
}

// Waits for c10d work, turning torch's errors into comm_error. A positive `timeout` bounds the wait: torch 2's
// gloo also takes it in a collective's options and fails the operation itself, 1.13's only through the wait
// (its collective then runs on until the group's own deadline, but the group is broken by then anyway).
inline void pg_wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds{0}) {
  try {
    if (timeout.count() > 0)
      work->wait(timeout);
    else
      work->wait();
  } catch (const std::exception& e) {
    throw comm_error(commsgd::concat(what, " failed: ", e.what()));
  }
}

template <class F>
auto pg_call(const char* what, F&& f) {
  try {
    return f();
  } catch (const commsgd::error&) {
    throw;
  } catch (const std::exception& e) {
    throw comm_error(commsgd::concat(what, " failed: ", e.what()));
  }
}

// One receive: its header lands in `header`, its payload in the caller's buffer or, when the lengths differ
// or the request was abandoned, in `scratch`. `posted` is set once its payload receive is posted, which is
// when the next receive on the same (peer, tag) channel may post its header.
struct pg_recv_op {
  at::Tensor header = at::zeros({1}, at::TensorOptions().dtype(at::kLong));
  void* data = nullptr;
  std::size_t bytes = 0; // what the caller expects
  std::vector<std::byte> scratch;
  std::mutex mutex;
  bool payload_posted = false;
  bool abandoned = false;
  std::promise<void> posted;
};

// Runs one receive to completion on the calling thread.
inline void pg_run_recv(pg_recv_op& op, const std::shared_future<void>& before,
                        const c10::intrusive_ptr<c10d::ProcessGroup>& group, int peer, int tag,
                        std::chrono::milliseconds timeout) {
  c10::intrusive_ptr<c10d::Work> payload;
  std::string failure;
  try {
    if (before.valid()) before.wait();
    std::vector<at::Tensor> h{op.header};
    pg_wait(pg_call("recv (header)", [&] { return group->recv(h, peer, tag); }), "recv (header)", timeout);
    const auto got = static_cast<std::uint64_t>(op.header.data_ptr<std::int64_t>()[0]);
    std::lock_guard<std::mutex> lock(op.mutex);
    void* target = op.data;
    if (op.abandoned || got != op.bytes) {
      if (!op.abandoned)
        failure = commsgd::concat("recv from rank ", peer, " with tag ", tag, ": the message holds ", got,
                                  " byte(s), the receive buffer holds ", op.bytes);
      op.scratch.resize(got);
      target = op.scratch.data();
    }
    if (got > 0) {
      std::vector<at::Tensor> t{pg_bytes(target, got)};
      payload = pg_call("recv", [&] { return group->recv(t, peer, tag); });
    }
    op.payload_posted = true;
    op.posted.set_value();
  } catch (...) {
    std::lock_guard<std::mutex> lock(op.mutex);
    if (!op.payload_posted) {
      op.payload_posted = true;
      op.posted.set_value();
    }
    throw;
  }
  if (payload) pg_wait(payload, "recv", timeout);
  if (!failure.empty()) throw comm_error(failure);
}

// Runs `body` on its own thread; the returned future carries its outcome. c10d's gloo work reports completion
// only through a blocking wait, so a non-blocking test() needs a thread to do the waiting.
template <class F>
std::future<void> pg_in_background(F body) {
  std::promise<void> done;
  auto result = done.get_future();
  std::thread([body = std::move(body), done = std::move(done)]() mutable {
    try {
      body();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  }).detach();
  return result;
}

} // namespace detail

} // namespace commsgd::inline v1::comm
