// What the compressor tests share: rounds on n threads over a metered communicator, the checks every
// compressor's contract makes (same bits on every rank, bytes equal to the cost model, errors raised on
// every rank, state round-trips), and gradients with a spread of magnitudes, signs and zeros.
#pragma once

#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/cost/sparse.hpp>
#include <commsgd/error.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace harness {

using namespace commsgd;

// A gradient with a spread of magnitudes (a Laplace-like body, some large values), exact zeros and -0.
inline std::vector<float> gradient(std::size_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<float> mag(1.0f);
  std::uniform_int_distribution<int> kind(0, 19);
  std::vector<float> g(d);
  for (auto& x : g) {
    const int k = kind(rng);
    const float v = mag(rng) * 1e-2f;
    x = k == 0 ? 0.0f : k == 1 ? -0.0f : k == 2 ? v * 100.0f : ((rng() & 1) ? v : -v);
  }
  return g;
}

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// Runs body(rank's compressor, comm) on n thread ranks and returns what each rank raised ("" for nothing).
template <class Make, class Body>
std::vector<std::string> raised(int n, Make make, Body body) {
  std::vector<std::string> what(static_cast<std::size_t>(n));
  comm::local_group(n).run([&](comm::local& c) {
    auto x = make(c.rank());
    try {
      body(x, c);
    } catch (const commsgd::error& e) {
      what[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  return what;
}

// Checks that every rank's message (raised()'s) names `part`.
inline void every_names(const std::vector<std::string>& what, const char* part) {
  for (const auto& w : what)
    CHECK_MESSAGE(w.find(part) != std::string::npos, "raised: '" << w << "', expected it to name: " << part);
}

struct rank_log {
  std::vector<std::vector<float>> outs; // one per round
  std::vector<comm::traffic> sent;      // metered traffic per round, calls left out as models do
  std::vector<std::uint64_t> wire;      // wire_bytes() per round
};

// Runs `rounds` rounds of the compressor make(rank) on n threads; grad(rank, round) is the gradient.
template <class Make, class Grad>
std::vector<rank_log> run(int n, int rounds, Make make, Grad grad, std::size_t d) {
  std::vector<rank_log> logs(static_cast<std::size_t>(n));
  comm::local_group(n).run([&](comm::local& raw) {
    comm::metered<comm::local> c(raw);
    auto x = make(c.rank());
    auto& log = logs[static_cast<std::size_t>(c.rank())];
    for (int t = 0; t < rounds; ++t) {
      const auto g = grad(c.rank(), t);
      std::vector<float> out(d);
      c.reset();
      x.reduce(c, g, out);
      const auto tot = c.counters().total();
      log.outs.push_back(out);
      log.sent.push_back({tot.messages_sent, tot.bytes_sent, tot.messages_received, tot.bytes_received});
      log.wire.push_back(x.wire_bytes());
    }
  });
  return logs;
}

// Every rank's round throws; returns each rank's message (empty when a rank did not throw E).
template <class E, class Make, class Input>
std::vector<std::string> errors_on_every_rank(int n, Make make, Input input) {
  std::vector<std::string> what(static_cast<std::size_t>(n));
  comm::local_group(n).run([&](comm::local& c) {
    auto x = make(c.rank());
    std::vector<float> g, out;
    input(c.rank(), g, out);
    try {
      x.reduce(c, std::span<const float>(g), std::span<float>(out));
    } catch (const E& e) {
      what[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  return what;
}

template <class X>
std::string saved(const X& x) {
  std::ostringstream os;
  x.save(os);
  return os.str();
}

// Save after `before` rounds, continue `after` rounds; a fresh compressor loaded from the save continues
// with the same bits. Then corrupt, truncated and foreign streams are refused and leave the state as it
// was. Runs on one rank so the check sees whole states.
template <class Make, class Grad>
void check_save_load(Make make, Grad grad, std::size_t d, const std::string& foreign, int before = 3,
                     int after = 3) {
  comm::local_group(1).run([&](comm::local& c) {
    auto a = make(0);
    std::vector<float> out(d), out2(d);
    for (int t = 0; t < before; ++t)
      a.reduce(c, grad(0, t), out);
    const std::string state = saved(a);
    auto b = make(0);
    {
      std::istringstream is(state);
      b.load(is);
    }
    CHECK(saved(b) == state);
    CHECK(b.steps() == a.steps());
    for (int t = before; t < before + after; ++t) {
      a.reduce(c, grad(0, t), out);
      b.reduce(c, grad(0, t), out2);
      CHECK(same_bits(out, out2));
    }
    CHECK(saved(a) == saved(b));

    auto fresh = make(0);
    const std::string untouched = saved(fresh);
    auto refuse = [&](const std::string& bytes) {
      std::istringstream is(bytes);
      CHECK_THROWS_AS(fresh.load(is), corrupt_data);
      CHECK(saved(fresh) == untouched);
    };
    std::string flipped = state;
    flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x10);
    refuse(flipped);
    refuse(state.substr(0, state.size() - 5));
    refuse(state.substr(0, 10));
    refuse(foreign);
  });
}

} // namespace harness
