// sparsify::none: the dense baseline. It sends the gradient as is, so the exchange is a plain all-reduce;
// it keeps only a step counter as state.
//
// policy::dense is the same baseline inside data_parallel: there the block gradients go to the coding
// scheme's exchange untouched, with no sparsifier in between (a coded scheme needs them dense).
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sparsify/finite.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>
#include <commsgd/sparsify/sparsifier.hpp>
#include <commsgd/state/top_k.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <vector>

namespace commsgd::inline v1::sparsify {

struct none_options {
  non_finite_policy on_non_finite = non_finite_policy::refuse;
};

class none {
public:
  using message_type = dense_view;
  static constexpr const char* name = "none";

  using options = none_options;

  explicit none(std::size_t length, options opt = {}) : length_(length), opt_(opt) {}

  std::size_t length() const noexcept { return length_; }
  std::uint64_t steps() const noexcept { return steps_; }

  // The view aliases `g` unless non-finite entries had to be zeroed, in which case it aliases a copy.
  dense_view step(std::span<const float> g) {
    detail::check_gradient_size(g.size(), length_);
    std::uint32_t hi = 0;
    for (float x : g)
      hi = std::max(hi, select::magnitude_key(x));
    dense_view out{g};
    if (hi >= select::infinite_key) {
      if (opt_.on_non_finite == non_finite_policy::refuse) detail::throw_non_finite(g, "gradient");
      cleaned_.assign(g.begin(), g.end());
      for (float& x : cleaned_)
        if (!detail::is_finite_bits(x)) x = 0.0f;
      out = dense_view{cleaned_};
    }
    ++steps_;
    return out;
  }

  void save(std::vector<std::byte>& out) const {
    state::writer w(name);
    w.put<std::uint64_t>(length_);
    w.put<std::uint64_t>(steps_);
    out = std::move(w).finish();
  }
  void save(std::ostream& os) const {
    std::vector<std::byte> blob;
    save(blob);
    state::write_frame(os, blob);
  }

  void load(std::span<const std::byte> blob) {
    state::reader r(blob, name);
    const auto len = r.get<std::uint64_t>();
    if (len != length_)
      throw corrupt_data(
          commsgd::concat("saved state: length ", len, " differs from this sparsifier's ", length_));
    const auto steps = r.get<std::uint64_t>();
    r.expect_end();
    steps_ = steps;
  }
  void load(std::istream& is) { load(state::read_frame(is)); }

private:
  std::size_t length_;
  options opt_;
  std::uint64_t steps_ = 0;
  std::vector<float> cleaned_;
};

static_assert(sparsifier<none>);

} // namespace commsgd::inline v1::sparsify
