#!/usr/bin/env bash
# TopKState's CUDA buckets on a GPU machine: builds commsgd_torch (_C and _cuda) for the python3 that has
# torch with CUDA and pybind11, then runs tests/torch/test_cuda.py; the output also goes to
# $OUT/torch_cuda.log when OUT is set.
#
#   bench/gpu/torch_cuda_test.sh [--build-only | --test-only] [BUILD_DIR]   (default: a fresh temporary directory)
#
# CMake on the repository, as the pip backend does, but only the two targets the tests import and one GPU
# architecture (CUDAARCHS, default 90: Hopper), so a 16-core machine is done in a few minutes. torch's CMake
# files see the same architecture (TORCH_CUDA_ARCH_LIST) instead of probing for one. run.sh builds while the
# CUDA tests run (--build-only), then tests (--test-only).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=$(command -v "${PYTHON:-python3}")
phase=all
case "${1:-}" in
  --build-only) phase=build; shift ;;
  --test-only) phase=test; shift ;;
esac
build=${1:-$(mktemp -d)}
log=/dev/null
[ -n "${OUT:-}" ] && log=$OUT/torch_cuda.log
export CUDAARCHS=${CUDAARCHS:-90}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$(echo "$CUDAARCHS" | sed 's/\([0-9]\)\([0-9]\)$/\1.\2/')}
{
  if [ "$phase" != test ]; then
    echo "== $("$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())')"
    prefix=$("$py" -c 'import torch.utils, pybind11; print(torch.utils.cmake_prefix_path + ";" + pybind11.get_cmake_dir())')
    generator=()
    command -v ninja > /dev/null && generator=(-G Ninja)
    cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
      -DCOMMSGD_TORCH_PYTHON="$py" -DCOMMSGD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDAARCHS" \
      -DCOMMSGD_BUILD_TESTS=OFF -DCOMMSGD_BUILD_BENCHMARKS=OFF -DCOMMSGD_BUILD_EXAMPLES=OFF \
      -DCOMMSGD_INSTALL=OFF -DCOMMSGD_ENABLE_MPI=OFF
    cmake --build "$build" --target commsgd_torch_ext commsgd_torch_cuda -j "$(nproc)"
  fi
  if [ "$phase" != build ]; then
    cd "$root/tests/torch"
    PYTHONPATH="$build/python" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 \
      timeout "${TORCH_TEST_LIMIT:-400}" "$py" -m pytest -v -rs -p no:cacheprovider --durations=5 test_cuda.py
  fi
} 2>&1 | tee -a "$log"
