// comm::process_group: the communicator over a torch.distributed (c10d) process group (target
// commsgd::torch).
//
//   auto store = c10::make_intrusive<c10d::FileStore>(path, world_size);
//   auto pg = commsgd::comm::make_gloo_group(store, rank, world_size, options);   // any supported torch
//   commsgd::comm::process_group c(pg, store);     // the store is needed only by split()
//
// The group is shared, not copied: the caller keeps using it, and commsgd's traffic is ordered with the
// caller's on the group's own queue. A trainer that issues its own collectives from another thread (a DDP
// hook runs in the autograd thread) should give commsgd a group of its own (torch.distributed.new_group).
//
// Data path: every operation wraps the caller's memory in a tensor (no copy) and waits for the c10d work.
// all_reduce_sum maps float, double and int32 to the matching tensor types; uint32 travels as int32, whose
// two's-complement sum has the same bits. Everything else travels as bytes. Counts are 64-bit: tensors are
// indexed by int64, so no transfer is split or truncated. c10d failures (a peer left, a timeout) surface as
// commsgd::comm_error carrying torch's message.
//
// Size agreement: all_reduce_sum, all_gather and broadcast first agree on their sizes (and broadcast on its
// root) in one 16- to 32-byte all-reduce, so ranks that disagree all throw size_mismatch instead of hanging
// or crashing the backend; set_verify_sizes(false) on every rank skips it. all_gather_v exchanges its counts
// anyway and pads every contribution to the largest (c10d's all-gather takes equal blocks), so unequal
// contributions cost up to size() * max count bytes of traffic; the sparse exchange's counts are close.
//
// Point-to-point framing: a message is an 8-byte header (the payload's byte count) followed, when the count
// is not zero, by the payload, both on the caller's tag. A receive posts the header first and the payload
// only once the header has said how long it is, so a message of the wrong length is drained into scratch
// memory and reported as a comm_error; the backend never sees mismatched buffers. Receives on the same
// (peer, tag) channel are matched in the order they were posted, whichever of them the caller waits for
// first. isend and irecv wait on a short-lived thread of their own (gloo's work reports completion only
// through a blocking wait, and test() must not block); blocking send and recv use the caller's thread.
// Destroying a request that has not completed waits for its send, or for a receive whose payload is
// already posted; a receive whose header has not arrived is abandoned and its message drained on arrival.
//
// split(color, key) creates a new c10d group of the same backend for each colour: ranks rendezvous on the
// store under a prefix unique to this split, and the group is made by the factory passed at construction,
// or, for a group whose CPU backend is gloo, by a gloo group with that backend's options (devices, timeout,
// threads).
//
// Torch versions: 1.13 and 2.x. Since 2.0 a c10d::ProcessGroup is a front over one backend per device type
// (ProcessGroupGloo is a c10d::Backend, no longer a ProcessGroup), so code that makes its own gloo group
// goes through make_gloo_group(), which returns a ProcessGroup on every supported version.
//
// Not thread safe: one thread at a time per communicator (its splits included).
#pragma once

#include <commsgd/comm/agreement.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/process_group/c10d.hpp>
#include <commsgd/comm/process_group/request.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace commsgd::inline v1::comm {

class process_group {
public:
  using request_type = process_group_request;
  using group_ptr = c10::intrusive_ptr<c10d::ProcessGroup>;
  using store_ptr = c10::intrusive_ptr<c10d::Store>;
  // Makes the group of a split: (a store whose keys are private to the new group, rank, size).
  using group_factory = std::function<group_ptr(const store_ptr&, int rank, int size)>;

  // `store` and `make_group` are needed only by split(); see the note at the top.
  explicit process_group(group_ptr group, store_ptr store = {}, group_factory make_group = {})
      : store_(std::move(store)), make_(std::move(make_group)) {
    if (!group) throw invalid_argument("argument 'group' is null; a c10d process group is required");
    channels_ = std::make_shared<channels>();
    channels_->group = std::move(group);
    rank_ = channels_->group->getRank();
    size_ = channels_->group->getSize();
    own_timeout_ = detail::pg_group_timeout(channels_->group);
    timeout_ = own_timeout_;
  }

  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;
  process_group(process_group&&) noexcept = default;
  process_group& operator=(process_group&&) noexcept = default;
  ~process_group() = default;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const group_ptr& native() const noexcept { return channels_->group; }
  const store_ptr& store() const noexcept { return store_; }

  bool verify_sizes() const noexcept { return verify_; }
  // Every rank must choose alike.
  void set_verify_sizes(bool on) noexcept { verify_ = on; }

  // A deadline for each operation from now on, in seconds (0: the group's own, set when it was made): an
  // operation a peer has not answered within it throws comm_error, and the group is then broken. For a
  // deadline that follows the network (a multiple of recent round times) rather than a fixed one.
  void set_timeout(double seconds) {
    commsgd::check_range("seconds", seconds, 0.0, 86400.0 * 365, "[0, one year] (0: the group's own)");
    timeout_ = seconds == 0.0
                   ? own_timeout_
                   : std::chrono::milliseconds{static_cast<std::int64_t>(std::ceil(seconds * 1000.0))};
  }
  double timeout() const noexcept { return static_cast<double>(timeout_.count()) / 1000.0; }

  void barrier() {
    c10d::BarrierOptions o;
    timed(o);
    detail::pg_wait(detail::pg_call("barrier", [&] { return group().barrier(o); }), "barrier", timeout_);
  }

  template <reducible T>
  void all_reduce_sum(std::span<T> data) {
    if (size_ == 1) return;
    if (verify_) agree_on_count("all_reduce_sum", "data.size()", data.size());
    if (data.empty()) return;
    std::vector<at::Tensor> t{detail::pg_typed(data)};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    timed(o);
    detail::pg_wait(detail::pg_call("allreduce", [&] { return group().allreduce(t, o); }), "allreduce",
                    timeout_);
  }

  template <transferable T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    const std::size_t m = mine.size();
    detail::check_all_gather(m, all.size(), size_, verify_, [this](auto v) { return min_max<2>(v); });
    if (m == 0) return;
    gather_bytes(mine.data(), m * sizeof(T), all.data());
  }

  template <transferable T>
  std::vector<std::size_t> all_gather_v(std::span<const T> mine, std::vector<T>& all) {
    std::vector<std::int64_t> counts64(static_cast<std::size_t>(size_));
    const std::int64_t my_count = static_cast<std::int64_t>(mine.size());
    gather_bytes(&my_count, sizeof my_count, counts64.data());
    std::vector<std::size_t> counts(counts64.begin(), counts64.end());
    std::size_t total = 0, most = 0;
    for (auto c : counts) {
      total += c;
      most = std::max(most, c);
    }
    all.resize(total);
    if (total == 0) return counts;
    if (most == mine.size() && static_cast<std::size_t>(size_) * most == total) {
      gather_bytes(mine.data(), most * sizeof(T), all.data());
      return counts;
    }
    // c10d gathers equal blocks: pad every contribution to the largest, then close the gaps.
    std::vector<T> padded(most), gathered(most * static_cast<std::size_t>(size_));
    std::copy(mine.begin(), mine.end(), padded.begin());
    gather_bytes(padded.data(), most * sizeof(T), gathered.data());
    std::size_t offset = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>(r * most), counts[r],
                  all.begin() + static_cast<std::ptrdiff_t>(offset));
      offset += counts[r];
    }
    return counts;
  }

  template <transferable T>
  void broadcast(std::span<T> data, int root) {
    detail::check_broadcast(data.size(), root, size_, verify_, [this](auto v) { return min_max<2>(v); });
    if (size_ == 1 || data.empty()) return;
    std::vector<at::Tensor> t{detail::pg_bytes(data.data(), data.size_bytes())};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    timed(o);
    detail::pg_wait(detail::pg_call("broadcast", [&] { return group().broadcast(t, o); }), "broadcast",
                    timeout_);
  }

  // Returns once the data is copied: c10d sends complete only when the receiver has posted its receive, and a
  // blocking send must not wait for that (two ranks that send to each other first would never meet). A
  // failure of the transfer surfaces at this communicator's next send, or at flush().
  template <transferable T>
  void send(std::span<const T> data, int dest, int tag) {
    check_p2p("dest", dest, tag);
    flush(false);
    at::Tensor copy =
        at::empty({static_cast<std::int64_t>(data.size_bytes())}, at::TensorOptions().dtype(at::kByte));
    if (!data.empty()) std::memcpy(copy.data_ptr(), data.data(), data.size_bytes());
    auto works = post_send(copy.data_ptr(), data.size_bytes(), dest, tag);
    channels_->buffered.push_back(detail::pg_in_background([works = std::move(works), copy, t = timeout_] {
      for (auto& w : works)
        detail::pg_wait(w, "send", t);
    }));
  }

  // Waits for every buffered send (when `all`, else only reaps finished ones) and raises the first failure.
  void flush(bool all = true) {
    auto& b = channels_->buffered;
    std::exception_ptr first;
    for (auto it = b.begin(); it != b.end();) {
      if (!all && it->wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        ++it;
        continue;
      }
      try {
        it->get();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      it = b.erase(it);
    }
    if (first) std::rethrow_exception(first);
  }

  template <transferable T>
  void recv(std::span<T> data, int source, int tag) {
    check_p2p("source", source, tag);
    auto op = make_recv(data.data(), data.size_bytes());
    detail::pg_run_recv(*op, chain(op, source, tag), native(), source, tag, timeout_);
  }

  template <transferable T>
  process_group_request isend(std::span<const T> data, int dest, int tag) {
    check_p2p("dest", dest, tag);
    auto works = post_send(data.data(), data.size_bytes(), dest, tag);
    process_group_request req;
    req.done_ = detail::pg_in_background([works = std::move(works), t = timeout_] {
      for (auto& w : works)
        detail::pg_wait(w, "send", t);
    });
    return req;
  }

  template <transferable T>
  process_group_request irecv(std::span<T> data, int source, int tag) {
    check_p2p("source", source, tag);
    auto op = make_recv(data.data(), data.size_bytes());
    process_group_request req;
    req.recv_ = op;
    req.done_ =
        detail::pg_in_background([op, before = chain(op, source, tag), group = native(), source, tag,
                                  t = timeout_] { detail::pg_run_recv(*op, before, group, source, tag, t); });
    return req;
  }

  // A send and a receive whose sizes both ends know (comm/send_recv.hpp): the payloads alone, without the
  // header, posted together and waited for on this thread. Both ends of `tag` must send this way. The backend
  // reads and writes buffers of this communicator's own (one copy each way), so that a failed operation,
  // which gloo may still complete later, never touches the caller's memory: after a failure those buffers are
  // kept for the life of the process. A sender of another size than the receive is a broken promise that
  // the backend reports as a failed operation.
  template <transferable T>
  void send_recv_sized(std::span<const T> send, int dest, std::span<T> recv, int source, int tag) {
    check_p2p("dest", dest, tag);
    check_p2p("source", source, tag);
    auto& b = channels_->sized;
    const auto room = [](at::Tensor& t, std::size_t bytes) {
      if (!t.defined() || static_cast<std::size_t>(t.numel()) < bytes)
        t = at::empty({static_cast<std::int64_t>(std::max<std::size_t>(bytes, 64))},
                      at::TensorOptions().dtype(at::kByte));
      return t.narrow(0, 0, static_cast<std::int64_t>(bytes));
    };
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    if (!recv.empty()) {
      std::vector<at::Tensor> t{room(b.in, recv.size_bytes())};
      works.push_back(detail::pg_call("recv", [&] { return group().recv(t, source, tag); }));
    }
    if (!send.empty()) {
      std::vector<at::Tensor> t{room(b.out, send.size_bytes())};
      std::memcpy(t[0].data_ptr(), send.data(), send.size_bytes());
      works.push_back(detail::pg_call("send", [&] { return group().send(t, dest, tag); }));
    }
    std::exception_ptr failed;
    for (auto& w : works) {
      try {
        detail::pg_wait(w, "send_recv", timeout_);
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) {
      b.kept.push_back(std::move(b.in));
      b.kept.push_back(std::move(b.out));
      b.in = at::Tensor();
      b.out = at::Tensor();
      std::rethrow_exception(failed);
    }
    if (!recv.empty()) std::memcpy(recv.data(), b.in.data_ptr(), recv.size_bytes());
  }

  // Collective; the new communicator inherits this one's store, factory and size checking.
  process_group split(int color, int key) {
    std::array<std::int32_t, 2> mine{color, key};
    std::vector<std::int32_t> all(2 * static_cast<std::size_t>(size_));
    gather_bytes(mine.data(), sizeof mine, all.data());
    int lowest = color;
    for (int r = 0; r < size_; ++r)
      lowest = std::min(lowest, all[2 * static_cast<std::size_t>(r)]);
    if (lowest < 0)
      throw invalid_argument(commsgd::concat("split: argument 'color' = ", lowest,
                                             lowest == color ? "" : " (on another rank)",
                                             " is outside the allowed range [0, inf)"));
    std::vector<std::pair<std::int32_t, int>> members; // (key, rank) of this colour
    for (int r = 0; r < size_; ++r)
      if (all[2 * static_cast<std::size_t>(r)] == color)
        members.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    while (members[static_cast<std::size_t>(new_rank)].second != rank_)
      ++new_rank;
    const int new_size = static_cast<int>(members.size());
    const std::string prefix = commsgd::concat(prefix_, "/", splits_++, "/", color);
    if (!store_)
      throw unsupported("split: this process_group was made without a store, so it cannot create groups; "
                        "pass the store the group was created with");
    auto child_store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
    group_ptr child = detail::pg_call("creating the split group", [&] {
      return make_ ? make_(child_store, new_rank, new_size) : default_group(child_store, new_rank, new_size);
    });
    process_group out(std::move(child), store_, make_);
    out.prefix_ = prefix;
    out.verify_ = verify_;
    out.timeout_ = timeout_;
    return out;
  }

private:
  c10d::ProcessGroup& group() const noexcept { return *channels_->group; }

  group_ptr default_group(const store_ptr& store, int rank, int size) const {
#if COMMSGD_TORCH_GLOO
    if (auto gloo = detail::gloo_backend_of(channels_->group))
      return make_gloo_group(store, rank, size, gloo->getOptions());
#endif
#if COMMSGD_TORCH_GLOO
    throw unsupported(commsgd::concat("split: no group factory was given and backend '",
                                      group().getBackendName(),
                                      "' has no gloo CPU backend to copy; pass a group_factory to the "
                                      "constructor"));
#else
    (void)store, (void)rank, (void)size;
    throw unsupported(commsgd::concat(
        "split: no group factory was given and this build has no gloo headers to make a group of backend '",
        group().getBackendName(), "'; pass a group_factory to the constructor"));
#endif
  }

  // c10d's all-gather of equal byte blocks; `out` holds size() blocks.
  void gather_bytes(const void* mine, std::size_t bytes, void* out) {
    if (size_ == 1) {
      std::memcpy(out, mine, bytes);
      return;
    }
    std::vector<at::Tensor> in{detail::pg_bytes(mine, bytes)};
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size_; ++r)
      outs[0].push_back(
          detail::pg_bytes(static_cast<std::byte*>(out) + static_cast<std::size_t>(r) * bytes, bytes));
    c10d::AllgatherOptions o;
    timed(o);
    detail::pg_wait(detail::pg_call("allgather", [&] { return group().allgather(outs, in, o); }), "allgather",
                    timeout_);
  }

  void check_peer(const char* name, int value) const {
    detail::check_rank(name, value, size_);
  }

  void check_p2p(const char* name, int peer, int tag) const {
    check_peer(name, peer);
    if (tag < 0)
      throw invalid_argument(
          commsgd::concat("argument 'tag' = ", tag, " is outside the allowed range [0, ", INT_MAX, "]"));
    // c10d backends have no messages to self.
    if (peer == rank_)
      throw unsupported(commsgd::concat("point-to-point with this rank itself (", peer,
                                        ") is not supported over a c10d process group"));
  }

  // Posts the header and the payload (when not empty) of one message.
  std::vector<c10::intrusive_ptr<c10d::Work>> post_send(const void* data, std::size_t bytes, int dest,
                                                        int tag) {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    std::vector<at::Tensor> h{
        at::full({1}, static_cast<std::int64_t>(bytes), at::TensorOptions().dtype(at::kLong))};
    works.push_back(detail::pg_call("send (header)", [&] { return group().send(h, dest, tag); }));
    if (bytes > 0) {
      std::vector<at::Tensor> t{detail::pg_bytes(data, bytes)};
      works.push_back(detail::pg_call("send", [&] { return group().send(t, dest, tag); }));
    }
    return works;
  }

  static std::shared_ptr<detail::pg_recv_op> make_recv(void* data, std::size_t bytes) {
    auto op = std::make_shared<detail::pg_recv_op>();
    op->data = data;
    op->bytes = bytes;
    return op;
  }

  // Appends a receive to its (peer, tag) channel; returns when the receive before it has posted its payload.
  std::shared_future<void> chain(const std::shared_ptr<detail::pg_recv_op>& op, int peer, int tag) {
    auto& last = channels_->last[{peer, tag}];
    std::shared_future<void> before = std::move(last);
    last = op->posted.get_future().share();
    return before;
  }

  // Smallest and largest of each value over all ranks, in one small all-reduce (max of v and of ~v).
  template <std::size_t K>
  std::array<std::pair<std::uint64_t, std::uint64_t>, K> min_max(std::array<std::uint64_t, K> v) {
    std::array<std::pair<std::uint64_t, std::uint64_t>, K> out;
    // int64 max over (v >> 1, v & 1) halves would do; flipping the top bit keeps the order in signed form.
    std::array<std::int64_t, 2 * K> buf;
    constexpr std::uint64_t flip = std::uint64_t{1} << 63;
    for (std::size_t k = 0; k < K; ++k) {
      buf[2 * k] = static_cast<std::int64_t>(v[k] ^ flip);
      buf[2 * k + 1] = static_cast<std::int64_t>(~v[k] ^ flip);
    }
    if (size_ > 1) {
      std::vector<at::Tensor> t{at::from_blob(buf.data(), {static_cast<std::int64_t>(2 * K)},
                                              at::TensorOptions().dtype(at::kLong))};
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::MAX;
      timed(o);
      detail::pg_wait(detail::pg_call("allreduce", [&] { return group().allreduce(t, o); }), "allreduce",
                      timeout_);
    }
    for (std::size_t k = 0; k < K; ++k)
      out[k] = {~(static_cast<std::uint64_t>(buf[2 * k + 1]) ^ flip),
                static_cast<std::uint64_t>(buf[2 * k]) ^ flip};
    return out;
  }

  void agree_on_count(const char* op, const char* arg, std::size_t n) {
    const auto mm = min_max<1>({n});
    if (mm[0].first != mm[0].second) throw detail::ranks_disagree(op, arg, n, mm[0]);
  }

  // Shared by the moved-from and moved-to communicator alike, so a move never loses a channel's order.
  struct channels {
    group_ptr group;
    std::map<std::pair<int, int>, std::shared_future<void>> last; // (peer, tag) -> last receive posted
    std::vector<std::future<void>> buffered;                      // blocking sends still in flight
    struct {
      at::Tensor in, out;           // send_recv_sized's buffers
      std::vector<at::Tensor> kept; // those of failed operations, which the backend may still use
    } sized;
  };
  std::shared_ptr<channels> channels_;
  store_ptr store_;
  group_factory make_;
  std::string prefix_ = "commsgd";
  std::uint64_t splits_ = 0;
  int rank_ = 0;
  int size_ = 0;
  bool verify_ = true;
  std::chrono::milliseconds own_timeout_{0}; // the group's, 0 where torch does not report it
  std::chrono::milliseconds timeout_{0};     // what each operation is given (0: nothing, gloo's own)

  template <class Options>
  void timed(Options& o) const noexcept {
    if (timeout_.count() > 0) o.timeout = timeout_;
  }
};

static_assert(request<process_group_request>);
static_assert(communicator<process_group>);

} // namespace commsgd::inline v1::comm
