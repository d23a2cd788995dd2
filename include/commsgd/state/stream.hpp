// state/ is the home of checkpoints: this header the frame, top_k.hpp a top_k sparsifier's body (host and
// device), strategy.hpp a sync strategy's, data_parallel.hpp a whole data_parallel's.
//
// The frame every saved state of commsgd shares (a sparsifier's, a sync strategy's, a whole data_parallel's):
//   magic "csgdspst" | u32 version | u32 byte-order mark | u64 total bytes | u32 kind length | kind |
//   body | u64 FNV-1a checksum of everything before it
// so that a reader can tell a foreign stream (magic, kind), one from another byte order (mark), a short
// one (total bytes) and a damaged one (checksum) apart and name which it is. Values are stored in native
// byte order: the mark makes a cross-endian load fail loudly instead of producing garbage. The magic keeps
// the letters it had when sparsifiers were the only thing saved, so their streams read as they always did.
//
// Strategies and data_parallel tell two parts of their state apart (state::part): what every rank holds
// identically (shared: the schedule, counters, the learning rate, a common model) and what belongs to this
// rank alone (local: residuals, a parameter server's model, a worker's version). Every rank may save all of
// it, or rank 0 alone may save the shared part and every rank its local part.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace commsgd::inline v1::state {

// Which part of a state a stream holds.
enum class part : std::uint32_t {
  shared = 1, // identical on every rank: rank 0 alone may save it
  local = 2,  // this rank's own
  all = 3,    // both, in one stream per rank
};

inline constexpr bool holds(part p, part what) noexcept {
  return (static_cast<std::uint32_t>(p) & static_cast<std::uint32_t>(what)) != 0;
}

inline const char* part_name(std::uint32_t p) noexcept {
  switch (p) {
  case 1:
    return "shared";
  case 2:
    return "local";
  case 3:
    return "all";
  default:
    return "unknown";
  }
}

} // namespace commsgd::inline v1::state

namespace commsgd::inline v1::state::detail {

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

} // namespace commsgd::inline v1::state::detail

namespace commsgd::inline v1::state {

// The kit a saved state is written and read with; a policy written outside the library uses it to get the
// frame's checks for its own state.

// Builds one frame: the prefix, the kind, then the fields put in order; finish() closes it with the size and
// the checksum.
class writer {
public:
  explicit writer(std::string_view kind) {
    raw(detail::state_magic, sizeof detail::state_magic);
    put<std::uint32_t>(detail::state_version);
    put<std::uint32_t>(detail::byte_order_mark);
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
  void put_string(std::string_view s) { put_bytes(std::as_bytes(std::span<const char>(s.data(), s.size()))); }

  // Bytes put so far, the frame's prefix and kind included: where the next field will start in the blob.
  std::size_t size() const noexcept { return buf_.size(); }

  std::vector<std::byte> finish() && {
    const std::uint64_t total = buf_.size() + sizeof(std::uint64_t);
    std::memcpy(buf_.data() + 16, &total, sizeof total);
    put<std::uint64_t>(detail::fnv1a(buf_));
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
class reader {
public:
  reader(std::span<const std::byte> blob, std::string_view kind) : blob_(blob) {
    if (blob.size() < detail::state_prefix_bytes + 4 + 8)
      throw corrupt_data(
          commsgd::concat("saved state: ", blob.size(), " bytes is too short to be a commsgd saved state"));
    if (std::memcmp(blob.data(), detail::state_magic, sizeof detail::state_magic) != 0)
      throw corrupt_data("saved state: not a commsgd saved state (magic bytes differ)");
    pos_ = sizeof detail::state_magic;
    const auto version = get<std::uint32_t>();
    if (version != detail::state_version)
      throw corrupt_data(commsgd::concat("saved state: format version ", version,
                                         " is not supported (this build reads ", detail::state_version, ")"));
    if (get<std::uint32_t>() != detail::byte_order_mark)
      throw corrupt_data("saved state: written on a machine of another byte order");
    const auto total = get<std::uint64_t>();
    if (total != blob.size())
      throw corrupt_data(commsgd::concat("saved state: header says ", total, " bytes, the stream has ",
                                         blob.size(), " (truncated or padded)"));
    std::uint64_t stored;
    std::memcpy(&stored, blob.data() + blob.size() - 8, 8);
    if (stored != detail::fnv1a(blob.first(blob.size() - 8)))
      throw corrupt_data("saved state: checksum mismatch (the stream is damaged)");
    end_ = blob.size() - 8;
    const auto kind_len = get<std::uint32_t>();
    need(kind_len);
    const std::string_view saved_kind(reinterpret_cast<const char*>(blob.data() + pos_), kind_len);
    pos_ += kind_len;
    if (saved_kind != kind)
      throw corrupt_data(
          commsgd::concat("saved state: is the state of '", saved_kind, "', not of '", kind, "'"));
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
          commsgd::concat("saved state: ", what, " has ", n, " elements, expected ", out.size()));
    need(out.size_bytes());
    if (!out.empty()) std::memcpy(out.data(), blob_.data() + pos_, out.size_bytes());
    pos_ += out.size_bytes();
  }

  // Reads an array of any stored length (at most what is left of the stream).
  template <class T>
  std::vector<T> get_vector() {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto n = get<std::uint64_t>();
    if (n > (end_ - pos_) / sizeof(T))
      throw corrupt_data("saved state: a field runs past the end of the stream");
    std::vector<T> out(static_cast<std::size_t>(n));
    if (n != 0) std::memcpy(out.data(), blob_.data() + pos_, out.size() * sizeof(T));
    pos_ += out.size() * sizeof(T);
    return out;
  }

  std::span<const std::byte> get_bytes() {
    const auto n = get<std::uint64_t>();
    need(n);
    auto s = blob_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

  std::string_view get_string() {
    const auto b = get_bytes();
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }

  // Bytes left before the checksum.
  std::size_t remaining() const noexcept { return end_ - pos_; }

  void expect_end() const {
    if (pos_ != end_)
      throw corrupt_data(commsgd::concat("saved state: ", end_ - pos_, " unexpected trailing bytes"));
  }

private:
  void need(std::uint64_t n) const {
    if (n > end_ - pos_) throw corrupt_data("saved state: a field runs past the end of the stream");
  }
  std::span<const std::byte> blob_;
  std::size_t pos_ = 0;
  std::size_t end_ = 0;
};

inline void write_frame(std::ostream& os, std::span<const std::byte> blob) {
  os.write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(blob.size()));
  if (!os) throw error("saving state: the output stream failed");
}

// The save(std::ostream&, args...) of an object whose save(std::vector<std::byte>&, args...) makes its blob.
template <class S, class... Args>
void write_saved(std::ostream& os, const S& s, Args&&... args) {
  std::vector<std::byte> blob;
  s.save(blob, std::forward<Args>(args)...);
  write_frame(os, blob);
}

// Reads exactly one blob, using the total in its prefix, so several states can follow each other in
// one stream.
inline std::vector<std::byte> read_frame(std::istream& is) {
  std::vector<std::byte> blob(detail::state_prefix_bytes);
  is.read(reinterpret_cast<char*>(blob.data()), static_cast<std::streamsize>(blob.size()));
  if (is.gcount() != static_cast<std::streamsize>(blob.size()))
    throw corrupt_data("saved state: the stream ends inside the header (truncated)");
  if (std::memcmp(blob.data(), detail::state_magic, sizeof detail::state_magic) != 0)
    throw corrupt_data("saved state: not a commsgd saved state (magic bytes differ)");
  std::uint64_t total;
  std::memcpy(&total, blob.data() + 16, sizeof total);
  if (total < detail::state_prefix_bytes + 12 || total > detail::state_max_bytes)
    throw corrupt_data(commsgd::concat("saved state: header claims an impossible size of ", total, " bytes"));
  // The header's size is not trusted with memory: the blob grows only as bytes actually arrive, so a
  // corrupt size costs at most one chunk before the stream runs out.
  constexpr std::size_t chunk = std::size_t{1} << 20;
  while (blob.size() < total) {
    const std::size_t have = blob.size();
    const std::size_t want = std::min<std::size_t>(chunk, static_cast<std::size_t>(total) - have);
    blob.resize(have + want);
    is.read(reinterpret_cast<char*>(blob.data() + have), static_cast<std::streamsize>(want));
    if (is.gcount() != static_cast<std::streamsize>(want))
      throw corrupt_data(commsgd::concat("saved state: the stream ends after ",
                                         have + static_cast<std::size_t>(is.gcount()), " of ", total,
                                         " bytes (truncated)"));
  }
  return blob;
}

// A saved field that must equal this object's: names it and both values.
template <class T, class U>
void expect_same(T saved, U mine, std::string_view what) {
  if (saved != static_cast<T>(mine))
    throw corrupt_data(commsgd::concat("saved state: ", what, " is ", saved, ", this one's is ", mine));
}

// A saved float option that must equal this object's bit for bit (-0 and NaN payloads included): names it and
// both values.
inline void expect_same_bits(float saved, float mine, std::string_view option) {
  if (std::bit_cast<std::uint32_t>(saved) != std::bit_cast<std::uint32_t>(mine))
    throw corrupt_data(
        commsgd::concat("saved state: option '", option, "' is ", saved, ", this one's is ", mine));
}

// What a saved state's save(std::ostream&) writes, as bytes (to nest one state inside another).
template <class S, class... Args>
std::vector<std::byte> to_bytes(const S& s, Args&&... args) {
  std::ostringstream os(std::ios::binary);
  s.save(os, std::forward<Args>(args)...);
  const std::string str = std::move(os).str();
  const auto* b = reinterpret_cast<const std::byte*>(str.data());
  return std::vector<std::byte>(b, b + str.size());
}

// A stream over bytes (to hand a nested state to a load(std::istream&)).
inline std::istringstream from_bytes(std::span<const std::byte> b) {
  return std::istringstream(std::string(reinterpret_cast<const char*>(b.data()), b.size()), std::ios::binary);
}

} // namespace commsgd::inline v1::state
