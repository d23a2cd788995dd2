// powersgd:<r>  SSGD on rank-r PowerSGD approximations of the MLP's weight matrices, with error feedback and
//               warm start; biases, and any layer too small to gain, are all-reduced dense (PyTorch's rule,
//               compress/powersgd_plan.hpp). r is one of 1, 2, 4, 8, 16.
//
// The compressor's whole round (its matrix products, orthogonalisations and the all-reduces' own summing)
// is charged as this rank's compute, on the thread's CPU clock, so time spent waiting for peers is not.
#pragma once

#include "scheme.hpp"
#include "schemes.hpp"

#include <commsgd/compress/powersgd.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/error.hpp>
#include <commsgd/policy/policy.hpp>

#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

namespace fmnist {

// The matrices of the MLP (mlp.hpp) from its per-layer sizes: layer l holds its weights, out x in in
// column-major order, which is the row-major in x out matrix, then its out biases. The last layer has
// `classes` outputs and each layer's inputs are the previous layer's outputs, so the sizes fix every width.
inline std::vector<commsgd::compress::layer_shape> mlp_layer_shapes(const std::vector<std::size_t>& sizes,
                                                                    std::size_t classes = 10) {
  std::vector<commsgd::compress::layer_shape> shapes(2 * sizes.size());
  std::size_t out = classes;
  for (std::size_t l = sizes.size(); l-- > 0;) {
    if (out == 0 || sizes[l] % out != 0 || sizes[l] / out < 2)
      throw commsgd::invalid_argument("powersgd: layer sizes that are not those of an MLP with " +
                                      std::to_string(classes) + " outputs");
    const std::size_t in = sizes[l] / out - 1;
    shapes[2 * l] = {in, out};
    shapes[2 * l + 1] = {out, 1};
    out = in;
  }
  return shapes;
}

// compress::powersgd whose rounds are charged to the trainer's compute clock.
class charged_powersgd_compressor : public commsgd::compress::powersgd {
public:
  using commsgd::compress::powersgd::powersgd;

  template <commsgd::comm::communicator C>
  commsgd::comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    if (!env_) return powersgd::reduce(c, g, out);
    commsgd::comm::exchange_report r;
    env_->charged([&] { r = powersgd::reduce(c, g, out); });
    return r;
  }

  // Where the next rounds' time goes: the trainer's step_env, which outlives the run.
  void charge_to(const step_env* env) noexcept { env_ = env; }

private:
  const step_env* env_ = nullptr;
};

// The rank is a template argument; the options carry the layer sizes, from which the shapes follow.
template <std::size_t Rank>
struct charged_powersgd {};

struct powersgd_layers {
  std::vector<std::size_t> layer_sizes;
};

} // namespace fmnist

template <std::size_t Rank>
struct commsgd::policy::compression_traits<fmnist::charged_powersgd<Rank>>
    : commsgd::policy::compressor_traits<compression_traits<fmnist::charged_powersgd<Rank>>,
                                         fmnist::charged_powersgd_compressor> {
  using options = fmnist::powersgd_layers;
  static fmnist::charged_powersgd_compressor make(std::size_t length, const options& o) {
    commsgd::compress::powersgd_options p;
    p.rank = Rank;
    p.layers = fmnist::mlp_layer_shapes(o.layer_sizes);
    return fmnist::charged_powersgd_compressor(length, p);
  }
};

namespace fmnist {

template <class Comm>
scheme_ptr<Comm> try_make_powersgd(const std::vector<std::string>& parts, const std::string& spec, Comm& comm,
                                   float lr, const std::vector<std::size_t>& layer_sizes) {
  if (parts.empty() || parts[0] != "powersgd") return nullptr;
  const int r = parts.size() > 1 ? std::stoi(parts[1]) : 1;
  const powersgd_layers o{layer_sizes};
  const std::size_t length = std::accumulate(layer_sizes.begin(), layer_sizes.end(), std::size_t{0});
  auto make = [&]<std::size_t R>() -> scheme_ptr<Comm> {
    using dp = commsgd::data_parallel<commsgd::policy::uncoded<>, charged_powersgd<R>,
                                      commsgd::policy::synchronous, Comm>;
    return std::make_unique<composed<Comm, dp>>(comm, length,
                                                typename dp::options{.lr = lr, .compression = o});
  };
  switch (r) {
  case 1:
    return make.template operator()<1>();
  case 2:
    return make.template operator()<2>();
  case 4:
    return make.template operator()<4>();
  case 8:
    return make.template operator()<8>();
  case 16:
    return make.template operator()<16>();
  default:
    throw commsgd::invalid_argument("argument 'scheme' = '" + spec + "': rank " + std::to_string(r) +
                                    " is not one of 1, 2, 4, 8, 16");
  }
}

} // namespace fmnist
