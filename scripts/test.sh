#!/usr/bin/env bash
# Builds commsgd with the dev preset and runs every test (host, threads, MPI, package; CUDA tests skip
# without a GPU). Extra arguments go to ctest, e.g. `bash scripts/test.sh -L mpi`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset dev
cmake --build --preset dev -j "$(nproc)"
ctest --preset dev -j "$(nproc)" "$@"
