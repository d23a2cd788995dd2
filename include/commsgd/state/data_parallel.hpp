// Checkpoints of a whole data_parallel<Coding, Compression, Sync, C>: what its save() and load() write and
// read (data_parallel.hpp keeps only the members that call these helpers).
//
//   std::ofstream f("rank" + std::to_string(rank) + ".ckpt", std::ios::binary);
//   trainer.save(f);                              // every rank, its own file; the model is the trainer's
//   ...
//   dp fresh(comm, length, options);              // the same composition, options and group
//   fresh.load(f);                                // refused (corrupt_data, nothing changed) unless it fits
//   fresh.start(params);                          // params: this rank's model as saved; no broadcast
//
// Or rank 0 alone saves the part every rank shares, and every rank its own:
//   if (rank == 0) trainer.save(shared_file, state::part::shared);
//   trainer.save(my_file, state::part::local);
//   fresh.load(shared_file, my_file);
//
// The stream is one frame (state/stream.hpp) of kind "data_parallel" whose body is
//   u32 part | u32 group size | i32 rank (-1 in a shared part) | coding policy | compression policy |
//   sync policy (type names) | u64 length | u64 block count |
//   shared section: u64 steps | the strategy's shared part (a nested stream)
//   local section:  this rank's blocks | u32 has sparsifier state | the sparsifier's or compressor's
//                   stream (empty without one) | the strategy's local part (a nested stream)
// The coding schemes keep no state between steps; their identity (block count, this rank's blocks) is
// saved, so a stream of another redundancy or assignment is refused. Policy names are the compiler's type
// names: a checkpoint moves between builds of one compiler family, like the byte order it records.
//
// Loading checks the whole frame and every identity field first; then the sparsifier loads (itself
// all-or-nothing), then the strategy; should the strategy refuse, the sparsifier is put back as it was.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>
#include <commsgd/state/stream.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

namespace commsgd::inline v1::state::detail {

inline constexpr const char* kind = "data_parallel";

template <class DP>
concept compression_with_state = requires(const DP& cd, DP& d, std::ostream& os, std::istream& is) {
  cd.compression().save(os);
  d.compression().load(is);
};

template <class S>
concept strategy_with_state = requires(const S& cs, S& s, std::ostream& os, std::istream& is) {
  cs.save(os, state::part::shared);
  s.load(is, is);
};

// What a stream must agree on with the object that loads it.
struct identity {
  std::uint32_t size = 0;
  std::int32_t rank = 0;
  std::string coding, sparsifier, sync;
  std::uint64_t length = 0, blocks = 0;
};

template <class Coding, class Compression, class Sync, class DP>
identity identity_of(const DP& dp, int size, int rank) {
  return {static_cast<std::uint32_t>(size),
          rank,
          typeid(Coding).name(),
          typeid(Compression).name(),
          typeid(Sync).name(),
          dp.length(),
          dp.block_count()};
}

inline std::vector<std::byte> bytes_of(const std::string& s) {
  const auto* b = reinterpret_cast<const std::byte*>(s.data());
  return std::vector<std::byte>(b, b + s.size());
}

template <class Coding, class Compression, class Sync, class DP>
void save(const DP& dp, std::ostream& os, state::part p, int size, int rank, std::uint64_t steps) {
  static_assert(strategy_with_state<typename DP::strategy_type>,
                "commsgd::data_parallel::save: this composition's sync strategy offers no save(os, part) and "
                "load(shared, local) (state/strategy.hpp says what a strategy supplies)");
  const auto bits = static_cast<std::uint32_t>(p);
  if (bits < 1 || bits > 3)
    throw invalid_argument(
        commsgd::concat("argument 'part' = ", bits, " is outside the allowed range {shared, local, all}"));
  const identity id = identity_of<Coding, Compression, Sync>(dp, size, rank);
  state::writer w(kind);
  w.put<std::uint32_t>(bits);
  w.put<std::uint32_t>(id.size);
  w.put<std::int32_t>(state::holds(p, state::part::local) ? id.rank : -1);
  w.put_string(id.coding);
  w.put_string(id.sparsifier);
  w.put_string(id.sync);
  w.put<std::uint64_t>(id.length);
  w.put<std::uint64_t>(id.blocks);
  if (state::holds(p, state::part::shared)) {
    w.put<std::uint64_t>(steps);
    w.put_bytes(state::to_bytes(dp.strategy(), state::part::shared));
  }
  if (state::holds(p, state::part::local)) {
    const auto mine = dp.my_blocks();
    w.put_array(std::span<const std::size_t>(mine.data(), mine.size()));
    if constexpr (compression_with_state<DP>) {
      w.put<std::uint32_t>(1u);
      std::ostringstream s(std::ios::binary);
      dp.compression().save(s);
      w.put_bytes(bytes_of(std::move(s).str()));
    } else {
      w.put<std::uint32_t>(0u);
      w.put_bytes({});
    }
    w.put_bytes(state::to_bytes(dp.strategy(), state::part::local));
  }
  state::write_frame(os, std::move(w).finish());
}

// What one stream holds once its frame and identity are checked; spans point into the caller's blob.
struct parsed {
  std::uint64_t steps = 0;
  std::span<const std::byte> strategy_shared, sparsifier, strategy_local;
  bool has_sparsifier = false;
};

inline void expect_name(std::string_view saved, const std::string& mine, const char* what) {
  if (saved != mine)
    throw corrupt_data(commsgd::concat("saved state: the ", what, " policy is '", saved,
                                       "', this data_parallel's is '", mine, "'"));
}

template <class DP>
void parse(const DP& dp, const identity& id, std::span<const std::byte> blob, state::part expected,
           parsed& out) {
  state::reader r(blob, kind);
  const auto p = r.get<std::uint32_t>();
  if (p != static_cast<std::uint32_t>(expected))
    throw corrupt_data(commsgd::concat(
        "saved state: the stream holds the ", state::part_name(p), " part of the state where the ",
        state::part_name(static_cast<std::uint32_t>(expected)), " part is expected"));
  state::expect_same(r.get<std::uint32_t>(), id.size, "group size");
  const auto rank = r.get<std::int32_t>();
  if (state::holds(expected, state::part::local))
    state::expect_same(rank, id.rank, "rank (the local part belongs to the rank that saved it)");
  else
    state::expect_same(rank, -1, "rank of a shared part (none: -1)");
  expect_name(r.get_string(), id.coding, "coding");
  expect_name(r.get_string(), id.sparsifier, "sparsifier");
  expect_name(r.get_string(), id.sync, "sync");
  state::expect_same(r.get<std::uint64_t>(), id.length, "length");
  state::expect_same(r.get<std::uint64_t>(), id.blocks, "block count");
  if (state::holds(expected, state::part::shared)) {
    out.steps = r.get<std::uint64_t>();
    out.strategy_shared = r.get_bytes();
  }
  if (state::holds(expected, state::part::local)) {
    const auto mine = dp.my_blocks();
    const auto saved = r.get_vector<std::size_t>();
    if (!std::equal(saved.begin(), saved.end(), mine.begin(), mine.end()))
      throw corrupt_data(commsgd::concat("saved state: this rank's ", saved.size(),
                                         " blocks differ from the ", mine.size(),
                                         " this data_parallel assigns it"));
    const auto has = r.get<std::uint32_t>();
    if (has != (compression_with_state<DP> ? 1u : 0u))
      throw corrupt_data(commsgd::concat("saved state: sparsifier state flag is ", has, ", expected ",
                                         compression_with_state<DP> ? 1 : 0));
    out.has_sparsifier = has == 1;
    out.sparsifier = r.get_bytes();
    if (!out.has_sparsifier && !out.sparsifier.empty())
      throw corrupt_data("saved state: holds sparsifier state, but this composition has no sparsifier");
    out.strategy_local = r.get_bytes();
  }
  r.expect_end();
}

template <class DP>
void commit(DP& dp, const parsed& t) {
  if constexpr (compression_with_state<DP>) {
    std::ostringstream backup(std::ios::binary);
    dp.compression().save(backup);
    {
      auto is = state::from_bytes(t.sparsifier);
      dp.compression().load(is);
    }
    try {
      auto shared = state::from_bytes(t.strategy_shared);
      auto local = state::from_bytes(t.strategy_local);
      dp.strategy().load(shared, local);
    } catch (...) {
      std::istringstream is(std::move(backup).str(), std::ios::binary);
      dp.compression().load(is);
      throw;
    }
  } else {
    auto shared = state::from_bytes(t.strategy_shared);
    auto local = state::from_bytes(t.strategy_local);
    dp.strategy().load(shared, local);
  }
}

// A stream saved with part::all; returns the step count to restore.
template <class Coding, class Compression, class Sync, class DP>
std::uint64_t load(DP& dp, std::istream& is, int size, int rank) {
  const identity id = identity_of<Coding, Compression, Sync>(dp, size, rank);
  const auto blob = state::read_frame(is);
  parsed t;
  parse(dp, id, blob, state::part::all, t);
  commit(dp, t);
  return t.steps;
}

// The shared part (saved by any rank, usually rank 0) and this rank's local part.
template <class Coding, class Compression, class Sync, class DP>
std::uint64_t load(DP& dp, std::istream& shared, std::istream& local, int size, int rank) {
  const identity id = identity_of<Coding, Compression, Sync>(dp, size, rank);
  const auto a = state::read_frame(shared);
  const auto b = state::read_frame(local);
  parsed t;
  parse(dp, id, a, state::part::shared, t);
  parse(dp, id, b, state::part::local, t);
  commit(dp, t);
  return t.steps;
}

} // namespace commsgd::inline v1::state::detail

namespace commsgd::inline v1::state {

// data_parallel's saved state, the body its save and load write and read (data_parallel.hpp calls these):
// one frame of kind "data_parallel" naming the composition, the world and the parts it holds.
template <class Coding, class Compression, class Sync, class DP>
void save_data_parallel(const DP& dp, std::ostream& os, part p, int size, int rank, std::uint64_t steps) {
  detail::save<Coding, Compression, Sync>(dp, os, p, size, rank, steps);
}

// Returns the steps the saved trainer had taken.
template <class Coding, class Compression, class Sync, class DP>
std::uint64_t load_data_parallel(DP& dp, std::istream& is, int size, int rank) {
  return detail::load<Coding, Compression, Sync>(dp, is, size, rank);
}

// The same from a shared part and this rank's local part saved apart.
template <class Coding, class Compression, class Sync, class DP>
std::uint64_t load_data_parallel(DP& dp, std::istream& shared, std::istream& local, int size, int rank) {
  return detail::load<Coding, Compression, Sync>(dp, shared, local, size, rank);
}

} // namespace commsgd::inline v1::state
