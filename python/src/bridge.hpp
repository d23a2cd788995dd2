// What the module's hook states share: their metered communicator, the checked view of a bucket tensor, a
// tensor copy of a state vector, the traffic counters as a dict (read after the queued rounds), and the dense
// averaging of a bucket. Their
// rounds run on an exchange_queue (exchange_queue.hpp).
#pragma once

#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "exchange_queue.hpp"

#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/process_group.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace commsgd_torch {

namespace py = pybind11;

using meter = commsgd::comm::metered<commsgd::comm::process_group>;
using group_ptr = c10::intrusive_ptr<c10d::ProcessGroup>;

// A float32, contiguous CPU tensor's values, or an error naming what is wrong.
inline std::span<float> values_of(const at::Tensor& t, const char* what) {
  using commsgd::concat;
  if (t.scalar_type() != at::kFloat)
    throw commsgd::invalid_argument(concat("argument '", what, "' has dtype ", c10::toString(t.scalar_type()),
                                           ", the allowed dtype is float32"));
  if (!t.device().is_cpu())
    throw commsgd::invalid_argument(
        concat("argument '", what, "' is on device ", t.device().str(), ", the allowed device is cpu"));
  if (!t.is_contiguous()) throw commsgd::invalid_argument(concat("argument '", what, "' is not contiguous"));
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
}

inline at::Tensor tensor_of(std::span<const float> v) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(v.size())}, at::TensorOptions().dtype(at::kFloat));
  std::copy(v.begin(), v.end(), t.data_ptr<float>());
  return t;
}

// A rank's traffic as the dict Python reads (comm::traffic's fields).
inline py::dict traffic_as_dict(const commsgd::comm::traffic& t) {
  py::dict d;
  d["bytes_sent"] = t.bytes_sent;
  d["bytes_received"] = t.bytes_received;
  d["messages_sent"] = t.messages_sent;
  d["messages_received"] = t.messages_received;
  return d;
}

// What a state's meter counted, with its count of collective calls.
inline py::dict traffic_dict(const meter& m) {
  const auto t = m.counters().total();
  py::dict d = traffic_as_dict(t);
  d["calls"] = t.calls;
  return d;
}

// A state's counters, read (or reset) once the rounds it has queued are done, so they include them.
inline py::dict traffic_when_done(exchange_queue& queue, const meter& m) {
  queue.drain();
  return traffic_dict(m);
}
inline void reset_when_done(exchange_queue& queue, meter& m) {
  queue.drain();
  m.reset();
}

// The keys of a state's per-bucket map, once the rounds it has queued are done.
template <class Map>
std::vector<typename Map::key_type> keys_when_done(exchange_queue& queue, const Map& buckets) {
  queue.drain();
  std::vector<typename Map::key_type> k;
  for (const auto& entry : buckets)
    k.push_back(entry.first);
  return k;
}

// The bindings every state shares: its traffic readings and, for the states with a dense phase, the dense
// rounds (average waits for its round without the GIL; average_async returns the future at once).
template <class State>
py::class_<State>& def_metered(py::class_<State>& c) {
  return c.def("traffic", &State::traffic).def("reset_traffic", &State::reset_traffic);
}
template <class State>
py::class_<State>& def_dense_rounds(py::class_<State>& c) {
  return def_metered(c)
      .def("average", &State::average, py::call_guard<py::gil_scoped_release>())
      .def("average_async", &State::average_async);
}

// A compressing state's rounds: exchange(buffer, index, <layout>) waits without the GIL, exchange_async
// returns the future at once; `layout` names the argument that describes the bucket's parameters.
template <class State>
py::class_<State>& def_bucket_rounds(py::class_<State>& c, const char* layout) {
  return def_dense_rounds(c)
      .def("exchange", &State::exchange, py::arg("buffer"), py::arg("index"), py::arg(layout),
           py::call_guard<py::gil_scoped_release>())
      .def("exchange_async", &State::exchange_async, py::arg("buffer"), py::arg("index"), py::arg(layout));
}

// The bucket's mean over ranks, in place (the iterations before compression starts), returned. Touches no
// Python object, so it runs on a state's exchange_queue.
inline at::Tensor average_bucket(meter& comm, const at::Tensor& buffer) {
  auto v = values_of(buffer, "bucket");
  comm.all_reduce_sum(v);
  buffer.div_(static_cast<double>(comm.size()));
  return buffer;
}

} // namespace commsgd_torch
