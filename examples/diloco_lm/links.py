"""The language-model head-to-head on emulated links: every arm of train.py run on a netcluster of shaped
links (real TCP at a set rate), then one table of time to target, bytes and peak exchange per arm and rate,
and a plot of validation loss against training time.

    sudo python3 examples/diloco_lm/links.py run --out DIR --rates 100mbit,1gbit --arms ddp,diloco-h30 \\
        [--ranks 4] [--python PY] [--local-steps N] -- [train.py options: --steps 1000 --width 64 ...]
    python3 examples/diloco_lm/links.py report --out DIR [--md FILE] [--plot FILE]
    python3 examples/diloco_lm/links.py repeats --out DIR1 DIR2 ... --target LOSS [--md FILE]

`run` starts one cluster per (rate, arm) with `tools/netcluster/netcluster exec` (so nothing is left behind,
whatever happens), one thread per rank, and writes DIR/<rate>/<arm>.jsonl (train.py's log) beside
DIR/runs.csv (the command, its wall time and the load average before and after). The rate `none` runs the
ranks on plain loopback instead: no shaping, the network as fast as this machine's copies, which is the
compute-only reference (the same steps, no exchange charged by a link).

`report` takes the target from DDP's final validation loss (+1 %), at the rate given by `--target-rate`
(default: the first DDP log found), and gives for each run: the first logged training time (`train_s`:
steps only, evaluations left out) at which the validation loss is at or below the target, the same for the
unshaped run of that arm, their ratio, the bytes rank 0 sent, and the busiest exchange (for DiLoCo, one
fragment's bytes).

`repeats` takes several `run --out` folders (repeats of the same grid) and gives each (rate, arm)'s time to
`--target` as median, min and max, with the step each run reached it at; a run that exited non-zero is listed
apart and never used.
"""
import argparse
import csv
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "netcluster"))
import launch  # noqa: E402
from launch import rate_bits  # noqa: E402

# name -> train.py options. DiLoCo's H is in the name, then its code (commsgd_torch.DiLoCo's compression,
# "topk-0.03" as "topk0.03"); "stream" adds P fragments with a delay and a merge.
ARMS = {
    "ddp": ["--arm", "ddp"],
    "fsdp": ["--arm", "fsdp"],
    "fsdp-rs-int8": ["--arm", "fsdp", "--reduce-scatter", "int8"],
    "fsdp-rs-e3m0": ["--arm", "fsdp", "--reduce-scatter", "e3m0"],
    "fsdp-rs-fp16": ["--arm", "fsdp", "--reduce-scatter", "fp16"],
    "fsdp-rs-bf16": ["--arm", "fsdp", "--reduce-scatter", "bf16"],
    "hsdp": ["--arm", "hsdp"],  # with --replica-ranks after `--` (and the cluster's --groups to match)
    "hsdp-fp16": ["--arm", "hsdp", "--replicate", "fp16"],
    "hsdp-powersgd": ["--arm", "hsdp", "--replicate", "powersgd", "--psgd-rank", "4"],
    "hsdp-topk": ["--arm", "hsdp", "--replicate", "topk", "--density", "0.01"],
    "hsdp-auto": ["--arm", "hsdp", "--replicate", "auto", "--psgd-rank", "4"],
    "ddp-powersgd": ["--arm", "ddp-powersgd", "--psgd-rank", "4"],
    "ddp-topk": ["--arm", "ddp-topk", "--density", "0.01"],
    "postlocal-h30": ["--arm", "postlocal", "--sync-every", "30"],
}
for h in (10, 30, 100, 300):
    base = ["--arm", "diloco", "--sync-every", str(h)]
    ARMS[f"diloco-h{h}"] = base
    for c in ("fp16", "int8", "e3m0", "topk-0.03"):
        ARMS[f"diloco-h{h}-{c.replace('-', '')}"] = base + ["--compression", c]
    ARMS[f"diloco-h{h}-stream"] = base + ["--fragments", "2", "--delay", str(max(1, h // 6)), "--alpha", "0.5"]
    ARMS[f"diloco-h{h}-stream-e3m0"] = ARMS[f"diloco-h{h}-stream"] + ["--compression", "e3m0"]
    ARMS[f"torchft-diloco-h{h}"] = ["--arm", "torchft-diloco", "--sync-every", str(h)]
    ARMS[f"torchft-diloco-h{h}-stream"] = ARMS[f"torchft-diloco-h{h}"] + ARMS[f"diloco-h{h}-stream"][4:]
    # SparseLoCo's recipe: top-k per chunk of 4096 with 2-bit values, the residual decayed by 0.95 each round
    # in place of the outer momentum (plain outer SGD, lr 1); "-b<decay>" in the name overrides the decay;
    # "-senders" takes each value's mean over the ranks that sent it (the code's -senders part).
    for d in ("0.01", "0.03"):
        for decay in ("0.95", "0.9", "0.99"):
            for senders in ("", "-senders"):
                tail = ("" if decay == "0.95" else f"-b{decay}") + senders
                sparse = ["--compression", f"topk-{d}-c4096-2bit-b{decay}{senders}", "--outer-lr", "1",
                          "--outer-momentum", "0"]
                ARMS[f"diloco-h{h}-sparse{d}{tail}"] = base + sparse
                ARMS[f"diloco-h{h}-stream-sparse{d}{tail}"] = ARMS[f"diloco-h{h}-stream"] + sparse
        # One set of indices for every rank (each chunk's from a leader that rotates), summed by a bf16 ring:
        # the same chunks, decay and plain outer step, no 2-bit values.
        shared = ["--compression", f"topk-{d}-c4096-b0.95-shared", "--outer-lr", "1", "--outer-momentum", "0"]
        ARMS[f"diloco-h{h}-shared{d}"] = base + shared
        ARMS[f"diloco-h{h}-stream-shared{d}"] = ARMS[f"diloco-h{h}-stream"] + shared
        # Each rank's own top-k summed by each chunk's owner, the senders' means cut to k (Ok-Topk's regions).
        regions = ["--compression", f"topk-{d}-c4096-b0.95-regions", "--outer-lr", "1", "--outer-momentum", "0"]
        ARMS[f"diloco-h{h}-regions{d}"] = base + regions
        ARMS[f"diloco-h{h}-stream-regions{d}"] = ARMS[f"diloco-h{h}-stream"] + regions

# Arms that older runs logged (bench/results/diloco-lm-*-2026-11-26) and `report` still reads, with the options
# they ran with; `run` refuses them. "fp4" was commsgd_torch's 4-bit code before the C++ engine: E3M0 rounded
# to the nearest power of two in log2 terms; "e3m0" rounds to the nearest in linear terms.
RETIRED = {}
for h in (10, 30, 100):
    RETIRED[f"diloco-h{h}-fp4"] = ["--arm", "diloco", "--sync-every", str(h), "--compression", "fp4"]
    RETIRED[f"diloco-h{h}-stream-fp4"] = ARMS[f"diloco-h{h}-stream"] + ["--compression", "fp4"]


# train.py's arms that exchange only every H steps: `run --local-steps` gives them a longer run (the same token
# stream, continued; the schedule stretched to it) so that they can reach DDP's final loss if they need more
# steps than DDP does. The time to the target charges them every extra step.
LOCAL_STEP_ARMS = ("diloco", "postlocal", "torchft-diloco")


def arm_options(name, retired=False):
    """train.py options of an arm: a name from ARMS (or, with `retired`, from RETIRED: an old log's), optionally
    followed by overrides of train.py options, `+option=value` each (`diloco-h30+outer-lr=1+outer-momentum=0`
    is DiLoCo at H = 30 with plain averaging)."""
    base, *extra = name.split("+")
    if base in RETIRED and retired:
        opts = list(RETIRED[base])
    elif base in RETIRED:
        raise SystemExit(f"links.py: arm '{base}' is retired (its code 'fp4' is gone); "
                         f"use '{base.replace('fp4', 'e3m0')}'")
    elif base not in ARMS:
        raise SystemExit(f"links.py: unknown arm '{base}' (known: {', '.join(ARMS)})")
    else:
        opts = list(ARMS[base])
    for e in extra:
        key, sep, value = e.partition("=")
        if not sep or not key:
            raise SystemExit(f"links.py: arm '{name}': override '{e}' is not option=value")
        opts += [f"--{key}", value]
    return opts


def run(args, train_args):
    header = ["rate", "arm", "ranks", "exit", "wall_s", "load_before", "load_after", "command"]
    with launch.RunLog(args.out, header) as runs:
        for rate in args.rates.split(","):
            for arm in args.arms.split(","):
                opts = arm_options(arm)
                log = os.path.join(args.out, rate, f"{arm}.jsonl")
                os.makedirs(os.path.dirname(log), exist_ok=True)
                train = [args.python, os.path.join(HERE, "train.py")] + opts + train_args + ["--log", log]
                if args.local_steps and opts[1] in LOCAL_STEP_ARMS:
                    train += ["--steps", str(args.local_steps)]  # argparse keeps the last --steps
                out = subprocess.DEVNULL if args.quiet else None
                groups = [] if args.group_size == 1 else ["--groups", str(args.ranks // args.group_size),
                                                          "--group-rate", args.group_rate]
                code, wall, before, after, command = launch.ranks(train, args.ranks, rate, args.port, arm, stdout=out,
                                                                  cluster=groups)
                runs.row([rate, arm, args.ranks, code, wall, before, after, command])


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def is_rate(name):
    """Whether a folder of `run --out` is a rate's (others, a repeat's say, may sit beside them)."""
    try:
        rate_bits(name)
        return True
    except ValueError:
        return False


def time_to(records, target):
    """(train_s, step, bytes sent) at the first evaluation at or below `target`, or Nones."""
    for r in records:
        if r["val_loss"] <= target:
            return r["train_s"], r["step"], r["bytes_sent"]
    return None, None, None


def exchanges(arm_opts, last):
    """How many exchanges the arm made up to its `last` log record: DiLoCo's own count where train.py logged
    it; else (other arms, and DiLoCo's logs from before 2026-11-27, whose finish() exchanged every fragment
    once more at the run's last step) from the schedule."""
    if last.get("exchanges") is not None:
        return last["exchanges"]
    opts = dict(zip(arm_opts[::2], arm_opts[1::2]))
    steps = last["step"]
    if opts["--arm"] not in ("diloco", "torchft-diloco"):
        return steps
    h, p = int(opts["--sync-every"]), int(opts.get("--fragments", 1))
    if opts["--arm"] == "torchft-diloco":
        return steps // (h // p)  # one fragment every H / P steps, nothing at the end
    finished = steps == last.get("of", steps)
    return p * (steps // h) + (p if finished else 0)


def report(args):
    logs = {}
    rates = [r for r in os.listdir(args.out) if os.path.isdir(os.path.join(args.out, r)) and is_rate(r)]
    for rate in sorted(rates, key=rate_bits):
        d = os.path.join(args.out, rate)
        for name in sorted(os.listdir(d)):
            if name.endswith(".jsonl"):
                recs = read_log(os.path.join(d, name))
                if recs:
                    logs[(rate, name[:-len(".jsonl")])] = recs
    ddp = [(rate, recs) for (rate, arm), recs in logs.items() if arm == "ddp"]
    if args.target_rate:
        ddp = [(r, recs) for r, recs in ddp if r == args.target_rate]
    if not ddp:
        raise SystemExit("links.py report: no DDP log to take the target from")
    target_rate, ddp_recs = ddp[0]
    final = ddp_recs[-1]["val_loss"]
    target = final * 1.01
    lines = [f"Target: DDP's final validation loss {final:.4f} nats/byte (the {target_rate} run, step "
             f"{ddp_recs[-1]['step']}) + 1 % = **{target:.4f}**. Bytes are rank 0's, sent until the target was "
             "reached (in the whole run where it was not). The compute-only reference is the same arm's run on "
             "loopback (the network unshaped; its exchanges still cost copies and CPU, as they do on a link).",
             "",
             "| rate | arm | time to target (s) | step | loopback time to target (s) | ratio | "
             "last val loss (step) | MB sent | DDP's bytes / these | busiest exchange (MB) | train time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ddp_to = {rate: time_to(recs, target)[2] for (rate, arm), recs in logs.items() if arm == "ddp"}
    for (rate, arm), recs in sorted(logs.items(), key=lambda kv: (rate_bits(kv[0][0]), kv[0][1])):
        t, step, sent_to = time_to(recs, target)
        ref = logs.get(("none", arm))
        t0 = time_to(ref, target)[0] if ref else None
        last = recs[-1]
        sent = sent_to if sent_to is not None else last["bytes_sent"]
        # The busiest exchange is known from the totals only where every exchange has the same size.
        even = arm == "ddp" or "diloco" in arm
        n_ex = exchanges(arm_options(arm, retired=True), last) if even else None
        busiest = last["bytes_sent"] / n_ex if last["bytes_sent"] and n_ex else None
        ref_bytes = ddp_to.get(rate) or next((b for b in ddp_to.values() if b), None)
        lines.append("| {} | {} | {} | {} | {} | {} | {:.4f} ({}) | {} | {} | {} | {:.1f} |".format(
            rate, arm, f"{t:.1f}" if t is not None else "not reached", step if step else "-",
            f"{t0:.1f}" if t0 is not None else "-",
            f"{t / t0:.2f}" if t is not None and t0 else "-", last["val_loss"], last["step"],
            f"{sent / 1e6:.2f}" if sent is not None else "-",
            f"{ref_bytes / sent:.0f}x" if sent and ref_bytes else "-",
            f"{busiest / 1e6:.3f}" if busiest is not None else "-", last["train_s"]))
    text = "\n".join(lines) + "\n"
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    print(text)
    if args.plot:
        plot(logs, target, args.plot)


def plot(logs, target, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    rates = sorted({rate for rate, _ in logs}, key=rate_bits)
    fig, axes = plt.subplots(1, len(rates), figsize=(5.5 * len(rates), 4.5), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for (r, arm), recs in sorted(logs.items()):
            if r != rate:
                continue
            ax.plot([x["train_s"] for x in recs], [x["val_loss"] for x in recs], label=arm,
                    linestyle="-" if arm.startswith("diloco") else "--")
        ax.axhline(target, color="grey", linewidth=0.8)
        ax.set_title(f"4 ranks, {rate}" if rate != "none" else "unshaped (loopback)")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("validation loss (nats/byte)")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # a short axis labels every minor tick
        ax.set_ylim(target - 0.1, 3.6)  # the first evaluations, before training settles, squash the rest
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def repeats(args):
    """Time to `--target` over repeats (one `run --out` folder each): min, median and max per (rate, arm), the
    step each reached it at, and the runs that exited non-zero (reported, never used)."""
    import statistics
    times, steps, crashed, missed, curves = {}, {}, [], {}, {}
    for folder in args.out:
        failed = set()
        runs_csv = os.path.join(folder, "runs.csv")
        if os.path.exists(runs_csv):
            with open(runs_csv) as f:
                for row in csv.DictReader(f):
                    if row["exit"] != "0":
                        failed.add((row["rate"], row["arm"]))
                        crashed.append(f"{folder}: {row['rate']} {row['arm']} exited {row['exit']}")
        for rate in os.listdir(folder):
            d = os.path.join(folder, rate)
            if not (os.path.isdir(d) and is_rate(rate)):
                continue
            for name in os.listdir(d):
                arm = name[:-len(".jsonl")]
                if not name.endswith(".jsonl") or (rate, arm) in failed:
                    continue
                recs = read_log(os.path.join(d, name))
                t, step, _ = time_to(recs, args.target)
                curves.setdefault((rate, arm), []).append((t if t is not None else float("inf"), recs))
                if t is None:
                    missed[(rate, arm)] = missed.get((rate, arm), 0) + 1
                    continue
                times.setdefault((rate, arm), []).append(t)
                steps.setdefault((rate, arm), []).append(step)
    lines = [f"Time to validation loss {args.target} (train_s at the first evaluation at or below it), over "
             f"{len(args.out)} repeats.", "",
             "| rate | arm | runs | time to target (s): median (min, max) | steps (each run) | not reached |",
             "|---|---|---|---|---|---|"]
    for key in sorted(set(times) | set(missed), key=lambda k: (rate_bits(k[0]), k[1])):
        t = times.get(key, [])
        cell = f"{statistics.median(t):.1f} ({min(t):.1f}, {max(t):.1f})" if t else "-"
        lines.append(f"| {key[0]} | {key[1]} | {len(t)} | {cell} | {', '.join(map(str, steps.get(key, [])))} | "
                     f"{missed.get(key, 0)} |")
    if crashed:
        lines += ["", "Crashed (not used): " + "; ".join(crashed)]
    text = "\n".join(lines) + "\n"
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    print(text)
    if args.plot:
        # Each (rate, arm)'s median run by time to the target (the lower middle of an even count).
        median_runs = {key: sorted(runs, key=lambda r: r[0])[(len(runs) - 1) // 2][1]
                       for key, runs in curves.items()}
        plot(median_runs, args.target, args.plot)


def main(argv):
    train_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, train_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--rates", default="100mbit")
    r.add_argument("--arms", default="ddp,diloco-h30")
    r.add_argument("--ranks", type=int, default=4)
    r.add_argument("--python", default=sys.executable)
    r.add_argument("--quiet", action="store_true", help="no training output on the terminal")
    r.add_argument("--port", type=int, default=None,
                   help="the ranks' rendezvous port on loopback (default: a free one for each arm)")
    r.add_argument("--group-rate", default=None,
                   help="with --group-size: the rate among the ranks of a group (netcluster --groups), the rate "
                        "of --rates everywhere else")
    r.add_argument("--group-size", type=int, default=1,
                   help="consecutive ranks a group (a node, or a replica of train.py --replica-ranks)")
    r.add_argument("--local-steps", type=int, default=0,
                   help=f"--steps for the local-step arms ({', '.join(LOCAL_STEP_ARMS)}); default: train.py's "
                        "--steps")
    q = sub.add_parser("report")
    q.add_argument("--out", required=True)
    q.add_argument("--md")
    q.add_argument("--plot")
    q.add_argument("--target-rate")
    m = sub.add_parser("repeats", help="time to a target over repeats: min, median, max")
    m.add_argument("--out", required=True, nargs="+")
    m.add_argument("--target", required=True, type=float)
    m.add_argument("--md")
    m.add_argument("--plot", help="validation loss against training time, each rate and arm's median run")
    args = p.parse_args(argv)
    if args.cmd == "run":
        run(args, train_args)
    elif args.cmd == "repeats":
        repeats(args)
    else:
        report(args)


if __name__ == "__main__":
    main(sys.argv[1:])
