#!/usr/bin/env bash
# On a GPU machine, after the build of run.sh: DRAM bytes and device time per kernel of the step, counted by
# Nsight Compute (not assumed), for a few steady-state steps of step_gpu_bench at N = 2^26, density 1e-3:
# the memory floor (floor_f32), cuda::batched_top_k<float> (batched_f32) and the old
# cuda::top_k<laplace_bisect> (top_k_laplace). Each row runs 5 unprofiled steps, then STEPS profiled ones
# (cudaProfilerStart/Stop around the step alone: the gradient drawing is not profiled).
#   bench/gpu/profile.sh [OUT.md] [STEPS]          (default OUT: $BUILD_DIR/results/profile.md, STEPS 3)
# Environment: BUILD_DIR (default build/gpu-bench), PROFILE_LOG_N (26), PROFILE_METHODS, DEVICE_NAME,
# NCU_LIMIT (seconds per ncu call, 60).
# Host-side copies and memsets are not kernels and do not appear; cuda::top_k's per-step host
# synchronisation is not device time either (the step benchmark's wall times include it).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build/gpu-bench}"
out="${1:-$build/results/profile.md}"
steps="${2:-3}"
log_n="${PROFILE_LOG_N:-26}"
methods="${PROFILE_METHODS:-floor_f32 batched_f32 top_k_laplace}"
bench="${BENCH_BIN:-$build/tests/cuda/bench_gpu}/gpu_bench"
work="$build/profile"
mkdir -p "$work" "$(dirname "$out")"
ncu_bin="$(command -v ncu || true)"
[[ -z "$ncu_bin" && -x /usr/local/cuda/bin/ncu ]] && ncu_bin=/usr/local/cuda/bin/ncu
if [[ -z "$ncu_bin" ]]; then
  echo "profile.sh: ncu not found; no profile" | tee "$out"
  exit 1
fi
device="${DEVICE_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo '?')}"
status=0
for m in $methods; do
  echo "profile.sh: $m at 2^$log_n, $steps profiled steps"
  timeout "${NCU_LIMIT:-60}" "$ncu_bin" --clock-control none --profile-from-start off \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --page raw --print-units base \
    "$bench" step --cases "$log_n:1e-3" --only "$m" --profile-steps "$steps" >"$work/$m.csv" 2>"$work/$m.err" ||
    { echo "profile.sh: ncu failed for $m (exit $?): $(tail -3 "$work/$m.err" | tr '\n' ' ')"; status=1; }
done
python3 - "$out" "$device" "$log_n" "$steps" "$work" $methods <<'PY'
import collections, csv, datetime, os, sys

out, device, log_n, steps, work = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
methods = sys.argv[6:]
n = 1 << log_n


def number(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


lines = [f"# DRAM traffic of the step, counted by Nsight Compute ({device}, {datetime.date.today().isoformat()})", "",
         f"Command: `bash bench/gpu/profile.sh` (run by `bench/gpu/run.sh`). `gpu_bench step --cases {log_n}:1e-3 "
         f"--only METHOD --profile-steps {steps}` under `ncu --clock-control none --metrics "
         "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum`; 5 steps unprofiled, then "
         f"{steps} profiled (the gradient drawing outside the profiled range). Figures per step (sums over the "
         f"profiled steps / {steps}); N = 2^{log_n} = {n}; GB/s = (read + write) / kernel time. Each kernel "
         "runs alone under the profiler (launch gaps and cuda::top_k's host synchronisation are not in these "
         "times), so the sum of kernel times is a lower bound of the step's time.", ""]
summary = []
for m in methods:
    path = os.path.join(work, f"{m}.csv")
    rows = []
    if os.path.exists(path):
        rows = list(csv.reader(l for l in open(path, errors="replace") if l.startswith('"')))
    if len(rows) < 2:
        lines += [f"## {m}", "", "no profile (see the run's log)", ""]
        continue
    head = rows[0]
    try:
        name, dur, rd, wr = (head.index(c) for c in ("Kernel Name", "gpu__time_duration.sum",
                                                     "dram__bytes_read.sum", "dram__bytes_write.sum"))
    except ValueError:
        lines += [f"## {m}", "", "unexpected ncu output (columns missing)", ""]
        continue
    total = collections.OrderedDict()
    for r in rows[1:]:
        if len(r) <= max(name, dur, rd, wr):
            continue
        t, b_r, b_w = number(r[dur]), number(r[rd]), number(r[wr])
        if t is None or b_r is None or b_w is None:
            continue  # the units row
        k = r[name].split("(")[0].split("<")[0].strip() or r[name]
        k = "::".join(k.removeprefix("void ").split("::")[-2:])
        c, s_t, s_r, s_w = total.get(k, (0, 0.0, 0.0, 0.0))
        total[k] = (c + 1, s_t + t, s_r + b_r, s_w + b_w)
    lines += [f"## {m}", "",
              "| kernel | launches per step | us per step | MB read per step | MB written per step | GB/s |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    T = R = W = L = 0.0
    for k, (c, t, r_, w) in total.items():
        lines.append(f"| {k[:70]} | {c / steps:.1f} | {t / 1e3 / steps:.1f} | {r_ / 1e6 / steps:.1f} | "
                     f"{w / 1e6 / steps:.1f} | {(r_ + w) / t if t else 0:.0f} |")
        T, R, W, L = T + t, R + r_, W + w, L + c
    lines.append(f"| **all** | {L / steps:.1f} | {T / 1e3 / steps:.1f} | {R / 1e6 / steps:.1f} | {W / 1e6 / steps:.1f} | "
                 f"{(R + W) / T if T else 0:.0f} |")
    lines.append("")
    summary.append((m, L / steps, T / 1e3 / steps, R / steps, W / steps))
if summary:
    lines += ["## Per step", "",
              "| method | kernels | kernel us | DRAM read MB | DRAM written MB | bytes / N | GB/s |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m, launches, us, r, w in summary:
        lines.append(f"| {m} | {launches:.1f} | {us:.1f} | {r / 1e6:.1f} | {w / 1e6:.1f} | {(r + w) / n:.2f} | "
                     f"{(r + w) / (us * 1e3) if us else 0:.0f} |")
    lines += ["", "bytes / N: the model says 12 for the floor (read g and e, write e) and for a step that forms p "
              "once and selects from candidates only; 24 for the old step (read g, read e, write p, the "
              "selection's read of p, the compaction's two reads of p), before its selection's extra passes."]
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
exit $status
