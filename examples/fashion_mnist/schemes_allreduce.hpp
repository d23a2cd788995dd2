// The sparse all-reduce in the trainer's slot:
//
//   topk_ar:<method>:<density>   SSGD on top-k sparsified gradients with error feedback, summed by the sparse
//                                all-reduce (sparsify/allreduce.hpp): region reduce-scatter, the global top-k
//                                of the sums, all-gather of it; values not applied return to the residual
//                                of the rank that sent them. method: exact, radix, laplace_bisect,
//                                hierarchical, sampled
//
// Like topk, the sparsifier's time (error-feedback sum, selection, compaction) is charged as the rank's
// compute and its selector runs on one thread. schemes.hpp includes this header after the pieces it builds
// on (composed, charged_sparsifier, one_thread_selector) and asks try_make_allreduce before giving up on a
// name.
#pragma once

#include <commsgd/data_parallel.hpp>
#include <commsgd/error.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/select.hpp>
#include <commsgd/sparsify/allreduce_reducer.hpp>
#include <commsgd/sparsify/top_k.hpp>

#include <cstddef>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace fmnist {

// policy::top_k_allreduce with the trainer's charged, one-thread sparsifier.
template <class Selector>
struct charged_top_k_allreduce {};

} // namespace fmnist

template <class Selector>
struct commsgd::policy::compression_traits<fmnist::charged_top_k_allreduce<Selector>> {
  using options = commsgd::policy::top_k_allreduce_settings;
  static constexpr bool dense_blocks = false;
  using sparsifier_type = fmnist::charged_sparsifier<commsgd::sparsify::top_k<Selector>>;
  template <class Scheme, class C>
  using reducer = commsgd::sparsify::allreduce_reducer<sparsifier_type, Scheme, C>;

  template <class C, class Scheme>
  static reducer<Scheme, C> make_reducer(C& c, Scheme scheme, std::size_t length, const options& o) {
    return reducer<Scheme, C>(c, std::move(scheme),
                              sparsifier_type(length, o.top_k, fmnist::one_thread_selector<Selector>()),
                              o.allreduce);
  }
};

namespace fmnist {

// The topk_ar scheme, or nullptr when `parts` names another one.
template <class Comm>
scheme_ptr<Comm> try_make_allreduce(const std::vector<std::string>& parts, const std::string& spec,
                                    Comm& comm, float lr, const std::vector<std::size_t>& layer_sizes) {
  if (parts.empty() || parts[0] != "topk_ar") return nullptr;
  const std::string method = parts.size() > 1 ? parts[1] : "exact";
  commsgd::policy::top_k_allreduce_settings s;
  s.top_k.density = std::stod(parts.size() > 2 ? parts[2] : "0.01");
  const std::size_t length = std::accumulate(layer_sizes.begin(), layer_sizes.end(), std::size_t{0});
  auto make = [&]<class Selector>() -> scheme_ptr<Comm> {
    using dp = commsgd::data_parallel<commsgd::policy::uncoded<>, charged_top_k_allreduce<Selector>,
                                      commsgd::policy::synchronous, Comm>;
    return std::make_unique<composed<Comm, dp>>(comm, length,
                                                typename dp::options{.lr = lr, .compression = s});
  };
  if (method == "exact") return make.template operator()<commsgd::select::exact>();
  if (method == "radix") return make.template operator()<commsgd::select::radix>();
  if (method == "laplace_bisect") return make.template operator()<commsgd::select::laplace_bisect>();
  if (method == "hierarchical") return make.template operator()<commsgd::select::hierarchical>();
  if (method == "sampled") return make.template operator()<commsgd::select::sampled>();
  throw commsgd::invalid_argument("argument 'scheme' = '" + spec + "': selection method '" + method +
                                  "' is not one of exact, radix, laplace_bisect, hierarchical, sampled");
}

} // namespace fmnist
