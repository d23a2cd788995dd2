"""Stragglers and faults on real links: fashion_mnist_stragglers_mpi on the emulated cluster (needs root).

    python3 examples/fashion_mnist/stragglers_links.py grid  --bin BUILD/examples/fashion_mnist --out OUT
    python3 examples/fashion_mnist/stragglers_links.py fault --bin BUILD/examples/fashion_mnist --out OUT
    python3 examples/fashion_mnist/stragglers_links.py report OUT > table.md

`grid` runs every scheme (ring SSGD, backup workers, fractional-repetition and cyclic gradient codes) against
every straggler: none, one rank computing 4x slower, one rank whose upload is 100x slower than the others'
(a slow port: its gradients leave late), and one rank slow both ways (the sum reaches it late too). One
`netcluster exec` cluster per run, so no run inherits another's queues. `fault` pulls one rank's cable in the
middle of a run (`netcluster port K down`), records when and how every rank fails, plugs it back in, resumes
the run from its last checkpoint and compares the final model with an uninterrupted run's, bit for bit.
"""
import argparse
import csv
import glob
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "netcluster"))
from launch import NETCLUSTER, RunLog, loadavg, netcluster  # noqa: E402
SCHEMES = ("ring", "backup", "gc_fr", "gc_cyclic")
# name: (netcluster up options, program options); rank 3 of 4 is the straggler.
STRAGGLERS = {
    "none": ([], []),
    "slow compute 4x": ([], ["--slow-rank", "3", "--slow-factor", "4"]),
    "slow upload 10 Mbit/s": (["--up-rate", "3=10mbit"], []),
    "slow port 10 Mbit/s both ways": (["--port-rate", "3=10mbit"], []),
}


def program(args, scheme, extra, out, tag):
    return [os.path.join(args.bin, "fashion_mnist_stragglers_mpi"), "--scheme", scheme, "--r", "2",
            "--steps", str(args.steps), "--eval-every", "10", "--timeout-s", str(args.timeout_s),
            "--csv", os.path.join(out, f"{tag}.csv"), "--log", os.path.join(out, f"{tag}.rank%r.log")] + extra


def grid(args):
    header = ["straggler", "scheme", "repeat", "rate", "exit", "wall_s", "load_before", "tag"]
    with RunLog(args.out, header) as runs:
        chosen = [x for x in STRAGGLERS if not args.stragglers or x in args.stragglers.split(",")]
        for repeat in range(args.first_repeat, args.first_repeat + args.repeats):
            for name in chosen:
                up, extra = STRAGGLERS[name]
                for scheme in args.schemes.split(","):
                    tag = f"{re.sub('[^a-z0-9]+', '_', name.lower())}-{scheme}-{repeat}"
                    cmd = [NETCLUSTER, "exec", "-n", str(args.ranks), "--rate", args.rate] + up + [
                        "mpirun", "--", "-np", str(args.ranks)] + program(args, scheme, extra, args.out, tag)
                    load = loadavg()
                    t0 = time.monotonic()
                    print("==", " ".join(cmd), flush=True)
                    with open(os.path.join(args.out, f"{tag}.out"), "w") as log:
                        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
                    runs.row([name, scheme, repeat, args.rate, code, round(time.monotonic() - t0, 1), load, tag])


def last_step(folder, ranks):
    """The newest step for which every rank has written its checkpoint."""
    steps = []
    for r in range(ranks):
        mine = [int(m.group(1)) for p in glob.glob(os.path.join(folder, f"rank{r}-step*.bin"))
                if (m := re.search(r"step(\d+)\.bin$", p))]
        steps.append(max(mine, default=0))
    return min(steps)


def endings(out, tag, ranks):
    """Per rank that has ended: its `failed: ...` line, or `finished` (all steps and finish() done)."""
    found = {}
    for r in range(ranks):
        path = os.path.join(out, f"{tag}.rank{r}.log")
        if not os.path.exists(path):
            continue
        for line in open(path):
            text = line.partition(" ")[2].strip()
            if text.startswith("failed:") or text == "finished":
                found[r] = text
    return found


def model_hash(out, tag):
    path = os.path.join(out, f"{tag}.rank0.log")
    if not os.path.exists(path):
        return None
    m = re.findall(r"model hash ([0-9a-f]+)", open(path).read())
    return m[-1] if m else None


def fault(args):
    os.makedirs(args.out, exist_ok=True)
    results = []
    for scheme, port in [tuple(x.split(":")) for x in args.cases.split(",")]:
        port = int(port)
        name = f"flt{os.getpid() % 1000}"
        base = f"{scheme}-port{port}"
        ckpt = os.path.join(args.out, f"{base}-ckpt")
        subprocess.run(["rm", "-rf", ckpt], check=True)
        res = {"scheme": scheme, "port": port, "timeout_s": args.timeout_s, "ranks": args.ranks}
        netcluster("up", "-n", args.ranks, "--name", name, "--rate", args.rate)
        try:
            mpirun = [NETCLUSTER, "mpirun", "--name", name, "--", "-np", str(args.ranks)]
            # The uninterrupted reference.
            with open(os.path.join(args.out, f"{base}-reference.out"), "w") as log:
                subprocess.call(mpirun + program(args, scheme, [], args.out, f"{base}-reference"), stdout=log,
                                stderr=subprocess.STDOUT, timeout=600)
            res["reference_hash"] = model_hash(args.out, f"{base}-reference")
            # The faulted run: the cable is pulled once every rank has checkpointed step cut_at.
            tag = f"{base}-faulted"
            extra = ["--checkpoint", ckpt, "--checkpoint-every", "10"]
            log = open(os.path.join(args.out, f"{tag}.out"), "w")
            proc = subprocess.Popen(mpirun + program(args, scheme, extra, args.out, tag), stdout=log,
                                    stderr=subprocess.STDOUT)
            while last_step(ckpt, args.ranks) < args.cut_at and proc.poll() is None:
                time.sleep(0.05)
            netcluster("port", "--name", name, port, "down")
            down_at = time.monotonic()
            res["checkpoint_at_cut"] = last_step(ckpt, args.ranks)
            # Every rank's own log says when it ended (a rank cut off cannot tell mpirun), so the driver
            # times each ending as it appears there. A rank that neither fails nor finishes within the guard
            # hangs. mpirun itself waits for the cut rank's daemon, so it ends only once the cable is back.
            seen, guard = {}, args.timeout_s * 4 + 30
            while len(seen) < args.ranks and time.monotonic() - down_at < guard:
                for r, text in endings(args.out, tag, args.ranks).items():
                    seen.setdefault(r, (round(time.monotonic() - down_at, 2), text))
                time.sleep(0.05)
            res["ranks"] = {str(r): {"after_s": s, "ending": text[:400]} for r, (s, text) in sorted(seen.items())}
            res["no_hang"] = len(seen) == args.ranks
            netcluster("port", "--name", name, port, "up")
            try:
                res["mpirun_exit"] = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                res["mpirun_exit"] = "killed after 60 s"
            log.close()
            res["faulted_hash"] = model_hash(args.out, tag)
            # Resume from the newest step every rank saved.
            tag = f"{base}-resumed"
            res["resumed_from"] = last_step(ckpt, args.ranks)
            with open(os.path.join(args.out, f"{tag}.out"), "w") as log:
                res["resumed_exit"] = subprocess.call(
                    mpirun + program(args, scheme, extra + ["--resume"], args.out, tag), stdout=log,
                    stderr=subprocess.STDOUT, timeout=600)
            res["resumed_hash"] = model_hash(args.out, tag)
            res["bit_exact"] = res["resumed_hash"] is not None and res["resumed_hash"] == res["reference_hash"]
        finally:
            netcluster("down", "--name", name, check=False)
        print(json.dumps(res), flush=True)
        results.append(res)
    with open(os.path.join(args.out, "faults.json"), "a") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")


def report(args):
    rows = list(csv.DictReader(open(os.path.join(args.out, "runs.csv"))))
    cells = {}
    for row in rows:
        curve = list(csv.DictReader(open(os.path.join(args.out, row["tag"] + ".csv"))))
        reached = next((float(p["train_s"]) for p in curve if float(p["accuracy"]) >= args.target), None)
        step = next((int(p["step"]) for p in curve if float(p["accuracy"]) >= args.target), None)
        last = curve[-1] if curve else None
        cells.setdefault((row["straggler"], row["scheme"]), []).append(
            (reached, step, float(last["train_s"]) / int(last["step"]) * 1e3 if last else None,
             float(last["accuracy"]) if last else None, float(last["mb_sent"]) if last else None,
             float(last["mb_received"]) if last else None, row["exit"]))
    print(f"| straggler | scheme | time to {args.target} (s) | repeats | vs ring | vs backup | steps | ms/step "
          "| rank 0 MB sent / received | final acc |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for straggler in STRAGGLERS:
        first = {s: cells.get((straggler, s), [(None,) * 7])[0] for s in SCHEMES}
        for s in SCHEMES:
            runs = cells.get((straggler, s))
            if not runs:
                continue
            t, step, ms, acc, sent, recv, code = runs[0]
            rep = ", ".join(f"{r[0]:.2f}" if r[0] else "-" for r in runs[1:])
            ratio = lambda ref: f"{ref / t:.2f}x" if t and ref else "-"
            print(f"| {straggler} | {s} | {f'{t:.2f}' if t else 'not reached'} | {rep} | {ratio(first['ring'][0])} "
                  f"| {ratio(first['backup'][0])} | {step or '-'} | {ms:.1f} | {sent:.0f} / {recv:.0f} | {acc:.4f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("grid", "fault"):
        q = sub.add_parser(name)
        q.add_argument("--bin", required=True, help="the folder holding fashion_mnist_stragglers_mpi")
        q.add_argument("--out", required=True)
        q.add_argument("--ranks", type=int, default=4)
        q.add_argument("--rate", default="1gbit")
        q.add_argument("--steps", type=int, default=150)
        q.add_argument("--timeout-s", type=float, default=10.0)
    sub.choices["grid"].add_argument("--schemes", default=",".join(SCHEMES))
    sub.choices["grid"].add_argument("--repeats", type=int, default=1)
    sub.choices["grid"].add_argument("--first-repeat", type=int, default=0,
                                     help="the repeat index of the first pass (to add repeats to a folder)")
    sub.choices["grid"].add_argument("--stragglers", default="",
                                     help="comma-separated names from STRAGGLERS (default: all)")
    sub.choices["fault"].add_argument("--cases", default="ring:2,gc_fr:2,gc_fr:0",
                                      help="scheme:rank whose port is pulled, comma separated")
    sub.choices["fault"].add_argument("--cut-at", type=int, default=50, help="pull once this step is saved")
    q = sub.add_parser("report")
    q.add_argument("out")
    q.add_argument("--target", type=float, default=0.75)
    args = p.parse_args()
    {"grid": grid, "fault": fault, "report": report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
