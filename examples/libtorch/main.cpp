// A LibTorch trainer that keeps its own model, backward pass and optimizer and lets commsgd exchange the
// gradients: a small CNN on Fashion-MNIST, over MPI (mpiexec -n 4 libtorch_cnn --comm mpi) or over a gloo
// process group of forked ranks (libtorch_cnn --comm gloo --ranks 4).
//
// data_parallel is used as the gradient exchange only: a step on a zero buffer with lr = 1 leaves minus the
// mean (top-k with error feedback, or dense) gradient in it, which goes back into the parameters' .grad for
// torch's SGD with momentum.
#include "../fashion_mnist/idx.hpp"

#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/process_group.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#ifdef COMMSGD_LIBTORCH_HAS_MPI
#include <boost/mpi/environment.hpp>
#include <commsgd/comm/mpi.hpp>
#endif

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

using namespace commsgd;

struct args {
  std::string comm = "gloo", sparsifier = "topk", data = fmnist::default_data_dir();
  int ranks = 2, epochs = 1, batch = 32;
  std::size_t subset = 2000, test_subset = 1000;
  double lr = 0.05, density = 0.01, min_accuracy = 0.0;
};

struct cnn : torch::nn::Module {
  torch::nn::Conv2d c1{register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5)))};
  torch::nn::Conv2d c2{register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5)))};
  torch::nn::Linear f1{register_module("f1", torch::nn::Linear(512, 128))};
  torch::nn::Linear f2{register_module("f2", torch::nn::Linear(128, 10))};
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(c1(x.view({-1, 1, 28, 28}))), 2);
    x = torch::max_pool2d(torch::relu(c2(x)), 2);
    return f2(torch::relu(f1(x.flatten(1))));
  }
};

// Copies between the parameters (or their gradients) and one flat vector, in parameters() order.
void flatten(const std::vector<torch::Tensor>& ts, std::vector<float>& out) {
  out.clear();
  for (const auto& t : ts) {
    auto c = t.contiguous();
    out.insert(out.end(), c.template data_ptr<float>(), c.template data_ptr<float>() + c.numel());
  }
}
void unflatten(const std::vector<float>& in, const std::vector<torch::Tensor>& ts, float scale) {
  torch::NoGradGuard no_grad;
  std::size_t off = 0;
  for (auto t : ts) {
    auto src = torch::from_blob(const_cast<float*>(in.data()) + off, t.sizes(), torch::kFloat);
    t.copy_(src * scale);
    off += static_cast<std::size_t>(t.numel());
  }
}

template <class Compression, class C>
double train(C& base, const args& a) {
  comm::metered<C> comm(std::move(base));
  const auto train_set = fmnist::load_set(a.data, "train", a.subset);
  const auto test_set = fmnist::load_set(a.data, "t10k", a.test_subset);
  torch::manual_seed(1);
  cnn net;
  auto params = net.parameters();
  std::vector<float> flat, grad, update;
  flatten(params, flat);
  using dp_t = data_parallel<policy::uncoded<>, Compression, policy::synchronous, comm::metered<C>>;
  typename dp_t::options o{.lr = 1.0f};
  if constexpr (requires { o.compression.top_k; }) o.compression.top_k.density = a.density;
  dp_t dp(comm, flat.size(), o);
  dp.start(flat); // rank 0's initial model everywhere
  unflatten(flat, params, 1.0f);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(a.lr).momentum(0.9));

  auto images = torch::from_blob(const_cast<float*>(train_set.images.data()),
                                 {static_cast<long>(train_set.count), 784}, torch::kFloat);
  std::vector<long> labels(train_set.labels.begin(), train_set.labels.end());
  auto targets = torch::tensor(labels, torch::kLong);
  // Rank r trains on samples r, r + n, r + 2n, ...; each rank's batch is `batch` of them.
  auto mine = torch::arange(comm.rank(), static_cast<long>(train_set.count), comm.size(), torch::kLong);
  long steps = 0;
  for (int epoch = 0; epoch < a.epochs; ++epoch) {
    auto order = mine.index_select(0, torch::randperm(mine.size(0), torch::kLong));
    for (long b = 0; b + a.batch <= order.size(0); b += a.batch, ++steps) {
      auto idx = order.slice(0, b, b + a.batch);
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(net.forward(images.index_select(0, idx)),
                                                       targets.index_select(0, idx));
      loss.backward();
      std::vector<torch::Tensor> grads;
      for (auto& p : params)
        grads.push_back(p.grad());
      flatten(grads, grad);
      update.assign(grad.size(), 0.0f);
      dp.step(update, grad, {.loss = loss.template item<double>()}); // update = -mean gradient
      unflatten(update, grads, -1.0f);
      opt.step();
    }
  }
  dp.finish(update);
  torch::NoGradGuard no_grad;
  auto test_images = torch::from_blob(const_cast<float*>(test_set.images.data()),
                                      {static_cast<long>(test_set.count), 784}, torch::kFloat);
  std::vector<long> test_labels(test_set.labels.begin(), test_set.labels.end());
  const double acc = net.forward(test_images)
                         .argmax(1)
                         .eq(torch::tensor(test_labels, torch::kLong))
                         .to(torch::kFloat)
                         .mean()
                         .template item<double>();
  if (comm.rank() == 0)
    std::printf(
        "%s over %s, %d ranks: test accuracy %.4f after %ld steps, %.0f bytes sent per step by rank 0\n",
        a.sparsifier.c_str(), a.comm.c_str(), comm.size(), acc, steps,
        static_cast<double>(comm.counters().total().bytes_sent) / static_cast<double>(std::max(steps, 1L)));
  comm.barrier();
  return acc;
}

template <class C>
double run(C& c, const args& a) {
  if (a.sparsifier == "dense") return train<policy::dense>(c, a);
  return train<policy::top_k<select::laplace_bisect>>(c, a);
}

int gloo_rank(int rank, const args& a, const std::string& dir) {
  alarm(600);
  auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", a.ranks);
  auto opt = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(120));
  opt->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  comm::process_group c(comm::make_gloo_group(store, rank, a.ranks, opt), store);
  const double acc = run(c, a);
  return acc >= a.min_accuracy ? 0 : 1;
}

int main(int argc, char** argv) try {
  args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--comm")
      a.comm = v;
    else if (k == "--sparsifier")
      a.sparsifier = v;
    else if (k == "--data")
      a.data = v;
    else if (k == "--ranks")
      a.ranks = std::stoi(v);
    else if (k == "--epochs")
      a.epochs = std::stoi(v);
    else if (k == "--batch")
      a.batch = std::stoi(v);
    else if (k == "--subset")
      a.subset = std::stoul(v);
    else if (k == "--test-subset")
      a.test_subset = std::stoul(v);
    else if (k == "--lr")
      a.lr = std::stod(v);
    else if (k == "--density")
      a.density = std::stod(v);
    else if (k == "--min-accuracy")
      a.min_accuracy = std::stod(v);
    else
      throw invalid_argument("unknown option '" + k + "'");
  }
  if (a.sparsifier != "topk" && a.sparsifier != "dense")
    throw invalid_argument("argument '--sparsifier' = '" + a.sparsifier + "' is not one of topk, dense");
  torch::set_num_threads(1);
  if (a.comm == "mpi") {
#ifdef COMMSGD_LIBTORCH_HAS_MPI
    boost::mpi::environment env(argc, argv);
    auto c = comm::mpi::world();
    return run(c, a) >= a.min_accuracy ? 0 : 1;
#else
    throw unsupported("this build has no MPI");
#endif
  }
  if (a.comm != "gloo")
    throw invalid_argument("argument '--comm' = '" + a.comm + "' is not one of gloo, mpi");
  if (a.ranks < 1 || a.ranks > 64)
    throw invalid_argument(
        commsgd::concat("argument '--ranks' = ", a.ranks, " is outside the allowed range [1, 64]"));
  char tmpl[] = "/tmp/commsgd-libtorch-XXXXXX";
  if (!mkdtemp(tmpl)) throw comm_error("cannot create a temporary folder for the store");
  std::vector<pid_t> children;
  for (int r = 1; r < a.ranks; ++r)
    if (const pid_t pid = fork(); pid == 0)
      std::_Exit(gloo_rank(r, a, tmpl));
    else
      children.push_back(pid);
  int status = gloo_rank(0, a, tmpl);
  for (auto pid : children) {
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) status = 1;
  }
  std::filesystem::remove_all(tmpl);
  return status;
} catch (const std::exception& e) {
  std::fprintf(stderr, "libtorch_cnn: %s\n", e.what());
  return 2;
}
