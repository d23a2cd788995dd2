#!/usr/bin/python3
"""Renders the tables of torch-ddp-1000-2026-11-24.md from the bench's summary.csv files (and the exploration
runs), so every figure in that file comes from a CSV beside it.

    /usr/bin/python3 bench/results/torch-ddp-1000-2026-11-24/render.py
"""
import csv
import glob
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def cell(v, fmt="{}"):
    return "not reached" if v in (None, "", "None") else fmt.format(v)


def table(summary, ddp_steps):
    out = ["| model | scheme | acc epoch 1 | epoch 2 | final | steps to DDP-1pt | steps to DDP-2pt (x DDP) | "
           "bytes sent/step (mean) | bytes sent (last step) | values changed at epoch 1 | held back at epoch 1 / 2 |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary:
        acc = r["acc_per_epoch"].split()
        s2 = r["steps_to_ddp_minus_2pt"]
        ratio = f" ({int(s2) / ddp_steps[r['model']]:.2f}x)" if s2 not in ("", "None") else ""
        hb = [r.get("held_back_epoch1"), r.get("held_back_epoch2")]
        hbt = " / ".join(f"{float(h):.2f}" for h in hb if h not in (None, "", "None")) or "-"
        ch = r.get("changed_epoch1")
        out.append(f"| {r['model']} | {r['scheme']} | {acc[0]} | {acc[1]} | {float(r['final_acc']):.4f} | "
                   f"{cell(r['steps_to_ddp_minus_1pt'])} | {cell(s2)}{ratio} | "
                   f"{float(r['bytes_sent_per_step']):,.0f} | {int(float(r['bytes_sent_last_step'])):,} | "
                   f"{'-' if ch in (None, '', 'None') else f'{float(ch):.3f}'} | {hbt} |")
    return "\n".join(out)


def main():
    for name in ("mlp", "mlp-momentum0", "cnn", "cnn-momentum0"):
        path = os.path.join(HERE, name, "summary.csv")
        if not os.path.exists(path):
            continue
        summary = rows(path)
        ddp = {r["model"]: int(r["steps_to_ddp_minus_2pt"]) for r in summary if r["scheme"] == "ddp"}
        print(f"### {name}\n\n{table(summary, ddp)}\n")
    explo, explo_ddp = [], {}
    for path in sorted(glob.glob(os.path.join(HERE, "exploration", "run*-summary.csv"))):
        run = os.path.basename(path).split("-")[0]
        for r in rows(path):
            if r["scheme"] == "ddp":
                # DDP's steps to its own 2-point target, the ratio's denominator; every run trains the same
                # deterministic DDP, so its runs must agree.
                steps = int(r["steps_to_ddp_minus_2pt"])
                if explo_ddp.setdefault(r["model"], steps) != steps:
                    raise SystemExit(f"{path}: DDP took {steps} steps to its 2-point target, "
                                     f"another exploration run {explo_ddp[r['model']]}")
            if r["scheme"] != "ddp" or run == "run1":
                r["scheme"] = f"{r['scheme']} ({run})"
                explo.append(r)
    missing = sorted({r["model"] for r in explo} - set(explo_ddp))
    if missing:
        raise SystemExit(f"exploration: no DDP run for {', '.join(missing)}, so no steps to divide by")
    print("### exploration\n\n" + table(explo, explo_ddp) + "\n")


if __name__ == "__main__":
    main()
