// coding::gradient_code_scheme<Kind, C>: a gradient code (coding/gradient_code.hpp) as a coding scheme.
//
// Every rank computes the r blocks the code gives it (one for backup_workers) and encodes them into one
// vector of d values. Under policy::synchronous the exchange waits for everyone: an all-gather of the
// vectors, then every rank decodes from all n (the same arithmetic on the same bits, so the same sum on every
// rank; for fractional repetition the same bits as from any n - s of them). That path exists so the scheme
// composes like every other; the point of a code is policy::first_arrivals (sync/first_arrivals.hpp), which
// proceeds with the first n - s answers and reads the code through code().
#pragma once

#include <commsgd/coding/gradient_code.hpp>
#include <commsgd/coding/scheme.hpp>
#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace commsgd::inline v1::coding {

template <gradient_code_kind Kind, comm::communicator C>
class gradient_code_scheme {
public:
  using communicator_type = C;
  using kind_type = Kind;

  // `comm` must outlive the scheme; r in [1, n] (fractional repetition: r divides n).
  gradient_code_scheme(C& comm, int r) : comm_(&comm), code_(comm.size(), r) {}

  int redundancy() const noexcept { return code_.redundancy(); }
  std::size_t block_count() const noexcept { return code_.block_count(); }
  std::span<const std::size_t> my_blocks() const { return code_.blocks_of(comm_->rank()); }
  std::vector<std::size_t> block_sizes(std::size_t batch) const { return code_.block_sizes(batch); }
  gradient_code<Kind>& code() noexcept { return code_; }
  const gradient_code<Kind>& code() const noexcept { return code_; }

  exchange_result exchange(block_gradients blocks, std::span<float> out) {
    const std::size_t d = out.size();
    const int n = comm_->size();
    mine_.resize(d);
    code_.encode(comm_->rank(), blocks, mine_);
    all_.resize(static_cast<std::size_t>(n) * d);
    comm_->all_gather(std::span<const float>(mine_), std::span<float>(all_));
    std::vector<std::span<const float>> coded;
    coded.reserve(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k)
      coded.push_back(std::span<const float>(all_).subspan(static_cast<std::size_t>(k) * d, d));
    const node_set everyone = n == max_nodes ? ~node_set{0} : node_bit(n) - 1;
    code_.decode(everyone, std::span<const std::span<const float>>(coded), out);
    return {};
  }

private:
  C* comm_;
  gradient_code<Kind> code_;
  std::vector<float> mine_, all_;
};

static_assert(coding_scheme<gradient_code_scheme<fractional_repetition, comm::archetype>>);
static_assert(coding_scheme<gradient_code_scheme<cyclic, comm::archetype>>);
static_assert(coding_scheme<gradient_code_scheme<backup_workers, comm::archetype>>);

} // namespace commsgd::inline v1::coding
