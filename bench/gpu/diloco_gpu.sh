#!/usr/bin/env bash
# DiLoCo on a GPU machine, one call: the device round's test shard and benchmark (with the torch-ops
# comparator), commsgd_torch built against the machine's torch and its CUDA tests (the torch class's device
# round against the host engine, bit for bit), and examples/diloco_lm/gpu_replicas.py's arms at equal steps,
# all four at once on the one GPU, beside the tests. Programs from `bash bench/gpu/run.sh --build-only`
# (build/gpu-bin), as run.sh uses them.
#   bench/gpu/diloco_gpu.sh            (TRAIN_LIMIT seconds for the arms, default 280; SKIP_TRAIN=1)
# Writes bench/results/diloco-round-gpu-<date>.md and diloco-gpu-replicas-<date>/ (one JSON-lines log per arm),
# and, with OUT set, $OUT/diloco-gpu.tgz (both, with every log) and the logs themselves.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${PREBUILT_DIR:-$root/build/gpu-bin}"
date="$(date +%Y-%m-%d)"
work="$root/build/diloco-gpu"
results="$root/bench/results"
arms_dir="$results/diloco-gpu-replicas-$date"
mkdir -p "$work" "$arms_dir"
logs="${OUT:-$work}"
export PYTHONUNBUFFERED=1
start=$SECONDS
cuda_lib="$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/lib64"
export LD_LIBRARY_PATH="$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
device="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
echo "device: ${device:-unknown GPU}; date: $date"

# The package, against the machine's torch (the CPU's work), while the device round is tested and timed.
bash "$root/bench/gpu/torch_cuda_test.sh" --build-only "$work/torch" >"$logs/torch_build.log" 2>&1 &
build_pid=$!
timeout 120 "$bin/cuda_select_test" --source-file='*/diloco_round_test.cu' --duration=true \
  >"$logs/diloco_round_test.log" 2>&1
round_test=$?
grep -E "test cases|FAILED|ERROR" "$logs/diloco_round_test.log" | tail -5
timeout 90 "$bin/gpu_bench" diloco_round --out "$work/diloco_round_gpu" >"$logs/diloco_round_bench.log" 2>&1
round_bench=$?
wait $build_pid
build=$?
echo "device round test: exit $round_test; bench: exit $round_bench; package build: exit $build ($((SECONDS - start)) s)"
tail -3 "$logs/torch_build.log"
if ((build == 0)); then
  timeout 120 python3 "$root/bench/gpu/diloco_round_torch.py" --ours "$work/diloco_round_gpu.csv" \
    --out "$work/diloco_round_torch.md" >>"$logs/diloco_round_bench.log" 2>&1 || echo "torch-ops comparator failed"
fi
{
  echo "# DiLoCo's round on device parameters, ${device:-unknown GPU}, $date"
  echo
  echo "\`bench/gpu/diloco_gpu.sh\` (diloco_round_gpu_bench, then diloco_round_torch.py on its sizes)."
  echo
  cat "$work/diloco_round_gpu.md" 2>/dev/null
  echo
  cat "$work/diloco_round_torch.md" 2>/dev/null
} >"$results/diloco-round-gpu-$date.md"

# The arms at equal steps, all at once, and the package's CUDA tests beside them.
arm_pids=()
if ((build == 0)) && [[ "${SKIP_TRAIN:-0}" != 1 ]]; then
  arm() { # arm NAME CODE OUTER_LR OUTER_MOMENTUM
    OMP_NUM_THREADS=2 PYTHONPATH="$work/torch/python" timeout "${TRAIN_LIMIT:-280}" python3 "$root/examples/diloco_lm/gpu_replicas.py" \
      --code "$2" --outer-lr "$3" --outer-momentum "$4" --log "$arms_dir/$1.jsonl" >"$work/arm-$1.log" 2>&1 &
    arm_pids+=($!)
  }
  arm float32 dense 0.7 0.9
  arm topk-1pct-senders topk-0.01-c4096-2bit-b0.95-senders 1.0 0.0
  arm topk-3pct-senders topk-0.03-c4096-2bit-b0.95-senders 1.0 0.0
  arm sparseloco topk-0.01-c4096-2bit-b0.95 1.0 0.0
fi
tests=skipped
if ((build == 0)); then
  # DiLoCo's CUDA tests first, each failing alone after 150 s where pytest-timeout is installed (a rank that
  # hangs prints its stack every minute), then the rest of test_cuda.py.
  per_test=()
  python3 -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout=150)
  (cd "$root/tests/torch" && rc=0 && for k in "diloco or device_round" "not (diloco or device_round)"; do
    PYTHONPATH="$work/torch/python" PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 \
      timeout "${TORCH_TEST_LIMIT:-300}" python3 -m pytest -v -rs -p no:cacheprovider --durations=0 \
      "${per_test[@]}" -k "$k" test_cuda.py || rc=$?
  done && exit $rc) >"$logs/torch_cuda_tests.log" 2>&1
  tests=$?
  grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$logs/torch_cuda_tests.log" | tail -30
fi
arms=0
for p in "${arm_pids[@]}"; do wait "$p" || arms=$?; done
for f in "$arms_dir"/*.jsonl; do
  [[ -f "$f" ]] && echo "$(basename "$f" .jsonl): $(tail -1 "$f")"
done
for f in "$work"/arm-*.log; do
  [[ -f "$f" ]] && grep -qE "Error|Traceback|refused|differs" "$f" && { echo "--- $f"; tail -15 "$f"; }
done
if [[ -n "${OUT:-}" ]]; then
  (cd "$root" && tar -czf "$OUT/diloco-gpu.tgz" "bench/results/diloco-round-gpu-$date.md" \
    "bench/results/diloco-gpu-replicas-$date" -C "$work" diloco_round_gpu.md diloco_round_gpu.csv \
    diloco_round_torch.md arm-float32.log arm-topk-1pct-senders.log arm-topk-3pct-senders.log arm-sparseloco.log \
    2>/dev/null)
fi
echo "round test: $round_test, round bench: $round_bench, package build: $build, torch CUDA tests: $tests," \
  "arms: $arms; $((SECONDS - start)) s"
cat "$results/diloco-round-gpu-$date.md"
[[ $round_test == 0 && $round_bench == 0 && $build == 0 && $tests == 0 && $arms == 0 ]]
