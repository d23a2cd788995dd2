// Fuzz target: sparsify::top_k::load from arbitrary bytes.
//
// A sparsifier (selector, index width, momentum, layers chosen by the input) takes a few steps so its state
// is not trivial, and is then handed a stream that is one of
//   - the input bytes as they are (mostly rejected by the frame checks),
//   - its own saved state with input-chosen damage (bytes overwritten, truncated, extended), with the total
//     and the checksum optionally repaired so that the damage reaches the body parser.
// Each stream goes through load(span) and load(istream). The only acceptable outcomes are:
//   - success, and then saving again reproduces the accepted stream byte for byte (nothing was misread), or
//   - commsgd::corrupt_data (or another commsgd::error), and then the state is exactly what it was before.
#include "fuzz_support.hpp"

#include <commsgd/error.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/sparsify/top_k.hpp>
#include <commsgd/state/top_k.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace sp = commsgd::sparsify;
namespace sel = commsgd::select;
using commsgd_fuzz::byte_source;

template <class S>
std::vector<std::byte> snapshot(const S& s) {
  std::vector<std::byte> out;
  s.save(out);
  return out;
}

template <class S>
void check_unchanged(const S& s, const std::vector<std::byte>& before, std::size_t last_size) {
  FUZZ_CHECK_MSG(snapshot(s) == before, "a rejected load changed the sparsifier's state");
  FUZZ_CHECK_MSG(s.last().size() == last_size, "a rejected load changed the last message");
}

template <class S>
void expect_stream_refused(S& s, std::istream& is, const std::vector<std::byte>& before,
                           std::size_t last_size) {
  bool ok = false;
  try {
    s.load(is);
    ok = true;
  } catch (const commsgd::error&) {
    check_unchanged(s, before, last_size);
  }
  FUZZ_CHECK_MSG(!ok, "load(istream) accepted a stream shorter than its header claims");
}

template <class S>
void try_load(S& s, std::span<const std::byte> blob) {
  const auto before = snapshot(s);
  const std::size_t last_size = s.last().size();

  // load(span)
  bool ok = false;
  try {
    s.load(blob);
    ok = true;
  } catch (const commsgd::error&) {
    check_unchanged(s, before, last_size);
  }
  if (ok) {
    FUZZ_CHECK_MSG(snapshot(s) == std::vector<std::byte>(blob.begin(), blob.end()),
                   "an accepted stream does not save back to the same bytes");
    FUZZ_CHECK(s.last().size() == 0);
    s.load(before); // back to the original for the stream path
  }

  // load(istream) reads exactly the `total` bytes its header claims, so it must accept or refuse as
  // load(span) does on that prefix, and leave whatever follows unread.
  if (blob.size() < commsgd::state::detail::state_prefix_bytes) {
    std::string bytes(reinterpret_cast<const char*>(blob.data()), blob.size());
    std::istringstream is(bytes, std::ios::binary);
    expect_stream_refused(s, is, before, last_size);
    return;
  }
  std::uint64_t claimed;
  std::memcpy(&claimed, blob.data() + 16, sizeof claimed);
  std::string bytes(reinterpret_cast<const char*>(blob.data()), blob.size());
  bytes += "TAIL";
  std::istringstream is(bytes, std::ios::binary);
  if (claimed > blob.size() || claimed < commsgd::state::detail::state_prefix_bytes) {
    expect_stream_refused(s, is, before, last_size);
    return;
  }
  const auto prefix = blob.first(static_cast<std::size_t>(claimed));
  bool prefix_ok = false;
  try {
    s.load(prefix);
    prefix_ok = true;
    s.load(before);
  } catch (const commsgd::error&) {
  }
  bool ok2 = false;
  try {
    s.load(is);
    ok2 = true;
  } catch (const commsgd::error&) {
    check_unchanged(s, before, last_size);
  }
  FUZZ_CHECK_MSG(ok2 == prefix_ok, "load(istream) and load(span) disagree on the same blob");
  if (ok2) {
    FUZZ_CHECK(snapshot(s) == std::vector<std::byte>(prefix.begin(), prefix.end()));
    const std::string rest = bytes.substr(static_cast<std::size_t>(claimed));
    std::string left(rest.size(), '\0');
    is.read(left.data(), static_cast<std::streamsize>(left.size()));
    FUZZ_CHECK_MSG(static_cast<std::size_t>(is.gcount()) == rest.size() && left == rest,
                   "load(istream) consumed bytes past its blob");
  }
}

void patch_frame(std::vector<std::byte>& blob) {
  if (blob.size() < commsgd::state::detail::state_prefix_bytes + 8) return;
  const std::uint64_t total = blob.size();
  std::memcpy(blob.data() + 16, &total, sizeof total);
  const std::uint64_t sum =
      commsgd::state::detail::fnv1a(std::span<const std::byte>(blob).first(blob.size() - 8));
  std::memcpy(blob.data() + blob.size() - 8, &sum, sizeof sum);
}

template <class Selector, class Index>
void run(byte_source& in, const Selector& proto) {
  sp::top_k_options opt;
  const std::size_t n = in.below(40);
  opt.density = 0.25;
  if (in.flag()) opt.momentum = 0.9;
  if (n >= 4 && in.flag()) opt.layer_offsets = {0, n / 3, n / 3, n};
  sp::top_k<Selector, Index> s(n, opt, proto);

  // A couple of steps with a fixed gradient give residuals, momentum, a step count and a warm threshold.
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i)
    g[i] = static_cast<float>((i * 7919u) % 23u) * 0.25f - 2.5f;
  const unsigned steps = in.u8() % 3;
  for (unsigned t = 0; t < steps; ++t) {
    try {
      s.step(g);
    } catch (const commsgd::unsupported&) {
      // laplace_bisect may refuse a tie-heavy layer; the state is then simply what it was.
    }
  }

  std::vector<std::byte> blob;
  const std::uint8_t mode = in.u8() % 4;
  if (mode == 0) {
    const auto raw = in.rest();
    blob.assign(reinterpret_cast<const std::byte*>(raw.data()),
                reinterpret_cast<const std::byte*>(raw.data() + raw.size()));
  } else {
    s.save(blob);
    // Damage: a few overwrites, then maybe a truncation or an extension.
    const unsigned edits = in.u8() % 6;
    for (unsigned e = 0; e < edits && !blob.empty(); ++e) {
      const std::size_t at = in.below(blob.size());
      blob[at] = static_cast<std::byte>(in.u8());
    }
    const std::uint8_t resize = in.u8() % 4;
    if (resize == 1 && !blob.empty()) blob.resize(in.below(blob.size()));
    if (resize == 2) blob.resize(blob.size() + 1 + in.below(16), static_cast<std::byte>(in.u8()));
    // Modes 2 and 3 repair total and checksum so that the body's own checks are exercised.
    if (mode >= 2) patch_frame(blob);
  }
  try_load(s, blob);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  byte_source in(data, size);
  switch (in.u8() % 4) {
  case 0:
    run<sel::exact, std::uint32_t>(in, sel::exact{});
    break;
  case 1:
    run<sel::exact, std::uint64_t>(in, sel::exact{});
    break;
  case 2:
    run<sel::laplace_bisect, std::uint32_t>(in, sel::laplace_bisect{});
    break;
  default: {
    sel::laplace_bisect::options o;
    o.warm_start = false;
    run<sel::laplace_bisect, std::uint64_t>(in, sel::laplace_bisect{o});
    break;
  }
  }
  return 0;
}
