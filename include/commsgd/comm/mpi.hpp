// comm::mpi: the communicator over MPI, for ranks that are processes (target commsgd::mpi).
//
//   boost::mpi::environment env(argc, argv);
//   auto c = commsgd::comm::mpi::world();                       // a private duplicate of MPI_COMM_WORLD
//   commsgd::comm::mpi mine(trainer_comm, boost::mpi::comm_attach); // or comm_duplicate, comm_take_ownership
//
// Ownership follows boost::mpi::comm_create_kind: comm_attach uses the handle and never frees it,
// comm_duplicate works on an MPI_Comm_dup of it (a private tag space, freed with the last copy),
// comm_take_ownership frees the caller's handle on destruction. A boost::mpi::communicator can be passed
// directly and shares its handle and ownership. Communicators this type creates (duplicates, splits, taken
// ones) get MPI_ERRORS_RETURN, so MPI failures surface as commsgd::comm_error carrying MPI's error string;
// an attached handle keeps the error handler its owner chose (MPI_ERRORS_ARE_FATAL aborts, as the owner
// asked).
//
// The data path calls the MPI C API directly (MPI_Allreduce with MPI_IN_PLACE/MPI_SUM on MPI_FLOAT,
// MPI_DOUBLE, MPI_INT32_T, MPI_UINT32_T; MPI_Allgather(v); MPI_Bcast; MPI_(I)Send/(I)Recv); other
// transferable types travel as MPI_BYTE. Counts are 64-bit: a transfer larger than max_chunk_elements() MPI
// elements (INT_MAX by default, the most one MPI call can carry) is split into several calls, never
// truncated. The limit is a per-communicator setting that every rank must set alike; tests lower it to see
// chunking on small data.
//
// Point-to-point framing: a message of n MPI elements goes as floor(n / L) full pieces of L elements and one
// final piece of n mod L elements (possibly empty), L the chunk limit. The final piece is always shorter than
// L, so a receiver that expects another length notices at the first piece that differs (a short piece, or an
// MPI truncation) instead of waiting for a piece that never comes. Below L this is exactly one message.
//
// Size agreement: all_reduce_sum, all_gather and broadcast exchange their sizes (and broadcast its root) in
// one 16- to 32-byte MPI_Allreduce before the transfer, so ranks that disagree all throw size_mismatch
// instead of hanging or corrupting memory. That costs one small-message latency per call, small beside any
// large transfer. Code that has checked its sizes can turn it off with set_verify_sizes(false) on every
// rank; a disagreement is then the caller's bug (MPI may fail with comm_error, or hang). all_gather_v needs
// no check: it exchanges the counts anyway. split always checks colours: it is rare and a mistake there
// would leave ranks in different groups.
//
// Timeouts: by default every call waits as long as MPI does, which is forever when a peer or its link is gone
// (TCP retransmits for many minutes before giving up, and Open MPI then aborts the job). set_timeout(s) bounds
// every call of this communicator and of the requests it makes: the blocking calls then run as their
// nonblocking forms (MPI_Iallreduce, MPI_Iallgather(v), MPI_Ibcast, MPI_Ibarrier, MPI_Isend/MPI_Irecv) polled
// until done or until s seconds have passed, when they throw comm_error naming the call, the timeout and the
// rank. MPI cannot cancel a collective or a send, so the communicator is broken from then on: every later
// call throws at once, requests still in flight are left to MPI (not waited for), and the process should
// save what is its own, end (MPI_Abort, or exit: MPI_Finalize could wait on the lost peer) and resume from
// its last checkpoint. The nonblocking collectives are Open MPI's libnbc schedules, not the tuned blocking
// algorithms, so a bounded all-reduce may take another route and sum in another order than an unbounded
// one; every rank of a communicator should choose alike.
//
// Not thread safe: one thread at a time per communicator, as MPI_THREAD_SERIALIZED allows.
#pragma once

#include <commsgd/comm/agreement.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/mpi/detail.hpp>
#include <commsgd/comm/mpi/request.hpp>
#include <commsgd/comm/poll.hpp>
#include <commsgd/error.hpp>

#include <boost/mpi/communicator.hpp>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace commsgd::inline v1::comm {

class mpi {
public:
  using request_type = mpi_request;

  // The most MPI elements one MPI call can carry.
  static constexpr std::size_t default_max_chunk_elements = INT_MAX;

  // A private duplicate of MPI_COMM_WORLD: commsgd's messages can never match the application's.
  static mpi world() {
    if (!detail::mpi_usable())
      throw comm_error("MPI is not initialised (or already finalised): create a boost::mpi::environment "
                       "(or call MPI_Init) before comm::mpi::world()");
    return mpi(MPI_COMM_WORLD, boost::mpi::comm_duplicate);
  }

  // Uses `comm` as boost::mpi::communicator(comm, kind) would: attach, duplicate or take ownership.
  mpi(MPI_Comm comm, boost::mpi::comm_create_kind kind) {
    check_handle(comm);
    try {
      comm_ = boost::mpi::communicator(comm, kind);
    } catch (const boost::mpi::exception& e) {
      throw comm_error(commsgd::concat("creating the communicator failed: ", e.what()));
    }
    if (kind != boost::mpi::comm_attach)
      detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    init();
  }

  // Shares `comm`'s handle and ownership; pass boost::mpi::communicator(c, boost::mpi::comm_duplicate) for a
  // private tag space.
  explicit mpi(const boost::mpi::communicator& comm) : comm_(comm) {
    check_handle(comm_);
    init();
  }

  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  mpi(mpi&& o) noexcept { take(o); }
  mpi& operator=(mpi&& o) noexcept {
    if (this != &o) take(o);
    return *this;
  }
  ~mpi() = default;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  MPI_Comm native() const noexcept { return raw_; }
  const boost::mpi::communicator& as_boost() const noexcept { return comm_; }

  std::size_t max_chunk_elements() const noexcept { return max_chunk_; }
  // Every rank must set the same limit: pieces of collectives and messages must line up.
  void set_max_chunk_elements(std::size_t limit) {
    commsgd::check_range("limit", limit, std::size_t{1}, default_max_chunk_elements, "[1, INT_MAX]");
    max_chunk_ = limit;
  }

  bool verify_sizes() const noexcept { return verify_; }
  // Every rank must choose alike; see the note at the top of the file for what turning it off costs.
  void set_verify_sizes(bool on) noexcept { verify_ = on; }

  // Seconds any one call (or request wait) may take, in (0, inf]; inf, the default, waits as long as MPI
  // does. After a call runs out the communicator is broken for good (see the top of the file).
  void set_timeout(double seconds) {
    if (!(seconds > 0)) // NaN too
      throw invalid_argument(
          commsgd::concat("argument 'seconds' = ", seconds, " is outside the allowed range (0, inf]"));
    deadline_->seconds = std::isinf(seconds) ? 0.0 : seconds;
  }
  double timeout() const noexcept {
    return deadline_->seconds > 0 ? deadline_->seconds : std::numeric_limits<double>::infinity();
  }
  // Whether a call ran out of time; nothing more can be done on this communicator then.
  bool timed_out() const noexcept { return deadline_->broken; }

  void barrier() {
    call(
        "MPI_Barrier", [&] { return MPI_Barrier(raw_); },
        [&](MPI_Request* r) { return MPI_Ibarrier(raw_, r); });
  }

  template <reducible T>
  void all_reduce_sum(std::span<T> data) {
    if (size_ == 1) return;
    if (verify_) agree_on_count("all_reduce_sum", "data.size()", data.size());
    const MPI_Datatype type = detail::mpi_wire<T>::type();
    for (std::size_t lo = 0; lo < data.size(); lo += max_chunk_) {
      T* at = data.data() + lo;
      const int len = piece(data.size(), lo);
      call(
          "MPI_Allreduce", [&] { return MPI_Allreduce(MPI_IN_PLACE, at, len, type, MPI_SUM, raw_); },
          [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, at, len, type, MPI_SUM, raw_, r); });
    }
  }

  template <transferable T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    const std::size_t m = mine.size();
    detail::check_all_gather(m, all.size(), size_, verify_, [this](auto v) { return min_max<2>(v); });
    if (m == 0) return;
    using wire = detail::mpi_wire<T>;
    const MPI_Datatype type = wire::type();
    const std::size_t units = m * wire::units;
    if (units <= max_chunk_) {
      const int len = static_cast<int>(units);
      call(
          "MPI_Allgather", [&] { return MPI_Allgather(mine.data(), len, type, all.data(), len, type, raw_); },
          [&](MPI_Request* r) {
            return MPI_Iallgather(mine.data(), len, type, all.data(), len, type, raw_, r);
          });
      return;
    }
    // Piece [lo, lo + len) of every rank's block lands `units` elements apart: a resized contiguous type
    // describes that stride, so no staging copy is needed.
    const std::size_t unit_bytes = sizeof(T) / wire::units;
    const auto* src = reinterpret_cast<const std::byte*>(mine.data());
    auto* dst = reinterpret_cast<std::byte*>(all.data());
    for (std::size_t lo = 0; lo < units; lo += max_chunk_) {
      const int len = piece(units, lo);
      MPI_Datatype run = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
      detail::mpi_check(MPI_Type_contiguous(len, type, &run), "MPI_Type_contiguous");
      int rc = MPI_Type_create_resized(run, 0, static_cast<MPI_Aint>(units * unit_bytes), &strided);
      MPI_Type_free(&run);
      detail::mpi_check(rc, "MPI_Type_create_resized");
      rc = MPI_Type_commit(&strided);
      if (rc != MPI_SUCCESS) {
        MPI_Type_free(&strided);
        detail::mpi_check(rc, "MPI_Type_commit");
      }
      // The type stays alive until the call is done, which a timeout may cut short: freed either way.
      struct type_guard {
        MPI_Datatype& t;
        ~type_guard() { MPI_Type_free(&t); }
      } guard{strided};
      const auto* from = src + lo * unit_bytes;
      auto* to = dst + lo * unit_bytes;
      call(
          "MPI_Allgather", [&] { return MPI_Allgather(from, len, type, to, 1, strided, raw_); },
          [&](MPI_Request* r) { return MPI_Iallgather(from, len, type, to, 1, strided, raw_, r); });
    }
  }

  template <transferable T>
  std::vector<std::size_t> all_gather_v(std::span<const T> mine, std::vector<T>& all) {
    std::vector<std::uint64_t> counts64(static_cast<std::size_t>(size_));
    const std::uint64_t my_count = mine.size();
    call(
        "MPI_Allgather",
        [&] { return MPI_Allgather(&my_count, 1, MPI_UINT64_T, counts64.data(), 1, MPI_UINT64_T, raw_); },
        [&](MPI_Request* r) {
          return MPI_Iallgather(&my_count, 1, MPI_UINT64_T, counts64.data(), 1, MPI_UINT64_T, raw_, r);
        });
    std::vector<std::size_t> counts(counts64.begin(), counts64.end());
    std::size_t total = 0;
    for (auto c : counts)
      total += c;
    all.resize(total);
    if (total == 0) return counts;

    using wire = detail::mpi_wire<T>;
    const MPI_Datatype type = wire::type();
    bool one_call = true;
    std::size_t offset = 0;
    for (auto c : counts) {
      one_call = one_call && offset * wire::units <= max_chunk_ && c * wire::units <= max_chunk_;
      offset += c;
    }
    if (one_call) {
      std::vector<int> unit_counts(counts.size()), displs(counts.size());
      offset = 0;
      for (std::size_t r = 0; r < counts.size(); ++r) {
        unit_counts[r] = static_cast<int>(counts[r] * wire::units);
        displs[r] = static_cast<int>(offset * wire::units);
        offset += counts[r];
      }
      const int len = static_cast<int>(mine.size() * wire::units);
      call(
          "MPI_Allgatherv",
          [&] {
            return MPI_Allgatherv(mine.data(), len, type, all.data(), unit_counts.data(), displs.data(), type,
                                  raw_);
          },
          [&](MPI_Request* r) {
            return MPI_Iallgatherv(mine.data(), len, type, all.data(), unit_counts.data(), displs.data(),
                                   type, raw_, r);
          });
      return counts;
    }
    // Some count or displacement does not fit one call: each rank broadcasts its part in pieces.
    offset = 0;
    for (int r = 0; r < size_; ++r) {
      const std::size_t c = counts[static_cast<std::size_t>(r)];
      if (r == rank_) std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(offset));
      bcast_units(all.data() + offset, c * wire::units, type, r);
      offset += c;
    }
    return counts;
  }

  template <transferable T>
  void broadcast(std::span<T> data, int root) {
    detail::check_broadcast(data.size(), root, size_, verify_, [this](auto v) { return min_max<2>(v); });
    using wire = detail::mpi_wire<T>;
    bcast_units(data.data(), data.size() * wire::units, wire::type(), root);
  }

  template <transferable T>
  void send(std::span<const T> data, int dest, int tag) {
    check_peer("dest", dest);
    check_tag(tag);
    using wire = detail::mpi_wire<T>;
    for_each_piece(data, [&](const void* at, int len, std::size_t) {
      call(
          "MPI_Send", [&] { return MPI_Send(at, len, wire::type(), dest, tag, raw_); },
          [&](MPI_Request* r) { return MPI_Isend(at, len, wire::type(), dest, tag, raw_, r); });
    });
  }

  template <transferable T>
  void recv(std::span<T> data, int source, int tag) {
    check_peer("source", source);
    check_tag(tag);
    using wire = detail::mpi_wire<T>;
    const std::size_t units = data.size() * wire::units;
    for_each_piece(data, [&](void* at, int len, std::size_t lo) {
      MPI_Status status;
      const int rc = call_status(
          "MPI_Recv", [&] { return MPI_Recv(at, len, wire::type(), source, tag, raw_, &status); },
          [&](MPI_Request* r) { return MPI_Irecv(at, len, wire::type(), source, tag, raw_, r); }, &status);
      if (rc != MPI_SUCCESS) {
        int cls = 0;
        MPI_Error_class(rc, &cls);
        throw comm_error(commsgd::concat(
            "recv from rank ", source, " with tag ", tag,
            cls == MPI_ERR_TRUNCATE ? ": the message is longer than the receive buffer of " : ": ",
            cls == MPI_ERR_TRUNCATE ? std::to_string(units) + " MPI element(s): " : std::string(),
            detail::mpi_error_text(rc)));
      }
      int got = 0;
      MPI_Get_count(&status, wire::type(), &got);
      if (got != len)
        throw comm_error(commsgd::concat("recv from rank ", source, " with tag ", tag,
                                         ": the message ended after ", lo + static_cast<std::size_t>(got),
                                         " MPI element(s), the receive buffer holds ", units));
    });
  }

  template <transferable T>
  mpi_request isend(std::span<const T> data, int dest, int tag) {
    check_peer("dest", dest);
    check_tag(tag);
    using wire = detail::mpi_wire<T>;
    detail::mpi_check_usable(*deadline_);
    mpi_request req(false, wire::type(), dest, tag, data.size() * wire::units, max_chunk_, deadline_);
    for_each_piece(data, [&](const void* at, int len, std::size_t) {
      auto& p = req.parts_.emplace_back();
      detail::mpi_check(MPI_Isend(at, len, wire::type(), dest, tag, raw_, &p.handle), "MPI_Isend");
    });
    return req;
  }

  template <transferable T>
  mpi_request irecv(std::span<T> data, int source, int tag) {
    check_peer("source", source);
    check_tag(tag);
    using wire = detail::mpi_wire<T>;
    detail::mpi_check_usable(*deadline_);
    mpi_request req(true, wire::type(), source, tag, data.size() * wire::units, max_chunk_, deadline_);
    for_each_piece(data, [&](void* at, int len, std::size_t) {
      auto& p = req.parts_.emplace_back();
      p.expected = len;
      detail::mpi_check(MPI_Irecv(at, len, wire::type(), source, tag, raw_, &p.handle), "MPI_Irecv");
    });
    return req;
  }

  // The new communicator owns its handle and inherits this one's chunk limit and size checking.
  mpi split(int color, int key) {
    // Every rank learns the smallest colour, so a negative colour on any rank fails on all of them.
    int lowest = color;
    if (size_ > 1)
      call(
          "MPI_Allreduce", [&] { return MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, raw_); },
          [&](MPI_Request* r) {
            return MPI_Iallreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, raw_, r);
          });
    if (lowest < 0)
      throw invalid_argument(commsgd::concat("split: argument 'color' = ", lowest,
                                             lowest == color ? "" : " (on another rank)",
                                             " is outside the allowed range [0, inf)"));
    MPI_Comm child = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split(raw_, color, key, &child), "MPI_Comm_split");
    mpi out(child, boost::mpi::comm_take_ownership);
    out.max_chunk_ = max_chunk_;
    out.verify_ = verify_;
    out.deadline_->seconds = deadline_->seconds;
    return out;
  }

private:
  static void check_handle(MPI_Comm comm) {
    if (comm == MPI_COMM_NULL)
      throw invalid_argument("argument 'comm' is MPI_COMM_NULL; a usable communicator is required");
    if (!detail::mpi_usable()) throw comm_error("MPI is not initialised (or already finalised)");
    int inter = 0;
    detail::mpi_check(MPI_Comm_test_inter(comm, &inter), "MPI_Comm_test_inter");
    if (inter)
      throw invalid_argument("argument 'comm' is an inter-communicator; an intra-communicator is required");
  }

  void init() {
    raw_ = comm_;
    deadline_ = std::make_shared<detail::mpi_deadline>();
    detail::mpi_check(MPI_Comm_rank(raw_, &rank_), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(raw_, &size_), "MPI_Comm_size");
    // MPI_TAG_UB is a predefined attribute of MPI_COMM_WORLD, the same for every communicator.
    void* value = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag);
    tag_ub_ = flag && value ? *static_cast<int*>(value) : 32767; // 32767: the least the standard allows
  }

  void take(mpi& o) noexcept {
    comm_ = std::move(o.comm_);
    o.comm_ = boost::mpi::communicator(MPI_COMM_NULL, boost::mpi::comm_attach);
    raw_ = std::exchange(o.raw_, MPI_COMM_NULL);
    rank_ = std::exchange(o.rank_, 0);
    size_ = std::exchange(o.size_, 0);
    tag_ub_ = o.tag_ub_;
    max_chunk_ = o.max_chunk_;
    verify_ = o.verify_;
    deadline_ = o.deadline_; // shared: the moved-from object stays safe to ask
  }

  bool bounded() const noexcept { return deadline_->seconds > 0; }

  // One MPI operation: its blocking form, or with a timeout its nonblocking form polled to the deadline
  // (a timed-out request is left to MPI: a collective's may not be freed or cancelled). Returns the code.
  template <class Blocking, class Start>
  int call_status(const char* name, Blocking&& blocking, Start&& start, MPI_Status* status) {
    if (!bounded()) return blocking();
    detail::mpi_check_usable(*deadline_);
    MPI_Request req = MPI_REQUEST_NULL;
    detail::mpi_check(start(&req), name);
    int rc = MPI_SUCCESS;
    detail::mpi_poll_bounded(
        *deadline_,
        [&] {
          int done = 0;
          rc = MPI_Test(&req, &done, status);
          return rc != MPI_SUCCESS || done != 0;
        },
        [&] { return commsgd::concat(name, " on rank ", rank_, " of ", size_); });
    return rc;
  }

  template <class Blocking, class Start>
  void call(const char* name, Blocking&& blocking, Start&& start) {
    detail::mpi_check(call_status(name, blocking, start, MPI_STATUS_IGNORE), name);
  }

  void check_peer(const char* name, int value) const { detail::check_rank(name, value, size_); }

  void check_tag(int tag) const {
    if (tag < 0 || tag > tag_ub_)
      throw invalid_argument(commsgd::concat(
          "argument 'tag' = ", tag, " is outside the allowed range [0, MPI_TAG_UB = ", tag_ub_, "]"));
  }

  // Length of the collective piece starting at lo.
  int piece(std::size_t units, std::size_t lo) const noexcept {
    return static_cast<int>(std::min(max_chunk_, units - lo));
  }

  // Length of the point-to-point piece starting at lo: full pieces, then the (short, maybe empty) rest.
  int frame(std::size_t units, std::size_t lo) const noexcept {
    return static_cast<int>(units - lo >= max_chunk_ ? max_chunk_ : units - lo);
  }

  // MPI counts are int: a point-to-point transfer of `data` goes as pieces of at most max_chunk_ MPI
  // elements, f(address, count, first element) for each in order; both sides derive the same pieces.
  template <class T, class F>
  void for_each_piece(std::span<T> data, F&& f) const {
    using wire = detail::mpi_wire<std::remove_const_t<T>>;
    using byte = std::conditional_t<std::is_const_v<T>, const std::byte, std::byte>;
    const std::size_t units = data.size() * wire::units;
    const std::size_t unit_bytes = sizeof(T) / wire::units;
    auto* bytes = reinterpret_cast<byte*>(data.data());
    for (std::size_t i = 0, pieces = detail::mpi_pieces(units, max_chunk_); i < pieces; ++i) {
      const std::size_t lo = i * max_chunk_;
      f(bytes + lo * unit_bytes, frame(units, lo), lo);
    }
  }

  void bcast_units(void* data, std::size_t units, MPI_Datatype type, int root) {
    int type_size = 0;
    MPI_Type_size(type, &type_size);
    auto* bytes = static_cast<std::byte*>(data);
    for (std::size_t lo = 0; lo < units; lo += max_chunk_) {
      auto* at = bytes + lo * static_cast<std::size_t>(type_size);
      const int len = piece(units, lo);
      call(
          "MPI_Bcast", [&] { return MPI_Bcast(at, len, type, root, raw_); },
          [&](MPI_Request* r) { return MPI_Ibcast(at, len, type, root, raw_, r); });
    }
  }

  // Smallest and largest of each value over all ranks, in one small all-reduce (max of v and of ~v).
  template <std::size_t K>
  std::array<std::pair<std::uint64_t, std::uint64_t>, K> min_max(std::array<std::uint64_t, K> v) {
    std::array<std::pair<std::uint64_t, std::uint64_t>, K> out;
    std::array<std::uint64_t, 2 * K> buf;
    for (std::size_t k = 0; k < K; ++k) {
      buf[2 * k] = v[k];
      buf[2 * k + 1] = ~v[k];
    }
    if (size_ > 1)
      call(
          "MPI_Allreduce",
          [&] {
            return MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(2 * K), MPI_UINT64_T, MPI_MAX,
                                 raw_);
          },
          [&](MPI_Request* r) {
            return MPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(2 * K), MPI_UINT64_T, MPI_MAX,
                                  raw_, r);
          });
    for (std::size_t k = 0; k < K; ++k)
      out[k] = {~buf[2 * k + 1], buf[2 * k]};
    return out;
  }

  void agree_on_count(const char* op, const char* arg, std::size_t n) {
    const auto mm = min_max<1>({n});
    if (mm[0].first != mm[0].second) throw detail::ranks_disagree(op, arg, n, mm[0]);
  }

  boost::mpi::communicator comm_ = boost::mpi::communicator(MPI_COMM_NULL, boost::mpi::comm_attach);
  MPI_Comm raw_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  int tag_ub_ = 32767;
  std::size_t max_chunk_ = default_max_chunk_elements;
  bool verify_ = true;
  std::shared_ptr<detail::mpi_deadline> deadline_ = std::make_shared<detail::mpi_deadline>();
};

static_assert(request<mpi_request>);
static_assert(communicator<mpi>);

} // namespace commsgd::inline v1::comm
