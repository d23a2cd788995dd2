"""DDP's hooks head to head on emulated links: bench.py's runs with every rank in its own network namespace
behind a shaped port (tools/netcluster: real TCP at a set rate), timed to DDP's final accuracy minus 1 point,
with pays.py's modelled time for the same cell beside each measured one.

    sudo python3 examples/torch_ddp/links.py profile --out DIR [--models mlp,cnn,wide]
    sudo python3 examples/torch_ddp/links.py run --out DIR --rates 100mbit,1gbit --models wide \\
        --schemes ddp,topk-laplace-1e-3 [--ranks 4] [--python PY] [--repeat TAG]
    python3 examples/torch_ddp/links.py report --out DIR [--accuracy KEPT]
    python3 examples/torch_ddp/links.py steps --out DIR [--pairs fp16:commsgd-fp16,bf16:commsgd-bf16]

`profile` measures pays.py's profile of each model (one process, one thread: run it with nothing else
running) into DIR/profile.json. `run` starts one cluster per (rate, model, scheme) with `netcluster exec`
(nothing is left behind, whatever happens) and keeps rank 0's records in DIR/w<ranks>/<rate>/<model>-<scheme>.json
beside DIR/runs.csv (the command, its wall time, the load average before and after). The rate `none` runs the
ranks on plain loopback: no shaping, the compute floor. Runs stop at the first evaluation (every half epoch)
whose mean with the two before it reaches the target (`--stop-at`, default: the target `report` uses), so a
scheme is charged every step up to it; one that never gets there trains the whole 1,000 steps.

`steps` prints, for each pair of schemes (PyTorch's hook, commsgd's) in every folder of DIR, the mean step
time of each (training seconds over steps, evaluations left out) at the last evaluation both runs reached, their
ratio and the bytes a step each sent: hooks compared at equal steps rather than to a target.

`report` writes DIR/grid.csv, DIR/grid.md and DIR/grid.png. Target per model and world: DDP allreduce's final
accuracy (the mean of its last three evaluations after 1,000 steps) minus 1 point, from a full DDP run kept in
DIR (rate `none`) or else in KEPT (pays.py's folder, the same runs and seed: bench.py's runs are
deterministic). Measured time to target = the run's training seconds (evaluations left out) at the first
evaluation on target. Predicted = pays.py's model for that cell: its step time at the link's nominal rate and
50 us latency on DIR/profile.json (a core per rank), over the steps the run itself needed (dense steps during
the warm-up). `auto` measures the network it runs on (AutoState with network=None) and decides after 20 dense
steps; its prediction is pays.py's choice at the nominal rate.
"""
import argparse
import csv
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "netcluster"))
import launch  # noqa: E402
from launch import rate_bits  # noqa: E402
KEPT = os.path.join(ROOT, "bench", "results", "where-compression-pays-2026-11-24")
SCHEMES = ["ddp", "fp16", "bf16", "powersgd-r1", "powersgd-r4", "topk-laplace-1e-3", "topk-laplace-1e-2",
           "commsgd-fp16", "commsgd-bf16", "auto"]
PYTORCH = ("ddp", "fp16", "bf16", "powersgd-r1", "powersgd-r4")
LATENCY = 50e-6  # pays.py's TCP latency
STEPS, EVALS_PER_EPOCH, GAP = 1000, 2, 0.01


def settings(world, data, stop_at=None):
    """bench.py's settings of pays.py's 1,000-step runs at `world` ranks (4,000 images a rank, 8 epochs)."""
    return argparse.Namespace(data=data, train=4000 * world, test=2000, epochs=8, batch=32, lr=0.05, momentum=0.9,
                              evals_per_epoch=EVALS_PER_EPOCH, seed=1, auto_network="measure", stop_at=stop_at)


# ---- one rank (run by netcluster inside the rank's namespace) ----------------------------------------------

def rank_main(args):
    import datetime as dt
    import torch
    import torch.distributed as dist
    sys.path.insert(0, HERE)
    import bench
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=600))
    t0 = time.perf_counter()
    out = bench.train(rank, world, settings(world, args.data, args.stop_at), args.model, args.scheme)
    out["wall_s"] = time.perf_counter() - t0
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out.update(model=args.model, scheme=args.scheme, world=world, stop_at=args.stop_at)
        with open(args.log, "w") as f:
            json.dump(compact(out), f)


def compact(run):
    """A run with only its evaluations' records kept and the steps' traffic summed (what report reads)."""
    recs = run["records"]
    if "steps" not in run:
        run = dict(run, steps=recs[-1]["step"],
                   **{f"{k}_total": sum(r[k] for r in recs) for k in ("bytes_sent", "bytes_received")})
    return dict(run, records=[r for r in recs if "acc" in r])


# ---- targets and curves -------------------------------------------------------------------------------------

def smoothed(records, width=3):
    evals = [r for r in records if "acc" in r]
    out = []
    for i, r in enumerate(evals):
        window = [e["acc"] for e in evals[max(0, i - width + 1):i + 1]]
        out.append((r["step"], sum(window) / len(window), r.get("train_s")))
    return out


def load(path):
    with open(path) as f:
        return json.load(f)


def target(out, kept, model, world):
    """DDP's final smoothed accuracy minus GAP: from a full DDP run in OUT on loopback, else the kept one."""
    for path in (os.path.join(out, f"w{world}", "none", f"{model}-ddp.json"),
                 os.path.join(kept, f"w{world}", model, "runs", f"{model}-ddp.json")):
        if os.path.exists(path):
            run = load(path)
            if not run.get("stopped"):
                return smoothed(run["records"])[-1][1] - GAP, path
    return None, None


# ---- run ----------------------------------------------------------------------------------------------------

def run(args):
    header = ["rate", "model", "scheme", "ranks", "tag", "exit", "wall_s", "load_before", "load_after", "command"]
    with launch.RunLog(args.out, header) as runs:
        for rate in args.rates.split(","):
            for model in args.models.split(","):
                for scheme in args.schemes.split(","):
                    stop = args.stop_at
                    if stop is None and not (rate == "none" and scheme == "ddp"):
                        stop, _ = target(args.out, args.accuracy, model, args.ranks)
                    folder = os.path.join(args.out, f"w{args.ranks}", rate + (f"-{args.repeat}" if args.repeat else ""))
                    os.makedirs(folder, exist_ok=True)
                    log = os.path.join(folder, f"{model}-{scheme}.json")
                    cmd = [args.python, os.path.abspath(__file__), "rank", "--model", model, "--scheme", scheme,
                           "--data", args.data, "--log", log]
                    if stop is not None:  # 0 stops at the first evaluation
                        cmd += ["--stop-at", f"{stop:.6f}"]
                    code, wall, before, after, command = launch.ranks(cmd, args.ranks, rate,
                                                                      label=f"{model} {scheme}")
                    runs.row([rate, model, scheme, args.ranks, args.repeat or "", code, wall, before, after, command])


# ---- profile ------------------------------------------------------------------------------------------------

def profile(args):
    sys.path.insert(0, HERE)
    import pays
    path = os.path.join(args.out, "profile.json")
    profs = load(path) if os.path.exists(path) else {}
    a = argparse.Namespace(data=args.data, batch=32, lr=0.05, momentum=0.9, seed=1)
    for m in args.models.split(","):
        t0 = time.time()
        profs[m] = pays.profile(a, m, pays.PYTORCH + pays.COMMSGD)
        print(f"{m}: profiled ({time.time() - t0:.0f} s)", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(profs, f, indent=1)


# ---- report -------------------------------------------------------------------------------------------------

def predicted(pays, profs, scheme, curve, goal, n, bandwidth, f=1.0):
    """pays.py's time to `goal` for `scheme` on this run's own curve, with every compute time scaled by `f`,
    and its auto choice."""
    choice = None
    name = scheme
    if scheme == "auto":
        choice = pays.auto_choice(profs, n, bandwidth, LATENCY, f)
        name = pays.AUTO_RUN[choice]
    if name not in profs:
        return None, choice
    dense = pays.step_seconds("ddp", profs, n, bandwidth, LATENCY, f)
    step = pays.step_seconds(name, profs, n, bandwidth, LATENCY, f)
    warmup = pays.warmup_of(name) if scheme != "auto" else (0 if choice == "dense" else 20)
    t, _ = pays.time_to([(s, acc) for s, acc, _ in curve], goal, step, dense if warmup else step, warmup)
    return t, choice


def auto_choice(run):
    log = run.get("auto_log") or []
    return log[-1]["choice"] if log and "choice" in log[-1] else None


def contention(pays, out, profs_all, model, n):
    """How much slower DDP's step is on loopback here (n ranks sharing the cores, gloo's copies) than the
    profile's step with a core per rank: the factor for the calibrated prediction, or None without the run."""
    path = os.path.join(out, f"w{n}", "none", f"{model}-ddp.json")
    if model not in profs_all or not os.path.exists(path):
        return None
    last = [r for r in load(path)["records"] if "train_s" in r][-1]
    return last["train_s"] / last["step"] / pays.step_seconds("ddp", profs_all[model], n, math.inf, LATENCY, 1.0)


def report(args):
    sys.path.insert(0, HERE)
    import pays
    path = os.path.join(args.out, "profile.json")
    profs_all = load(path) if os.path.exists(path) else {}
    if not profs_all:
        print(f"links.py: no {path} (run `profile` first): the model's predictions are left out", file=sys.stderr)
    rows = []
    for wdir in sorted(d for d in os.listdir(args.out) if d.startswith("w") and d[1:].isdigit()):
        n = int(wdir[1:])
        for rdir in sorted(os.listdir(os.path.join(args.out, wdir))):
            rate, _, tag = rdir.partition("-")
            for name in sorted(os.listdir(os.path.join(args.out, wdir, rdir))):
                model, scheme = name[:-len(".json")].split("-", 1)
                run = compact(load(os.path.join(args.out, wdir, rdir, name)))
                goal, source = target(args.out, args.accuracy, model, n)
                curve = smoothed(run["records"])
                hit = next(((s, t) for s, acc, t in curve if goal is not None and acc >= goal - 1e-12), None)
                bw = rate_bits(rate) / 8
                pred, pchoice = (predicted(pays, profs_all[model], scheme, curve, goal, n, bw)
                                 if model in profs_all and goal is not None else (None, None))
                f = contention(pays, args.out, profs_all, model, n)
                cal = (predicted(pays, profs_all[model], scheme, curve, goal, n, bw, f)[0]
                       if f and goal is not None else None)
                rows.append({
                    "ranks": n, "rate": rate, "repeat": tag, "model": model, "scheme": scheme,
                    "target": round(goal, 4) if goal is not None else None,
                    "target_from": os.path.relpath(source, ROOT) if source else None,
                    "step": hit[0] if hit else None, "measured_s": round(hit[1], 2) if hit else None,
                    "predicted_s": round(pred, 2) if pred is not None and hit else None,
                    "measured_over_predicted": round(hit[1] / pred, 2) if hit and pred else None,
                    "calibrated_s": round(cal, 2) if cal is not None and hit else None,
                    "measured_over_calibrated": round(hit[1] / cal, 2) if hit and cal else None,
                    "contention": round(f, 2) if f else None,
                    "steps_run": run["steps"], "train_s": round(curve[-1][2], 2),
                    "last_mean_acc": round(curve[-1][1], 4),
                    "bytes_sent_per_step": round(run["bytes_sent_total"] / run["steps"]),
                    "auto_choice": auto_choice(run) if scheme == "auto" else None,
                    "auto_model_choice": pchoice})
    by_cell = {}
    for r in rows:
        if not r["repeat"]:
            by_cell.setdefault((r["ranks"], r["rate"], r["model"]), {})[r["scheme"]] = r
    for r in rows:
        cell = by_cell.get((r["ranks"], r["rate"], r["model"]), {})
        ddp = cell.get("ddp", {}).get("measured_s")
        r["ddp_over_this"] = round(ddp / r["measured_s"], 2) if ddp and r["measured_s"] else None
    with open(os.path.join(args.out, "grid.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    md = tables(rows, by_cell)
    with open(os.path.join(args.out, "grid.md"), "w") as f:
        f.write(md)
    print(md)
    heatmap(args.out, by_cell)


def steps(args):
    pairs = [p.split(":") for p in args.pairs.split(",")]
    for wdir in sorted(d for d in os.listdir(args.out) if d.startswith("w") and d[1:].isdigit()):
        for rdir in sorted(os.listdir(os.path.join(args.out, wdir))):
            folder = os.path.join(args.out, wdir, rdir)
            models = sorted({n[:-len(".json")].split("-", 1)[0] for n in os.listdir(folder) if n.endswith(".json")})
            for model in models:
                for ref, ours in pairs:
                    paths = [os.path.join(folder, f"{model}-{s}.json") for s in (ref, ours)]
                    if not all(os.path.exists(x) for x in paths):
                        continue
                    runs = [compact(load(x)) for x in paths]
                    timed = [{r["step"]: r["train_s"] for r in run["records"] if "train_s" in r} for run in runs]
                    common = sorted(set(timed[0]) & set(timed[1]))
                    if not common:
                        continue
                    s = common[-1]
                    ms = [t[s] / s * 1e3 for t in timed]
                    per = [run["bytes_sent_total"] / run["steps"] for run in runs]
                    print(f"{wdir} {rdir} {model} {ref} {ms[0]:.2f} ms, {ours} {ms[1]:.2f} ms a step at step {s}: "
                          f"{ms[1] / ms[0]:.2f}x; bytes a step {per[0]:.0f}, {per[1]:.0f}")


def fmt(v, unit=""):
    return "not reached" if v is None else f"{v:.1f}{unit}"


def tables(rows, by_cell):
    schemes = [s for s in SCHEMES if any(s in c for c in by_cell.values())]
    lines = ["Measured time to target in seconds (in brackets: pays.py's model as it stands, a core per rank / "
             "the same model with compute scaled by DDP's measured loopback step here); `auto`: its choice on "
             "the measured network / the model's choice at the nominal rate.", "",
             "| ranks | rate | model | " + " | ".join(schemes) + " |",
             "|---|---|---|" + "---|" * len(schemes)]
    for (n, rate, model), cell in sorted(by_cell.items(), key=lambda kv: (kv[0][0], kv[0][2], rate_bits(kv[0][1]))):
        parts = []
        for s in schemes:
            r = cell.get(s)
            if r is None:
                parts.append("-")
                continue
            p = f" ({r['predicted_s']:.1f} / {r['calibrated_s']:.1f})" if r["calibrated_s"] is not None else (
                f" ({r['predicted_s']:.1f})" if r["predicted_s"] is not None else "")
            extra = f" {r['auto_choice']} / {r['auto_model_choice']}" if s == "auto" else ""
            parts.append(fmt(r["measured_s"]) + p + extra)
        lines.append(f"| {n} | {rate} | {model} | " + " | ".join(parts) + " |")
    reps = [r for r in rows if r["repeat"]]
    if reps:
        lines += ["", "Repeats (the same command again; first run's time beside it):", "",
                  "| ranks | rate | model | scheme | first (s) | repeat (s) | repeat / first |",
                  "|---|---|---|---|---|---|---|"]
        for r in reps:
            first = by_cell.get((r["ranks"], r["rate"], r["model"]), {}).get(r["scheme"], {}).get("measured_s")
            ratio = f"{r['measured_s'] / first:.2f}" if first and r["measured_s"] else "-"
            lines.append(f"| {r['ranks']} | {r['rate']} | {r['model']} | {r['scheme']} | {fmt(first)} | "
                         f"{fmt(r['measured_s'])} | {ratio} |")
    lines += ["", f"Goals (best = soonest on target; PyTorch: {', '.join(PYTORCH)}; commsgd: the rest but auto):", ""]
    for (n, rate, model), cell in sorted(by_cell.items(), key=lambda kv: (kv[0][0], kv[0][2], rate_bits(kv[0][1]))):
        def best(names):
            got = [(r["measured_s"], s) for s, r in cell.items() if s in names and r["measured_s"] is not None]
            return min(got) if got else (None, None)
        tp, sp = best(PYTORCH)
        tc, sc = best([s for s in cell if s not in PYTORCH and s != "auto"])
        ddp = cell.get("ddp", {}).get("measured_s")
        auto = cell.get("auto", {}).get("measured_s")
        if sp is None and sc is None:
            continue
        bits = [f"best PyTorch {sp or '-'} {fmt(tp, ' s')}", f"best commsgd {sc or '-'} {fmt(tc, ' s')}"]
        if tc and ddp:
            bits.append(f"DDP / best commsgd {ddp / tc:.2f}x")
        if tc and tp:
            bits.append(f"best PyTorch / best commsgd {tp / tc:.2f}x")
        if auto and tp:
            bits.append(f"auto / best PyTorch {auto / tp:.2f}")
        lines.append(f"- {n} ranks, {rate}, {model}: " + "; ".join(bits))
    return "\n".join(lines) + "\n"


def heatmap(out, by_cell):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"links.py: no heat map ({e})", file=sys.stderr)
        return
    groups = sorted({(n, m) for n, _, m in by_cell})
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.8), squeeze=False)
    for ax, (n, m) in zip(axes[0], groups):
        rates = sorted({r for nn, r, mm in by_cell if (nn, mm) == (n, m)}, key=rate_bits)
        schemes = [s for s in SCHEMES if any(s in by_cell[(n, r, m)] for r in rates)]
        val = [[None] * len(rates) for _ in schemes]
        for j, rate in enumerate(rates):
            cell = by_cell[(n, rate, m)]
            ddp = cell.get("ddp", {}).get("measured_s")
            for i, s in enumerate(schemes):
                r = cell.get(s)
                if r and r["measured_s"] and ddp:
                    val[i][j] = ddp / r["measured_s"]
        grid = [[math.log2(v) if v else float("nan") for v in row] for row in val]
        ax.imshow(grid, cmap="RdYlGn", vmin=-3, vmax=3, aspect="auto")
        for i, s in enumerate(schemes):
            for j, rate in enumerate(rates):
                r = by_cell[(n, rate, m)].get(s)
                if r is None:
                    continue
                if r["measured_s"] is None:
                    txt = "not\nreached"
                else:
                    txt = (f"{val[i][j]:.2f}x\n" if val[i][j] else "") + f"{r['measured_s']:.0f} s"
                if r["predicted_s"] is not None:
                    txt += f"\n({r['predicted_s']:.0f}" + (f"/{r['calibrated_s']:.0f})" if r["calibrated_s"] else ")")
                ax.text(j, i, txt, ha="center", va="center", fontsize=6.5)
        ax.set_xticks(range(len(rates)), rates)
        ax.set_yticks(range(len(schemes)), schemes, fontsize=7)
        ax.set_title(f"{m}, {n} ranks: DDP's time / this", fontsize=9)
    fig.suptitle("Time to DDP's final accuracy - 1 point on emulated links: DDP's time / this, measured s, "
                 "(model / calibrated model)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "grid.png"), dpi=130)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    data = "/usr/share/datasets/fashion-mnist"
    r = sub.add_parser("rank", help="one rank (netcluster runs it in the rank's namespace)")
    r.add_argument("--model", required=True)
    r.add_argument("--scheme", required=True)
    r.add_argument("--log", required=True)
    r.add_argument("--data", default=data)
    r.add_argument("--stop-at", type=float)
    q = sub.add_parser("run")
    q.add_argument("--out", required=True)
    q.add_argument("--rates", required=True)
    q.add_argument("--models", default="mlp,cnn,wide")
    q.add_argument("--schemes", default=",".join(SCHEMES))
    q.add_argument("--ranks", type=int, default=4)
    q.add_argument("--python", default=sys.executable)
    q.add_argument("--data", default=data)
    q.add_argument("--accuracy", default=KEPT, help="pays.py's folder, for targets not measured in OUT")
    q.add_argument("--stop-at", type=float, help="accuracy to stop at (default: the report's target)")
    q.add_argument("--repeat", help="a tag: keep this run beside the first as a repeat")
    f = sub.add_parser("profile")
    f.add_argument("--out", required=True)
    f.add_argument("--models", default="mlp,cnn,wide")
    f.add_argument("--data", default=data)
    g = sub.add_parser("report")
    g.add_argument("--out", required=True)
    g.add_argument("--accuracy", default=KEPT)
    h = sub.add_parser("steps")
    h.add_argument("--out", required=True)
    h.add_argument("--pairs", default="fp16:commsgd-fp16,bf16:commsgd-bf16")
    args = p.parse_args()
    {"rank": rank_main, "run": run, "profile": profile, "report": report, "steps": steps}[args.cmd](args)


if __name__ == "__main__":
    main()
