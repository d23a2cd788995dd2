#!/usr/bin/env python3
"""Merges select_gpu_bench and torch_topk JSON into bench/results/select-gpu-<date>.md.

usage: report.py GPU_JSON TORCH_JSON OUT_MD [--device NAME]
Ratios are the other method's median time over this one's, measured in the same script run: > 1 means this
method is faster than torch.topk / hierarchical; "x copy" is how many device-to-device copies of x it costs.
"""
import argparse
import json


def main():
    p = argparse.ArgumentParser()
    p.add_argument("gpu_json")
    p.add_argument("torch_json")
    p.add_argument("out_md")
    p.add_argument("--device", default=None, help="name reported by nvidia-smi")
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
    lines = [f"# GPU threshold selection: {device}", "",
             f"Program: bench/gpu/select_gpu_bench.cu and bench/gpu/torch_topk.py, run by bench/gpu/run.sh. "
             f"Median of {gpu.get('reps')} repetitions over {gpu.get('buffers')} buffers, CUDA events, warm-up first. "
             f"torch {torch_data.get('torch', 'not run')}. Approximate methods: tolerance {gpu.get('tolerance')}.",
             "",
             "Ratios: time of torch.topk (resp. hierarchical) / time of the method, so > 1 is faster; "
             "`x copy` = time / time of a device-to-device copy of x (the memory floor).", ""]
    methods = ["exact", "cub_sort", "radix", "hierarchical", "sampled", "laplace_cold", "laplace_warm",
               "laplace_trim", "compact"]
    bad = [r for r in rows if not r.get("ok", True)]
    for (dist, n, density), by in sorted(table.items()):
        lines.append(f"## {dist}, N = 2^{n.bit_length() - 1}, density {density:g} (k = {next(iter(by.values()))['k']})")
        lines.append("")
        lines.append("| method | median ms | vs torch.topk | vs hierarchical | x copy | count | ok |")
        lines.append("|---|---|---|---|---|---|---|")
        torch_ms = by.get("torch_topk", {}).get("median_ms")
        hier_ms = by.get("hierarchical", {}).get("median_ms")
        copy_ms = by.get("copy", {}).get("median_ms")
        for m in ["copy", "torch_topk"] + methods:
            if m not in by:
                continue
            r = by[m]
            t = r["median_ms"]
            ratio = lambda ref: f"{ref / t:.2f}" if ref and t > 0 else "-"
            xcopy = f"{t / copy_ms:.2f}" if copy_ms else "-"
            lines.append(f"| {m} | {t:.4f} | {ratio(torch_ms)} | {ratio(hier_ms)} | {xcopy} | {r['count']} | "
                         f"{'yes' if r.get('ok', True) else 'NO'} |")
        lines.append("")
    lines.append(f"Counts out of tolerance: {len(bad)}.")
    with open(a.out_md, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out_md}")


if __name__ == "__main__":
    main()
