// The umbrella header: everything host-side. comm::mpi needs commsgd/comm/mpi.hpp (target commsgd::mpi);
// CUDA code is reached only through commsgd/cuda.cuh (target commsgd::cuda).
#pragma once

#include <commsgd/coding/coding.hpp>
#include <commsgd/comm/comm.hpp>
#include <commsgd/compress/compress.hpp>
#include <commsgd/config.hpp>
#include <commsgd/cost/cost.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/error.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/select.hpp>
#include <commsgd/sparsify/sparsify.hpp>
#include <commsgd/state/stream.hpp>
#include <commsgd/sync/sync.hpp>
