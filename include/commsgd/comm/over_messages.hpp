// comm::over_messages<C>: wraps any communicator and runs every collective itself, out of C's point-to-point
// messages, so that what the collective moves can be counted message by message beneath it.
//
// comm::metered charges a collective by the bytes its assumed algorithm would send, since the transport's
// own algorithm is out of its sight; a byte count checked against that charge checks a formula against
// itself. Here the algorithm is this header's and every message it sends is real: over_messages<metered<C>>
// counts each message as it is handed to C (comm::metered counts point-to-point traffic as it is), and a test
// that runs an exchange over it compares cost/'s prediction with bytes that travelled. It is meant for such
// checks, not for speed (the transport's own collectives are faster).
//   all_reduce_sum  a ring over n chunks, chunk j the values [m j / n, m (j + 1) / n): n - 1 steps of
//                   reduce-scatter (at step s rank i sends chunk i - s to rank i + 1, and adds the chunk
//                   i - s - 1 it receives from rank i - 1 to its own values), after which rank i holds the
//                   sum of chunk i + 1; then n - 1 steps that pass the summed chunks on around the ring.
//                   Every rank receives the summing rank's bits (the concept's same bits everywhere); signed
//                   32-bit sums wrap, as the other models' do.
//   all_gather      its block to each other rank, theirs from each.
//   all_gather_v    its count (8 bytes) to each other rank, then its block: two messages a peer, where
//                   comm::metered charges one (the bytes are the same).
//   broadcast       the root sends the buffer to each other rank.
//   barrier, split  the wrapped communicator's own.
//   send to irecv   passed through.
// Collective messages use one fixed tag (over_messages_tag), so the caller's point-to-point traffic on that
// tag must not overlap a collective. Ranks that disagree on a collective's sizes get the wrapped
// communicator's error for a message of the wrong size.
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <numeric>
#include <span>
#include <type_traits>
#include <vector>

namespace commsgd::inline v1::comm {

// The point-to-point tag of the wrapper's collectives (in the fixed-tag range of comm/tags.hpp).
inline constexpr int over_messages_tag = 31200;

template <communicator C>
class over_messages {
public:
  using request_type = request_t<C>;

  explicit over_messages(C inner) : inner_(std::move(inner)) {}

  int rank() const noexcept { return inner_.rank(); }
  int size() const noexcept { return inner_.size(); }
  C& inner() noexcept { return inner_; }

  void barrier() { inner_.barrier(); }

  template <reducible T>
  void all_reduce_sum(std::span<T> data) {
    const int n = size();
    if (n == 1) return;
    const int next = (rank() + 1) % n, prev = (rank() + n - 1) % n;
    auto chunk = [&](int j) {
      const auto m = data.size(), un = static_cast<std::size_t>(n);
      const auto uj = static_cast<std::size_t>((j % n + n) % n);
      return data.subspan(m * uj / un, m * (uj + 1) / un - m * uj / un);
    };
    std::vector<T> in;
    for (int s = 0; s < n - 1; ++s) {
      const auto out = chunk(rank() - s), into = chunk(rank() - s - 1);
      in.resize(into.size());
      exchange(std::span<const T>(out), next, std::span<T>(in), prev);
      for (std::size_t k = 0; k < into.size(); ++k)
        if constexpr (std::is_same_v<T, std::int32_t>)
          into[k] =
              std::bit_cast<T>(std::bit_cast<std::uint32_t>(in[k]) + std::bit_cast<std::uint32_t>(into[k]));
        else
          into[k] = in[k] + into[k];
    }
    for (int s = 0; s < n - 1; ++s)
      exchange(std::span<const T>(chunk(rank() + 1 - s)), next, chunk(rank() - s), prev);
  }

  template <transferable T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    const auto n = static_cast<std::size_t>(size()), m = mine.size();
    if (all.size() != n * m)
      throw size_mismatch(commsgd::concat("over_messages::all_gather: argument 'all' has ", all.size(),
                                          " elements; it must hold size() * mine.size() = ", n, " * ", m));
    std::vector<request_type> pending;
    for (int r = 0; r < size(); ++r)
      if (r != rank()) {
        pending.push_back(inner_.isend(mine, r, over_messages_tag));
        pending.push_back(
            inner_.irecv(all.subspan(static_cast<std::size_t>(r) * m, m), r, over_messages_tag));
      }
    std::copy(mine.begin(), mine.end(), all.subspan(static_cast<std::size_t>(rank()) * m, m).begin());
    wait_all(pending);
  }

  template <transferable T>
  std::vector<std::size_t> all_gather_v(std::span<const T> mine, std::vector<T>& all) {
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(size()));
    counts[static_cast<std::size_t>(rank())] = mine.size();
    const std::uint64_t own = mine.size();
    std::vector<request_type> pending;
    for (int r = 0; r < size(); ++r)
      if (r != rank()) {
        pending.push_back(inner_.isend(std::span<const std::uint64_t>(&own, 1), r, over_messages_tag));
        pending.push_back(inner_.irecv(
            std::span<std::uint64_t>(counts).subspan(static_cast<std::size_t>(r), 1), r, over_messages_tag));
      }
    wait_all(pending);
    std::vector<std::size_t> out(counts.begin(), counts.end());
    all.resize(std::accumulate(out.begin(), out.end(), std::size_t{0}));
    std::size_t at = 0;
    for (int r = 0; r < size(); ++r) {
      const std::span<T> block(all.data() + at, out[static_cast<std::size_t>(r)]);
      if (r == rank())
        std::copy(mine.begin(), mine.end(), block.begin());
      else {
        pending.push_back(inner_.isend(mine, r, over_messages_tag));
        pending.push_back(inner_.irecv(block, r, over_messages_tag));
      }
      at += block.size();
    }
    wait_all(pending);
    return out;
  }

  template <transferable T>
  void broadcast(std::span<T> data, int root) {
    if (root < 0 || root >= size())
      throw invalid_argument(commsgd::concat("over_messages::broadcast: argument 'root' = ", root,
                                             " is outside the allowed range [0, ", size(), ")"));
    std::vector<request_type> pending;
    if (rank() != root)
      pending.push_back(inner_.irecv(data, root, over_messages_tag));
    else
      for (int r = 0; r < size(); ++r)
        if (r != root) pending.push_back(inner_.isend(std::span<const T>(data), r, over_messages_tag));
    wait_all(pending);
  }

  template <transferable T>
  void send(std::span<const T> data, int dest, int tag) {
    inner_.send(data, dest, tag);
  }

  template <transferable T>
  void recv(std::span<T> data, int source, int tag) {
    inner_.recv(data, source, tag);
  }

  template <transferable T>
  request_type isend(std::span<const T> data, int dest, int tag) {
    return inner_.isend(data, dest, tag);
  }

  template <transferable T>
  request_type irecv(std::span<T> data, int source, int tag) {
    return inner_.irecv(data, source, tag);
  }

  over_messages split(int color, int key) { return over_messages(inner_.split(color, key)); }

private:
  template <class T>
  void exchange(std::span<const T> out, int to, std::span<T> into, int from) {
    std::vector<request_type> pending;
    pending.push_back(inner_.isend(out, to, over_messages_tag));
    pending.push_back(inner_.irecv(into, from, over_messages_tag));
    wait_all(pending);
  }

  // Every request is waited for, even after one fails: a buffer of this call must not be written once it
  // has returned.
  static void wait_all(std::vector<request_type>& pending) {
    std::exception_ptr first;
    for (auto& q : pending)
      try {
        q.wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    pending.clear();
    if (first) std::rethrow_exception(first);
  }

  C inner_;
};

static_assert(communicator<over_messages<archetype>>);

} // namespace commsgd::inline v1::comm
