"""pays.py's output from the grid's rows: the CSV, the heat maps, the tables and the goals."""
import csv
import math
import os
import subprocess
import sys

from pays_model import BANDWIDTHS, SIZES


def write_csv(path, rows):
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def heatmap(out, rows, models, tgt="t1"):
    """One panel per model and device: log2 of (best PyTorch hook's time to target / best commsgd scheme's),
    bandwidth across, n down; > 0 where commsgd reaches the target sooner."""
    data = os.path.join(out, f"heatmap-{tgt}.dat")
    panels = [(m, d) for m in models for d in ("cpu", "gpu")]
    bws = [b[0] for b in BANDWIDTHS]
    with open(data, "w") as f:
        for pi, (m, d) in enumerate(panels):
            f.write(f"# {m} {d}\n")
            for r in rows:
                if r["model"] == m and r["device"] == d:
                    v = r[f"{tgt}_pytorch_over_commsgd"]
                    f.write(f"{bws.index(r['bandwidth'])} {SIZES.index(r['n'])} "
                            f"{math.log2(v) if v else 'NaN'} {v if v else 0:.2f}\n")
            f.write("\n\n")
    script = [f"set terminal pngcairo size 1300,{480 * len(models)} font ',10'",
              f"set output '{os.path.join(out, f'where-compression-pays-{tgt}.png')}'",
              f"set multiplot layout {len(models)},2",
              "set palette defined (-2 '#b2182b', 0 '#f7f7f7', 2 '#2166ac')", "set cbrange [-2:2]",
              "set cblabel 'log2(best PyTorch / best commsgd), time to target'",
              "set xtics (" + ", ".join(f"'{b}' {i}" for i, b in enumerate(bws)) + ")",
              "set ytics (" + ", ".join(f"'{n}' {i}" for i, n in enumerate(SIZES)) + ")",
              "set xlabel 'bandwidth (Gbit/s)'", "set ylabel 'ranks'", "set xrange [-0.5:3.5]",
              "set yrange [-0.5:6.5]"]
    for pi, (m, d) in enumerate(panels):
        dev = "CPU profile (measured)" if d == "cpu" else "GPU-class step (scaled)"
        script.append(f"set title '{m}, {dev}: best PyTorch hook / best commsgd scheme'")
        script.append(f"plot '{data}' index {pi} using 1:2:3 with image notitle, "
                      f"'' index {pi} using 1:2:(sprintf('%.2fx', $4)) with labels font ',9' notitle")
    script.append("unset multiplot")
    try:
        subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"pays: no heat map ({e})", file=sys.stderr)


def tables(rows, models, tgt="t1"):
    """Per model and device: best PyTorch / best commsgd (who), and auto / best PyTorch, bandwidth x n."""
    bws = [b[0] for b in BANDWIDTHS]
    out = []
    for m in models:
        for d in ("cpu", "gpu"):
            cells = {(r["bandwidth"], r["n"]): r for r in rows if r["model"] == m and r["device"] == d}
            if not cells:
                continue
            out.append(f"\n{m}, {'measured CPU profile' if d == 'cpu' else 'GPU-class step'}: best PyTorch hook's "
                       "time to target over the best commsgd scheme's (> 1: commsgd sooner; scheme), and auto's "
                       "over the best PyTorch hook's [auto's choice]\n")
            out.append("| n | " + " | ".join(f"{b}" for b in bws) + " |")
            out.append("|---|" + "---|" * len(bws))
            for n in SIZES:
                row = []
                for b in bws:
                    r = cells.get((b, n))
                    if r is None:
                        row.append("")
                        continue
                    v, a = r[f"{tgt}_pytorch_over_commsgd"], r[f"{tgt}_auto_over_pytorch"]
                    row.append(f"{v:.2f} {short(r[f'{tgt}_best_commsgd'])}; auto {a:.2f} [{r['auto_choice']}]"
                               if v and a else f"{v or 0:.2f} {short(r[f'{tgt}_best_commsgd'])}; auto - "
                               f"[{r['auto_choice']}]")
                out.append(f"| {n} | " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def short(s):
    return (s or "-").replace("topk-laplace-", "topk ").replace("commsgd-", "")


def goals(rows, models):
    lines = []
    for m in models:
        mr = [r for r in rows if r["model"] == m]
        for tgt, label in (("t1", "DDP-1pt"), ("t2", "DDP-2pt")):
            worst = max((r for r in mr if r[f"{tgt}_auto_over_pytorch"]), key=lambda r: r[f"{tgt}_auto_over_pytorch"],
                        default=None)
            missing = sum(1 for r in mr if r[f"{tgt}_auto_over_pytorch"] is None)
            over = sum(1 for r in mr if (r[f"{tgt}_auto_over_pytorch"] or 0) > 1.03)
            if worst:
                lines.append(f"- {m}, {label}: auto within 1.03x of the best PyTorch hook in "
                             f"{len(mr) - over - missing} of {len(mr)} cells (worst {worst[f'{tgt}_auto_over_pytorch']:.2f}x: "
                             f"{worst['device']} {worst['bandwidth']} n={worst['n']}, auto chose "
                             f"{worst['auto_choice']}, best PyTorch {worst[f'{tgt}_best_pytorch']}); "
                             f"{missing} cells where auto's run did not reach the target")
            cb = [r for r in mr if r["bandwidth"] == "1G" and r["n"] >= 16 and r["device"] == "gpu"]
            vs_pt = [r[f"{tgt}_pytorch_over_commsgd"] for r in cb if r[f"{tgt}_pytorch_over_commsgd"]]
            vs_ddp = [r[f"{tgt}_ddp_over_commsgd"] for r in cb if r[f"{tgt}_ddp_over_commsgd"]]
            gaps = [100 * (r["ddp_final"] - r[f"{tgt}_best_commsgd_final"]) for r in cb
                    if r.get(f"{tgt}_best_commsgd_final") is not None]
            if vs_pt:
                met = min(vs_pt) >= 1.5 and min(vs_ddp) >= 3.0 and max(gaps) <= 0.5
                lines.append(f"- {m}, {label}, communication-bound cells (1 Gbit/s, n >= 16, GPU-class): best "
                             f"commsgd {min(vs_pt):.2f}x to {max(vs_pt):.2f}x sooner than the best PyTorch hook, "
                             f"{min(vs_ddp):.2f}x to {max(vs_ddp):.2f}x sooner than DDP allreduce, final accuracy "
                             f"{max(gaps):+.2f} points below DDP's at worst (schemes: "
                             f"{', '.join(sorted({r[f'{tgt}_best_commsgd'] for r in cb}))}; PyTorch: "
                             f"{', '.join(sorted({r[f'{tgt}_best_pytorch'] for r in cb}))}): goal "
                             f"{'met' if met else 'not met'}")
    return "\n".join(lines) + "\n"
