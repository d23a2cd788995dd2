// comm::local's parts below the communicator (comm/local.hpp): the state the threads of a group share (every
// rank's published buffers, its point-to-point channels, the abort flag), the checks of peers and tags, and
// the request isend and irecv return.
#pragma once

#include <commsgd/comm/communicator.hpp>
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

namespace detail {

using namespace std::chrono_literals;

// How often a blocked rank looks whether the group was aborted or a peer left.
inline constexpr auto local_poll_interval = 20ms;

// State of the whole group of threads, shared by every communicator split from it.
struct local_world {
  explicit local_world(int n) : exited(static_cast<std::size_t>(n)) {}
  std::atomic<bool> aborted{false};
  std::vector<std::atomic<bool>> exited; // by world rank
};

// A message in flight between two ranks of one context.
struct local_channel {
  std::map<std::uint64_t, std::vector<std::byte>> messages; // by sequence number
  std::uint64_t next_send = 0;
  std::uint64_t next_recv = 0;
};

// State of one communicator (the world or a split): its members, barrier and published buffers.
struct local_context {
  local_context(std::shared_ptr<local_world> w, std::vector<int> members_)
      : world(std::move(w)), members(std::move(members_)), slots(members.size()) {}

  struct slot {
    const void* data = nullptr;
    std::size_t count = 0;
    long long a = 0, b = 0; // small integer arguments (root, color, key) for agreement checks
    std::shared_ptr<local_context> child;
  };

  std::shared_ptr<local_world> world;
  std::vector<int> members; // world ranks
  std::vector<slot> slots;

  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  std::uint64_t generation = 0;
  std::map<std::tuple<int, int, int>, local_channel> channels; // (source, dest, tag)

  int size() const noexcept { return static_cast<int>(members.size()); }

  // Throws when the group was aborted, or when a member that `waiting_on` names has left.
  template <class Pred>
  void check_alive(Pred waiting_on, const char* what) const {
    if (world->aborted.load(std::memory_order_acquire))
      throw comm_aborted(std::string("another rank failed while this rank waited in ") + what);
    for (int r = 0; r < size(); ++r)
      if (waiting_on(r) &&
          world->exited[static_cast<std::size_t>(members[static_cast<std::size_t>(r)])].load())
        throw comm_error(commsgd::concat("rank ", r, " returned while this rank waited for it in ", what));
  }

  void barrier(const char* what) {
    std::unique_lock lock(mu);
    const auto gen = generation;
    if (++arrived == size()) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    while (generation == gen) {
      cv.wait_for(lock, local_poll_interval);
      if (generation != gen) break;
      check_alive([](int) { return true; }, what);
    }
  }
};

inline void check_peer(const char* name, int value, int size) {
  if (value < 0 || value >= size)
    throw invalid_argument(
        commsgd::concat("argument '", name, "' = ", value, " is outside the allowed range [0, ", size, ")"));
}

inline void check_tag(int tag) {
  if (tag < 0)
    throw invalid_argument(
        commsgd::concat("argument 'tag' = ", tag, " is outside the allowed range [0, inf)"));
}

// Adds in wrap-around arithmetic for integers (signed overflow would be undefined), plainly for floats.
template <class T>
inline T wrapping_add(T a, T b) noexcept {
  if constexpr (std::is_same_v<T, std::int32_t>)
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(a) + static_cast<std::uint32_t>(b));
  else
    return a + b;
}

} // namespace detail

// Result of isend/irecv on comm::local. Sends are buffered, so their requests are complete at once.
class local_request {
public:
  local_request() = default;

  void wait() {
    if (!ctx_ || done_) return;
    std::unique_lock lock(ctx_->mu);
    auto& ch = ctx_->channels[key_];
    while (!take(ch)) {
      ctx_->cv.wait_for(lock, detail::local_poll_interval);
      if (take(ch)) break;
      const int source = std::get<0>(key_);
      ctx_->check_alive([source](int r) { return r == source; }, "irecv/recv");
    }
  }

  bool test() {
    if (!ctx_ || done_) return true;
    std::unique_lock lock(ctx_->mu);
    if (ctx_->world->aborted.load())
      throw comm_aborted("another rank failed while this rank tested a receive");
    return take(ctx_->channels[key_]);
  }

private:
  friend class local;
  local_request(std::shared_ptr<detail::local_context> ctx, std::tuple<int, int, int> key, std::uint64_t seq,
                std::span<std::byte> out)
      : ctx_(std::move(ctx)), key_(key), seq_(seq), out_(out) {}

  // Called with the context's lock held.
  bool take(detail::local_channel& ch) {
    auto it = ch.messages.find(seq_);
    if (it == ch.messages.end()) return false;
    if (it->second.size() != out_.size())
      throw comm_error(commsgd::concat("message of ", it->second.size(), " bytes from rank ",
                                       std::get<0>(key_), " with tag ", std::get<2>(key_),
                                       " does not fit the receive buffer of ", out_.size(), " bytes"));
    if (!out_.empty()) std::memcpy(out_.data(), it->second.data(), out_.size());
    ch.messages.erase(it);
    done_ = true;
    return true;
  }

  std::shared_ptr<detail::local_context> ctx_;
  std::tuple<int, int, int> key_{};
  std::uint64_t seq_ = 0;
  std::span<std::byte> out_;
  bool done_ = false;
};

} // namespace commsgd::inline v1::comm
