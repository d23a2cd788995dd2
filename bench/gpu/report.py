#!/usr/bin/env python3
"""Merges select_gpu_bench and torch_topk JSON into bench/results/select-gpu-<date>.md.

usage: report.py GPU_JSON TORCH_JSON OUT_MD [--device NAME] [--date YYYY-MM-DD]
Ratios are the other method's median time over this one's, measured in the same script run: > 1 means this
method is faster than torch.topk / hierarchical / cub::DeviceTopK; "x copy" is how many device-to-device
copies of x it costs.
"""
import argparse
import datetime
import json

# method -> (kind, what it returns). warm: started from the previous buffer's threshold (these buffers are
# independent draws of one law, so warm here measures the warm path on noise, not on a training sequence).
KIND = {
    "copy": ("floor", "a copy of x"),
    "torch_topk": ("cold, exact", "k abs(x) values + k int64 indices (abs formed before timing)"),
    "cub_topk_pairs": ("cold, exact", "k signed values + k int32 indices (DeviceTopK::MaxPairs + gather)"),
    "radix_compact": ("cold, exact", "k signed values + k uint32 indices"),
    "trim_cold_compact": ("cold, exact", "k signed values + k uint32 indices"),
    "trim_warm_compact": ("warm, exact", "k signed values + k uint32 indices"),
    "cub_sort": ("cold, exact", "all keys sorted"),
    "exact": ("cold, exact", "threshold"),
    "radix": ("cold, exact", "threshold"),
    "hierarchical": ("cold, exact", "threshold"),
    "sampled": ("cold, approximate", "threshold"),
    "laplace_cold": ("cold, approximate", "threshold"),
    "laplace_warm": ("warm, approximate", "threshold"),
    "laplace_trim": ("warm, exact", "threshold"),
    "compact": ("-", "compaction alone (radix's threshold given)"),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("gpu_json")
    p.add_argument("torch_json")
    p.add_argument("out_md")
    p.add_argument("--device", default=None, help="name reported by nvidia-smi")
    p.add_argument("--date", default=datetime.date.today().isoformat())
    a = p.parse_args()
    gpu = json.load(open(a.gpu_json))
    try:
        torch_data = json.load(open(a.torch_json))
    except (OSError, ValueError):
        torch_data = {"results": [], "device": None}
    rows = gpu["results"] + torch_data["results"]
    table = {}
    for r in rows:
        table.setdefault((r["distribution"], r["n"], r["density"]), {})[r["method"]] = r
    device = a.device or gpu.get("device")
    lines = [f"# GPU threshold selection: {device}", "", f"Device: {device}. Date: {a.date}.", "",
             f"Program: bench/gpu/select_gpu_bench.cu and bench/gpu/torch_topk.py, run by bench/gpu/run.sh. "
             f"Median of {gpu.get('reps')} repetitions over {gpu.get('buffers')} buffers, CUDA events, warm-up first. "
             f"torch {torch_data.get('torch', 'not run')}. Approximate methods: tolerance {gpu.get('tolerance')}.",
             "",
             "Like for like: the rows that return k pairs (torch_topk, cub_topk_pairs, radix_compact, "
             "trim_*_compact) do the same job, exact top-k with its indices; compare the cold ones with each other. "
             "Warm rows start from the previous buffer's threshold; the buffers are independent draws of one law, "
             "so this is the warm path on noise (the sequence and step tables have consecutive steps). Rows that "
             "return a threshold do less than the pair rows.", "",
             "Ratios: time of torch.topk (resp. hierarchical, cub::DeviceTopK pairs) / time of the method, so > 1 "
             "is faster; `x copy` = time / time of a device-to-device copy of x (the memory floor).", ""]
    methods = ["cub_topk_pairs", "radix_compact", "trim_cold_compact", "trim_warm_compact", "exact", "cub_sort",
               "radix", "hierarchical", "sampled", "laplace_cold", "laplace_warm", "laplace_trim", "compact"]
    bad = [r for r in rows if not r.get("ok", True)]
    for (dist, n, density), by in sorted(table.items()):
        lines.append(f"## {dist}, N = 2^{n.bit_length() - 1}, density {density:g} (k = {next(iter(by.values()))['k']})")
        lines.append("")
        lines.append("| method | kind | median ms | vs torch.topk | vs hierarchical | vs DeviceTopK | x copy | count | ok "
                     "| returns |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        torch_ms = by.get("torch_topk", {}).get("median_ms")
        hier_ms = by.get("hierarchical", {}).get("median_ms")
        dtk_ms = by.get("cub_topk_pairs", {}).get("median_ms")
        copy_ms = by.get("copy", {}).get("median_ms")
        for m in ["copy", "torch_topk"] + methods:
            if m not in by:
                continue
            r = by[m]
            t = r["median_ms"]
            ratio = lambda ref: f"{ref / t:.2f}" if ref and t > 0 else "-"
            xcopy = f"{t / copy_ms:.2f}" if copy_ms else "-"
            kind, what = KIND.get(m, ("?", ""))
            lines.append(f"| {m} | {kind} | {t:.4f} | {ratio(torch_ms)} | {ratio(hier_ms)} | {ratio(dtk_ms)} | {xcopy} | "
                         f"{r['count']} | {'yes' if r.get('ok', True) else 'NO'} | {what} |")
        lines.append("")
    lines.append(f"Counts out of tolerance: {len(bad)}.")
    with open(a.out_md, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out_md}")


if __name__ == "__main__":
    main()
