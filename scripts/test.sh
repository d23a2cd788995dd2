#!/usr/bin/env bash
# Builds commsgd with the dev preset and runs every test (host, threads, MPI, package; CUDA tests skip
# without a GPU). Extra arguments go to ctest, e.g. `bash scripts/test.sh -L mpi`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset dev
cmake --build --preset dev -j "$(nproc)"
# The emulated cluster's test needs root; as any other user it fails unless told that skipping it is allowed.
if [ "$(id -u)" -ne 0 ] && [ -z "${COMMSGD_NETCLUSTER_ALLOW_SKIP:-}" ]; then
  echo "test.sh: not root, so the netcluster test is allowed to skip (COMMSGD_NETCLUSTER_ALLOW_SKIP=1)"
  export COMMSGD_NETCLUSTER_ALLOW_SKIP=1
fi
ctest --preset dev -j "$(nproc)" "$@"
