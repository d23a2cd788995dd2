// commsgd_torch._C.TopK: top-k with error feedback per DDP bucket over a metered comm::process_group, behind
// commsgd_torch.topk_hook (python/commsgd_torch/topk.py): the sparse exchange (with its dense fallback),
// momentum correction and DGC's density warm-up, dense warm-up iterations, state save/load.
//
// What each bucket holds back follows its parameters across DDP's bucket rebuilds (residual_store.hpp).
//
// Momentum: the optimizer steps without it and the hook applies it (sparsify/top_k.hpp's momentum
// correction). During the dense warm-up the hook returns momentum SGD's update m v + mean(g), with v the
// same on every rank, and when top-k starts each rank's local momentum starts from that v, so momentum runs
// on unbroken across the switch.
//
// Rounds run on the state's exchange_queue (exchange_async returns DDP a future at once). Errors: every
// check that could fail on one rank only (dtype, length, NaN, a refused step) is turned into a poisoned
// message that still goes through the exchange, so the peers raise too instead of waiting; this rank raises
// its own, more precise error.
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "bridge.hpp"
#include "bucket_state.hpp"
#include "exchange_queue.hpp"
#include "residual_store.hpp"

#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/process_group.hpp>
#include <commsgd/compress/momentum.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/hierarchical.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/select/radix.hpp>
#include <commsgd/select/sampled.hpp>
#include <commsgd/sparsify/sparse_exchange.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <variant>
#include <vector>

namespace py = pybind11;
using namespace commsgd;

namespace {

using namespace commsgd_torch;

template <class S>
using tk = sparsify::top_k<S>;
using any_top_k = std::variant<tk<select::exact>, tk<select::radix>, tk<select::laplace_bisect>,
                               tk<select::hierarchical>, tk<select::sampled>>;

const char* const selector_names[] = {"exact", "radix", "laplace_bisect", "hierarchical", "sampled"};

template <std::size_t I = 0>
any_top_k make_top_k(std::size_t which, std::size_t n, const sparsify::top_k_options& o) {
  if constexpr (I < std::variant_size_v<any_top_k>) {
    if (which == I) {
      using T = std::variant_alternative_t<I, any_top_k>;
      using S = typename T::selector_type;
      return any_top_k(std::in_place_index<I>, n, o, S(typename S::options{}));
    }
    return make_top_k<I + 1>(which, n, o);
  } else {
    throw invalid_argument("unreachable selector index");
  }
}

std::size_t selector_index(const std::string& name) {
  for (std::size_t i = 0; i < std::size(selector_names); ++i)
    if (name == selector_names[i]) return i;
  throw invalid_argument(
      commsgd::concat("argument 'selector' = '", name,
                      "' is not one of exact, radix, laplace_bisect, hierarchical, sampled"));
}

void check_bucket(const at::Tensor& t) {
  if (t.scalar_type() != at::kFloat)
    throw invalid_argument(commsgd::concat("argument 'bucket' has dtype ", c10::toString(t.scalar_type()),
                                           ", the allowed dtype is float32"));
  if (!t.device().is_cpu())
    throw invalid_argument(
        commsgd::concat("argument 'bucket' is on device ", t.device().str(), ", the allowed device is cpu"));
  if (!t.is_contiguous())
    throw invalid_argument("argument 'bucket' is not contiguous; a contiguous tensor is required");
}

class topk_state {
  using store = residual_store<any_top_k>;
  using bucket = store::bucket;

public:
  topk_state(const group_ptr& group, const std::string& selector, double density, double momentum,
             const std::string& masking, std::int64_t dense_warmup, std::int64_t dgc_warmup_per_stage,
             bool warmup_momentum, bool layerwise)
      : comm_(comm::process_group(group)), selector_(selector_index(selector)),
        warmup_momentum_(warmup_momentum), layerwise_(layerwise) {
    opt_.density = density;
    opt_.momentum = momentum;
    if (masking == "keep")
      opt_.masking = sparsify::momentum_masking::keep;
    else if (masking == "dgc")
      opt_.masking = sparsify::momentum_masking::dgc;
    else
      throw invalid_argument(
          commsgd::concat("argument 'momentum_rule' = '", masking, "' is not one of keep, dgc"));
    if (dense_warmup < 0)
      throw invalid_argument(commsgd::concat("argument 'start_iter' = ", dense_warmup,
                                             " is outside the allowed range [0, inf)"));
    if (dgc_warmup_per_stage < 0)
      throw invalid_argument(commsgd::concat("argument 'dgc_warmup_steps_per_stage' = ", dgc_warmup_per_stage,
                                             " is outside the allowed range [0, inf)"));
    if (dgc_warmup_per_stage > 0)
      opt_.warmup = sparsify::dgc_warmup(static_cast<std::uint64_t>(dgc_warmup_per_stage));
    dense_warmup_ = dense_warmup;
    make_top_k(selector_, 1, opt_); // checks density and momentum now, not at the first bucket
  }

  // The bucket's average over ranks, as a new tensor, once every round posted before it is done.
  // `params`/`sizes`: model indices and element counts of the bucket's parameters, in bucket order.
  at::Tensor exchange(const at::Tensor& buffer, const std::vector<std::int64_t>& params,
                      const std::vector<std::int64_t>& sizes, bool last) {
    return queue_.run([=, this] { return round(buffer, params, sizes, last); });
  }

  // The same round, run after those posted before it; returns its future at once.
  python_future exchange_async(const at::Tensor& buffer, const std::vector<std::int64_t>& params,
                               const std::vector<std::int64_t>& sizes, bool last) {
    return queue_.post([=, this] { return round(buffer, params, sizes, last); });
  }

  py::dict traffic() { return commsgd_torch::traffic_when_done(queue_, comm_); }
  void reset_traffic() { commsgd_torch::reset_when_done(queue_, comm_); }
  std::int64_t iteration() {
    queue_.drain();
    return iteration_;
  }
  // Seconds spent in the sparsifier's steps (selection, error feedback), the hook's own computation.
  double compute_seconds() {
    queue_.drain();
    return compute_;
  }

  py::object residual(const std::string& key) {
    queue_.drain();
    const auto* b = store_.at(key);
    if (!b) return py::none();
    auto r = std::visit([](auto& s) { return s.residual(); }, b->sparsifier);
    return py::cast(at::from_blob(const_cast<float*>(r.data()), {static_cast<std::int64_t>(r.size())},
                                  at::TensorOptions().dtype(at::kFloat))
                        .clone());
  }

  // DGC's local momentum u of a bucket (None without momentum correction or before the bucket's first
  // compressed round): what AutoState hands back to the optimizer when it leaves top-k.
  py::object momentum(const std::string& key) {
    queue_.drain();
    const auto* b = store_.at(key);
    if (!b) return py::none();
    auto u = std::visit([](auto& s) { return s.momentum(); }, b->sparsifier);
    if (u.empty()) return py::none();
    return py::cast(at::from_blob(const_cast<float*>(u.data()), {static_cast<std::int64_t>(u.size())},
                                  at::TensorOptions().dtype(at::kFloat))
                        .clone());
  }

  py::object last_sent(const std::string& key) {
    queue_.drain();
    const auto* b = store_.at(key);
    if (!b) return py::none();
    auto v = std::visit([](auto& s) { return s.last().view(); }, b->sparsifier);
    at::Tensor idx = at::empty({static_cast<std::int64_t>(v.size())}, at::TensorOptions().dtype(at::kLong));
    at::Tensor val = at::empty({static_cast<std::int64_t>(v.size())}, at::TensorOptions().dtype(at::kFloat));
    for (std::size_t j = 0; j < v.size(); ++j) {
      idx.data_ptr<std::int64_t>()[j] = v.indices[j];
      val.data_ptr<float>()[j] = v.values[j];
    }
    return py::make_tuple(idx, val);
  }

  std::vector<std::string> keys() { return commsgd_torch::keys_when_done(queue_, store_.buckets()); }

  py::dict state_dict() {
    const auto buckets = buckets_dict(queue_, store_.buckets(), [](const bucket& b) {
      std::vector<std::byte> blob;
      std::visit([&](auto& s) { s.save(blob); }, b.sparsifier);
      return py::make_tuple(b.params, b.offsets, blob_bytes(blob));
    });
    py::dict d;
    d["selector"] = selector_names[selector_];
    d["iteration"] = iteration_;
    d["buckets"] = buckets;
    d["warmup_velocity"] = velocities_dict(warm_momentum_);
    return d;
  }

  void load_state_dict(const py::dict& d) {
    queue_.drain();
    const auto sel = d["selector"].cast<std::string>();
    if (selector_index(sel) != selector_)
      throw corrupt_data(commsgd::concat("saved state: selector '", sel, "', this hook's is '",
                                         selector_names[selector_], "'"));
    auto loaded = buckets_from<std::string, bucket>(
        d["buckets"].cast<py::dict>(), [this](py::handle, const py::tuple& t) {
          auto params = t[0].cast<std::vector<std::int64_t>>();
          auto offsets = t[1].cast<std::vector<std::int64_t>>();
          const auto blob = saved_blob(t[2]);
          commsgd::state::reader r(blob, "top_k"); // reads the length before the sparsifier exists
          const auto n = r.get<std::uint64_t>();
          bucket b{make_top_k(selector_, n, options_for(offsets, n)), std::move(params), std::move(offsets)};
          std::visit([&](auto& s) { s.load(std::span<const std::byte>(blob)); }, b.sparsifier);
          return b;
        });
    store::velocity_map warm;
    if (d.contains("warmup_velocity"))
      warm = velocities_from(d["warmup_velocity"].cast<py::dict>(), static_cast<float>(opt_.momentum),
                             "warmup_velocity");
    store_.replace(std::move(loaded));
    warm_momentum_ = std::move(warm);
    iteration_ = d["iteration"].cast<std::int64_t>();
  }

private:
  // One round, on the queue's thread (no Python object is touched).
  at::Tensor round(const at::Tensor& buffer, const std::vector<std::int64_t>& params,
                   const std::vector<std::int64_t>& sizes, bool last) {
    const std::size_t n = static_cast<std::size_t>(buffer.numel());
    at::Tensor out = at::empty({static_cast<std::int64_t>(n)}, at::TensorOptions().dtype(at::kFloat));
    std::span<float> o(out.data_ptr<float>(), n);
    std::exception_ptr local;
    sparsify::sparse_view<std::uint32_t> msg{};
    try {
      check_bucket(buffer);
      if (params.size() != sizes.size())
        throw size_mismatch(commsgd::concat("arguments 'params' and 'sizes' have ", params.size(), " and ",
                                            sizes.size(), " entries"));
      const auto total = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
      if (static_cast<std::size_t>(total) != n)
        throw size_mismatch(
            commsgd::concat("the bucket's parameters hold ", total, " elements, the bucket ", n));
      const std::span<const float> g(buffer.data_ptr<float>(), n);
      if (iteration_ < dense_warmup_) {
        msg = dense_message(g); // a NaN here makes every rank's exchange raise
      } else {
        auto& b = store_.find(
            params, sizes,
            [&](const std::vector<std::int64_t>& offsets) {
              return make_top_k(selector_, n, options_for(offsets, n));
            },
            static_cast<std::uint64_t>(iteration_ - dense_warmup_), warm_momentum_);
        const auto t0 = std::chrono::steady_clock::now();
        msg = std::visit([&](auto& s) { return s.step(g); }, b.sparsifier);
        compute_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    } catch (const commsgd::error&) {
      local = std::current_exception();
      msg = poisoned(n);
    }
    try {
      exchanger_.sum(comm_, msg, local ? std::span<float>(scratch_) : o);
    } catch (const commsgd::error&) {
      if (!local) throw;
    }
    if (local) std::rethrow_exception(local);
    const float world = static_cast<float>(comm_.size());
    for (auto& x : o)
      x /= world;
    if (iteration_ < dense_warmup_ && warmup_momentum_ && opt_.momentum > 0.0)
      apply_warmup_momentum(params, sizes, o);
    if (last) ++iteration_;
    return out;
  }

  // Momentum SGD's update during the dense warm-up: v <- m v + mean(g), returned in place of mean(g). v is
  // the same on every rank (every rank adds the same bits), kept per parameter for the top-k that follows.
  void apply_warmup_momentum(const std::vector<std::int64_t>& params, const std::vector<std::int64_t>& sizes,
                             std::span<float> o) {
    const float m = static_cast<float>(opt_.momentum);
    std::size_t off = 0;
    for (std::size_t j = 0; j < params.size(); ++j) {
      const auto count = static_cast<std::size_t>(sizes[j]);
      auto& u = warm_momentum_.try_emplace(params[j], m).first->second;
      u.resize(count);
      u.warm_up(o.subspan(off, count));
      off += count;
    }
  }

  // Per parameter (each takes its own k = ceil(density * size), as DGC selects per layer), or over the
  // whole bucket.
  sparsify::top_k_options options_for(const std::vector<std::int64_t>& offsets, std::size_t n) const {
    auto o = opt_;
    if (layerwise_) {
      o.layer_offsets.assign(offsets.begin(), offsets.end());
      o.layer_offsets.push_back(n);
      if (o.layer_offsets.front() != 0) o.layer_offsets.insert(o.layer_offsets.begin(), 0);
    }
    return o;
  }

  sparsify::sparse_view<std::uint32_t> dense_message(std::span<const float> g) {
    if (iota_.size() < g.size()) {
      iota_.resize(g.size());
      std::iota(iota_.begin(), iota_.end(), 0u);
    }
    return {g.size(), std::span<const std::uint32_t>(iota_.data(), g.size()), g};
  }

  // A message every rank's exchange refuses (a NaN, or an index out of range when the length is 0).
  sparsify::sparse_view<std::uint32_t> poisoned(std::size_t n) {
    scratch_.assign(n, 0.0f);
    static const std::uint32_t zero_index = 0;
    static const float nan = std::numeric_limits<float>::quiet_NaN();
    return {n, std::span<const std::uint32_t>(&zero_index, 1), std::span<const float>(&nan, 1)};
  }

  meter comm_;
  std::size_t selector_;
  sparsify::top_k_options opt_;
  bool warmup_momentum_ = true;
  bool layerwise_ = true;
  std::int64_t dense_warmup_ = 0;
  std::int64_t iteration_ = 0;
  store::velocity_map warm_momentum_; // per parameter, during the dense warm-up
  double compute_ = 0.0;
  store store_;
  sparsify::exchanger<std::uint32_t> exchanger_;
  std::vector<std::uint32_t> iota_;
  std::vector<float> scratch_;
  exchange_queue queue_; // last: its thread stops before anything it uses goes
};

} // namespace

void bind_topk(py::module_& m) {
  py::class_<topk_state> c(m, "TopK");
  def_metered(c)
      .def(py::init<const group_ptr&, const std::string&, double, double, const std::string&, std::int64_t,
                    std::int64_t, bool, bool>(),
           py::arg("process_group"), py::arg("selector"), py::arg("density"), py::arg("momentum"),
           py::arg("momentum_rule"), py::arg("start_iter"), py::arg("dgc_warmup_steps_per_stage"),
           py::arg("warmup_momentum"), py::arg("layerwise"))
      .def("exchange", &topk_state::exchange, py::arg("buffer"), py::arg("params"), py::arg("sizes"),
           py::arg("last"), py::call_guard<py::gil_scoped_release>())
      .def("exchange_async", &topk_state::exchange_async, py::arg("buffer"), py::arg("params"),
           py::arg("sizes"), py::arg("last"))
      .def("iteration", &topk_state::iteration)
      .def("compute_seconds", &topk_state::compute_seconds)
      .def("residual", &topk_state::residual)
      .def("momentum_buffer", &topk_state::momentum)
      .def("last_sent", &topk_state::last_sent)
      .def("keys", &topk_state::keys)
      .def("state_dict", &topk_state::state_dict)
      .def("load_state_dict", &topk_state::load_state_dict);
}
