// The one translation unit of commsgd_torch._cuda: every CUDA file parses the CUDA headers, CUB's among them,
// for about 15 s of a core before its own code, so the module's parts are compiled together. Each part keeps
// its own file and its own unnamed namespace.
#include "cuda_top_k.cu"

#include "cuda_diloco.cu"
