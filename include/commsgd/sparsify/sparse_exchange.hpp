// Sums every rank's message into a dense vector, over any communicator.
//
// A sparse exchange runs in two collectives:
//   1. an all_gather of a small header per rank (pair count, length, problem code and position), so every
//      rank sees every count and every rank's verdict on its own input. Bad input on any rank then raises
//      the same error on every rank, instead of leaving the others blocked in the next collective.
//   2. either an all_gather_v of the (index, value) pairs followed by a scatter-add in rank order, or, when
//      cost/sparse.hpp says the ring moves fewer bytes, a dense all_reduce_sum (SparCML's switch). The
//      choice uses only gathered counts, so it is identical on every rank.
// A rank with nothing to send still takes part in both collectives with an empty contribution.
//
// The scatter-add starts from +0 and adds rank 0's pairs, then rank 1's, ...; comm::local's all-reduce sums
// in the same rank order, so on comm::local both paths give the same sums (up to the sign of zeros). Other
// transports may order a dense sum differently.
//
// The CUDA sparsifier (cuda::top_k, through commsgd/cuda.cuh) hands over its pairs in pinned host memory,
// so this host exchange sums them as they are. Gathering device buffers directly would need a CUDA-aware
// transport and a scatter-add kernel that walks ranks in order (atomics would lose the deterministic
// order); neither exists. sparsify/sparse_reducer.hpp puts a sparsifier and this exchange behind the reducer
// a strategy sums through.
#pragma once

#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/exchange_report.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/sparse.hpp>
#include <commsgd/error.hpp>
#include <commsgd/select/validate.hpp>
#include <commsgd/sparsify/finite.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace commsgd::inline v1::sparsify {

struct exchange_options {
  cost::sparse_path path = cost::sparse_path::automatic;
};

namespace detail {

enum class message_problem : std::uint64_t {
  none = 0,
  output_size = 1, // out.size() != length
  ragged = 2,      // indices.size() != values.size()
  bad_index = 3,   // out of range or not strictly rising
  non_finite = 4,  // a value is NaN or inf; the count rides in the upper bits of the code
};

// Checks one rank's message before it is announced; `where` receives the position of the problem.
template <sparse_index Index>
message_problem inspect_message(const sparse_view<Index>& m, std::span<float> out, std::uint64_t& where) {
  where = 0;
  if (out.size() != m.length) {
    where = out.size();
    return message_problem::output_size;
  }
  if (m.indices.size() != m.values.size()) {
    where = m.values.size();
    return message_problem::ragged;
  }
  for (std::size_t j = 0; j < m.indices.size(); ++j)
    if (static_cast<std::uint64_t>(m.indices[j]) >= m.length || (j > 0 && m.indices[j] <= m.indices[j - 1])) {
      where = j;
      return message_problem::bad_index;
    }
  if (const auto bad = select::find_non_finite(m.values); bad.count > 0) {
    where = bad.first;
    return static_cast<message_problem>(static_cast<std::uint64_t>(message_problem::non_finite) |
                                        (static_cast<std::uint64_t>(bad.count) << 8));
  }
  return message_problem::none;
}

// Turns rank r's verdict on its own message (h = pair count, length, problem code, position) into the same
// exception on every rank.
inline void raise_message_problem(int r, int me, const std::uint64_t* h) {
  const auto code = static_cast<message_problem>(h[2] & 0xff);
  const std::string who = r == me ? std::string("this rank's") : commsgd::concat("rank ", r, "'s");
  switch (code) {
  case message_problem::none:
    return;
  case message_problem::output_size:
    throw size_mismatch(commsgd::concat("sparse exchange: ", who, " argument 'out' has ", h[3],
                                        " elements, its message's length is ", h[1]));
  case message_problem::ragged:
    throw size_mismatch(
        commsgd::concat("sparse exchange: ", who, " message has ", h[0], " indices but ", h[3], " values"));
  case message_problem::bad_index:
    throw invalid_argument(commsgd::concat("sparse exchange: ", who,
                                           " message argument 'indices' at position ", h[3],
                                           " is out of range [0, ", h[1], ") or not strictly rising"));
  case message_problem::non_finite:
    throw non_finite(who + " sparse message values", h[2] >> 8, h[3]);
  }
  throw corrupt_data(commsgd::concat("sparse exchange: rank ", r, " sent an unknown header code ", h[2]));
}

} // namespace detail

template <sparse_index Index = std::uint32_t>
class exchanger {
public:
  explicit exchanger(exchange_options opt = {}) : opt_(opt) {}

  const exchange_options& options() const noexcept { return opt_; }

  // out <- sum over ranks of each rank's `mine`, densified; identical bits on every rank.
  template <comm::communicator C>
  comm::exchange_report sum(C& c, sparse_view<Index> mine, std::span<float> out) {
    const int n = c.size();
    const auto problem = detail::inspect_message(mine, out, where_);
    std::array<std::uint64_t, cost::sparse_header_fields> header{mine.size(), mine.length,
                                                                 static_cast<std::uint64_t>(problem), where_};
    headers_.resize(header.size() * static_cast<std::size_t>(n));
    c.all_gather(std::span<const std::uint64_t>(header), std::span<std::uint64_t>(headers_));
    comm::exchange_report rep;
    rep.counts.resize(static_cast<std::size_t>(n));
    const std::uint64_t length = headers_[1];
    for (int r = 0; r < n; ++r) {
      const auto* h = headers_.data() + header.size() * static_cast<std::size_t>(r);
      detail::raise_message_problem(r, c.rank(), h);
      if (h[1] != length)
        throw size_mismatch(
            commsgd::concat("sparse exchange: ranks disagree on the message 'length' (rank 0 has ", length,
                            ", rank ", r, " has ", h[1], ")"));
      rep.counts[static_cast<std::size_t>(r)] = h[0];
      rep.total += h[0];
    }
    rep.dense = cost::sparse_uses_dense(opt_.path, rep.counts, length, sizeof(entry<Index>));

    std::fill(out.begin(), out.end(), 0.0f);
    if (rep.dense) {
      for (std::size_t j = 0; j < mine.size(); ++j)
        out[mine.indices[j]] = mine.values[j];
      c.all_reduce_sum(out);
      return rep;
    }
    packed_.resize(mine.size());
    for (std::size_t j = 0; j < mine.size(); ++j)
      packed_[j] = entry<Index>{mine.indices[j], mine.values[j]};
    const auto got = c.all_gather_v(std::span<const entry<Index>>(packed_), gathered_);
    for (int r = 0; r < n; ++r)
      if (got[static_cast<std::size_t>(r)] != rep.counts[static_cast<std::size_t>(r)])
        throw comm_error(commsgd::concat("sparse exchange: rank ", r, " announced ",
                                         rep.counts[static_cast<std::size_t>(r)], " pairs but sent ",
                                         got[static_cast<std::size_t>(r)]));
    // Every rank checked its own indices before sending; this guards the write against a damaged transport.
    for (const auto& e : gathered_) {
      if (static_cast<std::uint64_t>(e.index) >= length)
        throw corrupt_data(commsgd::concat("sparse exchange: received index ", e.index,
                                           " outside the vector's length ", length));
      out[static_cast<std::size_t>(e.index)] += e.value;
    }
    return rep;
  }

  // A dense message is already what a ring all-reduce wants.
  template <comm::communicator C>
  comm::exchange_report sum(C& c, dense_view mine, std::span<float> out) {
    if (out.size() != mine.length())
      throw size_mismatch(commsgd::concat("argument 'out' has ", out.size(),
                                          " elements, the message's length is ", mine.length()));
    if (out.data() != mine.values.data()) std::copy(mine.values.begin(), mine.values.end(), out.begin());
    c.all_reduce_sum(out);
    return {true, mine.length(), {}};
  }

private:
  exchange_options opt_;
  std::uint64_t where_ = 0;
  std::vector<std::uint64_t> headers_;
  std::vector<entry<Index>> packed_, gathered_;
};

// One-off forms; a training loop keeps an exchanger so its buffers are reused.
template <comm::communicator C, sparse_index Index>
comm::exchange_report all_sum(C& c, sparse_view<Index> mine, std::span<float> out,
                              exchange_options opt = {}) {
  return exchanger<Index>(opt).sum(c, mine, out);
}

template <comm::communicator C>
comm::exchange_report all_sum(C& c, dense_view mine, std::span<float> out) {
  return exchanger<>().sum(c, mine, out);
}

} // namespace commsgd::inline v1::sparsify
