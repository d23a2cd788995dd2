// comm::reserve_tags: point-to-point tags that no two components of one communicator share.
//
// Components that exchange point-to-point messages on a communicator they share with others (async_ps,
// partitioned, a trainer's own traffic) each need tags nobody else posts receives on. Each takes a block of
// consecutive tags on its communicator object when it is built and gives it back when it is destroyed:
//
//   comm::tag_lease tags = comm::reserve_tags(comm, 4, "async_ps");   // first free block, same on every rank
//   comm::tag_lease mine = comm::reserve_tags_at(comm, 1200, 4, "x"); // a block chosen by hand, checked
//
// The tag space (MPI guarantees tags up to 32767):
//   [0, 1000)        the user's own; commsgd never reserves it by itself
//   [1000, 30000)    blocks handed out automatically, first fit
//   [30000, 32767]   fixed tags of components that never overlap in time with others (coding schemes)
// A block chosen by hand may lie anywhere in [0, INT_MAX]; it is refused if it overlaps a block alive on the
// same communicator object, with a message that names both owners.
//
// Automatic blocks are the same on every rank as long as every rank reserves and releases in the same order,
// the rule collectives already impose: build and destroy components in the same order on every rank. Blocks
// belong to one communicator object, and the object must outlive the components that reserved on it, as they
// require anyway. A split has a tag space of its own, so its own blocks are right; but a metered<> or
// simulated<> around a communicator, or a copy of a comm::mpi (copies share one MPI_Comm), is another object
// over the same tag space: build components that share traffic on the same object, or give tags by hand.
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace commsgd::inline v1::comm {

inline constexpr int user_tags_end = 1000;     // [0, 1000): the user's
inline constexpr int auto_tags_end = 30000;    // [1000, 30000): reserved automatically
inline constexpr int fixed_tags_first = 30000; // [30000, 32767]: fixed tags of the coding schemes
inline constexpr int mpi_tag_limit = 32767;    // the largest tag MPI guarantees

namespace detail {

class tag_registry {
public:
  static tag_registry& instance() {
    static tag_registry r;
    return r;
  }

  int reserve(const void* comm, int count, std::string_view who) {
    check_count(count, who);
    std::lock_guard lock(mu_);
    auto& blocks = owners_[comm];
    int first = user_tags_end;
    for (const auto& [start, b] : blocks) {
      if (start >= auto_tags_end) break;
      if (start - first >= count) break;
      first = std::max(first, start + b.count);
    }
    if (auto_tags_end - first < count)
      throw invalid_argument(commsgd::concat(
          who, ": no block of ", count, " free tags is left in [", user_tags_end, ", ", auto_tags_end,
          ") on this communicator (", blocks.size(), " block(s) reserved); pass tags by hand or use fewer"));
    blocks.emplace(first, block{count, std::string(who)});
    return first;
  }

  void reserve_at(const void* comm, int first, int count, std::string_view who) {
    check_count(count, who);
    if (first < 0 || static_cast<long long>(first) + count - 1 > std::numeric_limits<int>::max())
      throw invalid_argument(commsgd::concat(who, ": argument 'tag_base' = ", first, " with ", count,
                                             " tags is outside the allowed range [0, INT_MAX - ", count - 1,
                                             "]"));
    std::lock_guard lock(mu_);
    auto& blocks = owners_[comm];
    for (const auto& [start, b] : blocks)
      if (start < first + count && first < start + b.count)
        throw invalid_argument(commsgd::concat(
            who, ": argument 'tag_base' = ", first, " takes tags [", first, ", ", first + count,
            "), which overlap tags [", start, ", ", start + b.count, ") held by ", b.who,
            " on the same communicator; leave the tag base at its default (-1, chosen free) or move it"));
    blocks.emplace(first, block{count, std::string(who)});
  }

  void release(const void* comm, int first) noexcept {
    std::lock_guard lock(mu_);
    const auto it = owners_.find(comm);
    if (it == owners_.end()) return;
    it->second.erase(first);
    if (it->second.empty()) owners_.erase(it);
  }

  // Blocks alive on `comm` (tests).
  std::size_t count(const void* comm) {
    std::lock_guard lock(mu_);
    const auto it = owners_.find(comm);
    return it == owners_.end() ? 0 : it->second.size();
  }

private:
  struct block {
    int count;
    std::string who;
  };

  static void check_count(int count, std::string_view who) {
    if (count < 1 || count > auto_tags_end - user_tags_end)
      throw invalid_argument(commsgd::concat(who, ": a block of ", count,
                                             " tags is outside the allowed range [1, ",
                                             auto_tags_end - user_tags_end, "]"));
  }

  std::mutex mu_;
  std::map<const void*, std::map<int, block>> owners_; // by communicator object, then by first tag
};

} // namespace detail

// A block of consecutive tags held on one communicator object; gives it back when destroyed. Move-only.
class tag_lease {
public:
  tag_lease() = default;
  tag_lease(const tag_lease&) = delete;
  tag_lease& operator=(const tag_lease&) = delete;
  tag_lease(tag_lease&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)), first_(o.first_), count_(o.count_) {}
  tag_lease& operator=(tag_lease&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, nullptr);
      first_ = o.first_;
      count_ = o.count_;
    }
    return *this;
  }
  ~tag_lease() { release(); }

  int first() const noexcept { return first_; }
  int count() const noexcept { return count_; }
  // The i-th tag of the block, i in [0, count).
  int operator[](int i) const noexcept { return first_ + i; }
  bool held() const noexcept { return comm_ != nullptr; }

private:
  template <class C>
  friend tag_lease reserve_tags(const C&, int, std::string_view);
  template <class C>
  friend tag_lease reserve_tags_at(const C&, int, int, std::string_view);

  tag_lease(const void* comm, int first, int count) : comm_(comm), first_(first), count_(count) {}

  void release() noexcept {
    if (comm_) detail::tag_registry::instance().release(comm_, first_);
    comm_ = nullptr;
  }

  const void* comm_ = nullptr;
  int first_ = 0;
  int count_ = 0;
};

// The first free block of `count` tags in [1000, 30000) on `comm`; `who` names the owner in errors.
template <class C>
tag_lease reserve_tags(const C& comm, int count, std::string_view who) {
  const int first = detail::tag_registry::instance().reserve(&comm, count, who);
  return tag_lease(&comm, first, count);
}

// The block [first, first + count) on `comm`, refused if any of it is held by another component.
template <class C>
tag_lease reserve_tags_at(const C& comm, int first, int count, std::string_view who) {
  detail::tag_registry::instance().reserve_at(&comm, first, count, who);
  return tag_lease(&comm, first, count);
}

// Blocks alive on `comm`.
template <class C>
std::size_t reserved_tag_blocks(const C& comm) {
  return detail::tag_registry::instance().count(&comm);
}

} // namespace commsgd::inline v1::comm
