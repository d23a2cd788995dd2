// commsgd_torch._C.LocalSGD: sync::local_sgd for a trainer whose optimizer is torch's, behind
// commsgd_torch.local_sgd_hook (python/commsgd_torch/__init__.py). The hook averages gradients during the
// warm-up (on the state's exchange_queue, so DDP overlaps it like any other hook); after each optimizer
// step, step() lets the strategy average (and correct) the model.
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "bridge.hpp"
#include "exchange_queue.hpp"

#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/process_group.hpp>
#include <commsgd/sync/local_sgd.hpp>

#include <pybind11/stl.h>

#include <limits>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace commsgd;

namespace {

using namespace commsgd_torch;

sync::correction_mode correction_of(const std::string& name) {
  if (name == "none") return sync::correction_mode::none;
  if (name == "at_sync") return sync::correction_mode::at_sync;
  if (name == "every_step") return sync::correction_mode::every_step;
  throw invalid_argument(
      commsgd::concat("argument 'correction' = '", name, "' is not one of none, at_sync, every_step"));
}

class local_sgd_state {
public:
  local_sgd_state(const group_ptr& group, float lr, int period, int warmup_steps, bool adaptive,
                  int max_period, const std::string& correction, float alpha)
      : comm_(comm::process_group(group)), warmup_(warmup_steps),
        strategy_(comm_, {.lr = lr,
                          .period = period,
                          .warmup_steps = 0,
                          .adaptive = adaptive,
                          .max_period = max_period,
                          .correction = correction_of(correction),
                          .alpha = alpha,
                          .average_on_finish = true}) {
    commsgd::check_range("start_iter", warmup_steps, 0, std::numeric_limits<int>::max(), "[0, inf)");
  }

  bool in_warmup() const { return steps_ < warmup_; }

  // Warm-up: the bucket's average over ranks, in place, once every round posted before it is done.
  at::Tensor average(const at::Tensor& buffer) {
    return queue_.run([=, this] { return commsgd_torch::average_bucket(comm_, buffer); });
  }
  python_future average_async(const at::Tensor& buffer) {
    return queue_.post([=, this] { return commsgd_torch::average_bucket(comm_, buffer); });
  }
  // The hook's round: averaged during the warm-up, left as it is (local) afterwards.
  python_future exchange_async(const at::Tensor& buffer) {
    if (in_warmup()) return average_async(buffer);
    return exchange_queue::ready(buffer);
  }

  // After the optimizer's step: the strategy's model averaging and correction. Returns true when the
  // models were averaged.
  bool step(const std::vector<at::Tensor>& params, double loss, double lr) {
    queue_.drain();
    const std::int64_t t = steps_++;
    if (t < warmup_) return false;
    gather(params);
    py::gil_scoped_release unlocked;
    if (!started_) {
      strategy_.start(x_);
      started_ = true;
    }
    strategy_.set_learning_rate(static_cast<float>(lr));
    zeros_.assign(x_.size(), 0.0f);
    const auto r = strategy_.step(x_, zeros_, {.loss = loss});
    py::gil_scoped_acquire locked;
    scatter(params);
    return r.averaged;
  }

  void finish(const std::vector<at::Tensor>& params) {
    queue_.drain();
    gather(params);
    {
      py::gil_scoped_release unlocked;
      strategy_.finish(x_);
    }
    scatter(params);
  }

  int current_period() const { return strategy_.current_period(); }
  std::int64_t steps() const { return steps_; }
  py::dict traffic() { return commsgd_torch::traffic_when_done(queue_, comm_); }
  void reset_traffic() { commsgd_torch::reset_when_done(queue_, comm_); }

private:
  void gather(const std::vector<at::Tensor>& params) {
    x_.clear();
    for (const auto& p : params) {
      commsgd_torch::values_of(p.contiguous(), "params");
      auto c = p.detach().contiguous();
      x_.insert(x_.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
  }
  void scatter(const std::vector<at::Tensor>& params) {
    std::size_t off = 0;
    at::NoGradGuard no_grad;
    for (const auto& p : params) {
      auto src = at::from_blob(x_.data() + off, p.sizes(), at::TensorOptions().dtype(at::kFloat));
      const_cast<at::Tensor&>(p).copy_(src);
      off += static_cast<std::size_t>(p.numel());
    }
  }

  meter comm_;
  std::int64_t warmup_;
  sync::local_sgd<meter> strategy_;
  std::int64_t steps_ = 0;
  bool started_ = false;
  std::vector<float> x_, zeros_;
  exchange_queue queue_; // last: its thread stops before anything it uses goes
};

} // namespace

void bind_local_sgd(py::module_& m) {
  py::class_<local_sgd_state> c(m, "LocalSGD");
  def_dense_rounds(c)
      .def(py::init<const group_ptr&, float, int, int, bool, int, const std::string&, float>(),
           py::arg("process_group"), py::arg("lr"), py::arg("period"), py::arg("start_iter"),
           py::arg("adaptive"), py::arg("max_period"), py::arg("correction"), py::arg("alpha"))
      .def("in_warmup", &local_sgd_state::in_warmup)
      .def("exchange_async", &local_sgd_state::exchange_async)
      .def("step", &local_sgd_state::step, py::arg("params"), py::arg("loss"), py::arg("lr"))
      .def("finish", &local_sgd_state::finish)
      .def("current_period", &local_sgd_state::current_period)
      .def("steps", &local_sgd_state::steps);
}
