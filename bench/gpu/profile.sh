#!/usr/bin/env bash
# On a GPU machine, after run.sh: per-kernel device time of one method over a sequence, from Nsight Compute
# (one replay per kernel, duration only), summed per kernel name over the timed steps.
#   bench/gpu/profile.sh METHOD SEQUENCE_DIR [STEPS]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build/gpu-bench}"
method="$1"
dir="$2"
bench="$build/tests/cuda/bench_gpu/sequence_gpu_bench"
[[ -x "$build/sequence_gpu_bench_cccl" ]] && bench="$build/sequence_gpu_bench_cccl"
ncu --metrics gpu__time_duration.sum --csv --page raw --print-units base \
  "$bench" --out "$build/profile" --sweeps 1 --only "$method" "$dir" >"$build/profile.csv"
python3 - "$build/profile.csv" <<'PY'
import csv, sys, collections
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
head = rows[0]
name, dur = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
total = collections.OrderedDict()
for r in rows[2:]:
    try:
        t = float(r[dur])
    except ValueError:
        continue
    k = r[name].split("(")[0].split("<")[0]
    c, s = total.get(k, (0, 0.0))
    total[k] = (c + 1, s + t)
print(f"{'kernel':60s} {'launches':>8s} {'total us':>10s}")
for k, (c, s) in total.items():
    print(f"{k[:60]:60s} {c:8d} {s / 1e3:10.1f}")
PY
