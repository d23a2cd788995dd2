// comm::narrow_ring_sum over comm::mpi (2, 3 and 4 ranks): the same cases and reference as on comm::local.
#include "mpi/support.hpp"
#include "support/narrow_ring_cases.hpp"

#include <commsgd/comm/mpi.hpp>

TEST_CASE("the 16-bit ring sum over MPI equals the reference, fp16 and bf16") {
  auto c = commsgd::comm::mpi::world();
  narrow_ring_cases::check_all<commsgd::compress::fp16_format>(c);
  narrow_ring_cases::check_all<commsgd::compress::bf16_format>(c);
}
