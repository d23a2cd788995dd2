// What top-k holds back per DDP bucket (its residual, and its momentum under momentum correction), kept so that
// it follows the parameters rather than the buckets. Buckets are keyed by the model indices of their
// parameters, in bucket order. DDP rebuilds its buckets after its first iteration; a new bucket then takes over
// the residual (and momentum) of each of its parameters from wherever that parameter was before, so nothing
// held back is lost or lands on another parameter.
//
// `Sparsifier` is a std::variant of sparsify::top_k types (one per selector): the store reaches it through
// the interface they share (residual, momentum, assign).
#pragma once

#include <commsgd/compress/momentum.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace commsgd_torch {

template <class Sparsifier>
class residual_store {
public:
  struct bucket {
    Sparsifier sparsifier;
    std::vector<std::int64_t> params;  // model indices, in bucket order
    std::vector<std::int64_t> offsets; // where each starts in the bucket
  };
  using bucket_map = std::map<std::string, bucket>;
  // The dense warm-up's momentum per parameter, which a parameter's first compressed round goes on from.
  using velocity_map = std::map<std::int64_t, commsgd::compress::hook_momentum>;

  const bucket_map& buckets() const noexcept { return buckets_; }

  // The bucket under `key`, or null.
  const bucket* at(const std::string& key) const {
    auto it = buckets_.find(key);
    return it == buckets_.end() ? nullptr : &it->second;
  }

  // The bucket of `params` (element counts `sizes`, n in all), made by `make(offsets)` at its first round,
  // when it adopts what its parameters hold elsewhere and starts at step `steps`.
  template <class Make>
  bucket& find(const std::vector<std::int64_t>& params, const std::vector<std::int64_t>& sizes, Make make,
               std::uint64_t steps, const velocity_map& warm) {
    const std::string key = key_of(params);
    if (auto it = buckets_.find(key); it != buckets_.end()) return it->second;
    std::vector<std::int64_t> offsets;
    std::int64_t off = 0;
    for (auto s : sizes) {
      offsets.push_back(off);
      off += s;
    }
    bucket b{make(offsets), params, std::move(offsets)};
    adopt(b, sizes, steps, warm);
    for (auto p : params)
      owner_[p] = key;
    return buckets_.emplace(key, std::move(b)).first->second;
  }

  // Takes `loaded` (a checkpoint's buckets) in place of every bucket held.
  void replace(bucket_map loaded) {
    buckets_ = std::move(loaded);
    owner_.clear();
    for (auto& [key, b] : buckets_)
      for (auto p : b.params)
        owner_[p] = key;
  }

private:
  static std::string key_of(const std::vector<std::int64_t>& params) {
    std::string k;
    for (auto p : params)
      k += (k.empty() ? "" : ",") + std::to_string(p);
    return k;
  }

  // Moves each parameter's residual (and momentum) from its previous bucket into `b`, and sets b's step
  // count, through the sparsifier's own assign().
  void adopt(bucket& b, const std::vector<std::int64_t>& sizes, std::uint64_t steps,
             const velocity_map& warm) {
    const bool momentum = std::visit([](auto& s) { return s.has_momentum(); }, b.sparsifier);
    const auto own_r = std::visit([](auto& s) { return s.residual(); }, b.sparsifier);
    const auto own_u = std::visit([](auto& s) { return s.momentum(); }, b.sparsifier);
    std::vector<float> residual(own_r.begin(), own_r.end()), velocity(own_u.begin(), own_u.end());
    bool moved = false;
    for (std::size_t j = 0; j < b.params.size(); ++j) {
      auto own = owner_.find(b.params[j]);
      if (own == owner_.end()) {
        // A parameter's first compressed round: its momentum goes on from the dense warm-up's.
        auto w = warm.find(b.params[j]);
        if (momentum && w != warm.end() && w->second.length() == static_cast<std::size_t>(sizes[j]))
          std::ranges::copy(w->second.buffer(), velocity.begin() + static_cast<std::ptrdiff_t>(b.offsets[j]));
        continue;
      }
      auto& old = buckets_.at(own->second);
      const auto pos = std::find(old.params.begin(), old.params.end(), b.params[j]) - old.params.begin();
      const auto from = static_cast<std::size_t>(old.offsets[static_cast<std::size_t>(pos)]);
      const auto count = static_cast<std::size_t>(sizes[j]);
      const auto to = static_cast<std::size_t>(b.offsets[j]);
      auto r = std::visit([](auto& s) { return s.residual(); }, old.sparsifier);
      std::copy_n(r.begin() + static_cast<std::ptrdiff_t>(from), count,
                  residual.begin() + static_cast<std::ptrdiff_t>(to));
      if (momentum) {
        auto u = std::visit([](auto& s) { return s.momentum(); }, old.sparsifier);
        std::copy_n(u.begin() + static_cast<std::ptrdiff_t>(from), count,
                    velocity.begin() + static_cast<std::ptrdiff_t>(to));
      }
      moved = true;
    }
    std::visit([&](auto& s) { s.assign(steps, residual, velocity); }, b.sparsifier);
    // A bucket none of whose parameters it still owns is dropped.
    if (moved)
      for (auto it = buckets_.begin(); it != buckets_.end();) {
        bool owns = false;
        for (auto p : it->second.params)
          if (auto o = owner_.find(p); o != owner_.end() && o->second == it->first &&
                                       std::find(b.params.begin(), b.params.end(), p) == b.params.end())
            owns = true;
        it = owns ? std::next(it) : buckets_.erase(it);
      }
  }

  bucket_map buckets_;
  std::map<std::int64_t, std::string> owner_; // parameter index -> key of the bucket holding its residual
};

} // namespace commsgd_torch
