// sync::replica_guard: an opt-in check that replicas which should be identical still are.
//
//   sync::replica_guard<C> guard(comm, 100);      // every 100 steps; 0 turns it off
//   loop { r = s.step(x, grad, info); guard.after_step(s, x, r); }
//   s.finish(x); guard.after_finish(s, x);
//
// data_parallel does exactly this when options::replica_check_every is set.
//
// A check hashes the model (model_hash: 64 bits over the bit patterns) and gathers one 64-bit word per rank,
// so it costs one pass over the model plus the smallest collective there is. Every rank receives the same
// words and so reaches the same verdict: either every rank returns, or every rank throws the same
// replicas_differ naming the step and the ranks outside the largest group of equal hashes (the lowest rank's
// group wins a tie). Nothing hangs.
//
// A check runs only where the strategy promises identical models (replica_promise): a check falls due every
// `every` steps and runs on the first step from then on after which the models must agree, and once more at
// finish when they must agree then. The promises of the built-in strategies:
//   synchronous, partitioned   after every step and at finish
//   local_sgd                  after warm-up and averaging steps, unless correction is at_sync (the pull
//                              leaves each rank its own model); at finish if it averages there
//   async_ps                   at finish only (workers pull different versions while training)
// Each strategy states its promise beside itself (sync/replica_promise.hpp); a strategy written elsewhere
// specialises replica_promise the same way, and unknown strategies promise nothing.
//
// The hash reads bits, not values: -0 and +0 differ, and so do NaNs with different payloads. That is the
// point: replicas that should be identical must be identical bit for bit, since any difference grows.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sync/replica_promise.hpp>
#include <commsgd/sync/strategy.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace commsgd::inline v1::sync {

namespace detail {

inline constexpr std::uint64_t hash_k1 = 0x9e3779b97f4a7c15ull;
inline constexpr std::uint64_t hash_k2 = 0xc2b2ae3d27d4eb4full;

// Bijective in `h` for a fixed `w` and in `w` for a fixed `h` (xor, rotation, odd multiplier), so a change
// confined to one word of the input always changes the result. One multiply per word: the multiplier's
// throughput bounds the speed, and eight independent lanes hide its latency.
constexpr std::uint64_t hash_round(std::uint64_t h, std::uint64_t w) noexcept {
  return std::rotl(h ^ w, 29) * hash_k1;
}

constexpr std::uint64_t hash_finish(std::uint64_t h) noexcept {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

inline std::uint64_t float_pair(const float* p) noexcept {
  return static_cast<std::uint64_t>(std::bit_cast<std::uint32_t>(p[0])) |
         (static_cast<std::uint64_t>(std::bit_cast<std::uint32_t>(p[1])) << 32);
}

inline std::string hex(std::uint64_t h) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(16) << std::setfill('0') << h;
  return out.str();
}

} // namespace detail

// 64-bit hash of the bit patterns of `x` and its length; the same value on every platform (words are formed
// from the floats' bits, not from memory order). It reads the model once at about memory speed; any
// difference confined to one 64-bit word is always detected, other differences go unseen with probability
// about 2^-64.
inline std::uint64_t model_hash(std::span<const float> x) noexcept {
  constexpr std::size_t lanes = 8;
  std::uint64_t lane[lanes];
  for (std::size_t l = 0; l < lanes; ++l)
    lane[l] = detail::hash_k2 * (2 * l + 1);
  const std::size_t words = x.size() / 2;
  const float* p = x.data();
  std::size_t w = 0;
  for (; w + lanes <= words; w += lanes)
    for (std::size_t l = 0; l < lanes; ++l)
      lane[l] = detail::hash_round(lane[l], detail::float_pair(p + 2 * (w + l)));
  for (; w < words; ++w)
    lane[w % lanes] = detail::hash_round(lane[w % lanes], detail::float_pair(p + 2 * w));
  std::uint64_t h = detail::hash_round(detail::hash_k2, static_cast<std::uint64_t>(x.size()));
  if (x.size() % 2 != 0) h = detail::hash_round(h, std::bit_cast<std::uint32_t>(x.back()));
  for (auto v : lane)
    h = detail::hash_round(h, v);
  return detail::hash_finish(h);
}

// Replicas that must be identical are not. The message names the step and the ranks; so do step() and
// ranks().
class replicas_differ : public error {
public:
  replicas_differ(const std::string& what, std::int64_t step, std::vector<int> ranks)
      : error(what), step_(step), ranks_(std::move(ranks)) {}
  // Steps completed when the check ran.
  std::int64_t step() const noexcept { return step_; }
  // The ranks outside the largest group of equal models, ascending.
  const std::vector<int>& ranks() const noexcept { return ranks_; }

private:
  std::int64_t step_;
  std::vector<int> ranks_;
};

// The verdict on one hash per rank (rank order): returns when all agree, else throws replicas_differ.
// A pure function, so that every rank, holding the same words, throws the same error. `when` reads like
// "after step 120" and goes into the message.
inline void check_replica_hashes(std::span<const std::uint64_t> hashes, std::int64_t step,
                                 const std::string& when) {
  if (hashes.empty()) return;
  std::map<std::uint64_t, std::vector<int>> groups;
  for (std::size_t r = 0; r < hashes.size(); ++r)
    groups[hashes[r]].push_back(static_cast<int>(r));
  if (groups.size() == 1) return;
  // The reference: the largest group; among equals, the one holding the lowest rank.
  const std::vector<int>* ref = nullptr;
  std::uint64_t ref_hash = 0;
  for (const auto& [h, ranks] : groups)
    if (!ref || ranks.size() > ref->size() || (ranks.size() == ref->size() && ranks.front() < ref->front())) {
      ref = &ranks;
      ref_hash = h;
    }
  std::vector<int> odd;
  std::ostringstream detail_text;
  for (std::size_t r = 0; r < hashes.size(); ++r)
    if (hashes[r] != ref_hash) {
      odd.push_back(static_cast<int>(r));
      detail_text << (odd.size() > 1 ? ", " : "") << "rank " << r << " " << detail::hex(hashes[r]);
    }
  std::ostringstream msg;
  msg << "replicas differ " << when << ": rank" << (odd.size() > 1 ? "s " : " ");
  for (std::size_t i = 0; i < odd.size(); ++i)
    msg << (i ? ", " : "") << odd[i];
  msg << " of " << hashes.size() << " hold" << (odd.size() > 1 ? "" : "s")
      << " a model other than the largest group of equal ones (rank";
  msg << (ref->size() > 1 ? "s " : " ");
  for (std::size_t i = 0; i < ref->size(); ++i)
    msg << (i ? ", " : "") << (*ref)[i];
  msg << ": hash " << detail::hex(ref_hash) << "; " << detail_text.str() << ")";
  throw replicas_differ(msg.str(), step, std::move(odd));
}

// What one rank contributes to a check: its model's hash and the steps it has taken.
struct replica_report {
  std::uint64_t hash = 0;
  std::int64_t steps = 0;
};

// Collective: every rank's replica_report, in rank order, the same words on every rank.
template <comm::communicator C>
std::vector<replica_report> gather_replica_reports(C& c, std::span<const float> model, std::int64_t steps) {
  const replica_report mine{model_hash(model), steps};
  std::vector<replica_report> all(static_cast<std::size_t>(c.size()));
  std::byte in[sizeof(mine)];
  std::memcpy(in, &mine, sizeof(mine));
  c.all_gather(std::span<const std::byte>(in), std::as_writable_bytes(std::span<replica_report>(all)));
  return all;
}

template <comm::communicator C>
class replica_guard {
public:
  // every = 0 turns the guard off; otherwise a check falls due every `every` steps: [0, inf).
  replica_guard(C& c, std::int64_t every) : comm_(&c), every_(every) {
    commsgd::check_range("replica_check_every", every, std::int64_t{0},
                         std::numeric_limits<std::int64_t>::max(), "[0, inf) (0 = off)");
    due_ = every_;
  }

  bool enabled() const noexcept { return every_ > 0; }
  std::int64_t every() const noexcept { return every_; }
  std::int64_t steps() const noexcept { return steps_; }
  // Checks run so far (each one a collective).
  std::int64_t checks() const noexcept { return checks_; }

  // Goes on from `steps` steps taken (after a checkpoint is loaded): counts from there, and the next check
  // falls due at the next multiple of the period. Never throws: a count past INT64_MAX is held there.
  void resume(std::uint64_t steps) noexcept {
    constexpr auto top = std::numeric_limits<std::int64_t>::max();
    steps_ = steps > static_cast<std::uint64_t>(top) ? top : static_cast<std::int64_t>(steps);
    if (enabled()) due_ = steps_ / every_ < top / every_ - 1 ? (steps_ / every_ + 1) * every_ : top;
  }

  // Collective: throws replicas_differ on every rank unless every rank's `model` has the same bits. The step
  // named is the most steps any rank has taken (ranks of an asynchronous strategy step at their own pace),
  // so the message reads the same on every rank.
  void check(std::span<const float> model, bool at_finish = false) {
    const auto reports = gather_replica_reports(*comm_, model, steps_);
    ++checks_;
    std::vector<std::uint64_t> hashes;
    std::int64_t step = 0;
    for (const auto& r : reports) {
      hashes.push_back(r.hash);
      step = std::max(step, r.steps);
    }
    check_replica_hashes(
        hashes, step,
        commsgd::concat(at_finish ? "at finish (after step " : "after step ", step, at_finish ? ")" : ""));
  }

  // Counts a step that returned `r`; checks when one is due and `s` promises identical models now. Every
  // rank reaches the same decision because the step count and the promise agree across ranks.
  template <class S>
  bool after_step(const S& s, std::span<const float> model, const step_result& r) {
    if (steps_ < std::numeric_limits<std::int64_t>::max()) ++steps_;
    if (!enabled() || steps_ < due_ || !replica_promise<S>::after_step(s, r)) return false;
    due_ = steps_ + every_;
    check(model);
    return true;
  }

  // At finish, where the strategy promises identical models then.
  template <class S>
  bool after_finish(const S& s, std::span<const float> model) {
    if (!enabled() || !replica_promise<S>::after_finish(s)) return false;
    check(model, true);
    return true;
  }

private:
  C* comm_;
  std::int64_t every_;
  std::int64_t due_ = 0;
  std::int64_t steps_ = 0;
  std::int64_t checks_ = 0;
};

} // namespace commsgd::inline v1::sync
