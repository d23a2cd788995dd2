// comm::narrow_ring_sum: a ring all-reduce of float values that travel in a narrower wire format (fp16 or bf16,
// through a codec), summed in float. Any communicator: it is built from isend/irecv alone.
//
// The concept's all_reduce_sum takes float, double and 32-bit integers only, and summing 16-bit values in
// float after an all_gather costs n-1 copies of every value. This is the ring that PyTorch's fp16 hook
// relies on its backend for: a reduce-scatter then an all-gather over n chunks (chunk j holds the values
// [m j / n, m (j + 1) / n), comm::metered's rule), so a rank sends and receives exactly comm::metered's ring
// share of m values, each in sizeof(wire) bytes: half the bytes of a float all-reduce.
//
// Arithmetic (the same bits on every rank and every run; tests/unit/comm_narrow_ring.cpp holds a reference):
// every rank's input values x_r must be exact in the wire format (the caller rounds them first). Chunk j
// starts at rank j and travels j, j+1, ..., j-1 (mod n): a rank decodes the partial sum it receives, adds its
// own value in float, and encodes the result for the next hop; the last rank's encoded sum is the chunk's
// result, which the all-gather hands to every rank (the last rank too, decoded from the same bits). So the
// result is ((x_j + x_{j+1})~ + x_{j+2})~ ... with ~ rounding to the wire format, as a 16-bit ring in a
// collective library computes it. With `saturate`, a partial sum beyond the format's range is sent as its
// largest finite value of the same sign; without, as infinity, which then reaches every rank's result.
// A NaN in any rank's input reaches every value of every rank's result (each chunk passes through every
// rank), which is how a rank that refuses its input makes every rank raise without a further message.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::comm {

// The point-to-point tag of the ring's messages: a fixed tag, as the coding schemes' (comm/tags.hpp), since a
// compressor's rounds never overlap another exchange on the same communicator.
inline constexpr int narrow_ring_tag = 31010;

// What the ring needs of a wire format: encode rounds a float to the nearest wire value (ties to even),
// decode is exact; inf_bits and max_finite_bits are the magnitudes of infinity and the largest finite value.
template <class F>
concept wire_codec = requires(float f, std::uint16_t h) {
  { F::encode(f) } -> std::same_as<std::uint16_t>;
  { F::decode(h) } -> std::same_as<float>;
  { F::inf_bits } -> std::convertible_to<std::uint16_t>;
  { F::max_finite_bits } -> std::convertible_to<std::uint16_t>;
};

// A codec may also convert in bulk (compress::fp16_format and bf16_format do, vectorised where the CPU allows):
// encode_n and decode_n as encode and decode on every value, sum_n(partial, x, out, saturate) as
// encode(decode(partial[i]) + x[i]) with the ring's saturation, each with exactly the bits of the one-value
// form. The ring then takes them; otherwise it converts value by value.
template <class F>
concept bulk_wire_codec = wire_codec<F> &&
    requires(std::span<const float> f, std::span<const std::uint16_t> h, std::span<std::uint16_t> o,
             std::span<float> d, bool s) {
  F::encode_n(f, o, s);
  F::sum_n(h, f, o, s);
  F::decode_n(h, d);
};

// Reusable buffers of one caller, so a round allocates nothing once warm.
struct narrow_ring_buffers {
  std::vector<std::uint16_t> wire, inbox;
};

template <wire_codec Codec, communicator C>
void narrow_ring_sum(C& c, std::span<float> x, bool saturate, narrow_ring_buffers& buf) {
  const int n = c.size();
  const int me = c.rank();
  const std::size_t m = x.size();
  auto narrow = [saturate](float v) {
    std::uint16_t h = Codec::encode(v);
    if (saturate && (h & 0x7fffu) == Codec::inf_bits)
      h = static_cast<std::uint16_t>((h & 0x8000u) | Codec::max_finite_bits);
    return h;
  };
  buf.wire.resize(m);
  if (n == 1) {
    if constexpr (bulk_wire_codec<Codec>) {
      Codec::encode_n(std::span<const float>(x), std::span<std::uint16_t>(buf.wire), saturate);
      Codec::decode_n(std::span<const std::uint16_t>(buf.wire), x);
    } else {
      for (std::size_t i = 0; i < m; ++i)
        x[i] = Codec::decode(narrow(x[i]));
    }
    return;
  }
  const auto un = static_cast<std::uint64_t>(n);
  auto lo = [&](int j) { return static_cast<std::size_t>(m * static_cast<std::uint64_t>(j) / un); };
  auto chunk = [&](int j) {
    j = ((j % n) + n) % n;
    return std::pair<std::size_t, std::size_t>{lo(j), lo(j + 1)};
  };
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  buf.inbox.resize(m / un + 1);
  std::uint16_t* w = buf.wire.data();
  // Exchanges one chunk with the neighbours: sends wire[send], receives into `into`.
  auto step = [&](std::pair<std::size_t, std::size_t> send, std::uint16_t* into, std::size_t count) {
    auto rr = c.irecv(std::span<std::uint16_t>(into, count), left, narrow_ring_tag);
    auto rs = c.isend(std::span<const std::uint16_t>(w + send.first, send.second - send.first), right,
                      narrow_ring_tag);
    rs.wait();
    rr.wait();
  };

  // Reduce-scatter: at step s this rank sends chunk me - s and adds its values to chunk me - 1 - s.
  {
    const auto [a, b] = chunk(me);
    if constexpr (bulk_wire_codec<Codec>)
      Codec::encode_n(std::span<const float>(x.data() + a, b - a), std::span<std::uint16_t>(w + a, b - a),
                      saturate);
    else
      for (std::size_t i = a; i < b; ++i)
        w[i] = narrow(x[i]);
  }
  for (int s = 0; s + 1 < n; ++s) {
    const auto [a, b] = chunk(me - 1 - s);
    step(chunk(me - s), buf.inbox.data(), b - a);
    if constexpr (bulk_wire_codec<Codec>)
      Codec::sum_n(std::span<const std::uint16_t>(buf.inbox.data(), b - a),
                   std::span<const float>(x.data() + a, b - a), std::span<std::uint16_t>(w + a, b - a),
                   saturate);
    else
      for (std::size_t i = a; i < b; ++i)
        w[i] = narrow(Codec::decode(buf.inbox[i - a]) + x[i]);
  }
  // This rank now holds chunk me + 1's result. All-gather: at step s it sends chunk me + 1 - s and receives
  // chunk me - s, in place.
  for (int s = 0; s + 1 < n; ++s) {
    const auto [a, b] = chunk(me - s);
    step(chunk(me + 1 - s), w + a, b - a);
  }
  if constexpr (bulk_wire_codec<Codec>) {
    Codec::decode_n(std::span<const std::uint16_t>(buf.wire), x);
  } else {
    for (std::size_t i = 0; i < m; ++i)
      x[i] = Codec::decode(w[i]);
  }
}

} // namespace commsgd::inline v1::comm
