// comm::narrow_ring_sum (and narrow_ring_sum_wire) against an independent reference, on any communicator: every rank regenerates every
// rank's input from (rank, case), so each can compute the expected sum itself, value by value, and compare
// its own result bit for bit. Used by the unit test (comm::local, n = 1 to 8) and the MPI test (mpiexec).
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/narrow_ring.hpp>
#include <commsgd/compress/half.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

namespace narrow_ring_cases {

// The sum comm::narrow_ring_sum must produce, value by value: index i lies in chunk j (the j with
// d j / n <= i < d (j + 1) / n), whose partial sum starts at rank j and takes ranks j+1, ..., j+n-1 in turn,
// rounded to the format after every addition (and once for a single rank). `saturate` clamps a rounded
// partial sum to the largest finite value. Inputs are exact in the format.
template <class Format>
std::vector<float> reference(const std::vector<std::vector<float>>& x, bool saturate = false) {
  const std::size_t n = x.size(), d = x.empty() ? 0 : x[0].size();
  auto round = [&](float v) {
    std::uint16_t h = Format::encode(v);
    if (saturate && (h & 0x7fffu) == Format::inf_bits)
      h = static_cast<std::uint16_t>((h & 0x8000u) | Format::max_finite_bits);
    return Format::decode(h);
  };
  std::vector<float> out(d);
  for (std::size_t i = 0; i < d; ++i) {
    std::size_t j = 0;
    while (!(d * j / n <= i && i < d * (j + 1) / n))
      ++j;
    float acc = x[j][i];
    for (std::size_t hop = 1; hop < n; ++hop)
      acc = round(acc) + x[(j + hop) % n][i];
    out[i] = round(acc);
  }
  return out;
}

// Rank r's input of case `which`: values exact in the format, at mixed scales, with zeros, -0 and values near
// the format's top (so partial sums overflow in the `big` cases).
template <class Format>
std::vector<float> input(int rank, std::size_t d, std::uint64_t which, bool big) {
  std::mt19937_64 rng(which * 7919 + static_cast<std::uint64_t>(rank) * 104729 + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale(-20, 6), kind(0, 15);
  std::vector<float> x(d);
  for (auto& v : x) {
    const int k = kind(rng);
    float raw = k == 0 ? 0.0f : k == 1 ? -0.0f : std::ldexp(normal(rng), scale(rng));
    if (big && k == 2) raw = (rng() & 1) ? 40000.0f : -40000.0f;
    v = Format::decode(Format::encode(raw));
  }
  return x;
}

// The inf and NaN of a result, as narrow_ring_sum_wire reports them: how many, the first one's index (0 if
// none).
inline commsgd::comm::wire_scan non_finite_of(const std::vector<float>& x) {
  commsgd::comm::wire_scan r;
  for (std::size_t i = x.size(); i-- > 0;)
    if (!std::isfinite(x[i])) {
      ++r.count;
      r.first = i;
    }
  return r;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

template <class Format>
std::vector<std::uint16_t> wire_of(const std::vector<float>& x) {
  std::vector<std::uint16_t> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    h[i] = Format::encode(x[i]);
  return h;
}

template <class Format>
std::vector<float> floats_of(const std::vector<std::uint16_t>& h) {
  std::vector<float> x(h.size());
  for (std::size_t i = 0; i < h.size(); ++i)
    x[i] = Format::decode(h[i]);
  return x;
}

// Every rank's input of one case and their reference sum. Ranks that share a process (comm::local's threads)
// share them, and so do the two piece settings, which run the same cases: made once a process, not once a rank
// and run (most of the test's time went to n^2 inputs and n references a case).
struct expected_case {
  std::vector<std::vector<float>> inputs;
  std::vector<float> sum;
};

template <class Format>
const expected_case& expected(int n, std::size_t d, std::uint64_t which, bool big, bool saturate) {
  static std::mutex mutex;
  static std::map<std::tuple<int, std::size_t, std::uint64_t, bool, bool>, expected_case> made;
  const std::lock_guard lock(mutex);
  const auto key = std::make_tuple(n, d, which, big, saturate);
  if (const auto it = made.find(key); it != made.end()) return it->second;
  expected_case e;
  for (int r = 0; r < n; ++r)
    e.inputs.push_back(input<Format>(r, d, which, big));
  e.sum = reference<Format>(e.inputs, saturate);
  return made.emplace(key, std::move(e)).first->second; // a map's elements stay where they are
}

// The reduce-scatter's pieces of the cases: the ring's own (chunks of 8 MiB or more go in pieces, none here),
// and small ones, every chunk of 100 values or more cut into uneven pieces of at most 64.
enum class pieces { ring_default, small };

// Runs every case on communicator `c` (collective: every rank calls it); narrow_ring_sum_wire too, from the
// same inputs in the wire format.
template <class Format, commsgd::comm::communicator C>
void check_all(C& c, pieces cut = pieces::ring_default) {
  const int n = c.size();
  commsgd::comm::narrow_ring_buffers buf;
  if (cut == pieces::small) {
    buf.piece = 64;
    buf.pieced_from = 100;
  }
  // How many pieces each chunk of a hop goes in (1 on one rank, where there are no hops).
  const auto pieces_of = [&](std::size_t d) {
    return n > 1 ? commsgd::comm::detail::ring_pieces(d, n, buf.piece, buf.pieced_from) : std::size_t{1};
  };
  if (cut == pieces::small && n > 1) CHECK(pieces_of(4099) > 2); // not vacuous
  std::uint64_t which = 0;
  for (const std::size_t d :
       {std::size_t{0}, std::size_t{1}, std::size_t{2}, static_cast<std::size_t>(n - 1),
        static_cast<std::size_t>(n + 1), std::size_t{7}, std::size_t{1001}, std::size_t{20001}})
    for (const bool big : {false, true})
      for (const bool saturate : {false, true}) {
        ++which;
        CAPTURE(d);
        CAPTURE(big);
        CAPTURE(saturate);
        const auto& [all, want] = expected<Format>(n, d, which, big, saturate);
        auto mine = all[static_cast<std::size_t>(c.rank())];
        const auto own = wire_of<Format>(mine);
        commsgd::comm::narrow_ring_sum<Format>(c, std::span<float>(mine), saturate, buf);
        CHECK(same_bits(mine, want));
        if (saturate) CHECK(std::all_of(mine.begin(), mine.end(), [](float v) { return std::isfinite(v); }));
        // The same ring from the 16-bit values themselves: the same bits.
        const auto scan = commsgd::comm::narrow_ring_sum_wire<Format>(c, own, saturate, buf);
        CHECK(same_bits(floats_of<Format>(buf.wire), want));
        // Every input here is finite (only sums overflow), so it may be sent from where it lies: the same
        // bits, the same count.
        const auto sent_in_place = commsgd::comm::narrow_ring_sum_wire<Format>(c, own, saturate, buf, true);
        CHECK(same_bits(floats_of<Format>(buf.wire), want));
        CHECK(sent_in_place.count == scan.count);
        CHECK(sent_in_place.first == scan.first);
        // Its count of inf and NaN, made without a pass over the result: that of the reference.
        const auto bad = non_finite_of(want);
        CHECK(scan.count == bad.count);
        CHECK(scan.first == bad.first);
        // Not vacuous: fp16 partial sums of 40000 overflow.
        if (Format::max_finite_bits == 0x7bffu && n > 1 && big && !saturate && d > 1000) CHECK(bad.count > 0);
      }
  // Overflows placed on the chunks' edges: every chunk's first value, its last, the one after its first, a
  // hop's second piece's first, in some chunks and not others (the chunks that hold one travel flagged, and
  // their first values come back).
  for (const std::size_t d : {std::size_t{3}, static_cast<std::size_t>(8 * n + 3), std::size_t{4099}})
    for (int pattern = 0; pattern < 5; ++pattern) {
      CAPTURE(d);
      CAPTURE(pattern);
      const float top = Format::decode(Format::max_finite_bits);
      std::vector<std::vector<float>> all;
      for (int r = 0; r < n; ++r)
        all.push_back(input<Format>(r, d, 5000 + d + static_cast<std::size_t>(pattern), false));
      const auto un = static_cast<std::size_t>(n);
      std::size_t filled = 0; // chunks that hold a value, so far
      for (std::size_t j = 0; j < un; ++j) {
        const std::size_t a = d * j / un, b = d * (j + 1) / un;
        if (a == b) continue;
        ++filled;
        // pattern 4: the first value of a hop's second piece (the chunk's second value when it goes whole)
        const std::size_t second_piece = a + std::max<std::size_t>(1, (b - a) / pieces_of(d));
        const std::size_t at = pattern == 0   ? a
                               : pattern == 1 ? b - 1
                               : pattern == 2 ? std::min(a + 1, b - 1)
                               : pattern == 4 ? std::min(second_piece, b - 1)
                                              : a;
        if (pattern == 3 && filled % 2 == 0) continue; // every other chunk
        for (auto& x : all)
          x[at] = top;
      }
      const auto want = reference<Format>(all, false);
      const auto own = wire_of<Format>(all[static_cast<std::size_t>(c.rank())]);
      const auto scan = commsgd::comm::narrow_ring_sum_wire<Format>(c, own, false, buf);
      CHECK(same_bits(floats_of<Format>(buf.wire), want));
      const auto bad = non_finite_of(want);
      CHECK(scan.count == bad.count);
      CHECK(scan.first == bad.first);
      if (n > 1) CHECK(bad.count > 0);
    }
  // A rank that contributes NaN (how a compressor refuses its input) makes every value of every rank's
  // result NaN, and one NaN value reaches exactly that index everywhere.
  for (int bad = 0; bad < n; ++bad) {
    std::vector<float> mine = input<Format>(c.rank(), 257, 999, false);
    if (c.rank() == bad) std::fill(mine.begin(), mine.end(), std::numeric_limits<float>::quiet_NaN());
    const auto own = wire_of<Format>(mine);
    commsgd::comm::narrow_ring_sum<Format>(c, std::span<float>(mine), false, buf);
    CHECK(std::all_of(mine.begin(), mine.end(), [](float v) { return std::isnan(v); }));
    const auto scan = commsgd::comm::narrow_ring_sum_wire<Format>(c, own, false, buf);
    const auto wire_sum = floats_of<Format>(buf.wire);
    CHECK(std::all_of(wire_sum.begin(), wire_sum.end(), [](float v) { return std::isnan(v); }));
    CHECK(scan.count == 257);
    CHECK(scan.first == 0);
    std::vector<float> one = input<Format>(c.rank(), 257, 998, false);
    if (c.rank() == bad) one[5] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> one_in = one;
    commsgd::comm::narrow_ring_sum<Format>(c, std::span<float>(one), false, buf);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < one.size(); ++i)
      wrong += std::isnan(one[i]) != (i == 5) ? 1 : 0;
    CHECK(wrong == 0);
    const auto one_scan = commsgd::comm::narrow_ring_sum_wire<Format>(c, wire_of<Format>(one_in), false, buf);
    CHECK(one_scan.count == 1);
    CHECK(one_scan.first == 5);
  }
}

} // namespace narrow_ring_cases
