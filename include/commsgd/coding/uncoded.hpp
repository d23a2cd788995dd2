// coding::uncoded<C, Exchange>: plain data parallelism. The batch is cut into n blocks, rank i computes
// block i, and the exchange policy decides how the n block gradients are summed:
//   by_ring_all_reduce  the communicator's all_reduce_sum: what a user would pick; 2(n-1)/n d values each way
//   by_all_gather       every rank gathers all n gradients and sums them (uncoded SSGD over multicast)
//   by_unicast          every rank sends its gradient to the n-1 others (uncoded SSGD over unicast)
// The last two sum in rank order from -0.0f, so they are bit-identical on every rank and to a reference fold.
#pragma once

#include <commsgd/coding/assignment.hpp>
#include <commsgd/coding/scheme.hpp>
#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

namespace commsgd::inline v1::coding {

struct by_ring_all_reduce {};
struct by_all_gather {};
struct by_unicast {};

template <class E>
concept uncoded_exchange =
    std::same_as<E, by_ring_all_reduce> || std::same_as<E, by_all_gather> || std::same_as<E, by_unicast>;

template <comm::communicator C, uncoded_exchange Exchange = by_ring_all_reduce>
class uncoded {
public:
  using communicator_type = C;
  using exchange_type = Exchange;

  // `comm` must outlive the scheme. Optional weights size each rank's share of the batch.
  explicit uncoded(C& comm, std::span<const double> weights = {})
      : comm_(&comm), assignment_(comm.size(), 1, weights) {}

  std::size_t block_count() const noexcept { return assignment_.block_count(); }
  std::span<const std::size_t> my_blocks() const { return assignment_.blocks_of(comm_->rank()); }
  std::vector<std::size_t> block_sizes(std::size_t batch) const { return assignment_.block_sizes(batch); }
  const coding::assignment& assignment() const noexcept { return assignment_; }

  exchange_result exchange(block_gradients blocks, std::span<float> out) {
    detail::check_blocks(blocks, 1, out.size());
    const std::span<const float> mine = blocks[0];
    const int n = comm_->size();
    const std::size_t d = out.size();
    if constexpr (std::same_as<Exchange, by_ring_all_reduce>) {
      std::copy(mine.begin(), mine.end(), out.begin());
      comm_->all_reduce_sum(out);
    } else {
      gathered_.resize(static_cast<std::size_t>(n) * d);
      if constexpr (std::same_as<Exchange, by_all_gather>) {
        comm_->all_gather(mine, std::span<float>(gathered_));
      } else {
        // Receives go first so that a transport with bounded buffering never waits on an unposted receive.
        std::vector<comm::request_t<C>> pending;
        pending.reserve(2 * static_cast<std::size_t>(n));
        for (int s = 0; s < n; ++s)
          if (s != comm_->rank()) pending.push_back(comm_->irecv(slot(s, d), s, detail::unicast_tag));
        for (int k = 0; k < n; ++k)
          if (k != comm_->rank()) pending.push_back(comm_->isend(mine, k, detail::unicast_tag));
        std::copy(mine.begin(), mine.end(), slot(comm_->rank(), d).begin());
        detail::wait_all(pending);
      }
      std::fill(out.begin(), out.end(), detail::sum_identity);
      for (int s = 0; s < n; ++s) {
        const auto g = slot(s, d);
        for (std::size_t e = 0; e < d; ++e)
          out[e] += g[e];
      }
    }
    return {};
  }

private:
  std::span<float> slot(int s, std::size_t d) {
    return std::span<float>(gathered_).subspan(static_cast<std::size_t>(s) * d, d);
  }

  C* comm_;
  coding::assignment assignment_;
  std::vector<float> gathered_;
};

static_assert(coding_scheme<uncoded<comm::archetype, by_ring_all_reduce>>);
static_assert(coding_scheme<uncoded<comm::archetype, by_all_gather>>);
static_assert(coding_scheme<uncoded<comm::archetype, by_unicast>>);

} // namespace commsgd::inline v1::coding
