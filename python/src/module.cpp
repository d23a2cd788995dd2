// commsgd_torch._C: the library behind the DDP communication hooks (python/commsgd_torch/: a .py file a hook,
// each over its binding here in src/).
//
// One file per hook state, each over its own comm::metered<comm::process_group> and its own exchange_queue
// (so a script reads the bytes this rank sent and received, and DDP gets a future at once):
//   topk.cpp         top-k with error feedback per bucket
//   local_sgd.cpp    sync::local_sgd for a trainer whose optimizer is torch's
//   powersgd.cpp     compress::powersgd per bucket
//   compressors.cpp  fp16, bf16 (a 16-bit ring all-reduce), sign, qsgd, random-k per bucket
//   auto.cpp         the step-time model and the automatic choice of exchange (plain functions)
//   diloco.cpp       sync::diloco, the DiLoCo engine behind commsgd_torch.DiLoCo, and the codes' sizes
//   reduce_scatter.cpp  int8 and e3m0 reduce-scatters behind commsgd_torch.fsdp (FSDP2's gradients)
// This file registers the library's exception types and the states.
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include <commsgd/error.hpp>

#include "exchange_queue.hpp"

namespace py = pybind11;

void bind_topk(py::module_& m);        // topk.cpp
void bind_local_sgd(py::module_& m);   // local_sgd.cpp
void bind_powersgd(py::module_& m);    // powersgd.cpp
void bind_compressors(py::module_& m); // compressors.cpp
void bind_auto(py::module_& m);        // auto.cpp
void bind_diloco(py::module_& m);      // diloco.cpp
void bind_reduce_scatter(py::module_& m); // reduce_scatter.cpp

PYBIND11_MODULE(_C, m) {
  m.doc() = "commsgd's communication-efficient exchanges behind DDP communication hooks";
  py::module::import("torch.distributed");

  // Registered base first: pybind11 tries the most recently registered translator first.
  auto& error = py::register_exception<commsgd::error>(m, "Error", PyExc_RuntimeError);
  auto& invalid = py::register_exception<commsgd::invalid_argument>(m, "InvalidArgument", error.ptr());
  py::register_exception<commsgd::size_mismatch>(m, "SizeMismatch", invalid.ptr());
  py::register_exception<commsgd::comm_error>(m, "CommError", error.ptr());
  py::register_exception<commsgd::corrupt_data>(m, "CorruptData", error.ptr());
  py::register_exception<commsgd::non_finite>(m, "NonFinite", error.ptr());
  py::register_exception<commsgd::unsupported>(m, "Unsupported", error.ptr());

  bind_topk(m);
  bind_local_sgd(m);
  bind_powersgd(m);
  bind_compressors(m);
  bind_auto(m);
  bind_diloco(m);
  bind_reduce_scatter(m);

  // Registered at import, so it runs after any atexit function a script registers later and before the
  // interpreter starts finalizing (see exchange_queue::drain_all).
  m.def("_drain_exchange_queues", &commsgd_torch::exchange_queue::drain_all,
        "Waits for every hook state's exchanges in flight (run at the interpreter's exit)");
  py::module_::import("atexit").attr("register")(m.attr("_drain_exchange_queues"));
}
