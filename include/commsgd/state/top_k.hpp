// The byte format of saved sparsifier state: the frame of every commsgd saved state (state/stream.hpp), with
// the body below.
//
// The body of a top_k sparsifier's state (write_top_k_state, read_top_k_state: host sparsify::top_k and
// cuda::top_k share them, so a checkpoint moves between the two) is
//   u64 length | u32 index bytes | u32 momentum (1 on, 0 off) | u64 layers | u64 steps | residual |
//   momentum (only when on) | u64 selectors | one byte array per selector (its warm-start state, or empty)
// with each array stored as u64 count | elements.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/state/stream.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace commsgd::inline v1::state {

// What a top_k sparsifier is, as far as its saved state goes: a state loads only into a sparsifier that
// agrees on all of it.
struct top_k_layout {
  std::uint64_t length = 0;
  std::uint32_t index_bytes = 0;
  bool momentum = false;
  std::uint64_t layers = 0;
  std::uint64_t selectors = 0;
};

// What read_top_k_state returns; the selectors' states go to its callback instead.
struct top_k_contents {
  std::uint64_t steps = 0;
  std::vector<float> residual;
  std::vector<float> momentum; // empty without momentum correction
};

// `selector_state(i)` gives selector i's saved bytes (empty when it keeps none).
template <class SelectorState>
std::vector<std::byte> write_top_k_state(std::string_view kind, const top_k_layout& layout,
                                         std::uint64_t steps, std::span<const float> residual,
                                         std::span<const float> momentum, SelectorState&& selector_state) {
  state::writer w(kind);
  w.put<std::uint64_t>(layout.length);
  w.put<std::uint32_t>(layout.index_bytes);
  w.put<std::uint32_t>(layout.momentum ? 1u : 0u);
  w.put<std::uint64_t>(layout.layers);
  w.put<std::uint64_t>(steps);
  w.put_array(residual);
  if (layout.momentum) w.put_array(momentum);
  w.put<std::uint64_t>(layout.selectors);
  for (std::uint64_t i = 0; i < layout.selectors; ++i) {
    const std::vector<std::byte> bytes = selector_state(static_cast<std::size_t>(i));
    w.put_bytes(bytes);
  }
  return std::move(w).finish();
}

// The same for selectors that keep nothing between calls (the device selectors): every selector's bytes empty.
inline std::vector<std::byte> write_top_k_state(std::string_view kind, const top_k_layout& layout,
                                                std::uint64_t steps, std::span<const float> residual,
                                                std::span<const float> momentum) {
  return write_top_k_state(kind, layout, steps, residual, momentum,
                           [](std::size_t) { return std::vector<std::byte>{}; });
}

// Parses and checks the whole blob against `layout` before returning, so a caller that replaces its state
// only afterwards changes nothing on a bad blob. `selector_state(i, bytes)` is called for each selector in
// order and may throw corrupt_data to refuse its bytes.
template <class SelectorState>
top_k_contents read_top_k_state(std::span<const std::byte> blob, std::string_view kind,
                                const top_k_layout& layout, SelectorState&& selector_state) {
  state::reader r(blob, kind);
  state::expect_same(r.get<std::uint64_t>(), layout.length, "length");
  state::expect_same(r.get<std::uint32_t>(), layout.index_bytes, "index size in bytes");
  state::expect_same(r.get<std::uint32_t>(), layout.momentum ? 1u : 0u, "momentum correction (1 on, 0 off)");
  state::expect_same(r.get<std::uint64_t>(), layout.layers, "layer count");
  top_k_contents c;
  c.steps = r.get<std::uint64_t>();
  c.residual.resize(layout.length);
  c.momentum.resize(layout.momentum ? layout.length : 0);
  r.get_array(std::span<float>(c.residual), "residual");
  if (layout.momentum) r.get_array(std::span<float>(c.momentum), "momentum");
  state::expect_same(r.get<std::uint64_t>(), layout.selectors, "selector count");
  for (std::uint64_t i = 0; i < layout.selectors; ++i)
    selector_state(static_cast<std::size_t>(i), r.get_bytes());
  r.expect_end();
  return c;
}

// The same for selectors that keep nothing between calls: whatever a host selector saved is skipped, since it
// means nothing to them.
inline top_k_contents read_top_k_state(std::span<const std::byte> blob, std::string_view kind,
                                       const top_k_layout& layout) {
  return read_top_k_state(blob, kind, layout, [](std::size_t, std::span<const std::byte>) {});
}

} // namespace commsgd::inline v1::state
