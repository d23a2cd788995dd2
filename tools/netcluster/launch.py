"""Launching one command per rank on the emulated cluster, for the head-to-head drivers in examples/ (each
`links.py` builds its own command lines and tables; how a run reaches the links lives here once).

    import launch
    code, wall_s, load_before, load_after, command = launch.ranks(cmd, ranks=4, rate="100mbit")
    launch.netcluster("port", "--name", name, 2, "down")   # any other netcluster command, checked
    with launch.RunLog(out_dir, ["rate", "arm", "exit", ...]) as runs:   # DIR/runs.csv, a row a run
        runs.row([rate, arm, code, ...])

rate "none" starts the ranks on plain loopback with the rendezvous in the environment (as `netcluster run`
sets it; torchrun's parser would take a script's options for abbreviations of its own); any other rate runs
`netcluster exec -n RANKS --rate RATE run -- CMD`, which removes its cluster however the run ends.
"""
import contextlib
import csv
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time

NETCLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netcluster")


def rate_bits(rate):
    """Bits per second of a netcluster rate (`100mbit`, `1gbit`, a plain number), inf for `none`."""
    if rate == "none":
        return math.inf
    for unit, m in (("kbit", 1e3), ("mbit", 1e6), ("gbit", 1e9)):
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * m
    try:
        return float(rate)
    except ValueError:
        raise ValueError(f"rate '{rate}' is not <number>[kbit|mbit|gbit] or none") from None


def netcluster(*words, check=True):
    """Runs `netcluster WORDS...`; its output (stdout and stderr). With `check`, a failure raises RuntimeError
    naming the command and what it said."""
    done = subprocess.run([NETCLUSTER, *map(str, words)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"netcluster {' '.join(map(str, words))} failed ({done.returncode}): {done.stdout.strip()}")
    return done.stdout


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def ranks(cmd, ranks, rate, port=None, label="", stdout=None, env=None, cluster=()):
    """Runs `cmd` once per rank at `rate`, one thread each; returns (exit code, the first non-zero one or 0;
    wall seconds; load average before; after; the command line as run). `port`: the rendezvous port on
    loopback, None for one free now (so that drivers side by side do not meet on a fixed one; a cluster's
    namespaces have their own). `cluster`: more options of `netcluster up` (groups, say). However the driver
    leaves (an exception, Ctrl-C, SIGTERM from a timeout), no rank it started outlives this call."""
    env = dict(os.environ if env is None else env, OMP_NUM_THREADS="1")
    before, t0 = loadavg(), time.monotonic()
    procs = []
    with _sigterm_as_exit():
        try:
            if rate == "none":
                port = free_port() if port is None else port
                print(f"== none {label}: {ranks} x {' '.join(cmd)}", flush=True)
                for r in range(ranks):
                    procs.append(subprocess.Popen(cmd, stdout=stdout, env=dict(
                        env, RANK=str(r), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                        GLOO_SOCKET_IFNAME="lo")))
                codes = [p.wait() for p in procs]
                code = next((c for c in codes if c != 0), 0)
            else:
                cmd = [NETCLUSTER, "exec", "-n", str(ranks), "--rate", rate] + list(cluster) + ["run", "--"] + cmd
                print(f"== {rate} {label}: {' '.join(cmd)}", flush=True)
                procs.append(subprocess.Popen(cmd, env=env, stdout=stdout))
                code = procs[0].wait()
        finally:
            _end(procs)
    wall = round(time.monotonic() - t0, 1)
    if code != 0:
        print(f"{os.path.basename(sys.argv[0])}: {rate} {label} exited {code}", file=sys.stderr)
    return code, wall, before, loadavg(), " ".join(cmd)


def free_port():
    """A TCP port on loopback that no socket holds now. Another process may take it before the ranks bind it,
    but two drivers each asking here do not get the same one while the first one's ranks hold it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _sigterm_as_exit():
    """SIGTERM raised as SystemExit while ranks run, so that the `finally` that ends them runs: Python's default
    for SIGTERM is to die at once, leaving every rank behind (only the main thread may set a handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _end(procs, grace_s=10.0):
    """Ends the processes of `procs` still running: SIGTERM (netcluster exec then removes its cluster), SIGKILL
    for one still there after `grace_s`."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class RunLog:
    """A driver's DIR/runs.csv: one row a run, appended, the header written when the file is new, each row
    flushed at once (a long grid that is stopped keeps every run it finished)."""

    def __init__(self, folder, header):
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "runs.csv")
        new = not os.path.exists(path)
        self._f = open(path, "a", newline="")
        self._w = csv.writer(self._f)
        if new:
            self.row(header)

    def row(self, values):
        self._w.writerow(values)
        self._f.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()
