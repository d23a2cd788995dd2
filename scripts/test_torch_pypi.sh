#!/usr/bin/env bash
# The torch test suite against the newest torch on PyPI, installed the way a user installs it: a fresh venv
# with nothing but pip's torch (pinned here) and what the tests import, then the README's `pip install ./python`,
# then every tests/torch suite against the installed package (not the build tree). The dev preset
# (scripts/test.sh) runs the same suites against Debian's torch 1.13, the oldest supported.
#
#   bash scripts/test_torch_pypi.sh              # COMMSGD_TORCH_VERSION=2.15.0 by default
#   bash scripts/test_torch_pypi.sh --prepare    # only the venv and its downloads (CI runs it during a build)
#   bash scripts/test_torch_pypi.sh --install    # the venv and pip install ./python, no tests
#   bash scripts/test_torch_pypi.sh --tests      # only the tests, against what --install installed
#
# COMMSGD_TORCHFT_VERSION pins torchft (default 0.2.0). COMMSGD_TORCH_VENV names the venv (default build/torch-<version>; kept, so a rerun skips the download).
# COMMSGD_TORCH_JOBS: how many suites run at once (default 3: their ranks spend much of their time waiting on
# each other's sockets, their deadlines and emulated links, so three keep two cores busier than two do).
# CMAKE_ARGS, CUDAARCHS and CMAKE_BUILD_PARALLEL_LEVEL reach the package's CMake as usual.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
version=${COMMSGD_TORCH_VERSION:-2.15.0}
venv=${COMMSGD_TORCH_VENV:-build/torch-$version}
python=$venv/bin/python
# No pip cache: the venv is kept for reruns, and a second copy of torch's 4 GB of wheels in the cache is what
# fills a small disk.
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_NO_CACHE_DIR=1
mode=${1:-}
case "$mode" in "" | --prepare | --install | --tests) ;; *)
  echo "test_torch_pypi: unknown argument '$mode' (expected --prepare, --install, --tests or nothing)" >&2
  exit 2 ;;
esac
prepare() {
  [ -x "$python" ] || /usr/bin/python3 -m venv "$venv"
  # torchft: the peer whose DiLoCo arm tests/torch/test_diloco_lm.py runs beside ours (it needs torch 2).
  "$python" -m pip install -q "torch==$version" numpy pytest "torchft==${COMMSGD_TORCHFT_VERSION:-0.2.0}"
}
install() {
  "$python" -m pip install -q ./python
}
tests() {
  # No PYTHONPATH: the suites import the package pip installed, and every_state.py checks they do.
  export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
  env -u PYTHONPATH "$python" tests/torch/every_state.py --expect-prefix "$venv"
  # A suite whose every test skipped fails unless this names the reason (tests/torch/run_pytest.py).
  if [ -z "${COMMSGD_ALLOW_SKIP+set}" ]; then
    COMMSGD_ALLOW_SKIP=$(env -u PYTHONPATH "$python" tests/torch/run_pytest.py --machine-skips)
    export COMMSGD_ALLOW_SKIP
    echo "test_torch_pypi: suites may skip whole for: ${COMMSGD_ALLOW_SKIP:-nothing} (COMMSGD_ALLOW_SKIP)"
  fi
  env -u PYTHONPATH "$python" tests/torch/run_pytest.py --all --jobs "${COMMSGD_TORCH_JOBS:-3}" -q --durations=5
}
timed() {
  local t0=$SECONDS
  "$1"
  echo "torch $version: $2 $((SECONDS - t0)) s"
}
case "$mode" in
  --prepare) timed prepare "venv and torch" ;;
  --install) timed prepare "venv and torch" && timed install "pip install ./python" ;;
  --tests) timed tests "tests" ;;
  "") timed prepare "venv and torch" && timed install "pip install ./python" && timed tests "tests" ;;
esac
