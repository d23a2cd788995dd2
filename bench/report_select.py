#!/usr/bin/env python3
"""Markdown tables from select_bench's JSON output (--benchmark_out=FILE --benchmark_out_format=json).

One table per case (distribution, N, density): each method's time, its ratio to nth_element, to radix and
to the floor (one read of x), the passes over x per call (laplace_bisect) and the achieved count / k.
Ratios use CPU time by default, which is what a shared machine measures most faithfully; --time real uses
wall-clock time instead. Sequence cases (select_bench --sequence=DIR) report the median over sweeps of the
thread CPU time per call (ms_per_call), whatever --time says, and the largest count / k of any call.

    python3 bench/report_select.py results.json [--time cpu|real]
"""

import argparse
import json
import sys
from collections import OrderedDict


def parse(path, time_key):
    with open(path) as f:
        doc = json.load(f)
    cases = OrderedDict()
    for b in doc.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue
        parts = b["name"].split("/")
        if len(parts) < 5 or parts[0] not in ("select", "sequence"):
            continue
        kind, method, dist, n, density = parts[:5]
        sequence = kind == "sequence"
        cases.setdefault((kind, dist, int(n), density), OrderedDict())[method] = {
            "time": float(b["ms_per_call"]) if sequence else float(b[time_key]),
            "unit": "ms" if sequence else b.get("time_unit", "ns"),
            "count_over_k": float(b.get("count_over_k", float("nan"))),
            "max_count_over_k": float(b.get("max_count_over_k", float("nan"))),
            "passes": float(b.get("passes_per_call", 0.0)),
            "calls": int(b.get("calls_per_sweep", 0)),
        }
    return doc.get("context", {}), cases


def fmt_ratio(x):
    return "-" if x is None else ("%.2f" % x if x < 100 else "%.0f" % x)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--time", choices=["cpu", "real"], default="cpu")
    args = ap.parse_args()
    context, cases = parse(args.json, "cpu_time" if args.time == "cpu" else "real_time")
    if not cases:
        print("no select/ benchmarks in %s" % args.json, file=sys.stderr)
        return 1
    out = []
    out.append("Host: %s, %s CPUs reported, %s MHz; build: %s. Times: %s time."
               % (context.get("host_name", "?"), context.get("num_cpus", "?"), context.get("mhz_per_cpu", "?"),
                  context.get("library_build_type", "?"), args.time))
    out.append("")
    for (kind, dist, n, density), methods in cases.items():
        if kind == "sequence":
            calls = max(r["calls"] for r in methods.values())
            out.append("### sequence %s, N = %d, density %s (%d timed calls per sweep, one per step)"
                       % (dist, n, density, calls))
        else:
            out.append("### %s, N = %d, density %s" % (dist, n, density))
        out.append("")
        out.append("| method | time | x nth_element (speed-up) | x radix (speed-up) | / floor | passes per call "
                   "| count / k (mean, max) |")
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        nth = methods.get("nth_element", {}).get("time")
        radix = methods.get("radix", {}).get("time")
        floor = methods.get("floor", {}).get("time")
        for m, r in methods.items():
            speedup = nth / r["time"] if nth and r["time"] > 0 else None
            over_radix = radix / r["time"] if radix and r["time"] > 0 else None
            over_floor = r["time"] / floor if floor else None
            passes = "%.2f" % r["passes"] if r["passes"] > 0 else "-"
            counts = "%.4f" % r["count_over_k"]
            if r["max_count_over_k"] == r["max_count_over_k"]:
                counts += ", %.4f" % r["max_count_over_k"]
            out.append("| %s | %.3g %s | %s | %s | %s | %s | %s |"
                       % (m, r["time"], r["unit"], fmt_ratio(speedup), fmt_ratio(over_radix),
                          fmt_ratio(over_floor), passes, counts))
        warm, cold = methods.get("laplace_bisect"), methods.get("laplace_bisect_cold")
        if warm and cold and warm["time"] > 0:
            out.append("")
            out.append("laplace_bisect warm / cold time: %.3f" % (warm["time"] / cold["time"]))
        out.append("")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
