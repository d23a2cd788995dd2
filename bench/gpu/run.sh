#!/usr/bin/env bash
# On a GPU machine, one call: build (Release, sm_90, the CUDA targets only), run the CUDA tests, the
# steady-state step and batched benchmarks, the selection benchmarks with their like-for-like anchors
# (cub::DeviceTopK pairs where a CCCL >= 3.3 is found, torch.topk), the Nsight Compute profile, and write
# dated tables into bench/results/:
#   step-gpu-<date>.md, batched-gpu-<date>.md, diloco-round-gpu-<date>.md, profile-gpu-<date>.md, select-gpu-<date>.md,
#   select-gpu-sequence-<date>.md  (+ the raw .json / .csv beside them)
# With OUT set, also $OUT/results.tgz (every table, JSON, CSV and log), the tables themselves and $OUT/run.log.
#   bench/gpu/run.sh [--quick]    (--quick: 2^24 and smaller, fewer steps and repetitions)
#   bench/gpu/run.sh --build-only (on any machine with nvcc: builds the programs into build/gpu-bin, which a
#                                  later run.sh on the GPU machine uses instead of building; carry that folder)
# It also builds commsgd_torch against the machine's torch while the CUDA tests run, then runs the torch CUDA
# tests (tests/torch/test_cuda.py) before the benchmarks (SKIP_TORCH=1 leaves them out).
# Environment: BUILD_DIR, CCCL_INCLUDE (a CCCL include folder with cub/device/device_topk.cuh), SEQUENCE_DIRS
# (extra accumulator dumps), SKIP_TESTS=1, SKIP_PROFILE=1, SKIP_TORCH=1, CTEST_LIMIT (seconds per test shard,
# default 240), RUN_BUDGET.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build/gpu-bench}"
prebuilt="${PREBUILT_DIR:-$root/build/gpu-bin}"
quick=()
build_only=0
[[ "${1:-}" == "--quick" ]] && quick=(--quick)
[[ "${1:-}" == "--build-only" ]] && build_only=1
date="$(date +%Y-%m-%d)"
work="$build/results"
results="$root/bench/results"
mkdir -p "$work" "$results"
if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  exec > >(tee "$OUT/run.log") 2>&1
fi
start=$SECONDS
declare -a summary
stage() { # stage NAME STATUS SECONDS_AT_START
  summary+=("$(printf '%-22s %-28s %4ds' "$1" "$2" $((SECONDS - $3)))")
}
export PYTHONUNBUFFERED=1

device="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
device="${device:-unknown GPU}"
echo "device: $device; date: $date; ${quick[*]:-full run}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null || true

# --- commsgd_torch against the machine's torch, on the CPU while the CUDA tests use the GPU.
torch_build="$build/torch"
torch_pid=""
if [[ $build_only -eq 0 && "${SKIP_TORCH:-0}" != 1 ]] && python3 -c 'import torch, pybind11' 2>/dev/null; then
  OUT= bash "$root/bench/gpu/torch_cuda_test.sh" --build-only "$torch_build" >"$work/torch_build.log" 2>&1 &
  torch_pid=$!
  torch_t=$SECONDS
fi

# --- A CCCL with cub::DeviceTopK (3.3 or later), for the DeviceTopK anchors: CCCL_INCLUDE, else one carried in
# .carry/cccl, else cupy's bundled copy, else a pip cuda-cccl, else any device_topk.cuh on the disk. Prints
# what it used.
cccl_flags=""
cccl_from=""
cccl_flags_for() { # a folder -> its -I flags, or nothing when it holds no DeviceTopK
  local d="$1"
  if [[ -f "$d/cub/device/device_topk.cuh" && -d "$d/cuda/std" ]]; then
    echo "-I$d"
  elif [[ -f "$d/cub/cub/device/device_topk.cuh" && -d "$d/libcudacxx/include" ]]; then
    echo "-I$d/cub -I$d/thrust -I$d/libcudacxx/include"
  elif [[ -f "$d/cub/device/device_topk.cuh" && -d "$d/../libcudacxx/include" ]]; then
    echo "-I$d -I$d/../thrust -I$d/../libcudacxx/include"
  fi
}
find_cccl() {
  local cands=()
  [[ -n "${CCCL_INCLUDE:-}" ]] && cands+=("$CCCL_INCLUDE")
  cands+=("$root/.carry/cccl/include" "$root/.carry/cccl") # a copy carried beside the checkout, if any
  local py
  py="$(python3 - 2>/dev/null <<'PY'
import glob, os, site, sys
roots = list(dict.fromkeys(site.getsitepackages() + [site.getusersitepackages()] + sys.path))
for r in roots:
    for pat in ("cupy/_core/include/cupy/_cccl", "cuda/cccl/headers/include", "nvidia/cuda_cccl/include",
                "nvidia/cu13/include", "nvidia/cu13/include/cccl"):
        for d in glob.glob(os.path.join(r, pat)):
            print(d)
PY
)"
  while IFS= read -r d; do [[ -n "$d" ]] && cands+=("$d"); done <<<"$py"
  while IFS= read -r f; do
    [[ -n "$f" ]] && cands+=("$(dirname "$(dirname "$(dirname "$f")")")")
  done < <(timeout 60 find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o \
    -name device_topk.cuh -path '*cub/device/*' -print 2>/dev/null | head -20)
  for d in "${cands[@]}"; do
    local f
    f="$(cccl_flags_for "$d")"
    if [[ -n "$f" ]]; then
      echo "$d|$f"
    fi
  done
}
t=$SECONDS
use_prebuilt=0
[[ $build_only -eq 0 && -f "$prebuilt/cuda_select_test" && -f "$prebuilt/gpu_bench" ]] && use_prebuilt=1
cccl_cands=()
[[ $use_prebuilt -eq 0 ]] && mapfile -t cccl_cands < <(find_cccl)
echo "CCCL with DeviceTopK: ${#cccl_cands[@]} candidate(s)"
for c in "${cccl_cands[@]}"; do
  d="${c%%|*}"
  v="$(grep -hs '#define CCCL_VERSION ' "$d"/cuda/std/__cccl/version.h "$d"/libcudacxx/include/cuda/std/__cccl/version.h \
    "$d"/../libcudacxx/include/cuda/std/__cccl/version.h | awk '{print $3}' | head -1)"
  echo "  $d (CCCL_VERSION ${v:-?})"
done
stage "find CCCL" "${#cccl_cands[@]} candidate(s)" $t

# --- Build: the CUDA targets only, in parallel; the DeviceTopK variants (plain nvcc, the CCCL first on the
# include path) beside it, trying each CCCL candidate until one compiles.
bin="$build/tests/cuda/bench_gpu"
test_bin="$build/tests/cuda/cuda_select_test"
programs=(gpu_bench)
if [[ $use_prebuilt -eq 1 ]]; then
  # Built by `run.sh --build-only` with the same nvcc, carried here: no build on the lent machine.
  echo "using the programs built beforehand in $prebuilt: $(cat "$prebuilt/built" 2>/dev/null)"
  bin="$prebuilt"
  test_bin="$prebuilt/cuda_select_test"
  # They load the CUDA runtime of the machine's toolkit (the same major version as the nvcc that built them).
  cuda_lib="$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/lib64"
  export LD_LIBRARY_PATH="$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  build_status=0
  [[ -f "$prebuilt/cccl_used" ]] && cp "$prebuilt/cccl_used" "$build/cccl_used" &&
    cp "$prebuilt"/*_cccl "$build/" 2>/dev/null
  stage "build" "built beforehand" $SECONDS
else
t=$SECONDS
static_runtime="-Xcompiler=-static-libstdc++,-static-libgcc"
rm -f "$build/cccl_used" "$build/select_gpu_bench_cccl" "$build/sequence_gpu_bench_cccl"
(
  for c in "${cccl_cands[@]}"; do
    d="${c%%|*}"
    f="${c#*|}"
    # shellcheck disable=SC2086
    if nvcc -std=c++20 --expt-relaxed-constexpr -O3 -arch=sm_90 $f -I "$root/include" $static_runtime \
      "$root/bench/gpu/select_gpu_bench.cu" -o "$build/select_gpu_bench_cccl" >"$build/cccl_build.log" 2>&1 &&
      nvcc -std=c++20 --expt-relaxed-constexpr -O3 -arch=sm_90 $f -I "$root/include" $static_runtime \
        "$root/bench/gpu/sequence_gpu_bench.cu" -o "$build/sequence_gpu_bench_cccl" >>"$build/cccl_build.log" 2>&1; then
      v="$(grep -hs '#define CCCL_VERSION ' "$d"/cuda/std/__cccl/version.h | awk '{print $3}' | head -1)"
      echo "$(basename "$d") (CCCL_VERSION ${v:-?})" >"$build/cccl_used"
      exit 0
    fi
    echo "CCCL at $d did not build (see $build/cccl_build.log)"
  done
  exit 1
) &
cccl_pid=$!
build_status=0
# The C++ runtime linked in, so that programs built by --build-only run on a machine with another one.
static_link="-static-libstdc++ -static-libgcc"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCOMMSGD_ENABLE_CUDA=ON -DCOMMSGD_ENABLE_MPI=OFF -DCOMMSGD_ENABLE_TORCH=OFF -DCOMMSGD_BUILD_EXAMPLES=OFF \
  -DCOMMSGD_BUILD_BENCHMARKS=OFF -DCMAKE_EXE_LINKER_FLAGS="$static_link" >"$build/configure.log" 2>&1 || { build_status=$?; tail -20 "$build/configure.log"; }
targets=(gpu_bench)
[[ "${SKIP_TESTS:-0}" != 1 ]] && targets=(cuda_select_test "${targets[@]}")
[[ $build_status -eq 0 ]] && { cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" || build_status=$?; }
stage "build" "exit $build_status" $t
t=$SECONDS
wait $cccl_pid
if [[ -f "$build/cccl_used" ]]; then
  echo "DeviceTopK anchors: built with $(cat "$build/cccl_used")"
  stage "build with CCCL" "$(cut -d' ' -f1 "$build/cccl_used")" $t
else
  echo "DeviceTopK anchors: no CCCL >= 3.3 found or none built: no cub::DeviceTopK rows"
  stage "build with CCCL" "none" $t
fi
fi
if [[ $build_status -ne 0 ]]; then
  echo "build failed: nothing to run"
  exit 1
fi
if [[ $build_only -eq 1 ]]; then
  rm -rf "$prebuilt" && mkdir -p "$prebuilt"
  cp "$test_bin" "$prebuilt/"
  for p in "${programs[@]}"; do cp "$bin/$p" "$prebuilt/"; done
  [[ -f "$build/cccl_used" ]] && cp "$build/cccl_used" "$build"/*_cccl "$prebuilt/"
  strip "$prebuilt"/* 2>/dev/null
  echo "nvcc $(nvcc --version | grep -o 'release [0-9.]*'), $(git -C "$root" rev-parse --short HEAD 2>/dev/null)" >"$prebuilt/built"
  ls -la "$prebuilt"
  exit 0
fi

# --- CUDA tests, and the torch CUDA tests beside them once their build is done (both only check results, so
# they may share the GPU). A failing test does not stop the benchmarks (their results are checked too).
test_status=skipped
shard_pids=()
shards=(select_test top_k_test batched_top_k_test diloco_round_test)
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  tests_t=$SECONDS
  # ctest -L cuda runs this one program; here its four test files run as four processes side by side
  # (the host references of one overlap the kernels of another), each with its own time limit.
  for f in "${shards[@]}"; do
    timeout "${CTEST_LIMIT:-240}" "$test_bin" --source-file="*/$f.cu" --duration=true >"$work/test_$f.log" 2>&1 &
    shard_pids+=($!)
  done
fi
torch_status=skipped
if [[ -n "$torch_pid" ]]; then
  wait "$torch_pid"
  torch_status=$?
  stage "torch build" "exit $torch_status" $torch_t
  tail -3 "$work/torch_build.log"
  if [[ $torch_status -eq 0 ]]; then
    t=$SECONDS
    OUT= TORCH_TEST_LIMIT="${TORCH_TEST_LIMIT:-240}" bash "$root/bench/gpu/torch_cuda_test.sh" --test-only "$torch_build" \
      >"$work/torch_test.log" 2>&1
    torch_status=$?
    grep -E 'PASSED|FAILED|SKIPPED|ERROR|passed|failed' "$work/torch_test.log" | tail -25
    stage "torch CUDA tests" "exit $torch_status" $t
  else
    tail -30 "$work/torch_build.log"
  fi
fi
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  test_status=0
  for i in "${!shard_pids[@]}"; do
    wait "${shard_pids[$i]}" || test_status=$?
  done
  for f in "${shards[@]}"; do
    echo "--- $f: $(grep -E 'test cases:' "$work/test_$f.log" | tail -1)"
    # A filter that matched nothing would pass with no test run.
    grep -qE 'test cases: *[1-9]' "$work/test_$f.log" || { echo "--- $f: no test case ran"; test_status=1; }
    grep -E 'ERROR|FAILED|failed|skipped' "$work/test_$f.log" | head -20
  done
  cat "$work"/test_*.log >"$work/ctest.log"
  stage "CUDA tests" "exit $test_status" $tests_t
fi

bench_status=0
run_stage() { # run_stage NAME LIMIT_SECONDS COMMAND...
  local name="$1" limit="$2" t0=$SECONDS rc left
  shift 2
  # Within the run's budget (RUN_BUDGET seconds from the start): a stage gets what is left, none under 15 s.
  left=$((${RUN_BUDGET:-480} - (SECONDS - start)))
  ((left < limit)) && limit=$left
  if ((limit < 15)); then
    echo "=== $name: skipped, $((SECONDS - start)) s into the run"
    bench_status=1
    stage "$name" "skipped (budget)" $t0
    return 1
  fi
  echo "=== $name (limit $limit s)"
  timeout "$limit" "$@"
  rc=$?
  [[ $rc -ne 0 ]] && bench_status=1
  stage "$name" "exit $rc" $t0
  return $rc
}

# --- The step in steady state on raw gradients, and ResNet-50's tensors batched.
run_stage "step_gpu_bench" 120 "$bin/gpu_bench" step --out "$work/step_gpu" "${quick[@]}"
run_stage "batched_gpu_bench" 120 "$bin/gpu_bench" batched --out "$work/batched_gpu" "${quick[@]}"
# --- DiLoCo's round on device parameters against its memory floor, then the same rounds as torch ops.
if run_stage "diloco_round_gpu_bench" 90 "$bin/gpu_bench" diloco_round --out "$work/diloco_round_gpu" "${quick[@]}"; then
  run_stage "diloco_round_torch.py" 120 python3 "$root/bench/gpu/diloco_round_torch.py" \
    --ours "$work/diloco_round_gpu.csv" --out "$work/diloco_round_torch.md" ||
    echo "diloco_round_torch.py failed: the table will have no torch rows"
fi
{
  echo "# DiLoCo's round on device parameters, $device, $date"
  echo
  echo "\`bench/gpu/run.sh\` (diloco_round_gpu_bench, then diloco_round_torch.py on its sizes)."
  echo
  cat "$work/diloco_round_gpu.md" 2>/dev/null
  echo
  cat "$work/diloco_round_torch.md" 2>/dev/null
} >"$results/diloco-round-gpu-$date.md"
# --- torch.topk anchors: the selection cases and the ResNet-50 loop, one python process.
run_stage "torch_topk.py" 150 python3 "$root/bench/gpu/torch_topk.py" --out "$work/torch_topk.json" \
  --resnet-out "$work/batched_torch.json" "${quick[@]}" ||
  echo "torch_topk.py failed: the reports will have no torch.topk rows"
python3 "$root/bench/gpu/report_step.py" step "$work/step_gpu.json" "$results/step-gpu-$date.md" \
  --device "$device" --date "$date" >/dev/null || bench_status=1
python3 "$root/bench/gpu/report_step.py" batched "$work/batched_gpu.json" "$work/batched_torch.json" \
  "$results/batched-gpu-$date.md" --device "$device" --date "$date" >/dev/null || bench_status=1
cp "$work/step_gpu.json" "$results/step-gpu-$date.json" 2>/dev/null
cp "$work/batched_gpu.json" "$results/batched-gpu-$date.json" 2>/dev/null
cp "$work/batched_torch.json" "$results/batched-gpu-$date-torch.json" 2>/dev/null

# --- DRAM bytes per kernel, counted by Nsight Compute.
if [[ "${SKIP_PROFILE:-0}" != 1 ]]; then
  run_stage "profile.sh" 200 env BUILD_DIR="$build" BENCH_BIN="$bin" DEVICE_NAME="$device" \
    PROFILE_LOG_N="$([[ ${#quick[@]} -gt 0 ]] && echo 24 || echo 26)" \
    bash "$root/bench/gpu/profile.sh" "$results/profile-gpu-$date.md" 3 >"$work/profile.log" 2>&1
  tail -12 "$work/profile.log"
fi

# --- Threshold selection on i.i.d. buffers, with the like-for-like anchors.
select_bench=("$bin/gpu_bench" select)
[[ -x "$build/select_gpu_bench_cccl" ]] && select_bench=("$build/select_gpu_bench_cccl")
run_stage "select_gpu_bench" 150 "${select_bench[@]}" --out "$work/select_gpu" "${quick[@]}"
python3 "$root/bench/gpu/report.py" "$work/select_gpu.json" "$work/torch_topk.json" \
  "$results/select-gpu-$date.md" --device "$device" --date "$date" || bench_status=1
cp "$work/select_gpu.json" "$results/select-gpu-$date.json" 2>/dev/null
cp "$work/select_gpu.csv" "$results/select-gpu-$date.csv" 2>/dev/null
cp "$work/torch_topk.json" "$results/select-gpu-$date-torch.json" 2>/dev/null

# --- Consecutive error-feedback accumulators (sequence.py make; 2^24 and 2^26 unless --quick), plus any
# dump folders named in SEQUENCE_DIRS (the trainer's --dump-accumulators). The least needed part: only 2^24
# when the run is already past RUN_BUDGET - 150 s, none past RUN_BUDGET - 60 s (RUN_BUDGET: 480).
t=$SECONDS
budget="${RUN_BUDGET:-480}"
seq_sizes="$([[ ${#quick[@]} -gt 0 ]] && echo 24 || echo 24 26)"
if ((SECONDS - start > budget - 60)); then
  seq_sizes=""
  echo "sequence part skipped: $((SECONDS - start)) s into the run"
elif ((SECONDS - start > budget - 150)); then
  seq_sizes=24
  echo "sequence part at 2^24 only: $((SECONDS - start)) s into the run"
fi
seq_root="$build/sequences"
seq_dirs=()
for lg in $seq_sizes; do
  timeout 120 python3 "$root/bench/gpu/sequence.py" make --out "$seq_root/ef-relu-2^$lg" --log-n "$lg" --steps 8 &&
    seq_dirs+=("$seq_root/ef-relu-2^$lg")
done
stage "sequence.py make" "${#seq_dirs[@]} sequence(s)" $t
for d in ${SEQUENCE_DIRS:-}; do seq_dirs+=("$d"); done
if [[ ${#seq_dirs[@]} -gt 0 ]]; then
  seq_bench=("$bin/gpu_bench" sequence)
  [[ -x "$build/sequence_gpu_bench_cccl" ]] && seq_bench=("$build/sequence_gpu_bench_cccl")
  run_stage "sequence_gpu_bench" 150 "${seq_bench[@]}" --out "$work/sequence_gpu" "${seq_dirs[@]}"
  run_stage "sequence.py time" 90 python3 "$root/bench/gpu/sequence.py" time --out "$work/sequence_torch.json" \
    "${seq_dirs[@]}" || echo "sequence.py time failed: the report will have no torch.topk row"
  python3 "$root/bench/gpu/report_sequence.py" "$work/sequence_gpu.json" "$work/sequence_torch.json" \
    "$results/select-gpu-sequence-$date.md" --device "$device" >/dev/null || bench_status=1
  cp "$work/sequence_gpu.json" "$results/select-gpu-sequence-$date.json" 2>/dev/null
  cp "$work/sequence_torch.json" "$results/select-gpu-sequence-$date-torch.json" 2>/dev/null
fi

# --- Everything back through $OUT: one archive, the tables beside it (at most 8 files in all).
if [[ -n "${OUT:-}" ]]; then
  (cd "$root" && tar -czf "$OUT/results.tgz" bench/results/*-"$date"* -C "$build" results cccl_build.log \
    configure.log cccl_used profile 2>/dev/null)
  for f in step-gpu batched-gpu diloco-round-gpu profile-gpu select-gpu select-gpu-sequence; do
    [[ -f "$results/$f-$date.md" ]] && cp "$results/$f-$date.md" "$OUT/"
  done
  echo "wrote $OUT/results.tgz ($(du -h "$OUT/results.tgz" | cut -f1)) and the tables"
fi

# --- The short summary, last, so that it is in the tail of the output.
echo
echo "================ summary ($device, $date, $((SECONDS - start)) s) ================"
printf '%s\n' "${summary[@]}"
python3 - "$work" <<'PY' || true
import json, os, sys
w = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(w, name)))["results"]
    except Exception:
        return []
step = load("step_gpu.json")
if step:
    print("\nstep (median ms / p90 ms / x floor / fast-full / ok):")
    for r in step:
        fl = r.get("floor_ms") or 0
        ff = f"{r['fast_timed']}/{r['full_timed']}" if "fast_timed" in r else ""
        print(f"  2^{r['n'].bit_length() - 1} {r['density']:g} {r['method']:14s} {r['median_ms']:8.4f} {r['p90_ms']:8.4f} "
              f"{(r['median_ms'] / fl if fl else 0):6.2f} {ff:>7s} {'ok' if r.get('ok') else 'FAILED'}")
batched = load("batched_gpu.json") + load("batched_torch.json")
if batched:
    print("\nResNet-50, 161 tensors (median ms / p90 ms / ok):")
    for r in batched:
        print(f"  {r['method']:18s} {r['median_ms']:8.4f} {r['p90_ms']:8.4f} {'ok' if r.get('ok', True) else 'FAILED'}")
sel = load("select_gpu.json") + load("torch_topk.json")
want = ("copy", "torch_topk", "cub_topk_pairs", "radix_compact", "trim_cold_compact", "trim_warm_compact")
rows = [r for r in sel if r["distribution"] == "relu_like" and r["density"] == 1e-3 and r["method"] in want]
if rows:
    print("\nselection + pairs, relu_like, density 1e-3 (median ms):")
    for n in sorted({r["n"] for r in rows}):
        by = {r["method"]: r for r in rows if r["n"] == n}
        print(f"  2^{n.bit_length() - 1}: " + ", ".join(f"{m} {by[m]['median_ms']:.4f}{'' if by[m].get('ok', True) else ' FAILED'}"
                                                  for m in want if m in by))
bad = [r for r in step + batched + sel if not r.get("ok", True)]
print(f"\nrows failing a check: {len(bad)}" + (": " + ", ".join(r["method"] for r in bad[:10]) if bad else ""))
PY
echo "tests: $test_status, torch CUDA tests: $torch_status, benchmarks: $([[ $bench_status -eq 0 ]] && echo ok || echo 'a stage failed')"
[[ "$test_status" == 0 || "$test_status" == skipped ]] && [[ "$torch_status" == 0 || "$torch_status" == skipped ]] &&
  [[ $bench_status -eq 0 ]]
