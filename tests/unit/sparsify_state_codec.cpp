// The one top_k checkpoint codec (state/top_k.hpp), shared by sparsify::top_k and cuda::top_k: the
// documented byte layout, round trips, and a refusal naming the field for every disagreement.
#include "support/gradients.hpp"

#include <commsgd/select/select.hpp>
#include <commsgd/sparsify/top_k.hpp>
#include <commsgd/state/top_k.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace sp = commsgd::sparsify;
namespace state = commsgd::state;
namespace sel = commsgd::select;

namespace {

std::vector<std::byte> bytes_of(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int b : v)
    out.push_back(static_cast<std::byte>(b));
  return out;
}

std::string refusal(std::span<const std::byte> blob, const state::top_k_layout& layout) {
  try {
    (void)state::read_top_k_state(blob, "top_k", layout, [](std::size_t, std::span<const std::byte>) {});
  } catch (const commsgd::corrupt_data& e) {
    return e.what();
  }
  return {};
}

} // namespace

TEST_CASE("top_k's saved state is the documented layout, field by field") {
  for (bool momentum : {false, true}) {
    CAPTURE(momentum);
    sp::top_k_options o;
    o.density = 0.1;
    o.momentum = momentum ? 0.9 : 0.0;
    o.layer_offsets = {0, 40, 100};
    sp::top_k<sel::laplace_bisect, std::uint64_t> t(100, o);
    for (std::uint64_t s = 0; s < 3; ++s)
      t.step(test_data::gradient(100, s));
    std::vector<std::byte> saved;
    t.save(saved);

    // The same fields written by hand through the frame writer, in the order the header documents.
    state::writer w("top_k");
    w.put<std::uint64_t>(100);
    w.put<std::uint32_t>(8);
    w.put<std::uint32_t>(momentum ? 1u : 0u);
    w.put<std::uint64_t>(2);
    w.put<std::uint64_t>(3);
    w.put_array(t.residual());
    if (momentum) w.put_array(t.momentum());
    w.put<std::uint64_t>(2);
    for (auto& s : t.selectors()) {
      const auto st = s.saved_state();
      w.put_bytes(std::as_bytes(std::span(&st, 1)));
    }
    const std::vector<std::byte> by_hand = std::move(w).finish();
    CHECK(saved == by_hand);
  }
}

TEST_CASE("write_top_k_state and read_top_k_state round-trip every field") {
  std::mt19937_64 rng(3);
  for (std::uint64_t length : {0u, 1u, 7u, 1000u})
    for (bool momentum : {false, true})
      for (std::uint64_t selectors : {0u, 1u, 3u}) {
        CAPTURE(length);
        CAPTURE(momentum);
        CAPTURE(selectors);
        const state::top_k_layout layout{length, 4, momentum, selectors == 0 ? 1 : selectors, selectors};
        const std::vector<float> residual = test_data::gradient(length, rng());
        const std::vector<float> mom = momentum ? test_data::gradient(length, rng()) : std::vector<float>{};
        std::vector<std::vector<std::byte>> states(selectors);
        for (std::size_t i = 0; i < states.size(); ++i)
          states[i].resize(i * 5, static_cast<std::byte>(i + 1));
        const std::uint64_t steps = rng();
        const auto blob = state::write_top_k_state("top_k", layout, steps, residual, mom,
                                                   [&](std::size_t i) { return states[i]; });
        std::vector<std::vector<std::byte>> got(selectors);
        std::size_t calls = 0;
        const state::top_k_contents c =
            state::read_top_k_state(blob, "top_k", layout, [&](std::size_t i, std::span<const std::byte> b) {
              CHECK(i == calls++);
              got[i].assign(b.begin(), b.end());
            });
        CHECK(c.steps == steps);
        CHECK(test_data::same_bits(c.residual, residual));
        CHECK(test_data::same_bits(c.momentum, mom));
        CHECK(calls == selectors);
        CHECK(got == states);
      }
}

TEST_CASE("read_top_k_state refuses a state of another shape, naming the field") {
  const state::top_k_layout layout{10, 4, true, 2, 2};
  const std::vector<float> residual(10, 1.0f), mom(10, 2.0f);
  const auto blob = state::write_top_k_state("top_k", layout, 5, residual, mom, [](std::size_t) {
    return bytes_of({1, 2});
  });
  CHECK(refusal(blob, layout).empty());
  auto changed = [&](auto edit) {
    state::top_k_layout l = layout;
    edit(l);
    return refusal(blob, l);
  };
  CHECK(changed([](auto& l) { l.length = 11; }).find("length is 10") != std::string::npos);
  CHECK(changed([](auto& l) { l.index_bytes = 8; }).find("index size in bytes is 4") != std::string::npos);
  CHECK(changed([](auto& l) { l.momentum = false; }).find("momentum correction") != std::string::npos);
  CHECK(changed([](auto& l) { l.layers = 1; }).find("layer count is 2") != std::string::npos);
  CHECK(changed([](auto& l) { l.selectors = 3; }).find("selector count is 2") != std::string::npos);
  // Another kind, and a callback that refuses its bytes.
  CHECK_THROWS_AS(
      state::read_top_k_state(blob, "none", layout, [](std::size_t, std::span<const std::byte>) {}),
      commsgd::corrupt_data);
  CHECK_THROWS_WITH_AS(state::read_top_k_state(blob, "top_k", layout,
                                               [](std::size_t i, std::span<const std::byte>) {
                                                 if (i == 1)
                                                   throw commsgd::corrupt_data("selector 1 refused");
                                               }),
                       "commsgd: selector 1 refused", commsgd::corrupt_data);
}
