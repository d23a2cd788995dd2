// comm::narrow_ring_sum: a ring all-reduce of float values that travel in a narrower wire format (fp16 or bf16,
// through a codec), summed in float. Any communicator: it is built from isend/irecv alone.
//
// The concept's all_reduce_sum takes float, double and 32-bit integers only, and summing 16-bit values in
// float after an all_gather costs n-1 copies of every value. This is the ring that PyTorch's fp16 hook
// relies on its backend for: a reduce-scatter then an all-gather over n chunks (chunk j holds the values
// [m j / n, m (j + 1) / n), comm::metered's rule), so a rank sends and receives exactly comm::metered's ring
// share of m values, each in sizeof(wire) bytes: half the bytes of a float all-reduce. The reduce-scatter's
// hops over long chunks go in pieces (ring_pieces messages a hop), each summed from the cache.
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
#include <commsgd/comm/send_recv.hpp>
#include <commsgd/comm/traffic.hpp>
#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
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
// encode(decode(partial[i]) + x[i]) with the ring's saturation, x float or (for narrow_ring_sum_wire) in the
// wire format and decoded, each with exactly the bits of the one-value form. The ring then takes them;
// otherwise it converts value by value.
template <class F>
concept bulk_wire_codec = wire_codec<F> &&
    requires(std::span<const float> f, std::span<const std::uint16_t> h, std::span<std::uint16_t> o,
             std::span<float> d, bool s) {
  F::encode_n(f, o, s);
  F::sum_n(h, f, o, s);
  F::sum_n(h, h, o, s);
  F::decode_n(h, d);
};

// The reduce-scatter's hops go in pieces of at most narrow_ring_piece values once a chunk holds
// narrow_ring_pieced values or more, so that a piece received is summed while it is still in the cache (a
// whole chunk's inbox, far beyond any cache, is written to memory and read back: about 5 % of an fp16 DiLoCo
// round at 64 M values). Shorter chunks go whole: a torch bucket (25 MiB by default) then costs the 2 (n - 1)
// messages it always did, each a wait of its own through c10d.
inline constexpr std::size_t narrow_ring_piece = std::size_t{1} << 16;  // 128 KiB of 16-bit values
inline constexpr std::size_t narrow_ring_pieced = std::size_t{1} << 22; // 8 MiB of them

// Reusable buffers of one caller, so a round allocates nothing once warm, and the reduce-scatter's pieces
// (detail::ring_pieces), which every rank of a ring must set alike (tests make them small).
struct narrow_ring_buffers {
  std::vector<std::uint16_t> wire, inbox;
  std::size_t piece = narrow_ring_piece, pieced_from = narrow_ring_pieced;
};

// The inf and NaN values of a ring's result: how many, and the first one's index (0 when there is none).
struct wire_scan {
  std::size_t count = 0, first = 0;
};

namespace detail {

// How many pieces each chunk of a hop is cut into when n ranks share m values: the same for every chunk and
// every rank, so that both ends of a hop cut it alike, and no piece is empty.
constexpr std::size_t ring_pieces(std::size_t m, int n, std::size_t piece = narrow_ring_piece,
                                  std::size_t pieced_from = narrow_ring_pieced) noexcept {
  const std::size_t shortest = m / static_cast<std::size_t>(n);
  if (shortest < pieced_from || piece == 0) return 1;
  return std::max<std::size_t>(1, (shortest + piece - 1) / piece);
}

// Where chunk j of m values begins when n ranks share them (comm::metered's rule): m j / n.
inline std::size_t ring_chunk_start(std::size_t m, int n, int j) noexcept {
  return static_cast<std::size_t>(m * static_cast<std::uint64_t>(j) / static_cast<std::uint64_t>(n));
}

// The ring's schedule, shared by both forms below: `start(a, b)` makes this rank's own chunk [a, b) in the
// wire format and returns where it lies (in buf.wire, or where the caller holds it already); `hop(a, b, inbox,
// last)` writes [a, b)'s partial sum plus this rank's values into buf.wire[a, b) from the partial sum received
// in inbox, `last` on the hops that make the chunk's result (chunk me + 1, which the all-gather then sends
// on); a hop's chunk comes a piece at a time, in order (ring_pieces). Leaves every rank's result in buf.wire
// (n >= 2).
template <communicator C, class Start, class Hop>
void narrow_ring_schedule(C& c, std::size_t m, narrow_ring_buffers& buf, Start&& start, Hop&& hop) {
  const int n = c.size();
  const int me = c.rank();
  auto lo = [&](int j) { return ring_chunk_start(m, n, j); };
  auto chunk = [&](int j) {
    j = ((j % n) + n) % n;
    return std::pair<std::size_t, std::size_t>{lo(j), lo(j + 1)};
  };
  const std::size_t pieces = ring_pieces(m, n, buf.piece, buf.pieced_from);
  // Piece k of the chunk [a, b): [a + (b - a) k / pieces, a + (b - a) (k + 1) / pieces).
  auto cut = [&](std::size_t a, std::size_t b, std::size_t k) { return a + (b - a) * k / pieces; };
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  buf.wire.resize(m);
  buf.inbox.resize(m / static_cast<std::size_t>(n) / pieces + 2);
  std::uint16_t* w = buf.wire.data();
  // Exchanges one stretch with the neighbours: sends `count_out` values from `from`, receives into `into`.
  auto step = [&](const std::uint16_t* from, std::size_t count_out, std::uint16_t* into, std::size_t count) {
    send_recv(c, std::span<const std::uint16_t>(from, count_out), right,
              std::span<std::uint16_t>(into, count), left, narrow_ring_tag);
  };
  // Reduce-scatter: at step s this rank sends chunk me - s (its own at s = 0, from where start left it) and
  // adds its values to chunk me - 1 - s, piece by piece.
  const auto [own_a, own_b] = chunk(me);
  const std::uint16_t* const own_chunk = start(own_a, own_b);
  for (int s = 0; s + 1 < n; ++s) {
    const auto [a, b] = chunk(me - 1 - s);
    const auto [sa, sb] = chunk(me - s);
    for (std::size_t k = 0; k < pieces; ++k) {
      const std::size_t pa = cut(a, b, k), pb = cut(a, b, k + 1);
      const std::size_t qa = cut(sa, sb, k), qb = cut(sa, sb, k + 1);
      step(s == 0 ? own_chunk + (qa - sa) : w + qa, qb - qa, buf.inbox.data(), pb - pa);
      hop(pa, pb, std::span<const std::uint16_t>(buf.inbox.data(), pb - pa), s + 2 == n);
    }
  }
  // This rank now holds chunk me + 1's result. All-gather: at step s it sends chunk me + 1 - s and receives
  // chunk me - s, in place, whole.
  for (int s = 0; s + 1 < n; ++s) {
    const auto [a, b] = chunk(me - s);
    const auto [sa, sb] = chunk(me + 1 - s);
    step(w + sa, sb - sa, w + a, b - a);
  }
}

template <wire_codec Codec>
std::uint16_t narrow(float v, bool saturate) {
  std::uint16_t h = Codec::encode(v);
  if (saturate && (h & 0x7fffu) == Codec::inf_bits)
    h = static_cast<std::uint16_t>((h & 0x8000u) | Codec::max_finite_bits);
  return h;
}

// dst <- src for one block of wire values; whether any of them is inf or NaN. A fixed count and no aliasing,
// so that the copy and the test are one vectorised pass at -O2 too (a block of a variable count was not, and
// a copy then a test read each block twice).
inline constexpr std::size_t wire_block = 64;
template <wire_codec Codec>
bool copy_wire_block(const std::uint16_t* __restrict src, std::uint16_t* __restrict dst) noexcept {
  unsigned special = 0;
  for (std::size_t j = 0; j < wire_block; ++j) {
    const std::uint16_t h = src[j];
    dst[j] = h;
    special += (h & 0x7fffu) >= Codec::inf_bits ? 1u : 0u;
  }
  return special != 0;
}

// The inf and NaN among n wire values at `at` (indices from `base`), counted 64 at a time (a loop the
// compiler vectorises); the first one found by a second look only when there is one.
template <wire_codec Codec>
wire_scan scan_wire(const std::uint16_t* at, std::size_t n, std::size_t base) noexcept {
  auto special = [](std::uint16_t h) { return (h & 0x7fffu) >= Codec::inf_bits ? 1u : 0u; };
  wire_scan r;
  std::size_t i = 0;
  for (; i + wire_block <= n; i += wire_block) {
    unsigned k = 0;
    for (std::size_t j = 0; j < wire_block; ++j)
      k += special(at[i + j]);
    r.count += k;
  }
  for (; i < n; ++i)
    r.count += special(at[i]);
  if (r.count > 0)
    while (special(at[r.first]) == 0)
      ++r.first;
  r.first += base;
  return r;
}

// Adds the scan of a later stretch to `into`.
inline void add_scan(wire_scan& into, const wire_scan& later) noexcept {
  if (into.count == 0) into.first = later.first;
  into.count += later.count;
}

} // namespace detail

// What `rank` of n sends and receives in one ring over m values (with the default pieces), as comm::metered
// counts it: the float ring's share at 2 bytes a value, in (n - 1) (pieces + 1) messages each way.
constexpr traffic narrow_ring_traffic(std::uint64_t m, int n, int rank) noexcept {
  auto t = ring_all_reduce_traffic(m, 2, n, rank);
  if (n > 1)
    t.messages_sent = t.messages_received =
        static_cast<std::uint64_t>(n - 1) * (detail::ring_pieces(static_cast<std::size_t>(m), n) + 1);
  return t;
}

template <wire_codec Codec, communicator C>
void narrow_ring_sum(C& c, std::span<float> x, bool saturate, narrow_ring_buffers& buf) {
  const std::size_t m = x.size();
  buf.wire.resize(m);
  std::uint16_t* w = buf.wire.data();
  if (c.size() == 1) {
    if constexpr (bulk_wire_codec<Codec>) {
      Codec::encode_n(std::span<const float>(x), std::span<std::uint16_t>(buf.wire), saturate);
      Codec::decode_n(std::span<const std::uint16_t>(buf.wire), x);
    } else {
      for (std::size_t i = 0; i < m; ++i)
        x[i] = Codec::decode(detail::narrow<Codec>(x[i], saturate));
    }
    return;
  }
  detail::narrow_ring_schedule(
      c, m, buf,
      [&](std::size_t a, std::size_t b) -> const std::uint16_t* {
        if constexpr (bulk_wire_codec<Codec>)
          Codec::encode_n(std::span<const float>(x.data() + a, b - a), std::span<std::uint16_t>(w + a, b - a),
                          saturate);
        else
          for (std::size_t i = a; i < b; ++i)
            w[i] = detail::narrow<Codec>(x[i], saturate);
        return w + a;
      },
      [&](std::size_t a, std::size_t b, std::span<const std::uint16_t> in, bool) {
        if constexpr (bulk_wire_codec<Codec>)
          Codec::sum_n(in, std::span<const float>(x.data() + a, b - a),
                       std::span<std::uint16_t>(w + a, b - a), saturate);
        else
          for (std::size_t i = a; i < b; ++i)
            w[i] = detail::narrow<Codec>(Codec::decode(in[i - a]) + x[i], saturate);
      });
  if constexpr (bulk_wire_codec<Codec>) {
    Codec::decode_n(std::span<const std::uint16_t>(buf.wire), x);
  } else {
    for (std::size_t i = 0; i < m; ++i)
      x[i] = Codec::decode(w[i]);
  }
}

// The same ring when every rank's values are already in the wire format (`own`, its bits): the result, in the
// wire format, is left in buf.wire, with exactly the bits narrow_ring_sum gives for x = decode(own) (decoding
// is exact, and a finite wire value encodes back to itself). No float buffer of the whole length is made: a
// caller that wants floats decodes buf.wire once, where it wants them. `own` must not lie in buf's buffers
// (the ring writes them while it reads own): commsgd::invalid_argument.
//
// Returns the result's inf and NaN (the same on every rank) without a pass over the result: each rank counts
// them in the chunk it finishes, block by block while the block is in cache. A chunk that holds one leaves
// its maker with a NaN in its first value, so every rank sees which chunks hold one from a value apiece; only
// then (a round that is refused anyway) does one small all_reduce_sum share those chunks' counts and put
// their first values back.
//
// `own_finite`: the caller knows that own holds no inf or NaN (a compressor whose encode said so). A finite
// wire value goes out as it is, so this rank's first chunk is then sent from own where it lies instead of
// copied into buf.wire first. Promised wrongly, an inf would go out unsaturated and a NaN with its payload.
template <wire_codec Codec, communicator C>
wire_scan narrow_ring_sum_wire(C& c, std::span<const std::uint16_t> own, bool saturate,
                               narrow_ring_buffers& buf, bool own_finite = false) {
  const std::size_t m = own.size();
  const auto overlaps = [&](const std::vector<std::uint16_t>& v) {
    const std::less<const std::uint16_t*> below;
    return m > 0 && v.capacity() > 0 && below(own.data(), v.data() + v.capacity()) &&
           below(v.data(), own.data() + m);
  };
  if (overlaps(buf.wire) || overlaps(buf.inbox))
    throw invalid_argument("narrow_ring_sum_wire: argument 'own' lies in the ring's own buffers (buf.wire or "
                           "buf.inbox), which the ring overwrites; pass the values from elsewhere");
  buf.wire.resize(m);
  std::uint16_t* w = buf.wire.data();
  // A wire value goes out as narrow(decode(h)): itself, but for inf under saturate and a NaN's payload, so
  // the bits are copied and only blocks holding inf or NaN (a test the compiler vectorises) are redone.
  auto first = [&](std::size_t a, std::size_t b) -> const std::uint16_t* {
    if (own_finite) return own.data() + a; // (one rank copies a finite own before this is asked)
    std::size_t i = a;
    for (; i + detail::wire_block <= b; i += detail::wire_block)
      if (detail::copy_wire_block<Codec>(own.data() + i, w + i))
        for (std::size_t j = i; j < i + detail::wire_block; ++j)
          w[j] = detail::narrow<Codec>(Codec::decode(w[j]), saturate);
    for (; i < b; ++i)
      w[i] = detail::narrow<Codec>(Codec::decode(own[i]), saturate);
    return w + a;
  };
  if (c.size() == 1) {
    // The result is this rank's values: as they are where they are finite, else narrowed and counted.
    if (own_finite) {
      std::copy(own.begin(), own.end(), w);
      return {};
    }
    first(0, m);
    return detail::scan_wire<Codec>(w, m, 0);
  }
  auto sum = [&](std::size_t a, std::size_t b, std::span<const std::uint16_t> in) {
    if constexpr (bulk_wire_codec<Codec>)
      Codec::sum_n(in, own.subspan(a, b - a), std::span<std::uint16_t>(w + a, b - a), saturate);
    else
      for (std::size_t i = a; i < b; ++i)
        w[i] = detail::narrow<Codec>(Codec::decode(in[i - a]) + Codec::decode(own[i]), saturate);
  };
  constexpr std::uint16_t flag = Codec::inf_bits | (Codec::inf_bits >> 1); // a quiet NaN
  const int n = c.size();
  auto lo = [&](int j) { return detail::ring_chunk_start(m, n, j); };
  // The chunk this rank finishes, [finished_a, finished_b), and the inf and NaN in it.
  const std::size_t finished_a = lo((c.rank() + 1) % n), finished_b = lo((c.rank() + 1) % n + 1);
  wire_scan mine;
  std::uint16_t mine_first = 0; // that chunk's first value, before the flag replaced it
  detail::narrow_ring_schedule(
      c, m, buf, first, [&](std::size_t a, std::size_t b, std::span<const std::uint16_t> in, bool last) {
        if (!last) return sum(a, b, in);
        constexpr std::size_t block = 4096; // values summed, then counted from L1
        for (std::size_t i = a; i < b; i += block) {
          const std::size_t e = std::min(b, i + block);
          sum(i, e, in.subspan(i - a, e - i));
          detail::add_scan(mine, detail::scan_wire<Codec>(w + i, e - i, i));
        }
        if (b == finished_b && mine.count > 0) { // the chunk's last piece: flag its first value
          mine_first = w[finished_a];
          w[finished_a] = flag;
        }
      });
  bool any = false;
  for (int j = 0; j < n && !any; ++j)
    any = lo(j) < lo(j + 1) && (w[lo(j)] & 0x7fffu) >= Codec::inf_bits;
  if (!any) return {};
  // Every rank holds the same bits, so every rank is here. Chunk j's count, first index and first value.
  std::vector<double> t(3 * static_cast<std::size_t>(n), 0.0);
  const auto at = 3 * static_cast<std::size_t>((c.rank() + 1) % n);
  t[at] = static_cast<double>(mine.count);
  t[at + 1] = static_cast<double>(mine.first);
  t[at + 2] = static_cast<double>(mine_first);
  c.all_reduce_sum(std::span<double>(t));
  wire_scan r;
  for (int j = 0; j < n; ++j) {
    const auto k = 3 * static_cast<std::size_t>(j);
    if (t[k] == 0.0) continue;
    w[lo(j)] = static_cast<std::uint16_t>(t[k + 2]);
    detail::add_scan(r, {static_cast<std::size_t>(t[k]), static_cast<std::size_t>(t[k + 1])});
  }
  return r;
}

} // namespace commsgd::inline v1::comm
