"""Goodput, loss at equal wall time and model agreement of train_ft.py runs, from their logs (one folder a run:
run.rank<R>.jsonl per replica), and a plot of validation loss and
live replicas against wall time.

    python3 examples/diloco_lm/ft_report.py --runs NAME=DIR[:BASELINE_NAME] ... [--md FILE] [--plot FILE]

Steps taken: inner steps the replicas computed (every incarnation); speed: steps taken / (ranks x wall time).
Goodput: inner steps that reached the common model (each replica's `delivered`, over all its incarnations) /
(ranks x wall time), wall time from the first replica's start to the last record of any replica (its end, or
the last line of one that never ended: a lost replica's tail counts). Resilience: goodput against the
baseline's (its own fault-free run), beside the speed, so that a faster arm is not read as a sturdier one.
Lost: replicas whose last incarnation logged no end (it exited with an error, or was still waiting). Back
within: where the run's folder holds faults.py's events.jsonl (with "unix" times), for each replica's return
(a restart, a cable back up) the rounds another replica committed before the returned one committed its next,
the worst of them (the goal: at most 2); "after its start": a restart counted from the new process's first
record (up and about to ask for a quorum) instead, its own start-up apart. Rounds short: rounds the lowest rank
took with a replica missing outside every fault's window (from a kill or a pulled cable to the replica's first
commit after its return), each a live replica left out of a round. Loss at equal wall time: the run's last validation loss
against the baseline's (a fault-free run) at the same wall time (the baseline's
evaluation nearest before it). Agreement: every round that two replicas committed at the same step holds the
same hash of the common model (commsgd's arm logs it).
"""
import argparse
import collections
import glob
import json
import os


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_run(folder):
    recs = []
    for path in sorted(glob.glob(os.path.join(folder, "run.rank*.jsonl"))):
        recs += read(path)
    return recs


def load_events(folder):
    path = os.path.join(folder, "events.jsonl")
    return read(path) if os.path.exists(path) else []


def rounds_to_return(recs, events, from_start=False):
    """The most rounds any returned replica waited: for each restart or cable_up event (at its "unix" time),
    the rounds a reference replica (the lowest other rank) committed after it and up to the returned replica's
    next commit; None without events, a return never followed by a commit counts as every round after it.
    from_start: a restart counts from its new incarnation's "start" record (the process up, its Manager built,
    about to ask for a quorum) rather than from the restart, so that the new process's own start-up (loading
    torch, building the model) is apart from the time the others take to let it in."""
    worst = None
    for e in events:
        if e.get("event") not in ("restart", "cable_up") or "unix" not in e:
            continue
        k = e["rank"]
        ref = min(r["rank"] for r in recs if r["rank"] != k)
        mine = [r for r in recs if r["rank"] == k and r["event"] == "round" and r["t"] > e["unix"]
                and r["incarnation"] == e.get("restarts", r["incarnation"])]  # a restart: its new incarnation
        before = [r["committed"] for r in recs if r["rank"] == k and r["event"] == "round" and r["t"] <= e["unix"]
                  and r["incarnation"] == (mine[0]["incarnation"] if mine else None)]
        floor = max(before) if before else 0
        back = next((r["t"] for r in mine if r["committed"] > floor), float("inf"))
        since = e["unix"]
        if from_start and e["event"] == "restart":
            up = [r["t"] for r in recs if r["rank"] == k and r["event"] == "start" and r["t"] > e["unix"]
                  and r["incarnation"] == e.get("restarts")]
            since = min(up) if up else float("inf")  # never up: as never back
        others = [r for r in recs if r["rank"] == ref and r["event"] == "round" and since < r["t"] <= back]
        never = back == float("inf") or since == float("inf")
        worst = max(worst or 0, float("inf") if never else len(others))
    return worst


def fault_windows(recs, events):
    """[start, end] in unix seconds of every fault: a kill until the restarted replica's first commit, a pulled
    cable until the cut-off replica's first commit after it came back (to the end of the run if never)."""
    end_of_run = max(r["t"] for r in recs)
    windows, opened = [], {}
    for e in sorted((e for e in events if "unix" in e), key=lambda e: e["unix"]):
        if e.get("event") in ("kill", "cable_down"):
            opened[e["rank"]] = e["unix"]
        elif e.get("event") in ("restart", "cable_up") and e["rank"] in opened:
            back = next((r["t"] for r in recs if r["rank"] == e["rank"] and r["event"] == "round"
                         and r["t"] > e["unix"] and r.get("committed", 0) > 0
                         and r["incarnation"] == e.get("restarts", r["incarnation"])), end_of_run)
            windows.append((opened.pop(e["rank"]), back))
    windows += [(t, end_of_run) for t in opened.values()]
    return windows


def rounds_short(recs, events, ranks):
    """Rounds the lowest rank took with fewer than `ranks` replicas outside every fault's window (a live,
    reachable replica left out: its heartbeats or its quorum request late, as on a link the data starves);
    None where the records do not say how many replicas a round had."""
    ref = min(r["rank"] for r in recs)
    rounds = [r for r in recs if r["rank"] == ref and r["event"] == "round" and "replicas" in r]
    if not rounds:
        return None
    windows = fault_windows(recs, events)
    # 0 replicas: torchft's count before its first quorum, not a round with someone missing.
    return sum(1 for r in rounds
               if 0 < r["replicas"] < ranks and not any(a <= r["t"] <= b for a, b in windows))


def summarise(recs, ranks, events=()):
    t0 = min(r["t"] for r in recs if r["event"] == "start")
    wall = max(r["t"] for r in recs) - t0  # every replica's tail, a lost one's included
    last_life = {}
    for r in recs:  # each rank's last incarnation: did it end?
        k = r["rank"]
        if k not in last_life or r["incarnation"] > last_life[k][0]:
            last_life[k] = (r["incarnation"], False, r)
        if r["incarnation"] == last_life[k][0]:
            last_life[k] = (r["incarnation"], last_life[k][1] or r["event"] == "end", r)
    lost = sorted((k, round(r["t"] - t0, 1), r.get("step")) for k, (_, ended, r) in last_life.items() if not ended)
    last, taken = {}, {}
    for r in recs:
        if "delivered" in r:
            last[(r["rank"], r["incarnation"])] = r["delivered"]
        if "taken" in r:
            taken[(r["rank"], r["incarnation"])] = r["taken"]
    delivered = sum(last.values())
    evals = sorted((r["t"] - t0, r["val_loss"], r["step"]) for r in recs if r["event"] == "eval")
    # Agreement: the hash after each round a replica committed, by step.
    by_step, prev = collections.defaultdict(set), {}
    for r in recs:
        key = (r["rank"], r["incarnation"])
        if r["event"] == "round" and "hash" in r:
            if r["committed"] > prev.get(key, -1) and key in prev:
                by_step[r["step"]].add(r["hash"])
            prev[key] = r["committed"]
    disagree = sorted(s for s, h in by_step.items() if len(h) > 1)
    live = sorted((r["t"] - t0, r["replicas"]) for r in recs if r["event"] == "round" and r["rank"] == 0)
    return {"wall": wall, "delivered": delivered, "taken": sum(taken.values()), "lost": lost,
            "back_within": rounds_to_return(recs, events),
            "back_after_start": rounds_to_return(recs, events, from_start=True),
            "short": rounds_short(recs, events, ranks),
            "goodput": delivered / (ranks * wall), "speed": sum(taken.values()) / (ranks * wall), "evals": evals,
            "rounds_checked": len(by_step), "disagree": disagree, "live": live, "t0": t0}


def rounds_text(n):
    return "-" if n is None else ("never" if n == float("inf") else str(n))


def loss_at(evals, wall):
    before = [e for e in evals if e[0] <= wall]
    return before[-1] if before else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, help="NAME=DIR or NAME=DIR:BASELINE")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--md")
    p.add_argument("--plot")
    args = p.parse_args()
    runs, base = {}, {}
    for spec in args.runs:
        name, _, rest = spec.partition("=")
        folder, _, baseline = rest.partition(":")
        runs[name] = summarise(load_run(folder), args.ranks, load_events(folder))
        if baseline:
            base[name] = baseline
    lines = ["| run | wall (s) | steps taken | speed (taken/s a rank) | steps delivered | goodput (steps/s a rank) "
             "| resilience (vs its fault-free run) | lost replicas (rank, s, step) | back within (rounds; after its start) | rounds short outside faults "
             "| final val loss (step) | fault-free at that wall time | rounds checked / differing |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in runs.items():
        final = s["evals"][-1] if s["evals"] else None
        ratio, ref = "-", "-"
        if name in base:
            b = runs[base[name]]
            ratio = f"{s['goodput'] / b['goodput']:.2f}x" if b["goodput"] else "-"
            at = loss_at(b["evals"], s["wall"]) if final else None
            if at and final:
                ref = f"{at[1]:.4f} ({at[2]}; {100 * (final[1] / at[1] - 1):+.1f} %)"
        loss = f"{final[1]:.4f} ({final[2]})" if final else "-"
        checked = f"{s['rounds_checked']} / {len(s['disagree'])}" if s["rounds_checked"] else "-"
        lost = "; ".join(f"{k}, {t}, {st}" for k, t, st in s["lost"]) or "none"
        back = rounds_text(s["back_within"])
        if s["back_within"] is not None:
            back += f"; {rounds_text(s['back_after_start'])}"
        lines.append(f"| {name} | {s['wall']:.1f} | {s['taken'] or '-'} | {s['speed']:.2f} | {s['delivered']} | "
                     f"{s['goodput']:.2f} | {ratio} | {lost} | {back} | {'-' if s['short'] is None else s['short']} | "
                     f"{loss} | {ref} | {checked} |")
    text = "\n".join(lines)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (a, b) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
        for name, s in runs.items():
            line, = a.plot([e[0] for e in s["evals"]], [e[1] for e in s["evals"]], label=name)
            b.step([x[0] for x in s["live"]], [x[1] for x in s["live"]], where="post", color=line.get_color(),
                   label=name)
        a.set_ylabel("validation loss (nats/byte)")
        a.set_ylim(top=2.2)
        a.legend(fontsize=8)
        b.set_ylabel("replicas in the round (rank 0)")
        b.set_xlabel("wall time (s)")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
