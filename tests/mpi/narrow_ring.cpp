// comm::narrow_ring_sum over comm::mpi (2, 3 and 4 ranks): the same cases and reference as on comm::local.
#include "mpi/support.hpp"
#include "support/narrow_ring_cases.hpp"

#include <commsgd/comm/mpi.hpp>

TEST_CASE("the 16-bit ring sum over MPI equals the reference, fp16 and bf16") {
  auto c = commsgd::comm::mpi::world();
  narrow_ring_cases::check_all<commsgd::compress::fp16_format>(c);
  narrow_ring_cases::check_all<commsgd::compress::bf16_format>(c);
}

TEST_CASE("the 16-bit ring sum over MPI in small pieces equals the reference, fp16 and bf16") {
  auto c = commsgd::comm::mpi::world();
  narrow_ring_cases::check_all<commsgd::compress::fp16_format>(c, narrow_ring_cases::pieces::small);
  narrow_ring_cases::check_all<commsgd::compress::bf16_format>(c, narrow_ring_cases::pieces::small);
}

TEST_CASE("every MPI rank ends the 16-bit ring with the reference's bits") {
  // What the cases above imply, checked across processes: each rank's result, gathered over MPI, equals
  // the reference every rank computes on its own.
  auto c = commsgd::comm::mpi::world();
  const std::size_t d = 4099;
  const auto n = static_cast<std::size_t>(c.size());
  std::vector<std::vector<float>> all;
  for (int r = 0; r < c.size(); ++r)
    all.push_back(narrow_ring_cases::input<commsgd::compress::fp16_format>(r, d, 7, false));
  auto mine = all[static_cast<std::size_t>(c.rank())];
  commsgd::comm::narrow_ring_buffers buf;
  commsgd::comm::narrow_ring_sum<commsgd::compress::fp16_format>(c, std::span<float>(mine), false, buf);
  std::vector<float> every(n * d);
  c.all_gather(std::span<const float>(mine), std::span<float>(every));
  const auto want = narrow_ring_cases::reference<commsgd::compress::fp16_format>(all);
  for (std::size_t r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(narrow_ring_cases::same_bits(
        std::vector<float>(every.begin() + static_cast<std::ptrdiff_t>(r * d),
                           every.begin() + static_cast<std::ptrdiff_t>((r + 1) * d)),
        want));
  }
}
