// coding::cssgd<Combiner, C>: coded synchronous SGD (CSSGD).
//
// Assignment: the batch is cut into C(n, r) blocks; block S (an r-subset of the nodes) is computed by every
// node of S (coding/assignment.hpp).
//
// Exchange, for every (r+1)-subset T of the nodes (a group, coding/groups.hpp), in lexicographic order:
// for k in T the block T\{k} is held by every member of T but k. Each block gradient is cut into r
// contiguous segments of L = ceil(d / r) words (the last ones shorter or empty; missing words count as 0,
// so nothing is truncated). Member s of T owns segment position(s, T\{k}) of each block T\{k} it holds and
// multicasts one packet of L words to the group: the combination of those r segments. Receiver k removes
// the r-1 segments of blocks it holds itself and is left with segment position(s, T\{k}) of the one block it
// lacks; the r packets of the group give it that whole block. A node is in C(n-1, r) groups, one per block
// it lacks, so it ends with every block gradient and sums them in block order.
//
// Per node and step, in packets of L words (4 bytes): C(n-1, r) multicasts sent, each to r receivers, and
// r * C(n-1, r) packets received (cost/coding_traffic.hpp states it in bytes). Packets carry no header: sizes,
// senders and contents are all derivable on both sides. The words past a short last segment must decode to
// zero; anything else, or a packet of another size, raises corrupt_data (decode_cssgd_packet,
// coding/cssgd_packet.hpp, a pure function with a fuzz target).
#pragma once

#include <commsgd/coding/assignment.hpp>
#include <commsgd/coding/combiner.hpp>
#include <commsgd/coding/cssgd_packet.hpp>
#include <commsgd/coding/groups.hpp>
#include <commsgd/coding/scheme.hpp>
#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace commsgd::inline v1::coding {

// Words per CSSGD packet for gradients of d values and redundancy r: one segment, padded.
inline constexpr std::uint64_t cssgd_packet_length(std::uint64_t d, int r) noexcept {
  return r <= 0 ? 0 : (d + static_cast<std::uint64_t>(r) - 1) / static_cast<std::uint64_t>(r);
}

template <combiner Combiner, comm::communicator C>
class cssgd {
public:
  using communicator_type = C;
  using combiner_type = Combiner;

  // Collective over `comm` (it splits the exchange groups). `comm` must outlive the scheme.
  cssgd(C& comm, int r, std::span<const double> weights = {})
      : comm_(&comm), assignment_(comm.size(), r, weights), slots_(assignment_.slots_of(comm.rank())),
        groups_(make_exchange_groups(comm, r + 1)) {}

  int redundancy() const noexcept { return assignment_.redundancy(); }
  std::size_t block_count() const noexcept { return assignment_.block_count(); }
  std::span<const std::size_t> my_blocks() const { return assignment_.blocks_of(comm_->rank()); }
  std::vector<std::size_t> block_sizes(std::size_t batch) const { return assignment_.block_sizes(batch); }
  const coding::assignment& assignment() const noexcept { return assignment_; }
  std::size_t group_count() const noexcept { return groups_.size(); }

  exchange_result exchange(block_gradients blocks, std::span<float> out) {
    const std::size_t d = out.size();
    detail::check_blocks(blocks, my_blocks().size(), d);
    exchange_result result;
    for (auto b : blocks)
      result.clipped += Combiner::count_clipped(b);

    const int r = redundancy();
    const int me = comm_->rank();
    const std::size_t len = static_cast<std::size_t>(cssgd_packet_length(d, r));
    decoded_.resize(slots_.lacking_count * d);
    packet_.resize(len);

    auto segment = [&](node_set block, int pos) {
      const auto g = blocks[slots_.held[assignment_.index_of(block)]];
      const std::size_t lo = std::min(d, static_cast<std::size_t>(pos) * len);
      const std::size_t hi = std::min(d, lo + len);
      return g.subspan(lo, hi - lo);
    };

    for (auto& group : groups_) {
      const auto t = members(group.members);
      for (int j = 0; j < static_cast<int>(t.size()); ++j) {
        const int s = t[static_cast<std::size_t>(j)];
        if (s == me) {
          std::fill(packet_.begin(), packet_.end(), 0u);
          for (int k : t)
            if (k != s) {
              const node_set b = group.members & ~node_bit(k);
              Combiner::combine(packet_, segment(b, position_in(b, s)));
            }
        }
        multicast(group, j);
        if (s == me) continue;
        own_.clear();
        for (int k : t)
          if (k != s && k != me) {
            const node_set b = group.members & ~node_bit(k);
            own_.push_back(segment(b, position_in(b, s)));
          }
        keep_segment(group.members & ~node_bit(me), s, d, len);
      }
    }

    acc_.assign(d, Combiner::accumulator_zero);
    for (std::size_t q = 0; q < assignment_.block_count(); ++q) {
      if (slots_.holds(q))
        Combiner::accumulate(std::span(acc_), blocks[slots_.held[q]]);
      else
        Combiner::accumulate(std::span(acc_),
                             std::span<const std::uint32_t>(decoded_).subspan(slots_.lacking[q] * d, d));
    }
    Combiner::finish(acc_, out);
    return result;
  }

private:
  void multicast(exchange_group<C>& group, int root) {
    try {
      group.comm.broadcast(std::span<std::uint32_t>(packet_), root);
    } catch (const size_mismatch& e) {
      throw corrupt_data(commsgd::concat("CSSGD packet of ", packet_.size(), " words from group rank ", root,
                                         " of group ", group.order,
                                         " does not have the size both sides derive: ", e.what()));
    }
  }

  // Removes this rank's own segments (own_) from the packet and keeps segment position(s, lacking) of the
  // block it lacks; the padding after it is checked (cssgd_packet.hpp).
  void keep_segment(node_set lacking, int s, std::size_t d, std::size_t len) {
    const std::size_t lo = std::min(d, static_cast<std::size_t>(position_in(lacking, s)) * len);
    const std::size_t hi = std::min(d, lo + len);
    const std::size_t slot = slots_.lacking[assignment_.index_of(lacking)];
    decode_cssgd_packet<Combiner>(std::span<std::uint32_t>(packet_), len, own_,
                                  std::span<std::uint32_t>(decoded_).subspan(slot * d + lo, hi - lo), s);
  }

  C* comm_;
  coding::assignment assignment_;
  block_slots slots_; // derived from assignment_, so declared after it
  std::vector<exchange_group<C>> groups_;
  std::vector<std::uint32_t> decoded_;
  std::vector<std::uint32_t> packet_;
  std::vector<std::span<const float>> own_; // this rank's segments in the packet being decoded
  std::vector<typename Combiner::accumulator> acc_;
};

// Deduces the communicator: make_cssgd<xor_bits>(comm, r).
template <combiner Combiner, comm::communicator C>
cssgd<Combiner, C> make_cssgd(C& comm, int r, std::span<const double> weights = {}) {
  return cssgd<Combiner, C>(comm, r, weights);
}

static_assert(coding_scheme<cssgd<xor_bits, comm::archetype>>);
static_assert(coding_scheme<cssgd<int32_sum, comm::archetype>>);

} // namespace commsgd::inline v1::coding
