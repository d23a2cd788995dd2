#!/usr/bin/env bash
# --dump-accumulators writes one raw float32 file of N finite values per requested step, and a manifest whose
# per-step sent counts are the top-k counts the selector may produce: k <= sent <= ceil(1.01 k).
#   dump_test.sh TRAINER DATA WORKDIR
set -eu
trainer=$1 data=$2 work=$3
rm -rf "$work"
"$trainer" train --data "$data" --scheme topk:laplace_bisect:0.01 --ranks 2 --subset 640 --test-subset 100 \
  --epochs 1 --batch 64 --no-fit --dump-accumulators "$work" --dump-steps 3:4
python3 - "$work" <<'PY'
import math, os, struct, sys
work = sys.argv[1]
meta, files = {}, []
for line in open(os.path.join(work, "manifest.txt")):
    w = line.split()
    if not w or w[0].startswith("#"):
        continue
    if w[0] == "file":
        files.append((w[1], int(w[2]), int(w[3])))
    else:
        meta[w[0]] = w[1]
n, density = int(meta["n"]), float(meta["density"])
k = math.ceil(density * n)
assert [s for _, s, _ in files] == [3, 4, 5, 6], files
for name, step, sent in files:
    raw = open(os.path.join(work, name), "rb").read()
    assert len(raw) == 4 * n, (name, len(raw), n)
    values = struct.unpack(f"<{n}f", raw)
    assert all(math.isfinite(v) for v in values), name
    assert k <= sent <= math.ceil(1.01 * k), (name, sent, k)
    assert sum(1 for v in values if v != 0.0) >= sent, name
print(f"ok: {len(files)} accumulators of {n} values, k = {k}")
PY
