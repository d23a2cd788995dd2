// The cuda_select_test program: every CUDA test file in one translation unit. Each file parses the CUDA
// headers (CUB's among them) for about 15 s of a core before it compiles a line of its own, so one unit
// instead of four saves CI most of a minute. Each file keeps its helpers in a namespace of its own.
// Without a device the program prints "skipped: no CUDA device" and returns 77, which ctest reports as skipped.
// cuda.cuh comes first, before any other header: this unit is also the proof that the one public CUDA header
// compiles on its own (tests/headers/ says so), and each test file's own include of it proves its guard.
#include <commsgd/cuda.cuh>

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "batched_top_k_test.cu"
#include "diloco_round_test.cu"
#include "select_test.cu"
#include "top_k_test.cu"

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
