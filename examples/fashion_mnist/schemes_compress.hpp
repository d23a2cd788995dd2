// The compressors of commsgd/compress as schemes: SSGD through data_parallel with a compressor in the
// compression slot.
//
//   fp16[:ef]  bf16[:ef]        every value in 16 bits, all-gathered; ef: with error feedback
//   sign                        EF-SignSGD: one scale per layer, 1 bit per value, all-gathered
//   qsgd:<s>[:ef]               QSGD with s levels, one norm per layer, all-gathered; ef: error feedback
//   random_k:<density>           random-k with error feedback, positions from a shared seed, values
//                               all-reduced
//
// The compressor's whole round is charged as this rank's compute, in thread CPU time, as the top-k schemes
// charge their selection: encoding, decoding and summing the n messages (a rank blocked in a collective
// spends no CPU time, so waiting is not charged; the transport's own copies are, a slight overcharge).
#pragma once

#include "scheme.hpp"

#include <commsgd/compress/compress.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/error.hpp>
#include <commsgd/policy/policy.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace fmnist {

// A compressor whose rounds are charged to the trainer's compute clock.
template <class Compressor>
class charged_compressor : public Compressor {
public:
  explicit charged_compressor(Compressor x) : Compressor(std::move(x)) {}

  template <class C>
  commsgd::comm::exchange_report reduce(C& c, std::span<const float> g, std::span<float> out) {
    commsgd::comm::exchange_report r;
    if (env_)
      env_->charged([&] { r = Compressor::reduce(c, g, out); });
    else
      r = Compressor::reduce(c, g, out);
    return r;
  }

  void charge_to(const step_env* env) noexcept { env_ = env; }

private:
  const step_env* env_ = nullptr;
};

// The policy tag of a charged compressor, and the options every compressor here reads.
template <class Compressor>
struct charged {};

struct compress_options {
  commsgd::compress::half_options half{};
  commsgd::compress::random_k_options random_k{};
  commsgd::compress::sign_options sign{};
  commsgd::compress::qsgd_options qsgd{};
};

template <class Compressor>
Compressor make_compressor(std::size_t length, const compress_options& o) {
  if constexpr (std::is_same_v<Compressor, commsgd::compress::fp16> ||
                std::is_same_v<Compressor, commsgd::compress::bf16>)
    return Compressor(length, o.half);
  else if constexpr (std::is_same_v<Compressor, commsgd::compress::random_k>)
    return Compressor(length, o.random_k);
  else if constexpr (std::is_same_v<Compressor, commsgd::compress::sign>)
    return Compressor(length, o.sign);
  else
    return Compressor(length, o.qsgd);
}

} // namespace fmnist

template <class Compressor>
struct commsgd::policy::compression_traits<fmnist::charged<Compressor>>
    : commsgd::policy::compressor_traits<compression_traits<fmnist::charged<Compressor>>,
                                         fmnist::charged_compressor<Compressor>> {
  using options = fmnist::compress_options;
  static fmnist::charged_compressor<Compressor> make(std::size_t length, const options& o) {
    return fmnist::charged_compressor<Compressor>(fmnist::make_compressor<Compressor>(length, o));
  }
};

namespace fmnist {

// SSGD with one block per rank (policy::uncoded<>) and the compressor in data_parallel's compression slot:
// this rank's block gradient is its loss sum scaled as `composed` (schemes.hpp) scales it, so the update
// is the batch mean every other scheme applies.
template <class Comm, class Dp>
class compressed final : public scheme<Comm> {
public:
  compressed(Comm& comm, std::size_t length, const typename Dp::options& o) : dp_(comm, length, o) {}

  void step(Comm&, step_env& env) override {
    dp_.compression().charge_to(&env);
    const auto sizes = dp_.block_sizes(env.batch);
    std::vector<std::size_t> offset(sizes.size() + 1, 0);
    for (std::size_t q = 0; q < sizes.size(); ++q)
      offset[q + 1] = offset[q] + sizes[q];
    const std::size_t mine = dp_.my_blocks()[0];
    const double scale = static_cast<double>(env.batch) / static_cast<double>(dp_.block_count());
    grad_.resize(env.params.size());
    env.gradient_by_layer(offset[mine], sizes[mine], scale, grad_, [](std::size_t) {});
    dp_.step(env.params, std::span<const float>(grad_));
    ++steps_;
  }

  std::string note() const override {
    std::ostringstream s;
    s << "wire bytes/step " << dp_.compression().wire_bytes();
    return s.str();
  }

private:
  Dp dp_;
  std::vector<float> grad_;
  std::size_t steps_ = 0;
};

// Builds a scheme of this file from its name, or returns nullptr when the name is not one of them.
template <class Comm>
scheme_ptr<Comm> try_make_compress(const std::vector<std::string>& parts, const std::string& spec, Comm& comm,
                                   float lr, const std::vector<std::size_t>& layer_sizes) {
  if (parts.empty()) return nullptr;
  const std::string& name = parts[0];
  if (name != "fp16" && name != "bf16" && name != "sign" && name != "qsgd" && name != "random_k")
    return nullptr;
  auto bad = [&](const std::string& why) {
    return commsgd::invalid_argument("argument 'scheme' = '" + spec + "': " + why);
  };
  const std::size_t length = std::accumulate(layer_sizes.begin(), layer_sizes.end(), std::size_t{0});
  std::vector<std::size_t> offsets{0};
  for (auto s : layer_sizes)
    offsets.push_back(offsets.back() + s);
  compress_options o;
  auto flag_ef = [&](std::size_t at) {
    if (parts.size() <= at) return false;
    if (parts[at] == "ef") return true;
    throw bad("'" + parts[at] + "' is not 'ef'");
  };
  auto make = [&]<class Compressor>() -> scheme_ptr<Comm> {
    using dp = commsgd::data_parallel<commsgd::policy::uncoded<>, charged<Compressor>,
                                      commsgd::policy::synchronous, Comm>;
    return std::make_unique<compressed<Comm, dp>>(comm, length,
                                                  typename dp::options{.lr = lr, .compression = o});
  };
  if (name == "fp16" || name == "bf16") {
    o.half.error_feedback = flag_ef(1);
    return name == "fp16" ? make.template operator()<commsgd::compress::fp16>()
                          : make.template operator()<commsgd::compress::bf16>();
  }
  if (name == "sign") {
    o.sign.layer_offsets = offsets;
    return make.template operator()<commsgd::compress::sign>();
  }
  if (name == "qsgd") {
    if (parts.size() < 2) throw bad("qsgd needs its levels, as qsgd:<s>");
    const unsigned long s = std::stoul(parts[1]);
    if (s < 1 || s > commsgd::compress::qsgd_options::max_levels) throw bad("levels must be in [1, 65535]");
    o.qsgd.levels = static_cast<std::uint32_t>(s);
    o.qsgd.layer_offsets = offsets;
    o.qsgd.seed = 1;
    o.qsgd.error_feedback = flag_ef(2);
    return make.template operator()<commsgd::compress::qsgd>();
  }
  if (parts.size() < 2) throw bad("random_k needs its density, as random_k:<density>");
  o.random_k.density = std::stod(parts[1]);
  o.random_k.seed = 1;
  return make.template operator()<commsgd::compress::random_k>();
}

} // namespace fmnist
