#!/usr/bin/env bash
# On a GPU machine: build (Release, sm_90), run the CUDA tests, benchmark every CUDA selector against
# torch.topk, a CUB sort and a copy, and write bench/results/select-gpu-<date>.md.
#   bench/gpu/run.sh [--quick]     (--quick: 2^20 and 2^24 only, 5 repetitions)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build/gpu-bench}"
quick=()
[[ "${1:-}" == "--quick" ]] && quick=(--quick)
date="$(date +%Y-%m-%d)"
work="$build/results"
mkdir -p "$work" "$root/bench/results"

device="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "device: $device"

# Only the CUDA parts: a GPU machine need not have MPI, Google Benchmark or LibTorch's C++ package (doctest is
# found through CMAKE_PREFIX_PATH where it is not installed).
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCOMMSGD_ENABLE_CUDA=ON -DCOMMSGD_ENABLE_MPI=OFF -DCOMMSGD_ENABLE_TORCH=OFF -DCOMMSGD_BUILD_EXAMPLES=OFF \
  -DCOMMSGD_BUILD_BENCHMARKS=OFF
cmake --build "$build" -j"$(nproc)" --target cuda_select_test select_gpu_bench sequence_gpu_bench

# A failing test does not stop the benchmark (its counts are checked too); the exit status reports both.
gpu_status=0
test_status=0
(cd "$build" && ctest -L cuda --output-on-failure) || test_status=$?
"$build/tests/cuda/bench_gpu/select_gpu_bench" --out "$work/select_gpu" "${quick[@]}" || gpu_status=$?
python3 "$root/bench/gpu/torch_topk.py" --out "$work/torch_topk.json" "${quick[@]}" ||
  echo "torch_topk.py failed: the report will have no torch.topk column"
python3 "$root/bench/gpu/report.py" "$work/select_gpu.json" "$work/torch_topk.json" \
  "$root/bench/results/select-gpu-$date.md" --device "$device"
cp "$work/select_gpu.json" "$root/bench/results/select-gpu-$date.json"
cp "$work/select_gpu.csv" "$root/bench/results/select-gpu-$date.csv"
[[ -f "$work/torch_topk.json" ]] && cp "$work/torch_topk.json" "$root/bench/results/select-gpu-$date-torch.json"
# Consecutive error-feedback accumulators: a synthetic sequence made here by exact error feedback (2^24 and
# 2^26 unless --quick), plus any dump folders named in SEQUENCE_DIRS (the trainer's --dump-accumulators).
# The sequence benchmark is built again with the CCCL headers in CCCL_INCLUDE, where given, for the
# cub::DeviceTopK column (CCCL 3.3 and later).
seq_status=0
seq_root="$build/sequences"
seq_dirs=()
for lg in $([[ ${#quick[@]} -gt 0 ]] && echo 24 || echo 24 26); do
  python3 "$root/bench/gpu/sequence.py" make --out "$seq_root/ef-relu-2^$lg" --log-n "$lg" --steps 8 &&
    seq_dirs+=("$seq_root/ef-relu-2^$lg")
done
for d in ${SEQUENCE_DIRS:-}; do seq_dirs+=("$d"); done
seq_bench="$build/tests/cuda/bench_gpu/sequence_gpu_bench"
if [[ -n "${CCCL_INCLUDE:-}" ]]; then
  nvcc -std=c++20 --expt-relaxed-constexpr -O3 -arch=sm_90 -I "$CCCL_INCLUDE" -I "$root/include" \
    "$root/bench/gpu/sequence_gpu_bench.cu" -o "$build/sequence_gpu_bench_cccl" &&
    seq_bench="$build/sequence_gpu_bench_cccl"
fi
"$seq_bench" --out "$work/sequence_gpu" "${seq_dirs[@]}" || seq_status=$?
python3 "$root/bench/gpu/sequence.py" time --out "$work/sequence_torch.json" "${seq_dirs[@]}" ||
  echo "sequence.py time failed: the report will have no torch.topk row"
python3 "$root/bench/gpu/report_sequence.py" "$work/sequence_gpu.json" "$work/sequence_torch.json" \
  "$root/bench/results/select-gpu-sequence-$date.md" --device "$device"
cp "$work/sequence_gpu.json" "$root/bench/results/select-gpu-sequence-$date.json"
[[ -f "$work/sequence_torch.json" ]] && cp "$work/sequence_torch.json" "$root/bench/results/select-gpu-sequence-$date-torch.json"
[[ $seq_status -ne 0 ]] && gpu_status=$seq_status

echo "tests: exit $test_status, benchmark: exit $gpu_status"
exit $((test_status != 0 || gpu_status != 0))
