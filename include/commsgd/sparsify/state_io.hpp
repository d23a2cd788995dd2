// The byte format of saved sparsifier state. A blob is
//   magic "csgdspst" | u32 version | u32 byte-order mark | u64 total bytes | u32 kind length | kind |
//   body | u64 FNV-1a checksum of everything before it
// so that a reader can tell a foreign stream (magic, kind), one from another byte order (mark), a short
// one (total bytes) and a damaged one (checksum) apart and name which it is. Values are stored in native
// byte order: the mark makes a cross-endian load fail loudly instead of producing garbage.
//
// The body of a top_k sparsifier's state (write_top_k_state, read_top_k_state: host sparsify::top_k and
// cuda::top_k share them, so a checkpoint moves between the two) is
//   u64 length | u32 index bytes | u32 momentum (1 on, 0 off) | u64 layers | u64 steps | residual |
//   momentum (only when on) | u64 selectors | one byte array per selector (its warm-start state, or empty)
// with each array stored as u64 count | elements.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

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

namespace commsgd::inline v1::sparsify::detail {

inline constexpr char state_magic[8] = {'c', 's', 'g', 'd', 's', 'p', 's', 't'};
inline constexpr std::uint32_t state_version = 1;
inline constexpr std::uint32_t byte_order_mark = 0x01020304u;
// magic, version, mark, total
inline constexpr std::size_t state_prefix_bytes = 8 + 4 + 4 + 8;
// Guards against allocating absurd sizes when a corrupt header claims them.
inline constexpr std::uint64_t state_max_bytes = std::uint64_t{1} << 40;

inline std::uint64_t fnv1a(std::span<const std::byte> bytes) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::byte b : bytes) {
    h ^= static_cast<std::uint64_t>(b);
    h *= 0x100000001b3ull;
  }
  return h;
}

class state_writer {
public:
  explicit state_writer(std::string_view kind) {
    raw(state_magic, sizeof state_magic);
    put<std::uint32_t>(state_version);
    put<std::uint32_t>(byte_order_mark);
    put<std::uint64_t>(0); // total, patched in finish()
    put<std::uint32_t>(static_cast<std::uint32_t>(kind.size()));
    raw(kind.data(), kind.size());
  }

  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    raw(&v, sizeof v);
  }

  template <class T>
  void put_array(std::span<const T> v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<std::uint64_t>(v.size());
    raw(v.data(), v.size_bytes());
  }

  void put_bytes(std::span<const std::byte> b) { put_array(b); }

  std::vector<std::byte> finish() && {
    const std::uint64_t total = buf_.size() + sizeof(std::uint64_t);
    std::memcpy(buf_.data() + 16, &total, sizeof total);
    put<std::uint64_t>(fnv1a(buf_));
    return std::move(buf_);
  }

private:
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  std::vector<std::byte> buf_;
};

// Checks the frame (magic, version, mark, size, checksum, kind) on construction, then hands out fields;
// every read is bounds-checked so that no corrupt length can run past the buffer.
class state_reader {
public:
  state_reader(std::span<const std::byte> blob, std::string_view kind) : blob_(blob) {
    if (blob.size() < state_prefix_bytes + 4 + 8)
      throw corrupt_data(commsgd::detail::concat("saved state: ", blob.size(),
                                                 " bytes is too short to be a commsgd sparsifier state"));
    if (std::memcmp(blob.data(), state_magic, sizeof state_magic) != 0)
      throw corrupt_data("saved state: not a commsgd sparsifier state (magic bytes differ)");
    pos_ = sizeof state_magic;
    const auto version = get<std::uint32_t>();
    if (version != state_version)
      throw corrupt_data(commsgd::detail::concat("saved state: format version ", version,
                                                 " is not supported (this build reads ", state_version, ")"));
    if (get<std::uint32_t>() != byte_order_mark)
      throw corrupt_data("saved state: written on a machine of another byte order");
    const auto total = get<std::uint64_t>();
    if (total != blob.size())
      throw corrupt_data(commsgd::detail::concat("saved state: header says ", total,
                                                 " bytes, the stream has ", blob.size(),
                                                 " (truncated or padded)"));
    std::uint64_t stored;
    std::memcpy(&stored, blob.data() + blob.size() - 8, 8);
    if (stored != fnv1a(blob.first(blob.size() - 8)))
      throw corrupt_data("saved state: checksum mismatch (the stream is damaged)");
    end_ = blob.size() - 8;
    const auto kind_len = get<std::uint32_t>();
    need(kind_len);
    const std::string_view saved_kind(reinterpret_cast<const char*>(blob.data() + pos_), kind_len);
    pos_ += kind_len;
    if (saved_kind != kind)
      throw corrupt_data(commsgd::detail::concat("saved state: is the state of a '", saved_kind,
                                                 "' sparsifier, not of '", kind, "'"));
  }

  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, blob_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // Reads an array whose stored length must equal `expected`.
  template <class T>
  void get_array(std::span<T> out, std::string_view what) {
    const auto n = get<std::uint64_t>();
    if (n != out.size())
      throw corrupt_data(
          commsgd::detail::concat("saved state: ", what, " has ", n, " elements, expected ", out.size()));
    need(out.size_bytes());
    if (!out.empty()) std::memcpy(out.data(), blob_.data() + pos_, out.size_bytes());
    pos_ += out.size_bytes();
  }

  std::span<const std::byte> get_bytes() {
    const auto n = get<std::uint64_t>();
    need(n);
    auto s = blob_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

  void expect_end() const {
    if (pos_ != end_)
      throw corrupt_data(commsgd::detail::concat("saved state: ", end_ - pos_, " unexpected trailing bytes"));
  }

private:
  void need(std::uint64_t n) const {
    if (n > end_ - pos_) throw corrupt_data("saved state: a field runs past the end of the stream");
  }
  std::span<const std::byte> blob_;
  std::size_t pos_ = 0;
  std::size_t end_ = 0;
};

inline void write_blob(std::ostream& os, std::span<const std::byte> blob) {
  os.write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(blob.size()));
  if (!os) throw error("saving sparsifier state: the output stream failed");
}

// Reads exactly one blob, using the total in its prefix, so several states can follow each other in
// one stream.
inline std::vector<std::byte> read_blob(std::istream& is) {
  std::vector<std::byte> blob(state_prefix_bytes);
  is.read(reinterpret_cast<char*>(blob.data()), static_cast<std::streamsize>(blob.size()));
  if (is.gcount() != static_cast<std::streamsize>(blob.size()))
    throw corrupt_data("saved state: the stream ends inside the header (truncated)");
  if (std::memcmp(blob.data(), state_magic, sizeof state_magic) != 0)
    throw corrupt_data("saved state: not a commsgd sparsifier state (magic bytes differ)");
  std::uint64_t total;
  std::memcpy(&total, blob.data() + 16, sizeof total);
  if (total < state_prefix_bytes + 12 || total > state_max_bytes)
    throw corrupt_data(
        commsgd::detail::concat("saved state: header claims an impossible size of ", total, " bytes"));
  // The header's size is not trusted with memory: the blob grows only as bytes actually arrive, so a
  // corrupt size costs at most one chunk before the stream runs out.
  constexpr std::size_t chunk = std::size_t{1} << 20;
  while (blob.size() < total) {
    const std::size_t have = blob.size();
    const std::size_t want = std::min<std::size_t>(chunk, static_cast<std::size_t>(total) - have);
    blob.resize(have + want);
    is.read(reinterpret_cast<char*>(blob.data() + have), static_cast<std::streamsize>(want));
    if (is.gcount() != static_cast<std::streamsize>(want))
      throw corrupt_data(commsgd::detail::concat("saved state: the stream ends after ",
                                                 have + static_cast<std::size_t>(is.gcount()), " of ", total,
                                                 " bytes (truncated)"));
  }
  return blob;
}

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
  state_writer w(kind);
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

template <class T, class U>
void expect_saved(T saved, U mine, const char* what) {
  if (saved != static_cast<T>(mine))
    throw corrupt_data(
        commsgd::detail::concat("saved state: ", what, " is ", saved, ", this sparsifier's is ", mine));
}

// Parses and checks the whole blob against `layout` before returning, so a caller that replaces its state
// only afterwards changes nothing on a bad blob. `selector_state(i, bytes)` is called for each selector in
// order and may throw corrupt_data to refuse its bytes.
template <class SelectorState>
top_k_contents read_top_k_state(std::span<const std::byte> blob, std::string_view kind,
                                const top_k_layout& layout, SelectorState&& selector_state) {
  state_reader r(blob, kind);
  expect_saved(r.get<std::uint64_t>(), layout.length, "length");
  expect_saved(r.get<std::uint32_t>(), layout.index_bytes, "index size in bytes");
  expect_saved(r.get<std::uint32_t>(), layout.momentum ? 1u : 0u, "momentum correction (1 on, 0 off)");
  expect_saved(r.get<std::uint64_t>(), layout.layers, "layer count");
  top_k_contents c;
  c.steps = r.get<std::uint64_t>();
  c.residual.resize(layout.length);
  c.momentum.resize(layout.momentum ? layout.length : 0);
  r.get_array(std::span<float>(c.residual), "residual");
  if (layout.momentum) r.get_array(std::span<float>(c.momentum), "momentum");
  expect_saved(r.get<std::uint64_t>(), layout.selectors, "selector count");
  for (std::uint64_t i = 0; i < layout.selectors; ++i)
    selector_state(static_cast<std::size_t>(i), r.get_bytes());
  r.expect_end();
  return c;
}

} // namespace commsgd::inline v1::sparsify::detail
