// commsgd_torch._C.DiLoCoEngine: sync::coded_diloco (sync/diloco.hpp, the one DiLoCo engine) over a
// process group, behind commsgd_torch.DiLoCo (python/commsgd_torch/diloco.py). The Python class keeps the
// parameters in one flat float32 host tensor and calls advance() after each inner step; the engine runs the
// schedule, the codes, the outer step and the merge on that tensor in place, its exchanges on its own thread,
// every call that may wait on the network without the GIL.
//
// The codes' names and sizes (sync/diloco_codes.hpp) and the ring's traffic (comm/traffic.hpp) are exported as
// plain functions, so Python reads them instead of writing them again.
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "bridge.hpp"

#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/sync/coded_diloco.hpp>
#include <commsgd/sync/diloco_codes.hpp>

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;
using namespace commsgd;

namespace {

using namespace commsgd_torch;

state::part part_of(const std::string& name) {
  if (name == "all") return state::part::all;
  if (name == "shared") return state::part::shared;
  if (name == "local") return state::part::local;
  throw invalid_argument(commsgd::concat("argument 'part' = '", name, "' is not one of all, shared, local"));
}

sync::fragment_layout layout_of(const std::string& name) {
  if (name == "strided") return sync::fragment_layout::strided;
  if (name == "contiguous") return sync::fragment_layout::contiguous;
  throw invalid_argument(
      commsgd::concat("argument 'layout' = '", name, "' is not one of strided, contiguous"));
}

// The engine's options as Python passes them, read into the engine's types by parse(): the engine and
// diloco_over_threads take the same options, so they are listed, named and checked here alone (the numeric
// ranges by sync::diloco itself).
struct engine_options {
  int sync_every;
  int fragments;
  int delay;
  float alpha;
  std::string layout;
  float outer_lr;
  float outer_momentum;
  std::string code;
  bool keep_delay_steps;

  sync::diloco_options parse() const {
    return {.sync_every = sync_every,
            .fragments = fragments,
            .delay = delay,
            .alpha = alpha,
            .keep_delay_steps = keep_delay_steps,
            .layout = layout_of(layout),
            .outer = {.lr = outer_lr, .momentum = outer_momentum}};
  }
  sync::diloco_code parse_code() const { return sync::diloco_code::parse(code); }
};

// A binding's function taking the arguments `Head` and then the options one by one, as Python passes them,
// from `f`, which takes them gathered in an engine_options.
template <class... Head, class F>
auto taking_options(F f) {
  return [f](Head... head, int sync_every, int fragments, int delay, float alpha, std::string layout,
             float outer_lr, float outer_momentum, std::string code, bool keep_delay_steps) {
    return f(std::forward<Head>(head)...,
             engine_options{sync_every, fragments, delay, alpha, std::move(layout), outer_lr, outer_momentum,
                            std::move(code), keep_delay_steps});
  };
}

// Calls `def` with the options' Python names, in taking_options' order.
template <class Def>
void with_option_args(Def def) {
  def(py::arg("sync_every"), py::arg("fragments"), py::arg("delay"), py::arg("alpha"), py::arg("layout"),
      py::arg("outer_lr"), py::arg("outer_momentum"), py::arg("compression"),
      py::arg("keep_delay_steps") = false);
}

class diloco_engine {
public:
  diloco_engine(const group_ptr& group, std::vector<std::size_t> layer_sizes, const engine_options& o)
      : comm_(comm::process_group(group)), engine_(comm_, std::move(layer_sizes), o.parse(), o.parse_code()) {
  }

  void start(const at::Tensor& flat, bool broadcast) {
    auto x = values_of(flat, "flat");
    py::gil_scoped_release unlocked;
    engine_.start(x, broadcast);
  }
  // A new membership: the engine's exchanges go to `group` from the next one (none may be in flight).
  void rebind(const group_ptr& group) {
    for (std::size_t p = 0; p < engine_.num_fragments(); ++p)
      if (engine_.in_flight(p))
        throw invalid_argument(
            commsgd::concat("DiLoCoEngine.rebind: fragment ", p,
                            "'s exchange is in flight; the allowed time is between exchanges"));
    py::gil_scoped_release unlocked;
    comm_ = meter(comm::process_group(group));
    comm_.inner().set_timeout(timeout_);
    engine_.rebind(comm_);
  }
  // Every exchange's operations from the next one on fail after `seconds` without an answer (0: the group's
  // own timeout); kept across rebind().
  void set_timeout(double seconds) {
    comm_.inner().set_timeout(seconds);
    timeout_ = seconds;
  }
  // The deadline each operation gets now, in seconds (the group's own until set_timeout; 0 where torch does
  // not report the group's).
  double timeout() noexcept { return comm_.inner().timeout(); }
  // This rank's pseudo-gradients scaled by w from the next exchange on (a weighted mean; see sync::diloco).
  void set_weight(float w) { engine_.set_weight(w); }
  float weight() const { return engine_.weight(); }
  // (exchanged, applied): whether an exchange started or was applied after this step.
  std::pair<bool, bool> advance(const at::Tensor& flat) {
    auto x = values_of(flat, "flat");
    py::gil_scoped_release unlocked;
    const auto r = engine_.advance(x);
    return {r.exchanged, r.averaged};
  }
  void finish(const at::Tensor& flat) {
    auto x = values_of(flat, "flat");
    py::gil_scoped_release unlocked;
    engine_.finish(x);
  }

  void drain() {
    py::gil_scoped_release unlocked;
    engine_.drain();
  }
  std::vector<std::size_t> touched_next() const { return engine_.touched_next(); }
  std::vector<std::size_t> applied_next() const { return engine_.applied_next(); }
  std::int64_t steps() const { return engine_.steps(); }
  std::uint64_t bytes_sent() const { return engine_.bytes_sent(); }
  std::uint64_t exchanges_started() const { return engine_.exchanges_started(); }
  std::uint64_t exchanges_applied() const { return engine_.exchanges_applied(); }
  std::size_t num_fragments() const { return engine_.num_fragments(); }
  std::vector<std::pair<std::size_t, std::size_t>> fragment_runs(std::size_t p) const {
    check_fragment(p);
    const auto r = engine_.fragment_runs(p);
    return {r.begin(), r.end()};
  }
  at::Tensor global_model(std::size_t p) const {
    check_fragment(p);
    return tensor_of(engine_.global_model(p));
  }
  at::Tensor outer_velocity(std::size_t p) const {
    check_fragment(p);
    return tensor_of(engine_.outer_velocity(p));
  }
  py::object residual(std::size_t p) const {
    check_fragment(p);
    if (engine_.code().format != sync::diloco_format::top_k) return py::none();
    return py::cast(tensor_of(engine_.residual(p)));
  }
  bool in_flight(std::size_t p) const {
    check_fragment(p);
    return engine_.in_flight(p);
  }
  std::string code() const { return engine_.code().name(); }

  // The whole state (shared and local parts), as bytes; waits for the exchanges in flight.
  // part: "all" (the whole state), "shared" (what every rank holds alike) or "local" (this rank's residuals).
  py::bytes save(const std::string& part) {
    std::ostringstream os(std::ios::binary);
    const auto p = part_of(part);
    {
      py::gil_scoped_release unlocked;
      engine_.save(os, p);
    }
    return py::bytes(std::move(os).str());
  }
  void load(const py::bytes& blob) {
    std::istringstream is(static_cast<std::string>(blob), std::ios::binary);
    py::gil_scoped_release unlocked;
    engine_.load(is);
  }
  // A peer's shared part with this rank's own local part: how a replica that joins takes the live state.
  void load_parts(const py::bytes& shared, const py::bytes& local) {
    std::istringstream a(static_cast<std::string>(shared), std::ios::binary);
    std::istringstream b(static_cast<std::string>(local), std::ios::binary);
    py::gil_scoped_release unlocked;
    engine_.load(a, b);
  }
  py::dict traffic() const { return traffic_dict(comm_); }

private:
  void check_fragment(std::size_t p) const {
    commsgd::check_range("fragment", p, std::size_t{0}, engine_.num_fragments() - 1,
                         commsgd::concat("[0, ", engine_.num_fragments() - 1, "]"));
  }

  meter comm_;
  double timeout_ = 0.0;             // set_timeout's, for the groups rebind() moves to
  sync::coded_diloco<meter> engine_; // after comm_: destroyed first, its exchange thread drained
};

// The engine on n thread ranks (comm::local), fed each rank's local parameters after every inner step:
// trajectories[r] is a (steps + 1) x d float32 tensor, row 0 the parameters at start, row s those after inner
// step s. Returns, per rank, the global model after every step (steps x d, fragment after fragment) and the
// bytes sent so far (steps values): what a run of DiLoCo over another transport must reproduce bit for bit
// when its ranks took those inner steps.
py::list diloco_over_threads(const std::vector<at::Tensor>& trajectories,
                             std::vector<std::size_t> layer_sizes, const engine_options& options) {
  const int n = static_cast<int>(trajectories.size());
  commsgd::check_range("trajectories", n, 1, 64, "[1, 64] ranks");
  std::int64_t steps = 0, d = 0;
  std::vector<const float*> rows(trajectories.size());
  for (std::size_t r = 0; r < trajectories.size(); ++r) {
    const auto& t = trajectories[r];
    if (t.dim() != 2 || (r > 0 && (t.size(0) != steps + 1 || t.size(1) != d)))
      throw invalid_argument("argument 'trajectories' must be 2-d tensors of one shape, (steps + 1) x d");
    steps = t.size(0) - 1;
    d = t.size(1);
    rows[r] = values_of(t, "trajectories").data();
  }
  std::vector<at::Tensor> globals, sent;
  for (int r = 0; r < n; ++r) {
    globals.push_back(at::zeros({steps, d}, at::TensorOptions().dtype(at::kFloat)));
    sent.push_back(at::zeros({steps}, at::TensorOptions().dtype(at::kLong)));
  }
  const auto o = options.parse();
  const auto parsed = options.parse_code();
  {
    py::gil_scoped_release unlocked;
    comm::local_group(n).run([&](comm::local& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      sync::coded_diloco<comm::local> e(c, layer_sizes, o, parsed);
      std::vector<float> x(rows[r], rows[r] + d);
      e.start(x);
      float* g = globals[r].data_ptr<float>();
      for (std::int64_t s = 1; s <= steps; ++s) {
        std::copy_n(rows[r] + s * d, d, x.begin());
        e.advance(x);
        float* at = g + (s - 1) * d;
        for (std::size_t p = 0; p < e.num_fragments(); ++p) {
          const auto gm = e.global_model(p);
          at = std::copy(gm.begin(), gm.end(), at);
        }
        sent[r].data_ptr<std::int64_t>()[s - 1] = static_cast<std::int64_t>(e.bytes_sent());
      }
    });
  }
  py::list out;
  for (int r = 0; r < n; ++r)
    out.append(py::make_tuple(globals[static_cast<std::size_t>(r)], sent[static_cast<std::size_t>(r)]));
  return out;
}

} // namespace

void bind_diloco(py::module_& m) {
  py::class_<diloco_engine> engine(m, "DiLoCoEngine");
  with_option_args([&](auto... options) {
    engine.def(py::init(taking_options<const group_ptr&, std::vector<std::size_t>>(
                   [](const group_ptr& group, std::vector<std::size_t> layer_sizes, const engine_options& o) {
                     return std::make_unique<diloco_engine>(group, std::move(layer_sizes), o);
                   })),
               py::arg("process_group"), py::arg("layer_sizes"), options...);
    m.def("diloco_over_threads",
          taking_options<const std::vector<at::Tensor>&, std::vector<std::size_t>>(diloco_over_threads),
          py::arg("trajectories"), py::arg("layer_sizes"), options...);
  });
  engine.def("start", &diloco_engine::start, py::arg("flat"), py::arg("broadcast") = true)
      .def("rebind", &diloco_engine::rebind, py::arg("process_group"))
      .def("set_timeout", &diloco_engine::set_timeout, py::arg("seconds"))
      .def("timeout", &diloco_engine::timeout)
      .def("set_weight", &diloco_engine::set_weight, py::arg("weight"))
      .def("weight", &diloco_engine::weight)
      .def("advance", &diloco_engine::advance)
      .def("finish", &diloco_engine::finish)
      .def("drain", &diloco_engine::drain)
      .def("touched_next", &diloco_engine::touched_next)
      .def("applied_next", &diloco_engine::applied_next)
      .def("steps", &diloco_engine::steps)
      .def("bytes_sent", &diloco_engine::bytes_sent)
      .def("exchanges_started", &diloco_engine::exchanges_started)
      .def("exchanges_applied", &diloco_engine::exchanges_applied)
      .def("num_fragments", &diloco_engine::num_fragments)
      .def("fragment_runs", &diloco_engine::fragment_runs)
      .def("global_model", &diloco_engine::global_model)
      .def("outer_velocity", &diloco_engine::outer_velocity)
      .def("residual", &diloco_engine::residual)
      .def("in_flight", &diloco_engine::in_flight)
      .def("code", &diloco_engine::code)
      .def("save", &diloco_engine::save, py::arg("part") = "all")
      .def("load", &diloco_engine::load)
      .def("load_parts", &diloco_engine::load_parts, py::arg("shared"), py::arg("local"))
      .def("traffic", &diloco_engine::traffic);

  // The codes (sync/diloco_codes.hpp) and the collectives' traffic (comm/traffic.hpp), for Python's byte counts.
  // The list of forms and the refusal's text too: a new code reaches Python with no edit here or there.
  m.def("diloco_code_forms", [] {
    std::vector<std::string> out;
    for (const auto f : sync::diloco_code_forms())
      out.emplace_back(f);
    return out;
  });
  m.def("diloco_codes_allowed", [] { return sync::diloco_codes_allowed(); });
  m.def(
      "diloco_code_name", [](const std::string& text) { return sync::diloco_code::parse(text).name(); },
      py::arg("compression"));
  m.def(
      "diloco_code_chosen",
      [](const std::string& code, std::uint64_t d, int n) {
        commsgd::check_range("ranks", n, 1, std::numeric_limits<int>::max(), "[1, 2^31 - 1]");
        return sync::diloco_code::parse(code).chosen(d, n).name();
      },
      py::arg("compression"), py::arg("values"), py::arg("ranks"));
  m.def(
      "diloco_code_unit", [](const std::string& code) { return sync::diloco_code::parse(code).unit(); },
      py::arg("compression"));
  m.def(
      "diloco_message_bytes",
      [](const std::string& code, std::uint64_t d) {
        return sync::diloco_code::parse(code).message_bytes(d);
      },
      py::arg("compression"), py::arg("values"));
  m.def(
      "diloco_round_traffic",
      [](const std::string& code, std::uint64_t d, int n, int rank, bool first_round) {
        return traffic_as_dict(sync::diloco_code::parse(code).round_traffic(d, n, rank, first_round));
      },
      py::arg("compression"), py::arg("values"), py::arg("ranks"), py::arg("rank"), py::arg("first_round"));
  m.def(
      "diloco_fragment_runs",
      [](const std::vector<std::size_t>& layer_sizes, std::size_t fragments, const std::string& layout) {
        commsgd::check_range("fragments", fragments, std::size_t{1},
                             std::max<std::size_t>(1, layer_sizes.size()),
                             commsgd::concat("[1, number of layers = ", layer_sizes.size(), "]"));
        return sync::fragment_runs_of(layer_sizes, fragments, layout_of(layout));
      },
      py::arg("layer_sizes"), py::arg("fragments"), py::arg("layout"));
  m.def(
      "broadcast_traffic",
      [](std::uint64_t bytes, int n, int rank, int root) {
        return traffic_as_dict(comm::broadcast_traffic(bytes, n, rank, root));
      },
      py::arg("bytes"), py::arg("ranks"), py::arg("rank"), py::arg("root") = 0);
  m.def(
      "ring_all_reduce_traffic",
      [](std::uint64_t elements, std::size_t element_size, int n, int rank) {
        return traffic_as_dict(comm::ring_all_reduce_traffic(elements, element_size, n, rank));
      },
      py::arg("elements"), py::arg("element_size"), py::arg("ranks"), py::arg("rank"));
  m.def(
      "all_gather_traffic",
      [](std::uint64_t bytes, int n) { return traffic_as_dict(comm::all_gather_traffic(bytes, n)); },
      py::arg("bytes"), py::arg("ranks"));
}
