// Helpers of the checkpoint tests, on threads (tests/unit/checkpoint_*.cpp) and under MPI
// (tests/mpi/checkpoint_mpi.cpp): streams as byte vectors, every damage a stream can suffer, and the
// deterministic gradients the training loops use.
//
// The damage checks return a description of the first failure (empty when all is well) instead of failing
// a test themselves, so that an MPI test can CHECK the result on every rank without leaving the others
// waiting in a collective.
#pragma once

#include <commsgd/error.hpp>
#include <commsgd/state/stream.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {

using bytes = std::vector<std::byte>;

template <class S, class... Args>
bytes save_bytes(const S& s, Args&&... args) {
  std::ostringstream os(std::ios::binary);
  s.save(os, std::forward<Args>(args)...);
  const std::string str = std::move(os).str();
  const auto* b = reinterpret_cast<const std::byte*>(str.data());
  return bytes(b, b + str.size());
}

inline std::istringstream stream_of(const bytes& b) {
  return std::istringstream(std::string(reinterpret_cast<const char*>(b.data()), b.size()), std::ios::binary);
}

template <class S>
void load_bytes(S& s, const bytes& b) {
  auto is = stream_of(b);
  s.load(is);
}

template <class S>
void load_bytes(S& s, const bytes& shared, const bytes& local) {
  auto a = stream_of(shared);
  auto b = stream_of(local);
  s.load(a, b);
}

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// Sets total and checksum to match the bytes, so that damage inside the body reaches the body's parser.
inline void repair_frame(bytes& b) {
  if (b.size() < commsgd::state::detail::state_prefix_bytes + 8) return;
  const std::uint64_t total = b.size();
  std::memcpy(b.data() + 16, &total, sizeof total);
  const std::uint64_t sum = commsgd::state::detail::fnv1a(std::span<const std::byte>(b).first(b.size() - 8));
  std::memcpy(b.data() + b.size() - 8, &sum, sizeof sum);
}

template <class... Parts>
std::string say(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Loading `b` into s must throw corrupt_data whose message holds `needle`, and leave s's saved state
// (save_bytes(s, save_args...)) as `before`.
template <class S, class Load>
std::string expect_refused(S& s, const bytes& before, Load&& load, const std::string& what,
                           const std::string& needle = {}) {
  try {
    load();
    return what + ": accepted";
  } catch (const commsgd::corrupt_data& e) {
    if (!needle.empty() && std::string(e.what()).find(needle) == std::string::npos)
      return what + ": refused with '" + e.what() + "', which does not name '" + needle + "'";
  } catch (const std::exception& e) {
    return what + ": threw something other than corrupt_data: " + e.what();
  }
  if (save_bytes(s) != before) return what + ": the refused load changed the state";
  return {};
}

// Every byte flipped, every proper prefix, another format version: each refused, s untouched. `good` is a
// stream that s would accept; s should hold some other state, so that "untouched" means something.
template <class S>
std::string check_damage(S& s, const bytes& good) {
  const bytes before = save_bytes(s);
  for (std::size_t i = 0; i < good.size(); ++i) {
    bytes b = good;
    b[i] ^= std::byte{0x5a};
    auto r = expect_refused(
        s, before, [&] { load_bytes(s, b); }, say("byte ", i, " flipped"));
    if (!r.empty()) return r;
  }
  for (std::size_t len = 0; len < good.size(); ++len) {
    bytes b(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    auto r = expect_refused(
        s, before, [&] { load_bytes(s, b); }, say("truncated to ", len, " bytes"), "saved state");
    if (!r.empty()) return r;
  }
  {
    bytes b = good;
    const std::uint32_t v = commsgd::state::detail::state_version + 1;
    std::memcpy(b.data() + 8, &v, sizeof v);
    repair_frame(b);
    auto r = expect_refused(
        s, before, [&] { load_bytes(s, b); }, "another format version", "format version");
    if (!r.empty()) return r;
  }
  return {};
}

// Random edits with the frame repaired, so that they reach the body: each one is either refused with s
// untouched, or accepted, and then s saves back exactly the bytes it accepted (nothing was misread).
template <class S>
std::string check_repaired_edits(S& s, const bytes& good, std::uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  const bytes before = save_bytes(s);
  const std::size_t body = commsgd::state::detail::state_prefix_bytes;
  if (good.size() <= body + 8) return {};
  for (int k = 0; k < count; ++k) {
    bytes b = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e)
      b[body + rng() % (b.size() - body - 8)] = static_cast<std::byte>(rng());
    repair_frame(b);
    try {
      load_bytes(s, b);
    } catch (const commsgd::corrupt_data&) {
      if (save_bytes(s) != before) return say("repaired edit ", k, ": the refused load changed the state");
      continue;
    } catch (const std::exception& e) {
      return say("repaired edit ", k, ": threw something other than corrupt_data: ", e.what());
    }
    if (save_bytes(s) != b) return say("repaired edit ", k, ": accepted, but saves back other bytes");
    load_bytes(s, before);
  }
  return {};
}

// A gradient that depends only on (rank, step): async tests replay the server's log with it.
inline std::vector<float> fixed_gradient(std::size_t dim, int rank, std::int64_t step) {
  std::vector<float> g(dim);
  std::uint64_t z = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(rank + 1) +
                    0xBF58476D1CE4E5B9ull * static_cast<std::uint64_t>(step + 1);
  for (auto& v : g) {
    z ^= z >> 31;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 29;
    v = static_cast<float>(static_cast<std::int64_t>(z >> 40) - (std::int64_t{1} << 23)) * 0x1.0p-26f;
  }
  return g;
}

} // namespace ckpt
