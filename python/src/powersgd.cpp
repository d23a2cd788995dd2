// commsgd_torch._C.PowerSGD: compress::powersgd per DDP bucket over a metered comm::process_group, behind
// commsgd_torch.powersgd_hook (python/commsgd_torch/powersgd.py).
//
// State is keyed by the bucket's index, as PyTorch's powerSGD_hook keys its own; a bucket whose layout
// changes after compression has started raises instead of dropping its residual (DDP rebuilds buckets only
// at its second iteration, which start_powerSGD_iter >= 2 keeps out of the compressed phase).
//
// Errors: a bad bucket on one rank is handed to the compressor as a gradient of the wrong size, which makes
// it take part in the round with NaN, so every rank raises instead of waiting (compress/powersgd.hpp).
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "bridge.hpp"
#include "bucket_state.hpp"
#include "exchange_queue.hpp"

#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/process_group.hpp>
#include <commsgd/compress/powersgd.hpp>
#include <commsgd/cost/powersgd.hpp>

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;
using namespace commsgd;

namespace {

using namespace commsgd_torch;
using shape_list = std::vector<std::pair<std::int64_t, std::int64_t>>;

std::vector<compress::layer_shape> to_shapes(const shape_list& s) {
  std::vector<compress::layer_shape> out;
  for (auto [r, c] : s) {
    if (r < 0 || c < 0)
      throw invalid_argument(commsgd::concat("argument 'shapes' holds a layer of ", r, " x ", c,
                                             "; rows and cols must be >= 0"));
    out.push_back({static_cast<std::size_t>(r), static_cast<std::size_t>(c)});
  }
  return out;
}

std::size_t total(const std::vector<compress::layer_shape>& s) {
  std::size_t t = 0;
  for (auto x : s)
    t += x.rows * x.cols;
  return t;
}

struct powersgd_settings {
  std::size_t rank;
  double min_compression_rate;
  float epsilon;
  std::uint64_t seed;
  bool error_feedback, warm_start;
};

compress::powersgd_options options_of(const powersgd_settings& s, const shape_list& shapes) {
  compress::powersgd_options o;
  o.rank = s.rank;
  o.layers = to_shapes(shapes);
  o.min_compression_rate = s.min_compression_rate;
  o.orthogonalization_epsilon = s.epsilon;
  o.seed = s.seed;
  o.error_feedback = s.error_feedback;
  o.warm_start = s.warm_start;
  return o;
}

class powersgd_state {
public:
  powersgd_state(const group_ptr& group, std::int64_t rank, double min_compression_rate, double epsilon,
                 std::int64_t seed, bool error_feedback, bool warm_start)
      : comm_(comm::process_group(group)) {
    if (rank < 1)
      throw invalid_argument(commsgd::concat("argument 'matrix_approximation_rank' = ", rank,
                                             " is outside the allowed range [1, inf)"));
    s_ = {static_cast<std::size_t>(rank),   min_compression_rate, static_cast<float>(epsilon),
          static_cast<std::uint64_t>(seed), error_feedback,       warm_start};
    compress::make_powersgd_plan(0, {}, s_.rank, min_compression_rate); // checks the rate now
    if (!(epsilon >= 0.0 && std::isfinite(epsilon)))
      throw invalid_argument(commsgd::concat("argument 'orthogonalization_epsilon' = ", epsilon,
                                             " is outside the allowed range [0, inf)"));
  }

  bool has(std::int64_t index) {
    queue_.drain();
    return buckets_.count(index) != 0;
  }

  // Builds bucket `index`'s compressor; initial_q (optional) is its Q before orthogonalisation, each
  // compressed layer's cols x r in gradient order.
  void create(std::int64_t index, const shape_list& shapes, const std::optional<at::Tensor>& initial_q) {
    queue_.drain();
    auto o = options_of(s_, shapes);
    if (initial_q) {
      const auto q = values_of(initial_q->contiguous(), "initial_q");
      o.initial_q.assign(q.begin(), q.end());
    }
    const std::size_t n = total(o.layers);
    buckets_.insert_or_assign(index, bucket{compress::powersgd(n, std::move(o)), shapes});
  }

  // The bucket's mean over ranks (DDP's convention), written over the bucket (as PyTorch's hook does, and
  // without allocating a bucket-sized tensor per round), which is returned: once every round posted before
  // it is done, or (exchange_async) as a future at once.
  at::Tensor exchange(const at::Tensor& buffer, std::int64_t index, const shape_list& shapes) {
    return queue_.run([=, this] { return round(buffer, index, shapes); });
  }
  python_future exchange_async(const at::Tensor& buffer, std::int64_t index, const shape_list& shapes) {
    return queue_.post([=, this] { return round(buffer, index, shapes); });
  }

  // Dense averaging for the iterations before compression starts.
  at::Tensor average(const at::Tensor& buffer) {
    return queue_.run([=, this] { return average_bucket(comm_, buffer); });
  }
  python_future average_async(const at::Tensor& buffer) {
    return queue_.post([=, this] { return average_bucket(comm_, buffer); });
  }

  py::dict traffic() { return commsgd_torch::traffic_when_done(queue_, comm_); }
  void reset_traffic() { commsgd_torch::reset_when_done(queue_, comm_); }

  // What bucket `index` hands its all-reduces per round: (dense values, P values, Q values).
  std::tuple<std::size_t, std::size_t, std::size_t> payload(std::int64_t index) {
    queue_.drain();
    const auto& p = buckets_.at(index).x.plan();
    return {p.dense_size, p.p_size, p.q_size};
  }
  at::Tensor residual(std::int64_t index) {
    queue_.drain();
    return tensor_of(buckets_.at(index).x.residual());
  }
  std::vector<std::int64_t> keys() { return commsgd_torch::keys_when_done(queue_, buckets_); }

  py::dict state_dict() {
    return buckets_dict(queue_, buckets_,
                        [](const bucket& b) { return py::make_tuple(b.shapes, saved_bytes(b.x)); });
  }

  void load_state_dict(const py::dict& d) {
    queue_.drain();
    buckets_ = buckets_from<std::int64_t, bucket>(d, [this](py::handle, const py::tuple& t) {
      auto shapes = t[0].cast<shape_list>();
      compress::powersgd x(total(to_shapes(shapes)), options_of(s_, shapes));
      auto is = saved_stream(t[1]);
      x.load(is);
      return bucket{std::move(x), std::move(shapes)};
    });
  }

private:
  // One round, on the queue's thread (no Python object is touched).
  at::Tensor round(const at::Tensor& buffer, std::int64_t index, const shape_list& shapes) {
    auto it = buckets_.find(index);
    if (it == buckets_.end())
      throw invalid_argument(commsgd::concat("bucket ", index, " has no PowerSGD state yet"));
    auto& b = it->second;
    std::span<float> g;
    std::exception_ptr local;
    try {
      if (shapes != b.shapes)
        throw unsupported(
            commsgd::concat("bucket ", index,
                            " changed its layout after PowerSGD started (DDP rebuilds buckets at its second "
                            "iteration: use start_powerSGD_iter >= 2)"));
      g = values_of(buffer, "bucket");
    } catch (const commsgd::error&) {
      local = std::current_exception();
      g = {}; // the wrong size: the compressor takes part with NaN and raises on every rank
    }
    try {
      b.x.reduce(comm_, g, g); // out may be the gradient itself (compress/powersgd.hpp)
    } catch (const commsgd::error&) {
      if (!local) throw;
    }
    if (local) std::rethrow_exception(local);
    if (comm_.size() > 1) buffer.div_(static_cast<double>(comm_.size()));
    return buffer;
  }

  struct bucket {
    compress::powersgd x;
    shape_list shapes;
  };
  meter comm_;
  powersgd_settings s_;
  std::map<std::int64_t, bucket> buckets_;
  exchange_queue queue_; // last: its thread stops before anything it uses goes
};

// Which layers PowerSGD compresses, and at which rank: (layer index, rank) in gradient order.
std::vector<std::pair<std::size_t, std::size_t>>
compressed_layers(const shape_list& shapes, std::int64_t rank, double min_compression_rate) {
  const auto s = to_shapes(shapes);
  if (rank < 1)
    throw invalid_argument(commsgd::concat("argument 'matrix_approximation_rank' = ", rank,
                                           " is outside the allowed range [1, inf)"));
  const auto plan =
      compress::make_powersgd_plan(total(s), s, static_cast<std::size_t>(rank), min_compression_rate);
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (const auto& m : plan.matrices)
    out.emplace_back(m.layer, m.rank);
  return out;
}

// One rank alone: every collective is the identity, so a round costs only its computation. Point-to-point
// has no peer to reach.
struct solo {
  struct request {
    void wait() {}
    bool test() { return true; }
  };
  using request_type = request;
  int rank() const { return 0; }
  int size() const { return 1; }
  void barrier() {}
  template <class T>
  void all_reduce_sum(std::span<T>) {}
  template <class T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    std::copy(mine.begin(), mine.end(), all.begin());
  }
  template <class T>
  std::vector<std::size_t> all_gather_v(std::span<const T> mine, std::vector<T>& all) {
    all.assign(mine.begin(), mine.end());
    return {mine.size()};
  }
  template <class T>
  void broadcast(std::span<T>, int) {}
  template <class T>
  void send(std::span<const T>, int, int) {
    throw comm_error("solo communicator: no peer to send to");
  }
  template <class T>
  void recv(std::span<T>, int, int) {
    throw comm_error("solo communicator: no peer to receive from");
  }
  template <class T>
  request isend(std::span<const T>, int, int) {
    throw comm_error("solo communicator: no peer to send to");
  }
  template <class T>
  request irecv(std::span<T>, int, int) {
    throw comm_error("solo communicator: no peer to receive from");
  }
  solo split(int, int) { return {}; }
};
static_assert(comm::communicator<solo>);

// Seconds per round of the compressor alone on one rank (solo: its all-reduces cost nothing), the
// computation a benchmark compares with PyTorch's. Runs `warmup` rounds first, then `rounds` timed ones.
double compute_seconds(const at::Tensor& buffer, const shape_list& shapes, std::int64_t rank, int warmup,
                       int rounds) {
  const auto g = values_of(buffer, "buffer");
  compress::powersgd_options o;
  o.rank = static_cast<std::size_t>(rank);
  o.layers = to_shapes(shapes);
  py::gil_scoped_release unlocked;
  solo c;
  compress::powersgd x(g.size(), o);
  std::vector<float> out(g.size());
  for (int i = 0; i < warmup; ++i)
    x.reduce(c, g, out);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i)
    x.reduce(c, g, out);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / rounds;
}

} // namespace

void bind_powersgd(py::module_& m) {
  py::class_<powersgd_state> c(m, "PowerSGD");
  def_bucket_rounds(c, "shapes")
      .def(py::init<const group_ptr&, std::int64_t, double, double, std::int64_t, bool, bool>(),
           py::arg("process_group"), py::arg("matrix_approximation_rank"), py::arg("min_compression_rate"),
           py::arg("orthogonalization_epsilon"), py::arg("random_seed"), py::arg("use_error_feedback"),
           py::arg("warm_start"))
      .def("has", &powersgd_state::has)
      .def("create", &powersgd_state::create, py::arg("index"), py::arg("shapes"),
           py::arg("initial_q") = std::nullopt)
      .def("payload", &powersgd_state::payload)
      .def("residual", &powersgd_state::residual)
      .def("keys", &powersgd_state::keys)
      .def("state_dict", &powersgd_state::state_dict)
      .def("load_state_dict", &powersgd_state::load_state_dict);
  m.def("powersgd_compressed_layers", &compressed_layers, py::arg("shapes"), py::arg("rank"),
        py::arg("min_compression_rate"));
  m.def("powersgd_compute_seconds", &compute_seconds, py::arg("buffer"), py::arg("shapes"), py::arg("rank"),
        py::arg("warmup"), py::arg("rounds"));
}
