// The (r+1)-groups CSSGD multicasts in, made once as sub-communicators of the parent.
//
// A rank belongs to C(n-1, r) groups but one split() gives each rank one communicator, so groups are made
// in rounds: each round packs pairwise disjoint groups (greedily, in lexicographic order) and splits once;
// a rank in none of that round's groups gets a singleton and drops it. Every rank computes the same
// schedule, so the collective splits line up.
//
// Why sub-communicators and not point-to-point over the parent: a group multicast then is a broadcast,
// an operation the wrappers see as such. comm::metered charges it as r unicasts of the packet (exactly what
// it costs on a switched network), comm::simulated can charge one transmission on a true multicast medium,
// and an MPI implementation is free to use hardware multicast or a tree. Point-to-point sends would count
// the same bytes on a switched network but hide the multicast from every layer below.
#pragma once

#include <commsgd/coding/subsets.hpp>
#include <commsgd/comm/communicator.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace commsgd::inline v1::coding {

template <comm::communicator C>
struct exchange_group {
  node_set members = 0;  // r+1 nodes; the group rank of a node is its position among them
  std::size_t order = 0; // index in the lexicographic list of all (r+1)-subsets: the global walk order
  C comm;
};

// Collective over `parent`: every rank calls it with the same group size. Returns this rank's groups in
// lexicographic order.
template <comm::communicator C>
std::vector<exchange_group<C>> make_exchange_groups(C& parent, int group_size) {
  const int n = parent.size();
  const int me = parent.rank();
  std::vector<exchange_group<C>> mine;
  if (group_size > n || group_size < 2) return mine;
  const auto all = subsets_lex(n, group_size);
  std::vector<bool> done(all.size(), false);
  std::size_t left = all.size();
  while (left > 0) {
    node_set used = 0;
    int colour = -1;
    int picked = 0;
    std::size_t my_group = 0;
    for (std::size_t g = 0; g < all.size(); ++g) {
      if (done[g] || (all[g] & used) != 0) continue;
      used |= all[g];
      done[g] = true;
      --left;
      if (contains(all[g], me)) {
        colour = picked;
        my_group = g;
      }
      ++picked;
    }
    const bool member = colour >= 0;
    auto sub = parent.split(member ? colour : picked + me, me);
    if (member) mine.push_back(exchange_group<C>{all[my_group], my_group, std::move(sub)});
  }
  std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.order < b.order; });
  return mine;
}

} // namespace commsgd::inline v1::coding
