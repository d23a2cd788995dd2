// commsgd_torch._cuda.DiLoCoFragment: one DiLoCo fragment's round on device parameters
// (cuda::diloco_fragment, bit for bit the host engine's), behind commsgd_torch.DiLoCo's device round
// (python/commsgd_torch/_device_round.py), which runs the engine's schedule and moves the messages over
// torch.distributed.
//
// As in cuda_top_k.cu, no torch header: tensors come in as data pointers and streams as handles, every call is
// ordered on the stream it is given, and only verdict() waits for the device.
#include <commsgd/cuda.cuh>
#include <commsgd/error.hpp>
#include <commsgd/sync/diloco_codes.hpp>

#include "cuda_handles.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace py = pybind11;
using namespace commsgd;

namespace {

namespace cu = commsgd::cuda;
using runs_t = std::vector<std::pair<std::size_t, std::size_t>>;

template <class Code>
using owned = std::unique_ptr<cu::diloco_fragment<Code>>;
using any_fragment = std::variant<owned<cu::dense_code>, owned<compress::int8_code>,
                                  owned<compress::e3m0_code>, owned<cu::top_k_code>>;

using commsgd_torch_cuda::pointer_of;
using commsgd_torch_cuda::stream_of;

// Why a code, on a fragment of `length` values, has no device round (empty: it has one). The 16-bit codes
// sum in a ring that rounds at every hop and the flat-in-n top-k codes route their values through owners:
// both are the host engine's.
std::string why_not_on_device(const sync::diloco_code& c, std::uint64_t length) {
  switch (c.format) {
  case sync::diloco_format::dense:
  case sync::diloco_format::int8:
  case sync::diloco_format::e3m0:
    return {};
  case sync::diloco_format::fp16:
  case sync::diloco_format::bf16:
    return "the 16-bit codes sum in a ring that rounds at every hop, on the host";
  case sync::diloco_format::top_k:
    if (c.shared || c.regions) return "the flat-in-n top-k codes (-shared, -regions) run on the host";
    if ((c.chunk == 0 ? length : c.chunk) > cu::detail::diloco::top_k_max_chunk)
      return commsgd::concat("the device round takes top-k chunks of at most ",
                             cu::detail::diloco::top_k_max_chunk, " values (-c<chunk>), not ",
                             c.chunk == 0 ? length : c.chunk);
    return {};
  }
  return "an unknown code";
}

class fragment {
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit([&](auto& p) -> decltype(auto) { return f(*p); }, f_);
  }

public:
  fragment(const runs_t& runs, const std::string& code, float lr, float momentum, float alpha) {
    const auto c = sync::diloco_code::parse(code);
    std::uint64_t length = 0;
    for (const auto& r : runs)
      length += r.second;
    if (const auto why = why_not_on_device(c, length); !why.empty())
      throw unsupported(commsgd::concat("DiLoCoFragment: code '", code, "' has no device round: ", why));
    const cu::diloco_fragment_options o{.lr = lr, .momentum = momentum, .alpha = alpha};
    switch (c.format) {
    case sync::diloco_format::dense:
      f_ = std::make_unique<cu::diloco_fragment<cu::dense_code>>(runs, o);
      break;
    case sync::diloco_format::int8:
      f_ = std::make_unique<cu::diloco_fragment<compress::int8_code>>(runs, o);
      break;
    case sync::diloco_format::e3m0:
      f_ = std::make_unique<cu::diloco_fragment<compress::e3m0_code>>(runs, o);
      break;
    default: {
      auto t = o;
      t.top_k = {.density = c.density,
                 .two_bit = c.two_bit,
                 .chunk = c.chunk,
                 .decay = static_cast<float>(c.decay),
                 .sender_mean = c.sender_mean};
      f_ = std::make_unique<cu::diloco_fragment<cu::top_k_code>>(runs, t);
    }
    }
  }

  std::size_t length() const {
    return visit([](auto& f) { return f.length(); });
  }
  std::size_t message_bytes() const {
    return visit([](auto& f) { return f.message_bytes(); });
  }
  // Whether apply() takes the sum of the messages (an all-reduce's) rather than the messages gathered.
  bool summed() const { return std::holds_alternative<owned<cu::dense_code>>(f_); }
  bool has_residual() const { return std::holds_alternative<owned<cu::top_k_code>>(f_); }
  bool has_velocity() const {
    return visit([](auto& f) { return f.velocity() != nullptr; });
  }

  void start(std::uintptr_t params, std::uintptr_t stream) {
    visit([&](auto& f) { f.start(pointer_of<const float>(params), stream_of(stream)); });
  }
  // This rank's message into `out` (message_bytes() on the device).
  void encode(std::uintptr_t params, float weight, std::uintptr_t out, std::uintptr_t stream) {
    visit([&](auto& f) {
      f.encode(pointer_of<const float>(params), weight, stream_of(stream));
      cu::check(cudaMemcpyAsync(pointer_of<void>(out), f.message(), f.message_bytes(),
                                cudaMemcpyDeviceToDevice, stream_of(stream)),
                "cudaMemcpyAsync");
    });
  }
  void apply(std::uintptr_t in, int n, std::uintptr_t params, std::uintptr_t stream) {
    visit([&](auto& f) {
      f.apply(pointer_of<const std::byte>(in), n, pointer_of<float>(params), stream_of(stream));
    });
  }
  // (own, own_first, sum, sum_first, corrupt): what the last encode and apply counted. Waits for the stream.
  py::tuple verdict(std::uintptr_t stream) const {
    cu::diloco_verdict v;
    {
      py::gil_scoped_release unlocked;
      v = visit([&](auto& f) { return f.verdict(stream_of(stream)); });
    }
    return py::make_tuple(v.own, v.own_first, v.sum, v.sum_first, v.corrupt);
  }
  void commit() {
    visit([](auto& f) { f.commit(); });
  }
  // The common model, the momentum and the residual (e, r) into `out` (length() floats each on the device).
  void global_into(std::uintptr_t out, std::uintptr_t stream) const { copy(out, part::global, stream); }
  void velocity_into(std::uintptr_t out, std::uintptr_t stream) const { copy(out, part::velocity, stream); }
  void residual_into(std::uintptr_t out, std::uintptr_t low, std::uintptr_t stream) const {
    copy(out, part::residual, stream);
    copy(low, part::residual_low, stream);
  }
  void load(std::uintptr_t global, std::uintptr_t velocity, std::uintptr_t residual, std::uintptr_t low,
            std::uintptr_t stream) {
    visit([&](auto& f) {
      f.load_device(pointer_of<const float>(global), pointer_of<const float>(velocity),
                    pointer_of<const float>(residual), pointer_of<const float>(low), stream_of(stream));
    });
  }

private:
  enum class part { global, velocity, residual, residual_low };
  void copy(std::uintptr_t out, part which, std::uintptr_t stream) const {
    visit([&](auto& f) {
      const float* from = which == part::global     ? f.global()
                          : which == part::velocity ? f.velocity()
                          : which == part::residual ? f.residual()
                                                    : f.residual_low();
      if (from == nullptr)
        throw invalid_argument(
            "DiLoCoFragment: this fragment keeps no such state (no momentum, or not top-k)");
      cu::check(cudaMemcpyAsync(pointer_of<float>(out), from, f.length() * 4, cudaMemcpyDeviceToDevice,
                                stream_of(stream)),
                "cudaMemcpyAsync");
    });
  }

  any_fragment f_;
};

} // namespace

void bind_diloco_fragment(py::module_& m) {
  m.def(
      "diloco_device_refusal",
      [](const std::string& code, std::uint64_t length) {
        return why_not_on_device(sync::diloco_code::parse(code), length);
      },
      py::arg("compression"), py::arg("length"),
      "Why `compression` has no device round on a fragment of `length` values ('' when it has one).");
  py::class_<fragment>(m, "DiLoCoFragment")
      .def(py::init<const runs_t&, const std::string&, float, float, float>(), py::arg("runs"),
           py::arg("compression"), py::arg("outer_lr"), py::arg("outer_momentum"), py::arg("alpha"))
      .def_property_readonly("length", &fragment::length)
      .def_property_readonly("message_bytes", &fragment::message_bytes)
      .def_property_readonly("summed", &fragment::summed)
      .def_property_readonly("has_residual", &fragment::has_residual)
      .def_property_readonly("has_velocity", &fragment::has_velocity)
      .def("start", &fragment::start, py::arg("params_ptr"), py::arg("stream"))
      .def("encode", &fragment::encode, py::arg("params_ptr"), py::arg("weight"), py::arg("out_ptr"),
           py::arg("stream"))
      .def("apply", &fragment::apply, py::arg("in_ptr"), py::arg("ranks"), py::arg("params_ptr"),
           py::arg("stream"))
      .def("verdict", &fragment::verdict, py::arg("stream"))
      .def("commit", &fragment::commit)
      .def("global_into", &fragment::global_into, py::arg("out_ptr"), py::arg("stream"))
      .def("velocity_into", &fragment::velocity_into, py::arg("out_ptr"), py::arg("stream"))
      .def("residual_into", &fragment::residual_into, py::arg("out_ptr"), py::arg("low_ptr"),
           py::arg("stream"))
      .def("load", &fragment::load, py::arg("global_ptr"), py::arg("velocity_ptr"), py::arg("residual_ptr"),
           py::arg("low_ptr"), py::arg("stream"));
}
