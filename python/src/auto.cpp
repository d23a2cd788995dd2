// The step-time model, the network model read from timed all-reduces and the automatic choice of exchange
// (cost/overlap.hpp, sync/measure_network.hpp, sync/choose_from_plans.hpp) for Python: a script measures its
// DDP step once with the dense hook and asks which hook to run. Plain numbers in and out, so this file needs
// pybind11 only, not torch's headers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <commsgd/cost/overlap.hpp>
#include <commsgd/sync/choose_from_plans.hpp>
#include <commsgd/sync/measure_network.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace py = pybind11;
namespace cost = commsgd::cost;
namespace csync = commsgd::sync;

namespace {

using matrix_list = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

commsgd::comm::network_model network(double latency_s, double bandwidth_bytes_per_s) {
  commsgd::comm::network_model net;
  net.latency_s = latency_s;
  net.bandwidth_bytes_per_s = bandwidth_bytes_per_s;
  return net;
}

// Python times torch.distributed's all-reduces on its own group; the model read from them is C++'s, the same
// arithmetic sync::measure_network applies to its own timings.
std::pair<double, double> fit_network(const std::vector<double>& small_s, const std::vector<double>& large_s,
                                      std::uint64_t large_floats) {
  const auto net = csync::fit_network(small_s, large_s, static_cast<std::size_t>(large_floats));
  return {net.latency_s, net.bandwidth_bytes_per_s};
}

py::dict overlapped_step(double forward_s, double backward_s, double optimizer_s,
                         const std::vector<std::tuple<double, double, double, double>>& buckets,
                         bool blocking) {
  cost::step_profile p{forward_s, backward_s, optimizer_s, {}};
  for (const auto& [ready, call, async, exchange] : buckets)
    p.buckets.push_back({ready, call, async, exchange});
  const auto s = cost::overlapped_step(p, blocking);
  py::dict d;
  d["total_s"] = s.total_s;
  d["backward_end_s"] = s.backward_end_s;
  d["exchange_end_s"] = s.exchange_end_s;
  d["exposed_s"] = s.exposed_s;
  return d;
}

double exchange_seconds(const std::string& candidate, std::uint64_t values, const matrix_list& matrices,
                        int n, double latency_s, double bandwidth_bytes_per_s) {
  return cost::exchange_seconds(candidate, {values, matrices}, n, network(latency_s, bandwidth_bytes_per_s));
}

py::dict choose(const std::vector<std::string>& candidates, double forward_s, double backward_s,
                double optimizer_s, const std::vector<double>& ready_s,
                const std::vector<std::pair<std::uint64_t, matrix_list>>& shapes,
                const std::map<std::string, std::vector<std::pair<double, double>>>& compute,
                const std::map<std::string, bool>& blocking, int n, double latency_s,
                double bandwidth_bytes_per_s, double margin,
                const std::map<std::string, double>& steps_factor) {
  csync::base_profile profile{forward_s, backward_s, optimizer_s, ready_s, {}};
  for (const auto& [values, matrices] : shapes)
    profile.shapes.push_back({values, matrices});
  // A name in compute or blocking that is not a candidate is most likely a typo: refuse it.
  const auto check_keys = [&](const auto& map, const char* what) {
    for (const auto& [name, unused] : map) {
      bool known = name == "dense";
      for (const auto& c : candidates)
        known = known || c == name;
      if (!known)
        throw commsgd::invalid_argument(commsgd::concat("argument '", what, "' has an entry for '", name,
                                                        "', which is not among the candidates"));
    }
  };
  check_keys(compute, "compute");
  check_keys(blocking, "blocking");
  check_keys(steps_factor, "steps_factor");
  std::vector<csync::candidate_plan> plans;
  for (const auto& name : candidates) {
    csync::candidate_plan p{name, {}, false};
    if (auto it = compute.find(name); it != compute.end())
      for (const auto& [call, async] : it->second)
        p.compute.push_back({call, async});
    if (auto it = blocking.find(name); it != blocking.end()) p.blocking = it->second;
    if (auto it = steps_factor.find(name); it != steps_factor.end()) p.steps_factor = it->second;
    plans.push_back(std::move(p));
  }
  // The caller may leave dense out of the names yet describe its measured compute.
  if (std::find(candidates.begin(), candidates.end(), "dense") == candidates.end()) {
    csync::candidate_plan p{"dense", {}, false};
    if (auto it = compute.find("dense"); it != compute.end())
      for (const auto& [call, async] : it->second)
        p.compute.push_back({call, async});
    if (auto it = blocking.find("dense"); it != blocking.end()) p.blocking = it->second;
    plans.push_back(std::move(p));
  }
  const auto c = csync::choose(plans, profile, n, network(latency_s, bandwidth_bytes_per_s), margin);
  py::dict predicted, weighed;
  for (std::size_t i = 0; i < c.names.size(); ++i) {
    predicted[py::str(c.names[i])] = c.predicted[i];
    weighed[py::str(c.names[i])] = c.weighed(i);
  }
  py::dict d;
  d["index"] = c.index;
  d["name"] = c.name;
  d["predicted"] = predicted;
  d["weighed"] = weighed;
  d["reason"] = c.reason;
  return d;
}

} // namespace

void bind_auto(py::module_& m) {
  using namespace py::literals;
  m.def("overlapped_step", &overlapped_step, "forward_s"_a, "backward_s"_a, "optimizer_s"_a, "buckets"_a,
        "blocking"_a = false,
        "Seconds of one DDP step whose bucket exchanges overlap backward; buckets are (ready_s, call_s, "
        "async_s, exchange_s). Returns dict(total_s, backward_end_s, exchange_end_s, exposed_s).");
  m.def("fit_network", &fit_network, "small_s"_a, "large_s"_a, "large_floats"_a,
        "The network model from timed ring all-reduces of float32: small_s[r] and large_s[r] are rank r's "
        "seconds for a one-float all-reduce and for one of large_floats floats. Returns (latency_s, "
        "bandwidth_bytes_per_s), each the worst over the ranks (bandwidth inf when the large one was no "
        "slower), as sync::measure_network reads its own timings.");
  m.def("exchange_seconds", &exchange_seconds, "candidate"_a, "values"_a, "matrices"_a, "n"_a, "latency_s"_a,
        "bandwidth_bytes_per_s"_a,
        "Network seconds of one bucket's exchange under a named candidate (dense, fp16, bf16, powersgd-r<k>, "
        "topk-<density>, sparse-allreduce-<density>, qsgd<levels>, localsgd-h<H>).");
  m.def("choose", &choose, "candidates"_a, "forward_s"_a, "backward_s"_a, "optimizer_s"_a, "ready_s"_a,
        "shapes"_a, "compute"_a, "blocking"_a, "n"_a, "latency_s"_a, "bandwidth_bytes_per_s"_a,
        "margin"_a = csync::default_choice_margin, "steps_factor"_a = std::map<std::string, double>{},
        "Predicts every candidate's step, weighs it by its steps factor (steps to an accuracy over "
        "dense's, 1 when not given) and picks the least, keeping dense unless another is below dense x "
        "(1 - margin). Returns dict(index, name, predicted (seconds a step), weighed, reason); index counts "
        "dense last when it was not named.");
}
