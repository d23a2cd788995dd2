// commsgd_torch._C.Compressor: one of compress::fp16, bf16, sign, qsgd, random_k per DDP bucket over a
// metered comm::process_group, behind commsgd_torch.compressor_hook (python/commsgd_torch/compressors.py).
//
// State (the error-feedback residual, the step counter that keys qsgd's and random-k's draws) is keyed by
// the bucket's index. A bucket whose parameter sizes change after compression has started raises instead
// of dropping or misplacing its residual (DDP rebuilds buckets at its second iteration, which a start
// iteration >= 2 keeps out of the compressed phase).
//
// Errors: a bad bucket on one rank is handed to the compressor as a gradient of the wrong size, which makes
// its collective verdict fail (compress/agree.hpp), so every rank raises instead of waiting; this rank
// raises its own, more precise error.
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "bridge.hpp"
#include "bucket_state.hpp"
#include "exchange_queue.hpp"

#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/process_group.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/momentum.hpp>
#include <commsgd/compress/qsgd.hpp>
#include <commsgd/compress/random_k.hpp>
#include <commsgd/compress/sign.hpp>
#include <commsgd/cost/compress.hpp>

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace py = pybind11;
using namespace commsgd;

namespace {

using namespace commsgd_torch;
using size_list = std::vector<std::int64_t>;
using any_compressor =
    std::variant<compress::fp16, compress::bf16, compress::sign, compress::qsgd, compress::random_k>;

const char* const kind_names[] = {"fp16", "bf16", "sign", "qsgd", "random_k"};

std::size_t kind_of(const std::string& kind) {
  for (std::size_t i = 0; i < std::size(kind_names); ++i)
    if (kind == kind_names[i]) return i;
  throw invalid_argument(
      commsgd::concat("argument 'kind' = '", kind, "' is not one of fp16, bf16, sign, qsgd, random_k"));
}

struct compressor_settings {
  std::size_t kind;
  bool error_feedback, layerwise;
  compress::half_overflow overflow;
  std::uint32_t levels;
  double density;
  std::uint64_t seed;
  float momentum = 0.0f; // > 0: the hook's own momentum, whose updates the compressor sends
};

std::vector<std::size_t> offsets_of(const size_list& sizes) {
  std::vector<std::size_t> o{0};
  for (auto s : sizes) {
    if (s < 0)
      throw invalid_argument(
          commsgd::concat("argument 'sizes' holds a parameter of ", s, " values; sizes must be >= 0"));
    o.push_back(o.back() + static_cast<std::size_t>(s));
  }
  return o;
}

// A bucket of fp16 or bf16 without error feedback or momentum holds nothing between rounds.
bool stateless(const compressor_settings& s) {
  return s.kind <= 1 && !s.error_feedback && s.momentum == 0.0f;
}

// Bucket sizes are the parameters' value counts in bucket order; the per-layer kinds (sign, qsgd) keep one
// scale per parameter when layerwise, else one for the whole bucket. `verify` false skips the 16-bit
// kinds' first-round check of the peers (a bucket DDP rebuilt, the same way on every rank).
any_compressor make(const compressor_settings& s, const size_list& sizes, bool verify = true) {
  auto off = offsets_of(sizes);
  const std::size_t n = off.back();
  if (!s.layerwise || off.size() < 2) off.clear();
  switch (s.kind) {
  case 0:
    return compress::fp16(n, {s.error_feedback, s.overflow, verify});
  case 1:
    return compress::bf16(n, {s.error_feedback, s.overflow, verify});
  case 2:
    return compress::sign(n, {std::move(off), s.error_feedback});
  case 3: {
    compress::qsgd_options o;
    o.levels = s.levels;
    o.layer_offsets = std::move(off);
    o.seed = s.seed;
    o.error_feedback = s.error_feedback;
    return compress::qsgd(n, std::move(o));
  }
  default: {
    compress::random_k_options o;
    o.density = s.density;
    o.seed = s.seed;
    o.error_feedback = s.error_feedback;
    return compress::random_k(n, o);
  }
  }
}

class compressor_state {
  struct bucket {
    any_compressor x;
    size_list sizes;
    compress::hook_momentum momentum; // follows the bucket's values under the hook's momentum, else empty
  };

public:
  compressor_state(const group_ptr& group, const std::string& kind, bool error_feedback,
                   const std::string& overflow, std::int64_t levels, double density, std::int64_t seed,
                   bool layerwise, double momentum)
      : comm_(comm::process_group(group)) {
    commsgd::check_range("momentum", momentum, 0.0, std::nextafter(1.0, 0.0), "[0, 1)");
    s_.momentum = static_cast<float>(momentum);
    s_.kind = kind_of(kind);
    s_.error_feedback = error_feedback;
    s_.layerwise = layerwise;
    if (overflow == "refuse")
      s_.overflow = compress::half_overflow::refuse;
    else if (overflow == "clamp")
      s_.overflow = compress::half_overflow::clamp;
    else
      throw invalid_argument(
          commsgd::concat("argument 'overflow' = '", overflow, "' is not one of refuse, clamp"));
    commsgd::check_range("levels", levels, 1, std::int64_t{compress::qsgd_options::max_levels}, "[1, 65535]");
    s_.levels = static_cast<std::uint32_t>(levels);
    if (seed < 0)
      throw invalid_argument(
          commsgd::concat("argument 'seed' = ", seed, " is outside the allowed range [0, 2^63)"));
    s_.seed = static_cast<std::uint64_t>(seed);
    s_.density = density;
    make(s_, {}); // checks the density (and anything else the compressor checks) now, on every rank alike
  }

  bool has(std::int64_t index) {
    queue_.drain();
    return buckets_.count(index) != 0;
  }

  // The bucket's mean over ranks (DDP's convention), written over the bucket, which is returned: once every
  // round posted before it is done, or (exchange_async) as a future at once.
  at::Tensor exchange(const at::Tensor& buffer, std::int64_t index, const size_list& sizes) {
    return queue_.run([=, this] { return round(buffer, index, sizes); });
  }
  python_future exchange_async(const at::Tensor& buffer, std::int64_t index, const size_list& sizes) {
    return queue_.post([=, this] { return round(buffer, index, sizes); });
  }

  // Dense averaging for the iterations before compression starts (with the hook's momentum, its update).
  at::Tensor average(const at::Tensor& buffer, std::int64_t index) {
    return queue_.run([=, this] { return warm_round(buffer, index); });
  }
  python_future average_async(const at::Tensor& buffer, std::int64_t index) {
    return queue_.post([=, this] { return warm_round(buffer, index); });
  }

  // Bucket `index`'s momentum buffer (empty without the hook's momentum).
  at::Tensor momentum_buffer(std::int64_t index) { return tensor_of(find(index).momentum.buffer()); }

  py::dict traffic() { return commsgd_torch::traffic_when_done(queue_, comm_); }
  void reset_traffic() { commsgd_torch::reset_when_done(queue_, comm_); }

  std::vector<std::int64_t> keys() { return commsgd_torch::keys_when_done(queue_, buckets_); }
  const bucket& find(std::int64_t index) {
    queue_.drain();
    auto it = buckets_.find(index);
    if (it == buckets_.end())
      throw invalid_argument(commsgd::concat("argument 'index' = ", index, " is not a known bucket"));
    return it->second;
  }
  at::Tensor residual(std::int64_t index) {
    return std::visit([](const auto& x) { return tensor_of(x.residual()); }, find(index).x);
  }
  // The residual's low part: residual + residual_low is exactly what the messages held back.
  at::Tensor residual_low(std::int64_t index) {
    return std::visit([](const auto& x) { return tensor_of(x.residual_low()); }, find(index).x);
  }
  std::uint64_t wire_bytes(std::int64_t index) {
    return std::visit([](const auto& x) { return x.wire_bytes(); }, find(index).x);
  }
  std::uint64_t steps(std::int64_t index) {
    return std::visit([](const auto& x) { return x.steps(); }, find(index).x);
  }
  // random-k's positions of the bucket's last round.
  std::vector<std::size_t> indices(std::int64_t index) {
    const auto* x = std::get_if<compress::random_k>(&find(index).x);
    if (!x) throw unsupported("indices(): only the random_k compressor sends chosen positions");
    return {x->indices().begin(), x->indices().end()};
  }

  py::dict state_dict() {
    py::dict d;
    d["buckets"] = buckets_dict(queue_, buckets_, [](const bucket& b) {
      return py::make_tuple(b.sizes, std::visit([](const auto& x) { return saved_bytes(x); }, b.x),
                            tensor_of(b.momentum.buffer()));
    });
    d["warmup_velocity"] = velocities_dict(warm_momentum_);
    return d;
  }

  void load_state_dict(const py::dict& d) {
    queue_.drain();
    auto loaded = buckets_from<std::int64_t, bucket>(
        d["buckets"].cast<py::dict>(), [this](py::handle index, const py::tuple& t) {
          auto sizes = t[0].cast<size_list>();
          auto x = make(s_, sizes);
          auto is = saved_stream(t[1]);
          std::visit([&](auto& c) { c.load(is); }, x);
          auto v = vector_of(t[2].cast<at::Tensor>(), "velocity");
          const auto n = offsets_of(sizes).back();
          if (v.size() != (s_.momentum > 0.0f ? n : 0))
            throw corrupt_data(commsgd::concat("saved state: bucket ", index.cast<std::int64_t>(),
                                               " holds a momentum of ", v.size(), " values, expected ",
                                               s_.momentum > 0.0f ? n : 0));
          compress::hook_momentum u(s_.momentum);
          u.assign(v);
          return bucket{std::move(x), std::move(sizes), std::move(u)};
        });
    auto warm = velocities_from(d["warmup_velocity"].cast<py::dict>(), s_.momentum, "velocity");
    buckets_ = std::move(loaded);
    warm_momentum_ = std::move(warm);
  }

private:
  // One round, on the queue's thread (no Python object is touched).
  static std::vector<float> vector_of(const at::Tensor& t, const char* what) {
    const auto v = values_of(t.contiguous(), what);
    return {v.begin(), v.end()};
  }

  // Dense warm-up: mean(g), or with momentum v <- m v + mean(g), v the same on every rank and handed to the
  // bucket as its local momentum when compression starts (so momentum runs on across the switch).
  at::Tensor warm_round(const at::Tensor& buffer, std::int64_t index) {
    average_bucket(comm_, buffer);
    if (s_.momentum > 0.0f) {
      auto o = values_of(buffer, "bucket");
      auto& u = warm_momentum_.try_emplace(index, s_.momentum).first->second;
      u.resize(o.size());
      u.warm_up(o);
    }
    return buffer;
  }

  at::Tensor round(const at::Tensor& buffer, std::int64_t index, const size_list& sizes) {
    auto it = buckets_.find(index);
    if (it == buckets_.end()) {
      bucket fresh{make(s_, sizes), sizes, compress::hook_momentum(s_.momentum)};
      if (s_.momentum > 0.0f) {
        fresh.momentum.resize(offsets_of(sizes).back());
        auto w = warm_momentum_.find(index);
        if (w != warm_momentum_.end() && w->second.length() == fresh.momentum.length())
          fresh.momentum.assign(w->second.buffer());
      }
      it = buckets_.emplace(index, std::move(fresh)).first;
    }
    auto& b = it->second;
    // A stateless bucket takes a new layout as it comes (DDP rebuilds buckets at its second iteration): the
    // same parameters, so no first-round check of the peers again.
    if (sizes != b.sizes && stateless(s_)) {
      if (offsets_of(sizes).back() != offsets_of(b.sizes).back()) b.x = make(s_, sizes, false);
      b.sizes = sizes;
    }
    std::span<float> g;
    std::exception_ptr local;
    try {
      if (sizes != b.sizes)
        throw unsupported(
            commsgd::concat("bucket ", index, " changed its layout after compression started (",
                            b.sizes.size(), " parameters of ", offsets_of(b.sizes).back(), " values before, ",
                            sizes.size(), " of ", offsets_of(sizes).back(),
                            " now; DDP rebuilds buckets at its second iteration: use start_iter >= 2)"));
      g = values_of(buffer, "bucket");
      if (static_cast<std::int64_t>(g.size()) != static_cast<std::int64_t>(offsets_of(sizes).back()))
        throw size_mismatch(commsgd::concat("argument 'bucket' has ", g.size(),
                                            " values, its parameters' sizes add up to ",
                                            offsets_of(sizes).back()));
    } catch (const commsgd::error&) {
      local = std::current_exception();
      g = {}; // the wrong size: the compressor's verdict fails on every rank
    }
    // fp16 and bf16 sum 16-bit values: each rank contributes g / n, as PyTorch's fp16 hook does, so that
    // the sum is already the mean and cannot overflow where the mean would not.
    const bool prescale = s_.kind <= 1 && comm_.size() > 1;
    if (prescale && !local) buffer.div_(static_cast<double>(comm_.size()));
    // The hook's momentum: the compressor sends u <- m u + g, and u is kept only once the round succeeds.
    std::span<const float> in = g;
    const bool with_momentum = s_.momentum > 0.0f && !local && g.size() == b.momentum.length();
    if (with_momentum) {
      b.momentum.propose(g, next_u_);
      in = next_u_;
    }
    try {
      // Every model writes out only after it has read all of its input, so out may be the gradient itself.
      std::visit([&](auto& x) { x.reduce(comm_, in, g); }, b.x);
    } catch (const commsgd::error&) {
      if (!local) throw;
    }
    if (local) std::rethrow_exception(local);
    if (with_momentum) {
      b.momentum.commit(next_u_);
      // random-k sends chosen positions, as top-k does, and takes DGC's rule with it: the momentum of a sent
      // position starts again from zero. Without it the residual's bursts, amplified by momentum, diverge.
      if (const auto* rk = std::get_if<compress::random_k>(&b.x)) b.momentum.restart(rk->indices());
    }
    if (comm_.size() > 1 && !prescale) buffer.div_(static_cast<double>(comm_.size()));
    return buffer;
  }

  meter comm_;
  compressor_settings s_;
  std::map<std::int64_t, bucket> buckets_;
  std::map<std::int64_t, compress::hook_momentum>
      warm_momentum_; // per bucket index, during the dense warm-up
  std::vector<float> next_u_;
  exchange_queue queue_; // last: its thread stops before anything it uses goes
};

// PyTorch's allreduce and fp16/bf16 compression hooks (default_hooks), the same operations on the same
// tensors, so the same bits, but completed on a state's exchange thread instead of through a Python callback
// chained to c10d's future. On torch 1.13 such a callback is released on gloo's worker thread after DDP has its
// result, taking the GIL; a script that ends meanwhile aborts (CPython stops a thread that asks for the GIL
// during finalization, and the unwind meets a noexcept destructor). AutoState's dense and 16-bit choices run
// here. finished() reports when each round was done (the clock of Python's time.monotonic), for the profile.
class pytorch_allreduce {
public:
  explicit pytorch_allreduce(const group_ptr& group) : group_(group) {}

  // allreduce_hook: the bucket divided by the group's size, then summed.
  python_future dense_async(const at::Tensor& buffer) {
    return queue_.post([=, this] { return reduce(buffer, buffer); });
  }
  // fp16_compress_hook (bf16_compress_hook): cast, divided, summed in 16 bits, copied back.
  python_future half_async(const at::Tensor& buffer, const std::string& dtype) {
    if (dtype != "float16" && dtype != "bfloat16")
      throw invalid_argument(
          commsgd::concat("argument 'dtype' = '", dtype, "' is not one of float16, bfloat16"));
    const auto low = dtype == "float16" ? at::kHalf : at::kBFloat16;
    return queue_.post([=, this] { return reduce(buffer.to(low), buffer); });
  }

  std::vector<double> finished() {
    queue_.drain();
    std::vector<double> out;
    out.swap(finished_);
    return out;
  }

private:
  at::Tensor reduce(at::Tensor wire, const at::Tensor& buffer) {
    wire.div_(group_->getSize());
    std::vector<at::Tensor> t{wire};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    group_->allreduce(t, o)->wait();
    if (!wire.is_same(buffer)) buffer.copy_(wire);
    finished_.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
    return buffer;
  }

  group_ptr group_;
  std::vector<double> finished_;
  exchange_queue queue_; // last: its thread stops before anything it uses goes
};

// What cost/compress.hpp says `rank` sends in one round of `kind` on a bucket of `length` values.
std::uint64_t wire_cost(const std::string& kind, std::uint64_t length, std::uint64_t layers,
                        std::uint64_t levels, std::uint64_t k, int world, int rank) {
  switch (kind_of(kind)) {
  case 0:
  case 1:
    return cost::half_traffic(length, world, rank).bytes_sent;
  case 2:
    return cost::sign_traffic(length, layers, world).bytes_sent;
  case 3:
    return cost::qsgd_traffic(length, layers, levels, world).bytes_sent;
  default:
    return cost::random_k_traffic(k, world, rank).bytes_sent;
  }
}

} // namespace

void bind_compressors(py::module_& m) {
  py::class_<compressor_state> c(m, "Compressor");
  def_bucket_rounds(c, "sizes")
      .def(py::init<const group_ptr&, const std::string&, bool, const std::string&, std::int64_t, double,
                    std::int64_t, bool, double>(),
           py::arg("process_group"), py::arg("kind"), py::arg("error_feedback"), py::arg("overflow"),
           py::arg("levels"), py::arg("density"), py::arg("seed"), py::arg("layerwise"), py::arg("momentum"))
      .def("has", &compressor_state::has)
      .def("momentum_buffer", &compressor_state::momentum_buffer)
      .def("keys", &compressor_state::keys)
      .def("residual", &compressor_state::residual)
      .def("residual_low", &compressor_state::residual_low)
      .def("wire_bytes", &compressor_state::wire_bytes)
      .def("steps", &compressor_state::steps)
      .def("indices", &compressor_state::indices)
      .def("state_dict", &compressor_state::state_dict)
      .def("load_state_dict", &compressor_state::load_state_dict);
  py::class_<pytorch_allreduce>(m, "PytorchAllreduce")
      .def(py::init<const group_ptr&>(), py::arg("process_group"))
      .def("dense_async", &pytorch_allreduce::dense_async, py::arg("buffer"))
      .def("half_async", &pytorch_allreduce::half_async, py::arg("buffer"), py::arg("dtype"))
      .def("finished", &pytorch_allreduce::finished);
  m.def("compressor_wire_bytes", &wire_cost, py::arg("kind"), py::arg("length"), py::arg("layers"),
        py::arg("levels"), py::arg("k"), py::arg("world"), py::arg("rank"));
}
