#!/usr/bin/env python3
"""Tabulates the straggler study: one markdown table from the summaries fashion_mnist_stragglers printed.

    python3 examples/fashion_mnist/stragglers_report.py DIR > table.md

DIR holds n<N>-r<R>-<delays>.txt (the program's standard output) beside the matching .csv curves. Per
configuration and scheme: time to the target, its ratio to ring SSGD and to backup workers (above 1: sooner),
steps to the target, modelled milliseconds per step, megabytes per node (the largest over ranks: the
decoding root for the first-arrival schemes) and the final accuracy (last evaluation, and the mean of the
last five, which moves less).
"""
import csv
import glob
import os
import re
import sys


def parse(path):
    rows = {}
    for line in open(path):
        parts = line.split()
        if len(parts) < 2 or parts[0] in ("scheme", "n") or parts[0].endswith(":"):
            continue
        if parts[0] == "gc_fr" and parts[1] == "skipped:":
            continue
        name = parts[0]
        if parts[1] == "never":
            rows[name] = None
            continue
        if parts[1] == "not":
            t = None
            rest = parts[4:]
        else:
            t = float(parts[1])
            rest = parts[3:]
        total, sent, recv, final, last5 = map(float, rest[:5])
        rows[name] = dict(t=t, total=total, sent=sent, recv=recv, final=final, last5=last5)
    return rows


def steps_to_target(csv_path, scheme, target):
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            if row["scheme"] == scheme and float(row["accuracy"]) >= target:
                return int(row["step"])
    return None


def main():
    d = sys.argv[1]
    target = float(sys.argv[2]) if len(sys.argv) > 2 else 0.75
    order = {"none": 0, "slow": 1, "exp": 2, "pareto": 3, "stop": 4}
    files = []
    for p in glob.glob(os.path.join(d, "n*-r*-*.txt")):
        m = re.match(r"n(\d+)-r(\d+)-(\w+)\.txt", os.path.basename(p))
        files.append((int(m.group(1)), int(m.group(2)), order.get(m.group(3), 9), m.group(3), p))
    files.sort()
    print("| n | r | delays | scheme | time to %.2f (s) | vs ring | vs backup | steps | ms/step | MB sent/node "
          "| MB recv/node | final acc | last-5 mean |" % target)
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, r, _, delays, p in files:
        rows = parse(p)
        ring = rows.get("ring")
        backup = rows.get("backup")
        curves = p[:-4] + ".csv"
        for name, v in rows.items():
            if v is None:
                print(f"| {n} | {r} | {delays} | {name} | never (waits for the stopped node) | | | | | | | | |")
                continue
            steps = steps_to_target(curves, name, target)
            nsteps = max(int(row["step"]) for row in csv.DictReader(open(curves)) if row["scheme"] == name)
            ms = 1000 * v["total"] / nsteps
            t = "%.3f" % v["t"] if v["t"] is not None else "not reached"
            vr = "%.2fx" % (ring["t"] / v["t"]) if ring and v["t"] and ring["t"] else "-"
            vb = "%.2fx" % (backup["t"] / v["t"]) if backup and v["t"] and backup["t"] else "-"
            bold = "**" if name.startswith("gc_") else ""
            print(f"| {n} | {r} | {delays} | {bold}{name}{bold} | {t} | {vr} | {vb} | {steps or '-'} | {ms:.2f} "
                  f"| {v['sent']:.0f} | {v['recv']:.0f} | {v['final']:.4f} | {v['last5']:.4f} |")


if __name__ == "__main__":
    main()
