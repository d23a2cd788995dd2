// What both async_ps roles share: the communicator, the checked options and the wire protocol.
//
// Four tags of its own, reserved on the communicator by comm::reserve_tags unless tag_base names them, so
// other traffic can share the communicator. A 16-byte header goes worker -> server (pull, push + its
// gradient on the next tag, done); the server answers a version and the parameters. Headers go first so
// that a large gradient never waits on a receive the server has not posted.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/tags.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sync/async_ps/options.hpp>

#include <cstdint>
#include <span>

namespace commsgd::inline v1::sync {

namespace detail {

template <comm::communicator C>
class async_ps_wire {
protected:
  async_ps_wire(C& c, const async_ps_options& o) : comm_(&c), opt_(o) {
    check_async_ps_options(c, o);
    tags_ = o.tag_base < 0 ? comm::reserve_tags(c, 4, "async_ps")
                           : comm::reserve_tags_at(c, o.tag_base, 4, "async_ps");
  }

  static constexpr std::int32_t kind_pull = 1, kind_push = 2, kind_done = 3;

  struct header {
    std::int32_t kind = 0;
    std::int32_t reserved = 0;
    std::int64_t version = 0;
  };

  void require_started(const char* what) const {
    if (!started_) throw invalid_argument(commsgd::concat("async_ps::", what, ": call start() first"));
  }

public:
  // The version of the model this rank last saw (server: the current one).
  std::int64_t version() const { return version_; }
  int workers() const { return comm_->size() - 1; }
  int rank() const { return comm_->rank(); }

protected:
  // Worker -> server. The header carries the version the worker last pulled: the server measures staleness
  // from it.
  void send_header(std::int32_t kind) {
    const header h{kind, 0, version_};
    comm_->send(std::span<const header>(&h, 1), opt_.server, tag_header());
  }
  void send_gradient(std::span<const float> grad) { comm_->send(grad, opt_.server, tag_grad()); }
  void receive_model(std::span<float> params) {
    std::int64_t v = 0;
    comm_->recv(std::span<std::int64_t>(&v, 1), opt_.server, tag_version());
    comm_->recv(params, opt_.server, tag_model());
    version_ = v;
  }

  // The server posts one header receive per worker and polls them all, so no worker's silence holds up
  // another; a gradient is received only once its header has said it is coming.
  auto post_header(header& h, int worker) {
    return comm_->irecv(std::span<header>(&h, 1), worker, tag_header());
  }
  void receive_gradient(std::span<float> grad, int worker) { comm_->recv(grad, worker, tag_grad()); }
  void send_model(std::span<const float> model, int worker) {
    const std::int64_t v = version_;
    comm_->send(std::span<const std::int64_t>(&v, 1), worker, tag_version());
    comm_->send(model, worker, tag_model());
  }

  C* comm_;
  async_ps_options opt_;
  bool started_ = false;
  std::int64_t version_ = 0;

private:
  int tag_header() const { return tags_[0]; }
  int tag_grad() const { return tags_[1]; }
  int tag_version() const { return tags_[2]; }
  int tag_model() const { return tags_[3]; }

  comm::tag_lease tags_;
};

} // namespace detail

} // namespace commsgd::inline v1::sync
