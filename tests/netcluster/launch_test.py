"""tools/netcluster/launch.py's ranks on plain loopback (rate "none"; no root, no namespaces): the first non-zero
exit is the run's, a driver stopped by SIGTERM (a timeout, a kill) ends every rank it started before it
leaves, where Python's default for SIGTERM left them all running, and drivers side by side rendezvous on ports
of their own (a fixed default port made the second one's rank 0 fail to bind)."""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "netcluster")
sys.path.insert(0, TOOLS)
import launch  # noqa: E402


def alive(pid):
    """Whether `pid` runs (a zombie has ended: it waits only for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def exit_codes():
    rank = "import os, sys; sys.exit({0: 0, 1: 3, 2: 5}[int(os.environ['RANK'])])"
    code, wall, *_ = launch.ranks([sys.executable, "-c", rank], ranks=3, rate="none", port=0, label="codes")
    assert code == 3, f"the first non-zero exit in rank order is 3, ranks() said {code}"
    assert wall >= 0
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "ranks() must put SIGTERM's handler back"


# Rank 0 listens on MASTER_PORT until every other rank has connected and sent its rank; the others retry for a
# while, as a rendezvous does. Two runs on one port: one rank 0 cannot bind (exit 4) or the ranks meet the
# wrong run (exit 6).
RENDEZVOUS = textwrap.dedent("""
    import os, socket, sys, time
    rank, n, port = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["MASTER_PORT"])
    run = sys.argv[1]
    if rank == 0:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            sys.exit(4)
        s.listen(n)
        seen = set()
        while len(seen) < n - 1:
            c, _ = s.accept()
            got = c.recv(64).decode().split()
            if got[0] != run:
                sys.exit(6)
            seen.add(int(got[1]))
            time.sleep(0.5)  # hold the port while the other run starts
        sys.exit(0)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port)) as c:
                c.sendall(f"{run} {rank}".encode())
            sys.exit(0)
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(5)
            time.sleep(0.05)
""")


def side_by_side(folder, port=None):
    script = os.path.join(folder, "rendezvous.py")
    with open(script, "w") as f:
        f.write(RENDEZVOUS)
    codes = {}

    def run(name):
        codes[name] = launch.ranks([sys.executable, script, name], ranks=3, rate="none", port=port, label=name)[0]

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads), "a driver did not return within 90 s"
    assert codes == {"a": 0, "b": 0}, f"two drivers at once, each on a free port, exit 0 and 0, not {codes}"


def sigterm_ends_ranks(folder):
    rank = ("import os, time; open(os.path.join(%r, 'rank' + os.environ['RANK']), 'w').write(str(os.getpid())); "
            "time.sleep(600)" % folder)
    driver = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {TOOLS!r})
        import launch
        launch.ranks([sys.executable, "-c", {rank!r}], ranks=3, rate="none", port=0, label="term")
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver])
    pids = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 3:
            assert time.monotonic() < deadline, "the ranks did not start within 60 s"
            assert proc.poll() is None, f"the driver left early ({proc.returncode})"
            time.sleep(0.1)
            pids = []
            for r in range(3):
                path = os.path.join(folder, f"rank{r}")
                text = open(path).read() if os.path.exists(path) else ""
                if text:
                    pids.append(int(text))
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        left = [pid for pid in pids if alive(pid)]
        assert not left, f"ranks {left} outlived their driver"
        assert code == 128 + signal.SIGTERM, f"the driver stopped by SIGTERM exits 143, not {code}"
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    exit_codes()
    with tempfile.TemporaryDirectory() as folder:
        side_by_side(folder)
        sigterm_ends_ranks(folder)
    print("launch_test: ok")
