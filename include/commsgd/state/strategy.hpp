// How a sync strategy's state is saved and loaded; every strategy's save/load goes through access.
//
// A strategy's stream is one frame (state/stream.hpp) of kind S::state_kind whose body is
//   u32 part (state::part) | u32 group size | i32 saving rank (-1 in a shared part) | shared section |
//   local section
// with each section present when the part holds it. A strategy supplies, privately (access is its
// friend):
//   static constexpr const char* state_kind;       the frame's kind, e.g. "sync::local_sgd"
//   struct saved;                                  the parsed state, before it replaces anything
//   C* comm_;                                      the group, or, where the strategy has no comm_ of its
//   state::place state_place() const;             own, the group's size and this rank
//   void save_section(state::writer&, state::part which) const;   which: shared or local
//   void parse_section(state::reader&, state::part which, saved&) const;
//                                                  throws corrupt_data and changes nothing
//   void commit(saved&&) noexcept;                 replaces the state (moves only)
//
// A strategy's public save(os, part), load(is) and load(shared, local) come from deriving from
// checkpointed<S>; load(shared, local) parses rank 0's shared part and this rank's local part before one
// commit.
//
// Loading checks the frame, then the group size (and the rank, for a local section), then parses every
// section into `saved`, and only then commits: a refused stream leaves the strategy as it was.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/state/stream.hpp>

#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

namespace commsgd::inline v1::state {

// Where a saved state belongs: the size of the group and this rank in it.
struct place {
  int group_size = 0;
  int rank = 0;
};

struct access {
  template <class S>
  static void save(const S& s, std::ostream& os, state::part p) {
    const auto bits = static_cast<std::uint32_t>(p);
    if (bits < 1 || bits > 3)
      throw invalid_argument(
          commsgd::concat("argument 'part' = ", bits, " is outside the allowed range {shared, local, all}"));
    state::writer w(S::state_kind);
    w.put<std::uint32_t>(bits);
    const auto at = place(s);
    w.put<std::uint32_t>(static_cast<std::uint32_t>(at.group_size));
    // The shared part names no rank, so that every rank's copy is the same bytes.
    w.put<std::int32_t>(state::holds(p, state::part::local) ? at.rank : -1);
    if (state::holds(p, state::part::shared)) s.save_section(w, state::part::shared);
    if (state::holds(p, state::part::local)) s.save_section(w, state::part::local);
    state::write_frame(os, std::move(w).finish());
  }

  // A stream saved with part::all.
  template <class S>
  static void load(S& s, std::istream& is) {
    const auto blob = state::read_frame(is);
    typename S::saved t{};
    parse(s, blob, state::part::all, t);
    s.commit(std::move(t));
  }

  // The shared part (saved by any rank, usually rank 0) and this rank's local part.
  template <class S>
  static void load(S& s, std::istream& shared, std::istream& local) {
    const auto a = state::read_frame(shared);
    const auto b = state::read_frame(local);
    typename S::saved t{};
    parse(s, a, state::part::shared, t);
    parse(s, b, state::part::local, t);
    s.commit(std::move(t));
  }

  // The group a strategy's state belongs to: its comm_'s, unless it says otherwise.
  template <class S>
  static state::place place(const S& s) {
    if constexpr (requires { s.state_place(); })
      return s.state_place();
    else
      return {s.comm_->size(), s.comm_->rank()};
  }

  template <class S>
  static void parse(const S& s, std::span<const std::byte> blob, state::part expected, typename S::saved& t) {
    state::reader r(blob, S::state_kind);
    const auto p = r.get<std::uint32_t>();
    if (p != static_cast<std::uint32_t>(expected))
      throw corrupt_data(commsgd::concat(
          "saved state: the stream holds the ", state::part_name(p), " part of the state where the ",
          state::part_name(static_cast<std::uint32_t>(expected)), " part is expected"));
    const auto at = place(s);
    state::expect_same(r.get<std::uint32_t>(), static_cast<std::uint32_t>(at.group_size), "group size");
    const auto saved_rank = r.get<std::int32_t>();
    if (state::holds(expected, state::part::local))
      state::expect_same(saved_rank, at.rank, "rank (the local part belongs to the rank that saved it)");
    else
      state::expect_same(saved_rank, -1, "rank of a shared part (none: -1)");
    if (state::holds(expected, state::part::shared)) s.parse_section(r, state::part::shared, t);
    if (state::holds(expected, state::part::local)) s.parse_section(r, state::part::local, t);
    r.expect_end();
  }
};

// The public checkpoint members of a strategy S, which derives from checkpointed<S> and supplies what
// access reads. Every rank saves part::all, or rank 0 part::shared and every rank part::local.
template <class S>
class checkpointed {
public:
  void save(std::ostream& os, state::part p = state::part::all) const {
    access::save(static_cast<const S&>(*this), os, p);
  }
  void load(std::istream& is) { access::load(static_cast<S&>(*this), is); }
  void load(std::istream& shared, std::istream& local) {
    access::load(static_cast<S&>(*this), shared, local);
  }
};

// A learning rate read back from a stream: refused as corrupt (not as a bad argument) when out of range.
inline float read_learning_rate(state::reader& r) {
  const auto lr = r.get<float>();
  if (!(lr > 0.0f) || !(lr < std::numeric_limits<float>::infinity()))
    throw corrupt_data(
        commsgd::concat("saved state: learning rate ", lr, " is outside the allowed range (0, inf)"));
  return lr;
}

} // namespace commsgd::inline v1::state
