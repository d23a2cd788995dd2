#!/usr/bin/env bash
# Builds commsgd with the dev preset and runs every test (host, threads, MPI, package; CUDA tests skip
# without a GPU). Extra arguments go to ctest, e.g. `bash scripts/test.sh -L mpi`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset dev
cmake --build --preset dev -j "$(nproc)"
# A suite whose every test skipped (a torch suite, the emulated cluster's test) fails unless COMMSGD_ALLOW_SKIP
# names its reason. Unless it is set already, this names what this machine cannot run (an old torch, no GPU,
# not root), by the tests' own checks in the interpreter the torch suites run in, and says so.
if [ -z "${COMMSGD_ALLOW_SKIP+set}" ]; then
  py=$(sed -n 's/^COMMSGD_TORCH_PYTHON:[A-Z]*=//p' build/dev/CMakeCache.txt)
  if [ -z "$py" ] || ! COMMSGD_ALLOW_SKIP=$("$py" tests/torch/run_pytest.py --machine-skips); then
    COMMSGD_ALLOW_SKIP=""  # no torch here: no torch suite is built
    [ "$(id -u)" -eq 0 ] || COMMSGD_ALLOW_SKIP="the emulated cluster needs root"
  fi
  export COMMSGD_ALLOW_SKIP
  echo "test.sh: suites may skip whole for: ${COMMSGD_ALLOW_SKIP:-nothing} (COMMSGD_ALLOW_SKIP)"
fi
ctest --preset dev -j "$(nproc)" "$@"
