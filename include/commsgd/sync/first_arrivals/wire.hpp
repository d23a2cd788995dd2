// What both rounds of sync::first_arrivals share: the message format, the buffers and the decode.
//
// Each message is 6 header words (round, status, count, responder set) and d words of float bits, for the
// upward vectors and the downward sums alike (status: vector, sum, failed, close). Two tags of its own:
// vectors go up on the first, sums (or "failed") come down on the second. The root keeps one receive posted
// per rank (receive_slot), so a vector never waits for a receive the root has not posted yet.
#pragma once

#include <commsgd/coding/gradient_code.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/tags.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sync/first_arrivals/options.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <span>
#include <vector>

namespace commsgd::inline v1::sync {

namespace detail {

inline constexpr std::size_t arrival_header_words = 6;
enum class arrival_status : std::uint32_t { vector = 0, sum = 1, failed = 2, close = 3 };

struct arrival_header {
  std::uint64_t round = 0;
  arrival_status status = arrival_status::vector;
  std::uint32_t count = 0;
  coding::node_set set = 0;
};

inline void put_header(std::span<std::uint32_t> msg, const arrival_header& h) noexcept {
  msg[0] = static_cast<std::uint32_t>(h.round);
  msg[1] = static_cast<std::uint32_t>(h.round >> 32);
  msg[2] = static_cast<std::uint32_t>(h.status);
  msg[3] = h.count;
  msg[4] = static_cast<std::uint32_t>(h.set);
  msg[5] = static_cast<std::uint32_t>(h.set >> 32);
}

inline arrival_header get_header(std::span<const std::uint32_t> msg) noexcept {
  arrival_header h;
  h.round = static_cast<std::uint64_t>(msg[0]) | static_cast<std::uint64_t>(msg[1]) << 32;
  h.status = static_cast<arrival_status>(msg[2]);
  h.count = msg[3];
  h.set = static_cast<std::uint64_t>(msg[4]) | static_cast<std::uint64_t>(msg[5]) << 32;
  return h;
}

// The state both rounds read and write; the strategy (first_arrivals.hpp) owns the step around them.
template <comm::communicator C>
class first_arrivals_wire {
protected:
  first_arrivals_wire(C& c, std::size_t length, const first_arrivals_options& o)
      : comm_(&c), opt_(o), d_(length) {
    const int n = c.size();
    check_first_arrivals_options(opt_, n);
    tags_ = opt_.tag_base < 0 ? comm::reserve_tags(c, 2, "first_arrivals")
                              : comm::reserve_tags_at(c, opt_.tag_base, 2, "first_arrivals");
    const std::size_t words = arrival_header_words + d_;
    if (c.rank() == opt_.root) {
      up_.resize(static_cast<std::size_t>(n));
      for (auto& u : up_)
        u.buffer.resize(words);
    } else {
      down_.resize(words);
    }
  }

  using request_type = comm::request_t<C>;

  struct receive_slot {
    std::vector<std::uint32_t> buffer;
    request_type request{};
    bool posted = false;
  };
  struct send_slot {
    std::vector<std::uint32_t> buffer;
    request_type request{};
    bool busy = false;
  };

  // A buffer whose earlier send has completed (sends to ranks still computing may stay open under MPI).
  send_slot& send_buffer(std::deque<send_slot>& pool, std::size_t words) {
    for (auto& s : pool) {
      if (s.busy && s.request.test()) s.busy = false;
      if (!s.busy) {
        s.buffer.resize(words);
        return s;
      }
    }
    pool.emplace_back();
    pool.back().buffer.resize(words);
    return pool.back();
  }

  void post(int k) {
    auto& u = up_[static_cast<std::size_t>(k)];
    if (u.posted) return;
    u.request = comm_->irecv(std::span<std::uint32_t>(u.buffer), k, tags_[0]);
    u.posted = true;
  }

  static void copy_payload(std::span<const std::uint32_t> msg, std::span<float> out) noexcept {
    std::memcpy(out.data(), msg.data() + arrival_header_words, out.size_bytes());
  }
  static void put_payload(std::span<std::uint32_t> msg, std::span<const float> in) noexcept {
    std::memcpy(msg.data() + arrival_header_words, in.data(), in.size_bytes());
  }

  template <class Code>
  coding::stragglers_exceeded too_few(const Code& code, int answered) const {
    return coding::stragglers_exceeded(
        commsgd::concat("first_arrivals: round ", step_, ": ", answered, " of ", comm_->size(),
                        " ranks answered within the time allowed; the ", code.redundancy(),
                        "-redundant code needs n - s = ", code.needed(),
                        " (it tolerates s = ", code.stragglers(), " missing)"),
        step_, answered, code.needed());
  }

  // The root's decode of the responders' vectors (its own from mine_, the others from their receive slots).
  template <class Code>
  void decode_into(Code& code, coding::node_set responders) {
    std::vector<std::span<const float>> coded;
    const auto who = coding::members(responders);
    staged_.resize(who.size());
    for (std::size_t k = 0; k < who.size(); ++k) {
      if (who[k] == opt_.root) {
        coded.emplace_back(mine_);
        continue;
      }
      staged_[k].resize(d_);
      copy_payload(up_[static_cast<std::size_t>(who[k])].buffer, staged_[k]);
      coded.emplace_back(staged_[k]);
    }
    report_.used = code.used(responders);
    code.decode(responders, std::span<const std::span<const float>>(coded), sum_);
  }

  C* comm_;
  first_arrivals_options opt_;
  std::size_t d_;
  comm::tag_lease tags_;
  std::vector<receive_slot> up_;    // root: one posted receive per rank
  std::vector<std::uint32_t> down_; // others: the root's message
  std::deque<send_slot> sends_, results_;
  std::vector<float> mine_, sum_; // this rank's coded vector; the decoded sum
  std::vector<std::vector<float>> staged_;
  std::uint64_t step_ = 0;
  std::uint64_t drained_ = 0;
  round_report report_{};
};

} // namespace detail

} // namespace commsgd::inline v1::sync
