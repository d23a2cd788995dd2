"""Runs the commsgd_torch test suites, and is the one list of them (ctest reads it with --list).

    run_pytest.py SUITE [pytest-args...]   tests/torch/test_SUITE.py (what ctest's torch.pytest.SUITE runs)
    run_pytest.py --all [pytest-args...]   every suite in one pytest run
    run_pytest.py --all --jobs N [...]     every suite, N suites at a time, each in its own pytest run
                                           (scripts/test_torch_pypi.sh: the ranks of one test wait on each
                                           other's sockets often enough that suites share the cores well)
    run_pytest.py --list                   the suite names, ';'-separated, for CMake
    run_pytest.py --machine-skips          the skip reasons this machine implies, ';'-separated, for scripts
                                           that opt in to them (scripts/test.sh, scripts/test_torch_pypi.sh)

A suite fails when fewer of its tests passed than SUITES says, less those that skipped for a reason this
machine gives (machine_skips(): no GPU, no NCCL, a torch too old for torchft, not root); pytest's "no tests
collected" included: a test file that silently stops collecting or running tests is noticed instead of
passing. It fails when a test skips for a reason other than the machine's (ALLOWED_SKIPS): a test that skips
because something it needs was not installed fails its suite instead of passing unseen; and when every test
of a suite skipped, unless COMMSGD_ALLOW_SKIP (';'-separated) names each reason they gave: a suite that ran
nothing passes only where the one who runs it said that this machine cannot run it.
"""
import os
import subprocess
import sys
import tempfile
import time

# suite -> (the least number of tests of tests/torch/test_<suite>.py that must pass where the machine lacks
# nothing, roughly how many seconds it takes beside CI's dev tests on two cores). --jobs starts the long ones
# first, so that the last to start is a short one.
SUITES = {"fault_tolerant": (17, 200), "diloco_lm": (15, 165), "auto": (19, 95), "fault_tolerant_sharded": (3, 90),
          "async": (5, 65), "hooks": (19, 60), "diloco_replicas": (7, 55), "fault_tolerant_links": (1, 55),
          "hsdp_hooks": (9, 50), "endings": (4, 40), "diloco": (61, 40), "diloco_conformance": (7, 30),
          "sim_codes": (9, 20), "compressors": (14, 15), "fsdp_codes": (6, 15), "ddp_links": (4, 15),
          "train": (1, 10), "device_round": (23, 10), "powersgd": (9, 10), "cuda": (1, 5), "run_pytest": (3, 3)}

# Suites of tools that are not the package's (examples/diloco_lm's model of the codes, one process, no ranks):
# they run on the newest torch only, so that the oldest one's run (scripts/test.sh on Debian's 1.13) spends its
# time on the package. On an older torch --list and --all leave them out; named alone, one still runs.
NEWEST_TORCH_ONLY = ("sim_codes",)

# The only reasons a test may skip and its suite still pass: what this machine lacks, not what was not
# installed. A skip reason must start with one of these.
ALLOWED_SKIPS = ("no CUDA device", "commsgd_torch built without _cuda", "torch has no NCCL",
                 "torchft needs torch 2", "the emulated cluster needs root", "FSDP2 needs torch 2")

HERE = os.path.dirname(os.path.abspath(__file__))


def suites_here():
    """The suites --list and --all run with this interpreter's torch: every one, less NEWEST_TORCH_ONLY's
    below torch 2."""
    import torch
    old = int(torch.__version__.split(".")[0]) < 2
    return [s for s in SUITES if not (old and s in NEWEST_TORCH_ONLY)]


def skip_reason(report):
    """The reason a skipped test gave, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def machine_skips():
    """The ALLOWED_SKIPS reasons that hold on this machine, by the checks the tests make."""
    import torch
    import torch.distributed as dist
    reasons = []
    if int(torch.__version__.split(".")[0]) < 2:
        reasons += ["torchft needs torch 2", "FSDP2 needs torch 2"]
    if not torch.cuda.is_available():
        reasons.append("no CUDA device")
    if not dist.is_nccl_available():
        reasons.append("torch has no NCCL")
    if os.geteuid() != 0:
        reasons.append("the emulated cluster needs root")
    if torch.cuda.is_available():
        try:
            from commsgd_torch import _cuda_topk
        except ImportError:  # not importable here (a script asking before the build): nothing to say of it
            _cuda_topk = None
        if _cuda_topk is not None and _cuda_topk._cuda is None:
            reasons.append("commsgd_torch built without _cuda")
    return reasons


class Count:
    """A pytest plugin counting each suite's tests; `machine`: the skip reasons this machine gives."""

    def __init__(self, machine=()):
        self.machine = tuple(machine)
        self.ran = dict.fromkeys(SUITES, 0)
        self.passed = dict.fromkeys(SUITES, 0)
        self.machine_skipped = dict.fromkeys(SUITES, 0)
        self.skip_reasons = {s: set() for s in SUITES}
        self.bad_skips = []

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.skipped):
            suite = os.path.basename(report.nodeid.split("::")[0])[len("test_"):-len(".py")]
            if suite in self.ran:
                self.ran[suite] += 1
                self.passed[suite] += report.passed
                if report.skipped:
                    self.skip_reasons[suite].add(skip_reason(report))
                    self.machine_skipped[suite] += skip_reason(report).startswith(self.machine)
            if report.skipped and not skip_reason(report).startswith(ALLOWED_SKIPS):
                self.bad_skips.append(f"{report.nodeid}: {skip_reason(report)}")

    def too_few(self, suites):
        """Suites of which fewer tests passed than SUITES asks, less those that skipped for the machine's
        reasons: a skip for any other reason, a test that stopped being collected, lower nothing."""
        out = []
        for s in suites:
            need = SUITES[s][0] - self.machine_skipped[s]
            if self.passed[s] < need:
                out.append(f"{s}: {self.passed[s]} passed of at least {need} ({SUITES[s][0]}, less "
                           f"{self.machine_skipped[s]} skipped for this machine's reasons)")
        return out

    def wholly_skipped(self, suites, allowed):
        """Suites of which every test skipped, each with the reasons `allowed` does not name."""
        out = []
        for s in suites:
            unnamed = sorted(r for r in self.skip_reasons[s] if not r.startswith(allowed))
            if self.ran[s] and not self.passed[s] and unnamed:
                out.append(f"{s}: " + "; ".join(unnamed))
        return out


def run_parallel(jobs, args):
    """Runs every suite in its own process, `jobs` at a time; prints each one's output whole when it ends."""
    pending = suites_here()
    pending.sort(key=lambda s: -SUITES[s][1])
    running, failed = [], []
    while pending or running:
        while pending and len(running) < jobs:
            suite = pending.pop(0)
            log = tempfile.TemporaryFile("w+")  # a pipe would fill and stall the suite while others run
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), suite] + args,
                                    stdout=log, stderr=subprocess.STDOUT, text=True)
            running.append((suite, proc, log, time.monotonic()))
        for entry in list(running):
            suite, proc, log, t0 = entry
            if proc.poll() is None:
                continue
            running.remove(entry)
            log.seek(0)
            out = log.read()
            log.close()
            print(f"==== {suite}: exit {proc.returncode}, {time.monotonic() - t0:.0f} s\n{out}", flush=True)
            if proc.returncode != 0:
                failed.append(suite)
        time.sleep(0.2)
    if failed:
        print(f"run_pytest: failed suites: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv):
    if argv[:1] == ["--list"]:
        print(";".join(suites_here()), end="")
        return 0
    if argv[:1] == ["--machine-skips"]:
        print(";".join(machine_skips()), end="")
        return 0
    if not argv or (argv[0] != "--all" and argv[0] not in SUITES):
        print(f"run_pytest: the first argument must be --all, --list, --machine-skips or one of {', '.join(SUITES)}",
              file=sys.stderr)
        return 2
    if argv[:2] == ["--all", "--jobs"]:
        if len(argv) < 3 or not argv[2].isdigit() or int(argv[2]) < 1:
            print(f"run_pytest: --jobs takes a whole number >= 1, got {argv[2:3]}", file=sys.stderr)
            return 2
        return run_parallel(int(argv[2]), argv[3:])
    import pytest

    suites = suites_here() if argv[0] == "--all" else [argv[0]]
    count = Count(machine_skips())
    files = [os.path.join(HERE, f"test_{s}.py") for s in suites]
    rc = pytest.main(["-p", "no:cacheprovider", "--rootdir", HERE] + argv[1:] + files, plugins=[count])
    if rc == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("run_pytest: no tests collected", file=sys.stderr)
        return 1
    short = count.too_few(suites)
    if rc == 0 and short:
        print("run_pytest: too few tests passed (" + "; ".join(short) + ")", file=sys.stderr)
        return 1
    if rc == 0 and count.bad_skips:
        print("run_pytest: tests skipped what they were asked to run (allowed only: " +
              ", ".join(repr(a) for a in ALLOWED_SKIPS) + "):\n  " + "\n  ".join(count.bad_skips),
              file=sys.stderr)
        return 1
    allowed = tuple(r for r in os.environ.get("COMMSGD_ALLOW_SKIP", "").split(";") if r)
    skipped = count.wholly_skipped(suites, allowed)
    if rc == 0 and skipped:
        print("run_pytest: every test of a suite skipped, for a reason COMMSGD_ALLOW_SKIP does not name (it "
              f"names: {', '.join(repr(a) for a in allowed) or 'nothing'}):\n  " + "\n  ".join(skipped),
              file=sys.stderr)
        return 1
    return int(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
