"""The failure study: every arm of train_ft.py meets the same faults at the same inner steps, with and without
them, repeated, at each link rate of the emulated cluster, and one table and plot a rate from ft_report.py.
A run already done (its folder holds done.json) is not run again, so the study can be run in parts, each part
alone on the machine (a run is a timed measurement).

    sudo python3 examples/diloco_lm/ft_study.py --out DIR --python PY [--rates 100mbit 10mbit]
        [--arms commsgd commsgd-streamed torchft-streamed ckpt] [--repeats 3] [--steps 9000]
        [--only RATE/ARM/faults-r1 ...] [--dry-run] [--report]

Folders: DIR/<rate>/<arm>/<faults|clean>-r<k>/ with run.rank<R>.jsonl (train_ft.py's logs), events.jsonl
(faults.py's; also for a clean run, which has no faults but the same driver), out.log and done.json (the
command, exit code, wall seconds and the machine's load before and after). --report writes DIR/<rate>.md and
DIR/<rate>.png from every finished run (ft_report.py: goodput, resilience against the arm's own clean run of
the same repeat, rounds to return, agreement).

The schedule (the issue's: a kill a minute, a restart 10 s later, one 30 s pulled cable) is in inner steps, so
that every arm meets it whole however fast it trains: rank 3 killed at step --kill-every and every
--kill-every steps after, up to --steps minus one kill's worth, restarted --restart-after seconds later; rank
2's cable pulled at --cable-at for --cable-for seconds. At 30 steps a second (a fault-free replica of this
model at 100 Mbit/s), 1,800 steps are a minute.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "netcluster"))
import launch  # noqa: E402

# Each arm's train_ft.py options at its best (the shipped defaults otherwise): float32 pseudo-gradients on
# every arm (torchft's DiLoCo quantises only on a GPU), H = 30, the streamed arms with 2 fragments and a delay
# of 5 steps; ours keeps the delay's steps whole (keep_delay_steps), torchft merges with its alpha 0.
ARMS = {
    "commsgd": ["--arm", "ft-diloco", "--compression", "dense"],
    "commsgd-streamed": ["--arm", "ft-diloco", "--compression", "dense", "--fragments", "2", "--delay", "5",
                         "--keep-delay-steps", "1"],
    "torchft": ["--arm", "torchft-diloco"],
    "torchft-streamed": ["--arm", "torchft-diloco", "--fragments", "2", "--delay", "5"],
    "ckpt": ["--arm", "ckpt-diloco", "--compression", "dense"],
    # train_ft.py's default code for the checkpoint-restart arm, 4-bit: fewer bytes than the others', so its
    # goodput is not theirs to compare with; kept for the runs made so.
    "ckpt-e3m0": ["--arm", "ckpt-diloco", "--compression", "e3m0"],
}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter with torch, torchft, commsgd_torch (and matplotlib, for --report)")
    p.add_argument("--rates", nargs="+", default=["100mbit", "10mbit"])
    p.add_argument("--arms", nargs="+", default=["commsgd", "commsgd-streamed", "torchft-streamed", "ckpt"],
                   choices=sorted(ARMS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=9000)
    p.add_argument("--kill-every", type=int, default=1800)
    p.add_argument("--restart-after", type=float, default=10.0)
    p.add_argument("--cable-at", type=int, default=2700)
    p.add_argument("--cable-for", type=float, default=30.0)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--only", nargs="*", default=None, help="RATE/ARM/<faults|clean>-r<k>: these runs alone")
    p.add_argument("--dry-run", action="store_true", help="print the runs and their commands, run nothing")
    p.add_argument("--report", action="store_true", help="the tables and plots of the finished runs")
    p.add_argument("--name", default="ftstudy", help="the emulated cluster's name")
    a = p.parse_args(argv)
    if a.kill_every <= 0 or a.kill_every >= a.steps:
        p.error(f"--kill-every {a.kill_every}: in [1, {a.steps - 1}] (--steps {a.steps})")
    if not 0 < a.cable_at < a.steps:
        p.error(f"--cable-at {a.cable_at}: in [1, {a.steps - 1}] (--steps {a.steps})")
    return a


def runs(a):
    """(rate, arm, kind, repeat, folder) of every run of the study, repeats outermost, so that a part of the
    study stopped early has whole repeats of every arm rather than every repeat of a few arms."""
    out = []
    for rate in a.rates:
        for k in range(1, a.repeats + 1):
            for arm in a.arms:
                for kind in ("clean", "faults"):
                    key = f"{rate}/{arm}/{kind}-r{k}"
                    if a.only is None or key in a.only:
                        out.append((rate, arm, kind, k, os.path.join(a.out, key)))
    return out


def fault_options(a, kind, log):
    """faults.py's options: the schedule in steps (none for a clean run: the same driver, no events)."""
    opts = ["--clock", "steps", "--progress", os.path.join(log, "run")]
    if kind == "faults":
        until = a.steps - a.kill_every // 2  # no kill whose restart the run would not see
        opts += ["--kill", "3", "--every", str(a.kill_every), "--restart-after", str(a.restart_after),
                 "--until", str(until), "--cable", f"2@{a.cable_at}+{a.cable_for}"]
    return opts


def command(a, arm, kind, repeat, folder):
    train = [a.python, os.path.join(HERE, "train_ft.py"), *ARMS[arm], "--steps", str(a.steps),
             "--seed", "0", "--log", os.path.join(folder, "run")]
    if arm == "ckpt":
        train += ["--ckpt-dir", os.path.join(folder, "ckpt")]
    return [sys.executable, os.path.join(ROOT, "tools", "netcluster", "faults.py"), "--name", a.name,
            "--log", os.path.join(folder, "events.jsonl"), "--seed", str(repeat),
            *fault_options(a, kind, folder), "--", *train]


def run_one(a, rate, arm, kind, repeat, folder):
    os.makedirs(folder, exist_ok=True)
    for f in os.listdir(folder):  # a run stopped part-way starts again from nothing
        if f.startswith("run.rank") or f in ("events.jsonl", "out.log"):
            os.remove(os.path.join(folder, f))
    cmd = command(a, arm, kind, repeat, folder)
    launch.netcluster("up", "-n", a.ranks, "--rate", rate, "--name", a.name)
    before, t0 = launch.loadavg(), time.monotonic()
    try:
        with open(os.path.join(folder, "out.log"), "w") as out:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, OMP_NUM_THREADS="1")).returncode
    finally:
        launch.netcluster("down", "--name", a.name, check=False)
    wall, after = time.monotonic() - t0, launch.loadavg()
    with open(os.path.join(folder, "done.json"), "w") as f:
        json.dump({"rate": rate, "arm": arm, "kind": kind, "repeat": repeat, "exit": code, "wall_s": round(wall, 1),
                   "load_before": before, "load_after": after, "started_unix": round(time.time() - wall, 1),
                   "command": portable(a, cmd)}, f)
    print(f"== {rate}/{arm}/{kind}-r{repeat}: exit {code}, {wall:.0f} s, load {before} -> {after}", flush=True)


def portable(a, cmd):
    """The command as a reader can run it elsewhere: the interpreters as PY and python3, the study's folder as
    OUT, the repository's files relative to its root."""
    names = [(os.path.abspath(a.out), "OUT"), (ROOT + os.sep, "")]
    out = []
    for arg in map(str, cmd):
        if arg == a.python:
            arg = "PY"
        elif arg == sys.executable:
            arg = "python3"
        else:
            for path, name in names:
                arg = arg.replace(path, name)
        out.append(arg)
    return out


def summary(a, rate):
    """Per arm: goodput (and speed) of its clean and faulted runs, median [min, max] of the repeats done,
    resilience (median faulted goodput / median clean goodput) and the worst return, as markdown lines."""
    sys.path.insert(0, HERE)
    import ft_report
    lines = ["| arm | clean goodput | faulted goodput | resilience | clean speed | faulted speed | runs (clean, "
             "faulted) | lost replicas | back within (rounds, worst; after its start) | rounds short outside faults "
             "(clean, faulted) |", "|---|---|---|---|---|---|---|---|---|---|"]

    def spread(xs):
        return f"{statistics.median(xs):.2f} [{min(xs):.2f}, {max(xs):.2f}]" if xs else "-"
    for arm in a.arms:
        got = {"clean": [], "faults": []}
        for k in range(1, a.repeats + 1):
            for kind in got:
                folder = os.path.join(a.out, rate, arm, f"{kind}-r{k}")
                if os.path.exists(os.path.join(folder, "done.json")):
                    got[kind].append(ft_report.summarise(ft_report.load_run(folder), a.ranks,
                                                         ft_report.load_events(folder)))
        med = {kind: statistics.median(s["goodput"] for s in v) if v else None for kind, v in got.items()}
        res = f"{med['faults'] / med['clean']:.2f}x" if med["clean"] and med["faults"] else "-"
        lost = sum(len(s["lost"]) for s in got["faults"])
        backs = [s["back_within"] for s in got["faults"] if s["back_within"] is not None]
        ups = [s["back_after_start"] for s in got["faults"] if s["back_after_start"] is not None]

        def short(kind):
            counts = [s["short"] for s in got[kind] if s["short"] is not None]
            return str(sum(counts)) if counts else "-"
        lines.append(f"| {arm} | {spread([s['goodput'] for s in got['clean']])} | "
                     f"{spread([s['goodput'] for s in got['faults']])} | {res} | "
                     f"{spread([s['speed'] for s in got['clean'] if s['taken']])} | "
                     f"{spread([s['speed'] for s in got['faults'] if s['taken']])} | "
                     f"{len(got['clean'])}, {len(got['faults'])} | {lost} | "
                     f"{ft_report.rounds_text(max(backs)) if backs else '-'}; "
                     f"{ft_report.rounds_text(max(ups)) if ups else '-'} | {short('clean')}, {short('faults')} |")
    return lines


def report(a):
    """Each rate: the summary by arm, then ft_report.py's table of every finished run (a faulted run against
    the clean run of its arm and repeat) and its plot of loss and live replicas against wall time."""
    for rate in a.rates:
        specs = []
        for rate_, arm, kind, k, folder in runs(a):
            if rate_ != rate or not os.path.exists(os.path.join(folder, "done.json")):
                continue
            name = f"{arm}/{kind}-r{k}"
            clean = f"{arm}/clean-r{k}"
            has_clean = os.path.exists(os.path.join(a.out, rate, clean, "done.json"))
            specs.append(f"{name}={folder}" + (f":{clean}" if kind == "faults" and has_clean else ""))
        if not specs:
            continue
        md = os.path.join(a.out, f"{rate}.md")
        subprocess.run([a.python, os.path.join(HERE, "ft_report.py"), "--ranks", str(a.ranks), "--runs", *specs,
                        "--md", md, "--plot", os.path.join(a.out, f"{rate}.png")], check=True,
                       stdout=subprocess.DEVNULL)
        with open(md) as f:
            runs_table = f.read()
        with open(md, "w") as f:
            f.write("\n".join(summary(a, rate)) + "\n\n" + runs_table)
        print(f"{md}:\n" + "\n".join(summary(a, rate)), flush=True)


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.report:
        report(a)
        return
    todo = [r for r in runs(a) if not os.path.exists(os.path.join(r[4], "done.json"))]
    print(f"{len(todo)} runs to do of {len(runs(a))}", flush=True)
    for rate, arm, kind, k, folder in todo:
        if a.dry_run:
            print(f"{rate}/{arm}/{kind}-r{k}: {' '.join(command(a, arm, kind, k, folder))}")
            continue
        run_one(a, rate, arm, kind, k, folder)


if __name__ == "__main__":
    main()
