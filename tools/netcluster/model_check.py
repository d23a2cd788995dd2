#!/usr/bin/env python3
"""model_check.py: the cost model checked against collectives measured on the emulated cluster.

For each (n, rate) it brings a cluster up (netcluster up), times comm::mpi's collectives with
bench/link_model under `netcluster mpirun` (Open MPI's default algorithm choice, and the variants below) and
gloo's with tools/netcluster/collectives.py under `netcluster run`, writes one CSV per backend and cluster, and
takes the cluster down. `report` turns the CSVs into the markdown table of model error.

  sudo python3 tools/netcluster/model_check.py measure --out bench/results/model-check-2026-11-25 \
      [--configs 2:100mbit,4:100mbit,2:1gbit,...] [--variants mpi,gloo,mpi-ring,mpi-links2] [--dry-run]
  python3 tools/netcluster/model_check.py report --out bench/results/model-check-2026-11-25 \
      --md bench/results/model-check-2026-11-25.md

Backends (the CSV file is BACKEND-nN-RATE.csv):
  mpi          link_model, Open MPI's own choice of algorithm (coll/tuned's fixed decision rules)
  mpi-ring     the same with the ring all-reduce forced (coll_tuned_allreduce_algorithm 4)
  mpi-links2   the same as mpi with two TCP connections per pair of processes (btl_tcp_links 2)
  mpi-noput    the same as mpi without the TCP BTL's emulated PUT (btl_tcp_flags NOPUT, below)
  mpi-ring-noput  both
  gloo         collectives.py under torch.distributed's gloo
Every Open MPI run also gets `mpi_yield_when_idle 1`: Open MPI sees one slot per "host" and would otherwise
busy-poll, and n processes polling on 2 cores take the CPU the kernel's TCP needs.

A cell (op, size) is skipped when four calls (the first, left out, and the least of three timed) would take
over 30 s by model_tcp (--max-cell); the report says which.
"""
import argparse
import csv
import datetime
import io
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NETCLUSTER = os.path.join(HERE, "netcluster")
SIZES = ["1k", "16k", "256k", "1m", "4m", "16m", "64m"]
BIG = ["1m", "4m", "16m", "64m"]  # the bandwidth-bound range the goal names
OPS = ["all_reduce", "all_gather", "ring16"]
DEFAULT_CONFIGS = "2:100mbit,4:100mbit,2:1gbit,4:1gbit,8:100mbit,8:1gbit,2:10gbit,4:10gbit,8:10gbit"
YIELD = ["--mca", "mpi_yield_when_idle", "1"]
# btl_tcp_flags without "put": ob1 then sends long messages by its send/receive pipeline (128 KiB fragments)
# instead of its RDMA protocol emulated over TCP, which serialises the two directions of an exchange.
NOPUT = "send,inplace,need-ack,need-csum,hetero-rdma"
VARIANTS = {
    # name: (extra mpirun arguments, ops, sizes); None = every op or size
    "mpi": (YIELD, None, None),
    "gloo": (None, None, None),
    "mpi-ring": (YIELD + ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm",
                          "4"], ["all_reduce"], ["1m", "4m", "16m"]),
    "mpi-links2": (YIELD + ["--mca", "btl_tcp_links", "2"], None, ["1m", "4m", "16m"]),
    "mpi-noput": (YIELD + ["--mca", "btl_tcp_flags", NOPUT], None, ["256k", "1m", "4m", "16m", "64m"]),
    "mpi-ring-noput": (YIELD + ["--mca", "btl_tcp_flags", NOPUT, "--mca", "coll_tuned_use_dynamic_rules", "1",
                                "--mca", "coll_tuned_allreduce_algorithm", "4"], ["all_reduce"], ["1m", "4m", "16m"]),
    "mpi-ring-links2": (YIELD + ["--mca", "btl_tcp_links", "2", "--mca", "coll_tuned_use_dynamic_rules", "1",
                                 "--mca", "coll_tuned_allreduce_algorithm", "4"], ["all_reduce"], ["1m", "4m", "16m"]),
}


def size_bytes(s):
    return int(s[:-1]) * {"k": 1024, "m": 1024 * 1024}[s[-1]]


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def predict(link_model, n, rate, sizes, ops):
    out = subprocess.run([link_model, "--predict", "--ranks", str(n), "--rate", rate, "--ops", ",".join(ops),
                          "--sizes", ",".join(sizes)], check=True, capture_output=True, text=True).stdout
    return {(r["op"], int(r["bytes"])): float(r["model_tcp_s"]) for r in csv.DictReader(io.StringIO(out))}


def plan(args, n, rate, variant):
    """[(ops, sizes)] runs for one backend on one cluster, and the cells skipped as too long."""
    _, ops, sizes = VARIANTS[variant]
    ops, sizes = ops or OPS, sizes or SIZES
    model = predict(args.link_model, n, rate, sizes, ops)
    runs, skipped, estimate = {}, [], 0.0
    for op in ops:
        kept = []
        for s in sizes:
            t = model[(op, size_bytes(s))]
            if 4 * t > args.max_cell:
                skipped.append((op, s, 4 * t))
            else:
                kept.append(s)
                estimate += max(args.seconds, 4 * t) + 0.2
        if kept:
            runs.setdefault(tuple(kept), []).append(op)
    return [(ops_, list(sizes_)) for sizes_, ops_ in runs.items()], skipped, estimate


def sh(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, **kw)


def measure(args):
    os.makedirs(args.out, exist_ok=True)
    configs = [(int(c.split(":")[0]), c.split(":")[1]) for c in args.configs.split(",")]
    variants = args.variants.split(",")
    total = 0.0
    for n, rate in configs:
        for v in variants:
            runs, skipped, est = plan(args, n, rate, v)
            total += est + 6 * len(runs)
            print(f"n={n} {rate} {v}: about {est:.0f} s; skipped {[(o, s) for o, s, _ in skipped]}",
                  file=sys.stderr)
    print(f"estimated in all: {total / 60:.1f} min", file=sys.stderr)
    if args.dry_run:
        return 0
    log_path = os.path.join(args.out, "runs.csv")
    new_log = not os.path.exists(log_path)
    log = open(log_path, "a", newline="")
    w = csv.writer(log)
    if new_log:
        w.writerow(["file", "ops", "sizes", "skipped", "start_utc", "seconds", "loadavg_before", "loadavg_after",
                    "rc"])
    nice = ["nice", "-n", "19"]
    for n, rate in configs:
        if time.monotonic() > args.deadline:
            print("deadline reached; stopping before", n, rate, file=sys.stderr)
            break
        sh(nice + [NETCLUSTER, "down", "--name", args.name], capture_output=True)
        if sh(nice + [NETCLUSTER, "up", "-n", str(n), "--rate", rate, "--name", args.name]).returncode:
            return 1
        try:
            if rate.endswith("gbit") and float(rate[:-4]) >= 10:
                # The machine, not the bucket, sets the rate up there: measure one stream to report beside it.
                r = sh([NETCLUSTER, "measure", "--name", args.name, "--seconds", "3"], capture_output=True,
                       text=True)
                with open(os.path.join(args.out, f"tcp-n{n}-{rate}.txt"), "w") as f:
                    f.write(f"loadavg {loadavg()}\n{r.stdout}{r.stderr}")
            for v in variants:
                runs, skipped, _ = plan(args, n, rate, v)
                path = os.path.join(args.out, f"{v}-n{n}-{rate}.csv")
                header = True
                with open(path, "w") as out:
                    for ops, sizes in runs:
                        before, t0 = loadavg(), time.time()
                        common = ["--rate", rate, "--ops", ",".join(ops), "--sizes", ",".join(sizes),
                                  "--seconds", str(args.seconds)]
                        if v == "gloo":
                            cmd = [NETCLUSTER, "run", "--name", args.name, "--", args.python,
                                   os.path.join(HERE, "collectives.py"), "--link-model", args.link_model] + common
                            if not header:
                                cmd.append("--no-header")
                            env = dict(os.environ, OMP_NUM_THREADS="1")
                        else:
                            cmd = [NETCLUSTER, "mpirun", "--name", args.name, "--", "-np", str(n)] + \
                                VARIANTS[v][0] + [args.link_model] + common
                            env = None
                        r = sh(cmd, capture_output=True, text=True, env=env, timeout=args.max_run)
                        lines = [l.split("] ", 1)[-1] for l in r.stdout.splitlines()]
                        rows = [l for l in lines if l.count(",") >= 6 and not l.startswith("+")]
                        if not header:
                            rows = [l for l in rows if not l.startswith("op,")]
                        out.write("".join(l + "\n" for l in rows))
                        out.flush()
                        header = header and not rows
                        if r.returncode:
                            print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
                        w.writerow([os.path.basename(path), ",".join(ops), ",".join(sizes),
                                    ";".join(f"{o}:{s}" for o, s, _ in skipped),
                                    datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).strftime("%H:%M:%S"),
                                    f"{time.time() - t0:.0f}", before, loadavg(), r.returncode])
                        log.flush()
                        skipped = []  # listed once per file
        finally:
            sh(nice + [NETCLUSTER, "down", "--name", args.name], capture_output=True)
    return 0


# ---------------------------------------------------------------------------------------------------- report

def read_csvs(out):
    data = {}  # (backend, n, rate) -> {(op, bytes): row}
    for f in sorted(os.listdir(out)):
        if not f.endswith(".csv") or f == "runs.csv":
            continue
        backend, n, rate = f[:-4].rsplit("-", 2)
        with open(os.path.join(out, f)) as fh:
            rows = list(csv.DictReader(fh))
        data[(backend, int(n[1:]), rate)] = {(r["op"], int(r["bytes"])): r for r in rows}
    return data


def rate_key(rate):
    return float(rate[:-4]) * (1000 if rate.endswith("gbit") else 1)


def err(row, col):
    m = float(row[col])
    return float(row["measured_s"]) / m - 1 if m > 0 else float("nan")


def fmt(e):
    return f"{100 * e:+.0f}"


def rule_col(backend, op, n):
    """The model the results file's rule assigns to a backend's operation: duplex::half (model_half) where
    Open MPI runs a pairwise exchange with its default TCP protocol (PUT on), model_tcp everywhere else."""
    if not backend.startswith("mpi") or "noput" in backend:
        return "model_tcp_s"
    if n == 2:
        return "model_half_s"  # every 2-rank exchange is with the one peer, both ways
    if backend.startswith("mpi-ring") or op == "ring16":
        return "model_tcp_s"  # a ring of 3 or more sends and receives on different connections
    return "model_half_s"  # Open MPI's default: Rabenseifner (all_reduce), recursive doubling (all_gather)


def report(args):
    data = read_csvs(args.out)
    order = {"gloo": 0, "mpi": 1, "mpi-noput": 2, "mpi-ring": 3, "mpi-ring-noput": 4, "mpi-links2": 5}
    keys = sorted(data, key=lambda k: (order.get(k[0], 9), rate_key(k[2]), k[1]))
    md = []
    for col, title in (("model_tcp_s", "model_tcp (full duplex, TCP payload)"),
                       ("rule", "the model by rule (model_half for Open MPI's pairwise exchanges with PUT on, "
                                "model_tcp elsewhere)")):
        md.append(f"\n### Error against {title}, in % (measured / model - 1)\n")
        md.append("| backend | op | n | rate | " + " | ".join(SIZES) + " |")
        md.append("|---|---|---|---|" + "---|" * len(SIZES))
        for key in keys:
            backend, n, rate = key
            rows = data[key]
            for op in OPS:
                c = rule_col(backend, op, n) if col == "rule" else col
                cells = []
                for s in SIZES:
                    r = rows.get((op, size_bytes(s)))
                    cells.append(fmt(err(r, c)) if r and c in r else "")
                if any(cells):
                    tag = " (half)" if col == "rule" and c == "model_half_s" else ""
                    md.append(f"| {backend} | {op}{tag} | {n} | {rate} | " + " | ".join(cells) + " |")
    # Summary: the largest |error| at 1 MB and up, per backend and op; 10 Gbit/s apart (this machine's copies,
    # not the links, set that rate).
    md.append("\n### Largest |error| at 1 MB and up, in %, and the cells within 15 %\n")
    md.append("| backend | op | rates | cells | model_tcp: largest | within 15 % | by rule: largest | within 15 % |")
    md.append("|---|---|---|---|---|---|---|---|")
    for group, rates in (("100 Mbit/s", ("100mbit",)), ("1 Gbit/s", ("1gbit",)), ("10 Gbit/s", ("10gbit",))):
        for backend in sorted({k[0] for k in data}, key=lambda b: order.get(b, 9)):
            for op in OPS:
                worst = {"model_tcp_s": None, "rule": None}
                within = {"model_tcp_s": 0, "rule": 0}
                count = 0
                for (b, n, rate), rows in data.items():
                    if b != backend or rate not in rates:
                        continue
                    for s in BIG:
                        r = rows.get((op, size_bytes(s)))
                        if not r:
                            continue
                        count += 1
                        for c in worst:
                            e = err(r, rule_col(b, op, n) if c == "rule" else c)
                            within[c] += abs(e) <= 0.15
                            if worst[c] is None or abs(e) > abs(worst[c][0]):
                                worst[c] = (e, f"n={n} {rate} {s}")
                if count:
                    md.append(f"| {backend} | {op} | {group} | {count} | " + " | ".join(
                        f"{fmt(worst[c][0])} ({worst[c][1]}) | {within[c]}" for c in worst) + " |")
    text = "\n".join(md) + "\n"
    if args.md:
        with open(args.md) as f:
            doc = f.read()
        begin, end = "<!-- tables: begin -->", "<!-- tables: end -->"
        if begin in doc and end in doc:
            doc = doc[: doc.index(begin) + len(begin)] + "\n" + text + doc[doc.index(end):]
            with open(args.md, "w") as f:
                f.write(doc)
            return 0
    sys.stdout.write(text)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--configs", default=DEFAULT_CONFIGS)
    m.add_argument("--variants", default="mpi,gloo,mpi-ring,mpi-links2")
    m.add_argument("--name", default="mcheck")
    m.add_argument("--seconds", type=float, default=2.0)
    m.add_argument("--max-cell", type=float, default=30.0, help="skip a cell whose four calls take longer (s)")
    m.add_argument("--max-run", type=float, default=900.0, help="give up on one launch after this long (s)")
    m.add_argument("--minutes", type=float, default=1e9, help="start no new cluster after this long")
    m.add_argument("--link-model", default=os.path.join(REPO, "build/dev/bench/link_model"))
    m.add_argument("--python", default="/usr/bin/python3")
    m.add_argument("--dry-run", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("--out", required=True)
    r.add_argument("--md", help="replace the part between the tables markers of this file")
    args = p.parse_args()
    if args.cmd == "measure":
        args.deadline = time.monotonic() + 60 * args.minutes
        return measure(args)
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
