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

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCOMMSGD_ENABLE_CUDA=ON -DCOMMSGD_ENABLE_MPI=OFF -DCOMMSGD_BUILD_EXAMPLES=OFF
cmake --build "$build" -j"$(nproc)" --target cuda_select_test select_gpu_bench
(cd "$build" && ctest -L cuda --output-on-failure)

gpu_status=0
"$build/tests/cuda/bench_gpu/select_gpu_bench" --out "$work/select_gpu" "${quick[@]}" || gpu_status=$?
python3 "$root/bench/gpu/torch_topk.py" --out "$work/torch_topk.json" "${quick[@]}" ||
  echo "torch_topk.py failed: the report will have no torch.topk column"
python3 "$root/bench/gpu/report.py" "$work/select_gpu.json" "$work/torch_topk.json" \
  "$root/bench/results/select-gpu-$date.md" --device "$device"
cp "$work/select_gpu.json" "$root/bench/results/select-gpu-$date.json"
cp "$work/select_gpu.csv" "$root/bench/results/select-gpu-$date.csv"
[[ -f "$work/torch_topk.json" ]] && cp "$work/torch_topk.json" "$root/bench/results/select-gpu-$date-torch.json"
exit "$gpu_status"
