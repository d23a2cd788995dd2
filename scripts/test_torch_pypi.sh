#!/usr/bin/env bash
# The torch test suite against the newest torch on PyPI, installed the way a user installs it: a fresh venv
# with nothing but pip's torch (pinned here) and what the tests import, then the README's `pip install ./python`,
# then every tests/torch suite against the installed package (not the build tree). The dev preset
# (scripts/test.sh) runs the same suites against Debian's torch 1.13, the oldest supported.
#
#   bash scripts/test_torch_pypi.sh            # COMMSGD_TORCH_VERSION=2.15.0 by default
#
# COMMSGD_TORCH_VENV names the venv (default build/torch-<version>; kept, so a rerun skips the download).
# CMAKE_ARGS, CUDAARCHS and CMAKE_BUILD_PARALLEL_LEVEL reach the package's CMake as usual.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
version=${COMMSGD_TORCH_VERSION:-2.15.0}
venv=${COMMSGD_TORCH_VENV:-build/torch-$version}
python=$venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
start=$(date +%s)
if [ ! -x "$python" ]; then
  /usr/bin/python3 -m venv "$venv"
fi
"$python" -m pip install -q "torch==$version" numpy pytest
installed=$(date +%s)
"$python" -m pip install -q ./python
built=$(date +%s)
echo "torch $version: venv and torch $((installed - start)) s, pip install ./python $((built - installed)) s"
# No PYTHONPATH: the suites import the package pip just installed.
env -u PYTHONPATH OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 "$python" tests/torch/run_pytest.py --all -q
echo "torch $version: suites $(($(date +%s) - built)) s"
