// comm::local: a communicator whose ranks are threads of one process.
//
//   commsgd::comm::local_group{4}.run([](commsgd::comm::local& c) { ... });
//
// Collectives work on the ranks' own buffers through shared memory: each rank publishes a pointer, and the
// work is split so that no element is touched by two threads at once, so there is no per-element locking and
// an all-reduce runs at memory speed. Sums are reduced in rank order, so every rank gets the same bits.
//
// Nothing hangs: a rank that throws aborts the group, and every rank blocked in any call of the group (or of
// a communicator split from it) gets comm_aborted within a few tens of milliseconds; a rank that returns
// while another waits for it makes that wait fail with comm_error. run() joins every thread and rethrows the
// first error.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/local/context.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <thread>
#include <tuple>
#include <vector>

namespace commsgd::inline v1::comm {

class local {
public:
  using request_type = local_request;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return ctx_->size(); }

  void barrier() { ctx_->barrier("barrier"); }

  template <reducible T>
  void all_reduce_sum(std::span<T> data) {
    publish(data.data(), data.size());
    sync("all_reduce_sum");
    agree("all_reduce_sum", [&] { check_equal_counts("all_reduce_sum", "data.size()"); });
    const std::size_t n = data.size();
    const int p = size();
    if (p > 1 && n > 0) {
      auto peer = [&](int r) { return static_cast<const T*>(ctx_->slots[static_cast<std::size_t>(r)].data); };
      // Phase 1: this rank owns one chunk and sums it over all ranks, in rank order, into its own buffer.
      // No other rank reads this chunk of this buffer during the phase, so writing it in place is safe.
      const auto [lo, hi] = chunk(n, p, rank_);
      constexpr std::size_t block = 1024;
      T acc[block];
      for (std::size_t b = lo; b < hi; b += block) {
        const std::size_t len = std::min(block, hi - b);
        const T* first = peer(0) + b;
        for (std::size_t e = 0; e < len; ++e)
          acc[e] = first[e];
        for (int r = 1; r < p; ++r) {
          const T* src = peer(r) + b;
          for (std::size_t e = 0; e < len; ++e)
            acc[e] = detail::wrapping_add(acc[e], src[e]);
        }
        std::memcpy(data.data() + b, acc, len * sizeof(T));
      }
      sync("all_reduce_sum");
      // Phase 2: copy every other chunk from the rank that owns it.
      for (int r = 0; r < p; ++r) {
        if (r == rank_) continue;
        const auto [clo, chi] = chunk(n, p, r);
        if (chi > clo) std::memcpy(data.data() + clo, peer(r) + clo, (chi - clo) * sizeof(T));
      }
    }
    sync("all_reduce_sum");
  }

  template <transferable T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    const bool fits = all.size() == mine.size() * static_cast<std::size_t>(size());
    publish(mine.data(), mine.size(), fits ? 1 : 0);
    sync("all_gather");
    agree("all_gather", [&] {
      check_equal_counts("all_gather", "mine.size()");
      for (int r = 0; r < size(); ++r)
        if (slot(r).a == 0)
          throw size_mismatch(commsgd::concat("all_gather: on rank ", r,
                                              " argument 'all' must hold size() * mine.size() = ", size(),
                                              " * ", slot(r).count, " elements"));
    });
    const std::size_t m = mine.size();
    for (int r = 0; r < size(); ++r)
      if (m > 0) std::memcpy(all.data() + static_cast<std::size_t>(r) * m, slot(r).data, m * sizeof(T));
    sync("all_gather");
  }

  template <transferable T>
  std::vector<std::size_t> all_gather_v(std::span<const T> mine, std::vector<T>& all) {
    publish(mine.data(), mine.size());
    sync("all_gather_v");
    std::vector<std::size_t> counts(static_cast<std::size_t>(size()));
    for (int r = 0; r < size(); ++r)
      counts[static_cast<std::size_t>(r)] = slot(r).count;
    all.resize(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    std::size_t offset = 0;
    for (int r = 0; r < size(); ++r) {
      const std::size_t c = counts[static_cast<std::size_t>(r)];
      if (c > 0) std::memcpy(all.data() + offset, slot(r).data, c * sizeof(T));
      offset += c;
    }
    sync("all_gather_v");
    return counts;
  }

  template <transferable T>
  void broadcast(std::span<T> data, int root) {
    publish(data.data(), data.size(), root);
    sync("broadcast");
    agree("broadcast", [&] {
      for (int r = 0; r < size(); ++r)
        if (slot(r).a != root)
          throw invalid_argument(commsgd::concat("broadcast: ranks disagree on 'root' (rank ", r, " passed ",
                                                 slot(r).a, ", rank ", rank_, " passed ", root, ")"));
      detail::check_peer("root", root, size());
      check_equal_counts("broadcast", "data.size()");
    });
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), slot(root).data, data.size_bytes());
    sync("broadcast");
  }

  template <transferable T>
  void send(std::span<const T> data, int dest, int tag) {
    post(std::as_bytes(data), dest, tag);
  }

  template <transferable T>
  void recv(std::span<T> data, int source, int tag) {
    irecv(data, source, tag).wait();
  }

  template <transferable T>
  local_request isend(std::span<const T> data, int dest, int tag) {
    post(std::as_bytes(data), dest, tag);
    return {};
  }

  template <transferable T>
  local_request irecv(std::span<T> data, int source, int tag) {
    detail::check_peer("source", source, size());
    detail::check_tag(tag);
    const auto key = std::make_tuple(source, rank_, tag);
    std::uint64_t seq;
    {
      std::lock_guard lock(ctx_->mu);
      seq = ctx_->channels[key].next_recv++;
    }
    return local_request(ctx_, key, seq, std::as_writable_bytes(data));
  }

  local split(int color, int key) {
    publish(nullptr, 0, color, key);
    sync("split");
    agree("split", [&] {
      for (int r = 0; r < size(); ++r)
        if (slot(r).a < 0)
          throw invalid_argument(commsgd::concat("split: argument 'color' = ", slot(r).a, " on rank ", r,
                                                 " is outside the allowed range [0, inf)"));
    });
    // Members of my color, ordered by (key, rank); the first of them creates the shared context.
    std::vector<int> group;
    for (int r = 0; r < size(); ++r)
      if (slot(r).a == color) group.push_back(r);
    std::stable_sort(group.begin(), group.end(), [&](int x, int y) { return slot(x).b < slot(y).b; });
    const int leader = *std::min_element(group.begin(), group.end());
    if (rank_ == leader) {
      std::vector<int> world_ranks;
      for (int r : group)
        world_ranks.push_back(ctx_->members[static_cast<std::size_t>(r)]);
      ctx_->slots[static_cast<std::size_t>(rank_)].child =
          std::make_shared<detail::local_context>(ctx_->world, std::move(world_ranks));
    }
    sync("split");
    auto child = slot(leader).child;
    const int my_rank = static_cast<int>(std::find(group.begin(), group.end(), rank_) - group.begin());
    sync("split");
    if (rank_ == leader) ctx_->slots[static_cast<std::size_t>(rank_)].child.reset();
    return local(std::move(child), my_rank);
  }

private:
  friend class local_group;
  local(std::shared_ptr<detail::local_context> ctx, int rank) : ctx_(std::move(ctx)), rank_(rank) {}

  const detail::local_context::slot& slot(int r) const { return ctx_->slots[static_cast<std::size_t>(r)]; }

  void publish(const void* data, std::size_t count, long long a = 0, long long b = 0) {
    std::lock_guard lock(ctx_->mu);
    auto& s = ctx_->slots[static_cast<std::size_t>(rank_)];
    s.data = data;
    s.count = count;
    s.a = a;
    s.b = b;
  }

  void sync(const char* what) { ctx_->barrier(what); }

  // Runs a check that every rank evaluates on the same published data, so all reach the same verdict. A
  // rejecting rank synchronises once more before it throws: otherwise it could publish for its next call
  // while a slower rank still reads the slots of this one.
  template <class Check>
  void agree(const char* what, Check check) {
    try {
      check();
    } catch (const commsgd::error&) {
      sync(what);
      throw;
    }
  }

  // Every rank sees every count, so every rank reaches the same verdict and none is left waiting.
  void check_equal_counts(const char* op, const char* arg) const {
    for (int r = 1; r < size(); ++r)
      if (slot(r).count != slot(0).count)
        throw size_mismatch(commsgd::concat(op, ": ranks disagree on ", arg, " (rank 0 has ", slot(0).count,
                                            ", rank ", r, " has ", slot(r).count, ")"));
  }

  static std::pair<std::size_t, std::size_t> chunk(std::size_t n, int parts, int which) {
    const auto p = static_cast<std::size_t>(parts), w = static_cast<std::size_t>(which);
    return {n * w / p, n * (w + 1) / p};
  }

  void post(std::span<const std::byte> bytes, int dest, int tag) {
    detail::check_peer("dest", dest, size());
    detail::check_tag(tag);
    if (ctx_->world->aborted.load()) throw comm_aborted("another rank failed before this rank's send");
    std::vector<std::byte> message(bytes.begin(), bytes.end());
    {
      std::lock_guard lock(ctx_->mu);
      auto& ch = ctx_->channels[std::make_tuple(rank_, dest, tag)];
      ch.messages.emplace(ch.next_send++, std::move(message));
    }
    ctx_->cv.notify_all();
  }

  std::shared_ptr<detail::local_context> ctx_;
  int rank_ = 0;
};

// Runs one function on n threads, each with its own rank of a fresh comm::local.
class local_group {
public:
  explicit local_group(int n) : n_(n) {
    if (n < 1)
      throw invalid_argument(commsgd::concat("argument 'n' = ", n, " is outside the allowed range [1, inf)"));
  }

  int size() const noexcept { return n_; }

  // Calls fn(comm::local&) on every rank, joins all threads, and rethrows the first exception any rank threw.
  template <class Fn>
  void run(Fn&& fn) const {
    auto world = std::make_shared<detail::local_world>(n_);
    std::vector<int> members(static_cast<std::size_t>(n_));
    std::iota(members.begin(), members.end(), 0);
    auto ctx = std::make_shared<detail::local_context>(world, std::move(members));

    std::mutex error_mu;
    std::exception_ptr first_error;
    auto body = [&](int r) {
      try {
        local c(ctx, r);
        fn(c);
      } catch (...) {
        {
          std::lock_guard lock(error_mu);
          if (!first_error) first_error = std::current_exception();
        }
        world->aborted.store(true, std::memory_order_release);
      }
      world->exited[static_cast<std::size_t>(r)].store(true);
    };
    {
      std::vector<std::jthread> threads;
      threads.reserve(static_cast<std::size_t>(n_ - 1));
      for (int r = 1; r < n_; ++r)
        threads.emplace_back(body, r);
      body(0);
    }
    if (first_error) std::rethrow_exception(first_error);
  }

private:
  int n_;
};

static_assert(request<local_request>);
static_assert(communicator<local>);

} // namespace commsgd::inline v1::comm
