#!/usr/bin/env python3
"""Markdown tables from select_bench's JSON output (--benchmark_out=FILE --benchmark_out_format=json).

One table per case (distribution, N, density): each method's time, its ratio to nth_element and to the
floor (one read of x), and the achieved count / k. Ratios use CPU time by default, which is what a shared
machine measures most faithfully; --time real uses wall-clock time instead.

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
        if len(parts) != 5 or parts[0] != "select":
            continue
        _, method, dist, n, density = parts
        cases.setdefault((dist, int(n), density), OrderedDict())[method] = {
            "time": float(b[time_key]),
            "unit": b.get("time_unit", "ns"),
            "count_over_k": float(b.get("count_over_k", float("nan"))),
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
    for (dist, n, density), methods in cases.items():
        out.append("### %s, N = %d, density %s" % (dist, n, density))
        out.append("")
        out.append("| method | time | x nth_element (speed-up) | / floor | count / k |")
        out.append("|---|---:|---:|---:|---:|")
        nth = methods.get("nth_element", {}).get("time")
        floor = methods.get("floor", {}).get("time")
        for m, r in methods.items():
            speedup = nth / r["time"] if nth and r["time"] > 0 else None
            over_floor = r["time"] / floor if floor else None
            out.append("| %s | %.3g %s | %s | %s | %.4f |" % (m, r["time"], r["unit"], fmt_ratio(speedup),
                                                           fmt_ratio(over_floor), r["count_over_k"]))
        out.append("")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
