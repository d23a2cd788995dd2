// comm::exchange_report: what one reduction round put on the wire, as every exchanger (sparsify/) and
// compressor (compress/) reports it, so that data_parallel and the cost models read one shape.
#pragma once

#include <cstdint>
#include <vector>

namespace commsgd::inline v1::comm {

struct exchange_report {
  bool dense = false;                // a dense all-reduce carried the sum
  std::uint64_t total = 0;           // pairs or values over all ranks (the dense length for a dense message)
  std::vector<std::uint64_t> counts; // pairs or values per rank (empty for a dense message)
};

} // namespace commsgd::inline v1::comm
