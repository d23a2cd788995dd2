// commsgd_torch._cuda: commsgd::cuda::batched_top_k behind one Python class, for CUDA buckets of TopKState
// (python/commsgd_torch/cuda_topk.py); the module also holds DiLoCo's device round (cuda_diloco.cu).
//
// No torch header reaches this file: tensors come in as data pointers and streams as handles, so the module
// builds wherever nvcc and pybind11 are, whatever torch (CPU-only included) the package is built against,
// and the device code never meets torch's CUDA version. The caller owns the device and the stream: the step
// runs on the current device, on the stream it is given, and never synchronises the host.
//
// The module is compiled as one unit, cuda_module.cu, which includes this file and cuda_diloco.cu.
//
// Errors are the package's own classes (commsgd_torch.NonFinite and the like), looked up in commsgd_torch._C
// when one is raised, so this module has no order of import to keep.
#include <commsgd/cuda.cuh>
#include <commsgd/error.hpp>

#include "cuda_handles.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace py = pybind11;
using namespace commsgd;

namespace {

template <class G>
using batched = std::unique_ptr<commsgd::cuda::batched_top_k<G>>;
using any_batched = std::variant<batched<float>, batched<__half>, batched<__nv_bfloat16>>;

using commsgd_torch_cuda::pointer_of;
using commsgd_torch_cuda::stream_of;

class top_k {
  // Calls f on the step of this dtype (the pointer is const, the step is not: the Python object owns it).
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit([&](auto& p) -> decltype(auto) { return f(*p); }, s_);
  }

public:
  top_k(const std::vector<std::size_t>& lengths, double density, double momentum, const std::string& rule,
        const std::string& dtype) {
    commsgd::cuda::batched_top_k_options o;
    o.density = density;
    o.momentum = momentum;
    if (rule == "dgc")
      o.masking = sparsify::momentum_masking::dgc;
    else if (rule == "keep")
      o.masking = sparsify::momentum_masking::keep;
    else
      throw invalid_argument(
          commsgd::concat("argument 'momentum_rule' = '", rule, "' is not one of dgc, keep"));
    if (dtype == "float32")
      s_ = std::make_unique<commsgd::cuda::batched_top_k<float>>(lengths, o);
    else if (dtype == "float16")
      s_ = std::make_unique<commsgd::cuda::batched_top_k<__half>>(lengths, o);
    else if (dtype == "bfloat16")
      s_ = std::make_unique<commsgd::cuda::batched_top_k<__nv_bfloat16>>(lengths, o);
    else
      throw invalid_argument(
          commsgd::concat("argument 'dtype' = '", dtype, "' is not one of float32, float16, bfloat16"));
    dtype_ = dtype;
  }

  std::size_t total_k() const {
    return visit([](auto& s) { return s.total_k(); });
  }
  std::size_t length() const {
    return visit([](auto& s) { return s.length(); });
  }
  std::size_t tensors() const {
    return visit([](auto& s) { return s.tensors(); });
  }
  std::size_t k(std::size_t t) const {
    return visit([&](auto& s) { return s.k(t); });
  }
  std::size_t message_offset(std::size_t t) const {
    return visit([&](auto& s) { return s.message_offset(t); });
  }
  bool has_momentum() const {
    return visit([](auto& s) { return s.has_momentum(); });
  }
  const std::string& dtype() const { return dtype_; }

  void step(std::uintptr_t grad, std::uintptr_t index, std::uintptr_t value, std::uintptr_t stream) {
    visit([&](auto& s) {
      using G = typename std::remove_reference_t<decltype(s)>::gradient_type;
      s.step(pointer_of<const G>(grad), pointer_of<std::uint32_t>(index), pointer_of<float>(value),
             stream_of(stream));
    });
  }
  void check_refused(std::uintptr_t stream) {
    visit([&](auto& s) { s.check_refused(stream_of(stream)); });
  }
  void check_last_step() {
    visit([](auto& s) { s.check_last_step(); });
  }
  void residual_into(std::uintptr_t out, std::uintptr_t stream) const {
    visit([&](auto& s) { s.residual_into(pointer_of<float>(out), stream_of(stream)); });
  }
  void momentum_into(std::uintptr_t out, std::uintptr_t stream) const {
    visit([&](auto& s) { s.momentum_into(pointer_of<float>(out), stream_of(stream)); });
  }
  void assign(std::uintptr_t residual, std::uintptr_t momentum, std::uint64_t steps, std::uintptr_t stream) {
    visit([&](auto& s) {
      s.assign(pointer_of<const float>(residual), pointer_of<const float>(momentum), steps,
               stream_of(stream));
    });
  }
  void reset(std::uintptr_t stream) {
    visit([&](auto& s) { s.reset(stream_of(stream)); });
  }

  py::dict report(std::uintptr_t stream) const {
    const auto r = visit([&](auto& s) { return s.report(stream_of(stream)); });
    py::dict d;
    d["committed"] = r.committed;
    d["refused"] = r.refused;
    d["threshold"] = r.threshold;
    d["fast_steps"] = r.fast_steps;
    d["full_steps"] = r.full_steps;
    return d;
  }

  py::bytes save(std::uintptr_t stream) const {
    std::vector<std::byte> blob;
    visit([&](auto& s) { s.save(blob, stream_of(stream)); });
    return py::bytes(reinterpret_cast<const char*>(blob.data()), blob.size());
  }
  void load(const std::string& bytes, std::uintptr_t stream) {
    const std::span<const std::byte> blob(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
    visit([&](auto& s) { s.load(blob, stream_of(stream)); });
  }

private:
  any_batched s_;
  std::string dtype_;
};

// The package's exception class for a commsgd error, most derived first (internal_error has none of its own).
void raise_as(const char* name, const std::exception& e) {
  py::object cls = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  try {
    cls = py::module_::import("commsgd_torch._C").attr(name);
  } catch (py::error_already_set&) { // a module imported without its package: still a RuntimeError
  }
  PyErr_SetString(cls.ptr(), e.what());
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const size_mismatch& e) {
    raise_as("SizeMismatch", e);
  } catch (const invalid_argument& e) {
    raise_as("InvalidArgument", e);
  } catch (const non_finite& e) {
    raise_as("NonFinite", e);
  } catch (const comm_error& e) {
    raise_as("CommError", e);
  } catch (const corrupt_data& e) {
    raise_as("CorruptData", e);
  } catch (const unsupported& e) {
    raise_as("Unsupported", e);
  } catch (const error& e) {
    raise_as("Error", e);
  }
}

} // namespace

void bind_diloco_fragment(py::module_& m); // cuda_diloco.cu

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "commsgd on CUDA: the batched top-k step of TopKState's CUDA buckets, DiLoCo's device round";
  py::register_local_exception_translator(translate);

  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<top_k>(m, "TopK")
      .def(
          py::init<const std::vector<std::size_t>&, double, double, const std::string&, const std::string&>(),
          py::arg("lengths"), py::arg("density"), py::arg("momentum") = 0.0, py::arg("momentum_rule") = "dgc",
          py::arg("dtype") = "float32")
      .def_property_readonly("total_k", &top_k::total_k)
      .def_property_readonly("length", &top_k::length)
      .def_property_readonly("tensors", &top_k::tensors)
      .def_property_readonly("has_momentum", &top_k::has_momentum)
      .def_property_readonly("dtype", &top_k::dtype)
      .def("k", &top_k::k, py::arg("t"))
      .def("message_offset", &top_k::message_offset, py::arg("t"))
      .def("step", &top_k::step, py::arg("grad_ptr"), py::arg("index_ptr"), py::arg("value_ptr"),
           py::arg("stream"), release())
      .def("check_refused", &top_k::check_refused, py::arg("stream") = 0, release())
      .def("check_last_step", &top_k::check_last_step, release())
      .def("residual_into", &top_k::residual_into, py::arg("ptr"), py::arg("stream"), release())
      .def("momentum_into", &top_k::momentum_into, py::arg("ptr"), py::arg("stream"), release())
      .def("assign", &top_k::assign, py::arg("residual_ptr"), py::arg("momentum_ptr"), py::arg("steps"),
           py::arg("stream"), release())
      .def("reset", &top_k::reset, py::arg("stream") = 0, release())
      .def("report", &top_k::report, py::arg("stream") = 0)
      .def("save", &top_k::save, py::arg("stream") = 0)
      .def("load", &top_k::load, py::arg("blob"), py::arg("stream") = 0);
  bind_diloco_fragment(m);
}
