// coding::uncoded_shuffle<C>: CSSGD's redundant assignment with the coding taken out, to isolate what the
// coding buys.
//
// For every (r+1)-group T and k in T, each of the r holders s of block T\{k} sends k its own segment of that
// block by unicast: segment position(s, T\{k}) of r balanced segments ([d*j/r, d*(j+1)/r), no padding, since
// nothing is combined). A node receives exactly the C(n-1, r) blocks it lacks, d values each, and sends
// about as much; on a switched network that is what CSSGD costs too, on a true multicast medium CSSGD sends r
// times less. Sums are taken in block order from -0.0f, so the result is bit-identical to cssgd<xor_bits>.
#pragma once

#include <commsgd/coding/assignment.hpp>
#include <commsgd/coding/scheme.hpp>
#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>

#include <cstddef>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::coding {

// Element range [first, second) of balanced segment j of r over d values.
inline constexpr std::pair<std::uint64_t, std::uint64_t> balanced_segment(std::uint64_t d, int r,
                                                                          int j) noexcept {
  const auto ur = static_cast<std::uint64_t>(r), uj = static_cast<std::uint64_t>(j);
  return {d * uj / ur, d * (uj + 1) / ur};
}

template <comm::communicator C>
class uncoded_shuffle {
public:
  using communicator_type = C;

  // Not collective: point-to-point traffic needs no sub-communicators. `comm` must outlive the scheme.
  uncoded_shuffle(C& comm, int r, std::span<const double> weights = {})
      : comm_(&comm), assignment_(comm.size(), r, weights), slots_(assignment_.slots_of(comm.rank())) {
    // The groups this rank is in, in the shared lexicographic order: both ends of every pair walk it alike,
    // which is what matches sends to receives on one tag.
    const int me = comm.rank();
    if (r < comm.size())
      for (node_set t : subsets_lex(comm.size(), r + 1))
        if (contains(t, me)) groups_.push_back(t);
  }

  int redundancy() const noexcept { return assignment_.redundancy(); }
  std::size_t block_count() const noexcept { return assignment_.block_count(); }
  std::span<const std::size_t> my_blocks() const { return assignment_.blocks_of(comm_->rank()); }
  std::vector<std::size_t> block_sizes(std::size_t batch) const { return assignment_.block_sizes(batch); }
  const coding::assignment& assignment() const noexcept { return assignment_; }

  exchange_result exchange(block_gradients blocks, std::span<float> out) {
    const std::size_t d = out.size();
    detail::check_blocks(blocks, my_blocks().size(), d);
    const int r = redundancy();
    const int me = comm_->rank();
    decoded_.resize(slots_.lacking_count * d);

    std::vector<comm::request_t<C>> pending;
    pending.reserve(2 * groups_.size() * static_cast<std::size_t>(r));
    for (node_set t : groups_) {
      const node_set lacking = t & ~node_bit(me);
      const std::size_t base = slots_.lacking[assignment_.index_of(lacking)] * d;
      for (int s : members(lacking)) {
        const auto [lo, hi] = balanced_segment(d, r, position_in(lacking, s));
        pending.push_back(
            comm_->irecv(std::span<float>(decoded_).subspan(base + lo, hi - lo), s, detail::shuffle_tag));
      }
    }
    for (node_set t : groups_)
      for (int k : members(t)) {
        if (k == me) continue;
        const node_set b = t & ~node_bit(k);
        const auto [lo, hi] = balanced_segment(d, r, position_in(b, me));
        pending.push_back(comm_->isend(blocks[slots_.held[assignment_.index_of(b)]].subspan(lo, hi - lo), k,
                                       detail::shuffle_tag));
      }
    detail::wait_all(pending);

    std::fill(out.begin(), out.end(), detail::sum_identity);
    for (std::size_t q = 0; q < assignment_.block_count(); ++q) {
      const std::span<const float> g =
          slots_.holds(q) ? blocks[slots_.held[q]]
                          : std::span<const float>(decoded_).subspan(slots_.lacking[q] * d, d);
      for (std::size_t e = 0; e < d; ++e)
        out[e] += g[e];
    }
    return {};
  }

private:
  C* comm_;
  coding::assignment assignment_;
  block_slots slots_; // derived from assignment_, so declared after it
  std::vector<node_set> groups_;
  std::vector<float> decoded_;
};

static_assert(coding_scheme<uncoded_shuffle<comm::archetype>>);

} // namespace commsgd::inline v1::coding
