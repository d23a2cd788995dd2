// commsgd_torch._C.ReduceScatter: compress::int8_reduce_scatter, e3m0_reduce_scatter, fp16_reduce_scatter or
// bf16_reduce_scatter over a metered comm::process_group, behind commsgd_torch.fsdp.CompressedReduceScatter
// (FSDP2's custom reduce-scatter).
//
// One object serves one FSDP2 parameter group: one flat input a backward, the same length every time, so
// the state (the error-feedback residual over the whole input, the step count) is the object's. The round
// runs on the calling thread with the GIL released: FSDP2 waits for the result before it goes on.
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "bridge.hpp"

#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/process_group.hpp>
#include <commsgd/compress/block_reduce_scatter.hpp>
#include <commsgd/compress/half_reduce_scatter.hpp>
#include <commsgd/cost/compress.hpp>

#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <variant>

namespace py = pybind11;
using namespace commsgd;

namespace {

using namespace commsgd_torch;
using any_scatter = std::variant<compress::int8_reduce_scatter, compress::e3m0_reduce_scatter,
                                 compress::fp16_reduce_scatter, compress::bf16_reduce_scatter>;

// Bits a value of `code`, or an error naming it.
unsigned bits_of(const std::string& code) {
  if (code == "int8") return 8;
  if (code == "e3m0") return 4;
  if (code == "fp16" || code == "bf16") return 16;
  throw invalid_argument(
      commsgd::concat("argument 'code' = '", code, "' is not one of int8, e3m0, fp16, bf16"));
}

// What a rank sends a round: cost/compress.hpp's model of the code's reduce-scatter.
std::uint64_t wire_bytes_of(const std::string& code, std::uint64_t length, std::uint64_t block_size,
                            int world) {
  if (bits_of(code) == 16) return cost::half_reduce_scatter_traffic(length, world).bytes_sent;
  return cost::block_reduce_scatter_traffic(length, world, block_size, bits_of(code)).bytes_sent;
}

class reduce_scatter_state {
public:
  reduce_scatter_state(const std::string& code, std::int64_t block_size, bool error_feedback)
      : code_(code), error_feedback_(error_feedback) {
    bits_of(code);
    commsgd::check_range("block_size", block_size, std::int64_t{1}, std::numeric_limits<std::int64_t>::max(),
                         "[1, inf)");
    block_size_ = static_cast<std::size_t>(block_size);
  }

  // out (input / group size values) receives this rank's part of the sum over the group's ranks.
  void call(const at::Tensor& out, const at::Tensor& in, const group_ptr& group) {
    const auto g = values_of(in, "input_tensor");
    const auto o = values_of(out, "output_tensor");
    if (!comm_) {
      comm_.emplace(comm::process_group(group));
      group_ = group;
    } else if (group.get() != group_.get()) {
      throw unsupported("commsgd_torch ReduceScatter: called with another process group than its first; "
                        "use one object per FSDP2 module");
    }
    if (!x_) x_ = make(g.size());
    py::gil_scoped_release nogil;
    std::visit([&](auto& x) { x.reduce_scatter(*comm_, std::span<const float>(g), o); }, *x_);
  }

  bool started() const { return x_.has_value(); }
  std::uint64_t steps() const {
    return x_ ? std::visit([](const auto& x) { return x.steps(); }, *x_) : 0;
  }
  std::uint64_t wire_bytes() const {
    return x_ ? std::visit([](const auto& x) { return x.wire_bytes(); }, *x_) : 0;
  }
  // residual + residual_low is exactly what the messages held back, value by value.
  at::Tensor residual() const {
    return std::visit([](const auto& x) { return tensor_of(x.residual()); }, started_or_throw());
  }
  at::Tensor residual_low() const {
    return std::visit([](const auto& x) { return tensor_of(x.residual_low()); }, started_or_throw());
  }
  py::dict traffic() const {
    if (!comm_) return traffic_as_dict({});
    return traffic_dict(*comm_);
  }

  // The whole state as bytes (the compressor's versioned, checksummed stream), or None before the first round.
  py::object state() const {
    if (!x_) return py::none();
    std::ostringstream os;
    std::visit([&](const auto& x) { x.save(os); }, *x_);
    return py::bytes(os.str());
  }
  // All or nothing: a stream of another length, code or block size leaves the state as it was.
  void load_state(const py::object& s, std::int64_t length) {
    if (s.is_none()) {
      x_.reset();
      return;
    }
    if (length < 0)
      throw invalid_argument(
          commsgd::concat("argument 'length' = ", length, " is outside the allowed range [0, inf)"));
    auto x = make(static_cast<std::size_t>(length));
    std::istringstream is(s.cast<std::string>());
    std::visit([&](auto& c) { c.load(is); }, x);
    x_ = std::move(x);
  }
  std::int64_t length() const {
    return x_ ? static_cast<std::int64_t>(std::visit([](const auto& x) { return x.length(); }, *x_)) : -1;
  }

private:
  any_scatter make(std::size_t length) const {
    const compress::block_quant_options o{.block_size = block_size_, .error_feedback = error_feedback_};
    // 16-bit values need no scale: block_size does not apply to them. An overflow of the format is refused.
    const compress::half_options h{.error_feedback = error_feedback_};
    if (code_ == "int8") return compress::int8_reduce_scatter(length, o);
    if (code_ == "e3m0") return compress::e3m0_reduce_scatter(length, o);
    if (code_ == "fp16") return compress::fp16_reduce_scatter(length, h);
    return compress::bf16_reduce_scatter(length, h);
  }
  const any_scatter& started_or_throw() const {
    if (!x_)
      throw invalid_argument("commsgd_torch ReduceScatter: no round has run, so there is no residual yet");
    return *x_;
  }

  std::string code_;
  std::size_t block_size_ = 256;
  bool error_feedback_ = true;
  group_ptr group_;
  std::optional<meter> comm_;
  std::optional<any_scatter> x_;
};

} // namespace

void bind_reduce_scatter(py::module_& m) {
  py::class_<reduce_scatter_state>(m, "ReduceScatter")
      .def(py::init<const std::string&, std::int64_t, bool>(), py::arg("code"), py::arg("block_size"),
           py::arg("error_feedback"))
      .def("__call__", &reduce_scatter_state::call, py::arg("output"), py::arg("input"),
           py::arg("process_group"))
      .def("started", &reduce_scatter_state::started)
      .def("steps", &reduce_scatter_state::steps)
      .def("wire_bytes", &reduce_scatter_state::wire_bytes)
      .def("residual", &reduce_scatter_state::residual)
      .def("residual_low", &reduce_scatter_state::residual_low)
      .def("traffic", &reduce_scatter_state::traffic)
      .def("length", &reduce_scatter_state::length)
      .def("state", &reduce_scatter_state::state)
      .def("load_state", &reduce_scatter_state::load_state, py::arg("state"), py::arg("length"));
  m.def(
      "reduce_scatter_wire_bytes",
      [](const std::string& code, std::uint64_t length, std::uint64_t block_size, int world) {
        return wire_bytes_of(code, length, block_size, world);
      },
      py::arg("code"), py::arg("length"), py::arg("block_size"), py::arg("world"));
}
