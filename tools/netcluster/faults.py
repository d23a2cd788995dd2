"""A failure driver for the emulated cluster: runs one command per rank on a cluster that `netcluster up` made,
and on a seeded schedule kills ranks (SIGKILL, the whole session) and restarts them, pulls cables and slows
ports, logging every event with its time. For training that is meant to keep going when peers fail: the ranks
see real deaths and real dead links, not exceptions raised on cue.

    sudo python3 tools/netcluster/faults.py --name NAME --log events.jsonl [--seed S] [--logs DIR] \\
        [--kill K|random --every M [--first-at T] [--restart-after R] [--until T]] \\
        [--cable K@T+D ...] [--slow K@T+D=RATE ...] [--clock steps --progress PREFIX] -- CMD ARGS...

--kill: every M seconds from --first-at (default M), kill rank K, or a rank drawn at random (seeded) from those
running; with --restart-after, start it again R seconds later in its namespace with the environment `netcluster
run` gives it plus COMMSGD_RESTARTS (how many times this rank was restarted). No kill starts after --until.
--cable K@T+D: rank K's cable pulled at T seconds for D seconds. --slow K@T+D=RATE: rank K's port at RATE both
ways from T for D seconds, then back to the rate the cluster was made with. Several of each may be given.

--clock steps: the start of every event (--first-at, --every, --until, each window's T) counts the ranks'
inner steps instead of seconds: the most advanced step in the ranks' logs PREFIX.rank<K>.jsonl (JSON lines
with a "step", as examples/diloco_lm/train_ft.py's --log writes them). Every run then meets the same faults at
the same points of its training, however fast it trains; how long a fault lasts (D, --restart-after) stays in
seconds, as a pulled cable or a restart does.

Every event is one JSON line in --log: {"t": seconds since the start, "event": start, exit, kill, restart,
cable_down, cable_up, slow, rate_back, "rank": K, ...}, with "unix" (the wall clock, to line events up with
the ranks' own logs) and "step" (the progress) under --clock steps. The driver ends when every rank has exited
on its own (a killed rank waiting for its restart has not) and returns the first non-zero exit code of a rank's last run,
or 0. Stopping the driver (Ctrl-C, SIGTERM) kills every rank's session and restores every port.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import NETCLUSTER, netcluster  # noqa: E402


def parse_window(text, what, rate=False):
    """K@T+D (or K@T+D=RATE) as (k, t, d[, rate])."""
    m = re.fullmatch(r"(\d+)@(\d+(?:\.\d+)?)\+(\d+(?:\.\d+)?)" + (r"=(\S+)" if rate else ""), text)
    if not m:
        form = "K@T+D=RATE" if rate else "K@T+D"
        raise SystemExit(f"faults.py: {what} '{text}' is not {form} (rank, start and length in seconds)")
    k, t, d = int(m.group(1)), float(m.group(2)), float(m.group(3))
    return (k, t, d, m.group(4)) if rate else (k, t, d)


def cluster_ports(name):
    """Per rank: (namespace, upload rate in bits per second, 0 for unlimited), from the cluster's state."""
    out = []
    with open(f"/run/commsgd-netcluster/{name}/state") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == "port":
                out.append((parts[2], int(parts[4])))
    return out


def rank_env(name, k, master_port):
    text = subprocess.run([NETCLUSTER, "env", "--name", name, "--master-port", str(master_port), str(k)],
                          check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


class Driver:
    def __init__(self, args, cmd):
        self.args, self.cmd = args, cmd
        self.ports = cluster_ports(args.name)
        self.n = len(self.ports)
        for what, k in [("--kill", args.kill)] + [("--cable", c[0]) for c in args.cable] + \
                [("--slow", s[0]) for s in args.slow]:
            if k not in (None, "random") and not 0 <= int(k) < self.n:
                raise SystemExit(f"faults.py: {what} rank {k} is outside [0, {self.n - 1}]")
        self.rng = random.Random(args.seed)
        self.log = open(args.log, "w")
        self.t0 = time.monotonic()
        self.procs = [None] * self.n       # the running process of each rank, or None
        self.restarts = [0] * self.n
        self.last_code = [None] * self.n   # exit code of each rank's last run that ended on its own
        self.waiting = set()               # ranks killed and due to restart
        self.timers = []                   # (due, seq, action) kept sorted, due in seconds
        self.step_timers = []              # the same, due in inner steps (--clock steps)
        self.seq = 0
        self.offsets = [0] * self.n        # how far each rank's progress log was read
        self.step = 0                      # the most advanced inner step any rank has logged

    def now(self):
        return time.monotonic() - self.t0

    def clock(self):
        """Where the schedule stands: seconds since the start, or the most advanced inner step."""
        return self.progress() if self.args.clock == "steps" else self.now()

    def progress(self):
        for k in range(self.n):
            try:
                with open(f"{self.args.progress}.rank{k}.jsonl") as f:
                    f.seek(self.offsets[k])
                    text = f.read()
            except FileNotFoundError:
                continue
            whole = text[:text.rfind("\n") + 1]  # a line still being written is read next time
            self.offsets[k] += len(whole.encode())
            for line in whole.splitlines():
                try:
                    self.step = max(self.step, int(json.loads(line).get("step", 0)))
                except (ValueError, TypeError, AttributeError):
                    pass
        return self.step

    def event(self, event, rank=None, **more):
        rec = {"t": round(self.now(), 3), "unix": round(time.time(), 3), "event": event}
        if self.args.clock == "steps":
            rec["step"] = self.step
        if rank is not None:
            rec["rank"] = rank
        rec.update(more)
        self.log.write(json.dumps(rec) + "\n")
        self.log.flush()

    def at(self, due, action, timers=None):
        """`action` at `due` seconds (or on `timers`' own clock)."""
        timers = self.timers if timers is None else timers
        self.seq += 1
        timers.append((due, self.seq, action))
        timers.sort()

    def at_clock(self, due, action):
        """`action` when the schedule's clock (seconds, or steps) reaches `due`."""
        self.at(due, action, self.step_timers if self.args.clock == "steps" else None)

    def start(self, k):
        self.waiting.discard(k)
        env = dict(os.environ, **rank_env(self.args.name, k, self.args.master_port),
                   COMMSGD_RESTARTS=str(self.restarts[k]))
        ns = env.pop("NETCLUSTER_NS")
        out = open(os.path.join(self.args.logs, f"rank_{k}.log"), "a") if self.args.logs else None
        self.procs[k] = subprocess.Popen(["ip", "netns", "exec", ns] + self.cmd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT if out else None, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.event("start" if self.restarts[k] == 0 else "restart", k, restarts=self.restarts[k],
                   pid=self.procs[k].pid)

    def kill(self, k):
        p = self.procs[k]
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        self.procs[k] = None

    def kill_tick(self):
        a = self.args
        if a.until is not None and self.clock() > a.until:
            return
        running = [k for k in range(self.n) if self.procs[k] is not None]
        if a.kill == "random":
            victim = self.rng.choice(running) if running else None
        else:
            victim = int(a.kill) if int(a.kill) in running else None
        if victim is not None:
            self.kill(victim)
            self.event("kill", victim)
            if a.restart_after is not None:
                self.restarts[victim] += 1
                self.waiting.add(victim)
                self.at(self.now() + a.restart_after, lambda k=victim: self.start(k))
        self.at_clock(self.clock() + a.every, self.kill_tick)

    def set_rate(self, k, bps):
        netcluster("port", "--name", self.args.name, str(k), "rate", f"{bps}bit" if bps else "unlimited")

    def schedule(self):
        a = self.args
        if a.kill is not None:
            self.at_clock(a.first_at if a.first_at is not None else a.every, self.kill_tick)
        # A window starts on the schedule's clock and lasts D seconds.
        for k, t, d in a.cable:
            self.at_clock(t, lambda k=k, d=d: (netcluster("port", "--name", a.name, str(k), "down"),
                                               self.event("cable_down", k),
                                               self.at(self.now() + d, lambda: self.cable_up(k))))
        for k, t, d, rate in a.slow:
            self.at_clock(t, lambda k=k, d=d, rate=rate: (
                netcluster("port", "--name", a.name, str(k), "rate", rate), self.event("slow", k, rate=rate),
                self.at(self.now() + d, lambda: self.rate_back(k))))

    def cable_up(self, k):
        netcluster("port", "--name", self.args.name, str(k), "up")
        self.event("cable_up", k)

    def rate_back(self, k):
        self.set_rate(k, self.ports[k][1])
        self.event("rate_back", k, bits_per_s=self.ports[k][1])

    def restore(self):
        """Every port up and at its own rate, whatever was pending."""
        for k in range(self.n):
            try:
                netcluster("port", "--name", self.args.name, str(k), "up")
                self.set_rate(k, self.ports[k][1])
            except RuntimeError:
                pass

    def run(self):
        for k in range(self.n):
            self.start(k)
        self.schedule()
        try:
            while True:
                for k, p in enumerate(self.procs):
                    if p is not None and p.poll() is not None:
                        self.procs[k] = None
                        self.last_code[k] = p.returncode
                        self.event("exit", k, code=p.returncode)
                if all(p is None for p in self.procs) and not self.waiting:
                    break
                now = self.now()
                while self.timers and self.timers[0][0] <= now:
                    _, _, action = self.timers.pop(0)
                    action()
                if self.step_timers:
                    step = self.progress()
                    while self.step_timers and self.step_timers[0][0] <= step:
                        _, _, action = self.step_timers.pop(0)
                        action()
                time.sleep(0.05)
        finally:
            for k, p in enumerate(self.procs):
                if p is not None:
                    self.kill(k)
                    self.event("stopped", k)
            self.restore()
            self.log.close()
        return next((c for c in self.last_code if c), 0)


def main(argv):
    if "--" not in argv:
        raise SystemExit("faults.py: the command to run goes after --")
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--logs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--kill")
    p.add_argument("--every", type=float)
    p.add_argument("--first-at", type=float)
    p.add_argument("--restart-after", type=float)
    p.add_argument("--until", type=float)
    p.add_argument("--cable", action="append", default=[], type=lambda s: parse_window(s, "--cable"))
    p.add_argument("--slow", action="append", default=[], type=lambda s: parse_window(s, "--slow", rate=True))
    p.add_argument("--clock", choices=("seconds", "steps"), default="seconds")
    p.add_argument("--progress", help="--clock steps: the prefix of the ranks' logs, PREFIX.rank<K>.jsonl")
    args = p.parse_args(argv[:cut])
    if args.clock == "steps" and not args.progress:
        raise SystemExit("faults.py: --clock steps needs --progress PREFIX (the ranks' logs PREFIX.rank<K>.jsonl)")
    cmd = argv[cut + 1:]
    if not cmd:
        raise SystemExit("faults.py: no command after --")
    if args.kill is not None and (args.kill != "random" and not args.kill.isdigit()):
        raise SystemExit(f"faults.py: --kill {args.kill}: expected a rank or 'random'")
    if args.kill is not None and not (args.every and args.every > 0):
        raise SystemExit("faults.py: --kill needs --every M with M > 0 seconds")
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    driver = Driver(args, cmd)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return driver.run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
