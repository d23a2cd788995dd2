"""Merges sequence_gpu_bench's JSON and sequence.py's torch.topk JSON into one markdown table per sequence.

  report_sequence.py OURS.json TORCH.json OUT.md --device NAME
A call's time is the median over sweeps at that step; the table gives the first step (cold for every
method) and the median over the later steps (warm where the method keeps state), and ratios on the later
steps against torch.topk, hierarchical, cub::DeviceTopK (where measured) and one copy of the input.
"""
import argparse
import datetime
import json


def med(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("torch")
    ap.add_argument("out")
    ap.add_argument("--device", default="?")
    a = ap.parse_args()
    ours = json.load(open(a.ours))
    try:
        torch = json.load(open(a.torch))["results"]
    except (OSError, ValueError, KeyError):
        torch = []
    seqs = {}
    for r in ours["results"]:
        seqs.setdefault(r["sequence"], []).append(r)
    for t in torch:
        seqs.setdefault(t["dir"], []).append({"sequence": t["dir"], "method": "torch_topk", "ok": t.get("ok", True),
                                              "max_count": t["k"], "per_step_ms": t["per_step_ms"]})
    lines = [f"# GPU selection on consecutive error-feedback accumulators ({a.device}, "
             f"{datetime.date.today().isoformat()})", "",
             "Command: `bash bench/gpu/run.sh` (sequence part: `bench/gpu/sequence.py`, "
             "`sequence_gpu_bench`). Each method runs over the sequence in step order, a fresh object per "
             f"sweep ({ours.get('sweeps')} sweeps, median per step, CUDA events). 'later' is the median over "
             "steps 2..S, where warm-started methods start from the previous step.", "",
             "Like for like (exact, k pairs out): `radix_compact` (cold) and `trim_compact` (warm) give signed "
             "values + uint32 indices; `cub_device_topk` (cold) gives magnitude keys + int32 indices and gathers "
             "the signed values; `torch_topk` (cold) gives |x| values + int64 indices, with |x| formed before "
             "timing. The selectors alone (`radix`, `laplace_*`, ...) return a threshold, not pairs.", ""]
    for name, rows in seqs.items():
        by = {r["method"]: med(r["per_step_ms"][1:] or r["per_step_ms"]) for r in rows}
        ref = {m: by.get(m) for m in ("torch_topk", "hierarchical", "cub_device_topk", "copy")}
        lines += [f"## {name}", "",
                  "| method | first call ms | later ms | torch.topk / this | hierarchical / this | "
                  "DeviceTopK / this | this / copy | counts |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in rows:
            later = by[r["method"]]
            def ratio(x):
                return f"{x / later:.2f}" if x and later else "-"
            lines.append(f"| {r['method']} | {r['per_step_ms'][0]:.4f} | {later:.4f} | {ratio(ref['torch_topk'])} | "
                         f"{ratio(ref['hierarchical'])} | {ratio(ref['cub_device_topk'])} | "
                         f"{(later / ref['copy']) if ref['copy'] else float('nan'):.2f} | "
                         f"{'ok' if r['ok'] else 'OUT OF TOLERANCE'} (max {r['max_count']}) |")
        lines.append("")
    open(a.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
