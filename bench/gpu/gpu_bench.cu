// The GPU benchmarks as one program, `gpu_bench NAME [options]`, NAME one of step, batched, select, sequence,
// diloco_round (each NAME_gpu_bench.cu says what it times and takes). One program of one translation unit:
// each .cu file parses the CUDA headers for about 15 s of a core before its own code, and every CUDA build,
// CI's included, compiles these. Each file still builds alone as its own program (run.sh does so with a
// newer CCCL for the DeviceTopK anchors).
#define COMMSGD_GPU_BENCH_ONE_PROGRAM
#include "batched_gpu_bench.cu"
#include "diloco_round_gpu_bench.cu"
#include "select_gpu_bench.cu"
#include "sequence_gpu_bench.cu"
#include "step_gpu_bench.cu"

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  struct program {
    const char* name;
    int (*run)(int, char**);
  };
  const program programs[] = {{"step", step_bench::run},
                              {"batched", batched_bench::run},
                              {"select", select_bench::run},
                              {"sequence", sequence_bench::run},
                              {"diloco_round", diloco_round_bench::run}};
  const std::string name = argc > 1 ? argv[1] : "";
  for (const program& p : programs) {
    if (name == p.name) {
      // The program sees its own name first, as it would alone, so its usage line names it.
      std::string self = std::string(argv[0]) + " " + p.name;
      argv[1] = self.data();
      return p.run(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "usage: %s step|batched|select|sequence|diloco_round [options] (got '%s')\n", argv[0],
               name.c_str());
  return 2;
}
