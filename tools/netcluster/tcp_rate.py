#!/usr/bin/env python3
"""TCP throughput between two ranks of an emulated cluster (netcluster's `measure`).

No iperf is assumed on the machine, so this is the smallest tool that answers one question: how many payload
bytes per second does one TCP stream carry through the shaped link? The receiver times the bytes itself and
leaves out the first part of the transfer, where slow start and the token bucket's initial burst would make
the figure higher or lower than the link's steady rate.

  tcp_rate.py receive --bind ADDR --port P [--warmup S]     prints one JSON line when the sender is done
  tcp_rate.py send --host ADDR --port P --seconds S          sends zeros for S seconds
"""
import argparse
import json
import socket
import sys
import time

CHUNK = 1 << 20


def receive(args):
    with socket.create_server((args.bind, args.port), reuse_port=False) as server:
        server.settimeout(args.accept_timeout)
        # The parent waits for this line before it starts the sender, so the sender never races the bind.
        print("listening", flush=True)
        try:
            conn, _ = server.accept()
        except socket.timeout:
            sys.exit(f"tcp_rate: no sender connected to {args.bind}:{args.port} within {args.accept_timeout} s")
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    first = None
    last = None
    samples = []  # (time, bytes so far) at each read after the warm-up
    with conn:
        conn.settimeout(args.accept_timeout)
        while True:
            n = conn.recv_into(view)
            now = time.monotonic()
            if n == 0:
                break
            if first is None:
                first = now
            total += n
            last = now
            if now - first >= args.warmup:
                samples.append((now, total))
    if first is None or last is None:
        sys.exit("tcp_rate: the sender connected but sent nothing")
    result = {"bytes": total, "seconds": last - first,
              "mbit_per_s_all": total * 8 / max(last - first, 1e-9) / 1e6}
    if len(samples) >= 10 and samples[-1][0] - samples[0][0] > 0.2:
        # The slope of bytes over time by least squares, rather than two end points: a reader that the busy
        # machine schedules late at either end would otherwise move the figure by what piled up meanwhile.
        t0 = samples[0][0]
        ts = [t - t0 for t, _ in samples]
        bs = [b for _, b in samples]
        mt, mb = sum(ts) / len(ts), sum(bs) / len(bs)
        slope = sum((t - mt) * (b - mb) for t, b in zip(ts, bs)) / sum((t - mt) ** 2 for t in ts)
        result["steady_seconds"] = ts[-1]
        result["mbit_per_s"] = slope * 8 / 1e6
    else:
        # Too short to leave the warm-up out: the whole transfer is the best figure there is.
        result["steady_seconds"] = result["seconds"]
        result["mbit_per_s"] = result["mbit_per_s_all"]
    print(json.dumps(result), flush=True)


def send(args):
    deadline = time.monotonic() + args.connect_timeout
    while True:
        try:
            sock = socket.create_connection((args.host, args.port), timeout=args.connect_timeout)
            break
        except OSError as err:
            if time.monotonic() > deadline:
                sys.exit(f"tcp_rate: cannot connect to {args.host}:{args.port}: {err}")
            time.sleep(0.05)
    payload = bytes(CHUNK)
    end = time.monotonic() + args.seconds
    with sock:
        while time.monotonic() < end:
            sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        # Wait for the receiver to close, so the sender's exit means every byte arrived.
        sock.settimeout(args.connect_timeout + args.seconds)
        while sock.recv(4096):
            pass


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("receive")
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--warmup", type=float, default=0.5, help="seconds left out at the start (default 0.5)")
    r.add_argument("--accept-timeout", type=float, default=30.0)
    s = sub.add_parser("send")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--seconds", type=float, default=3.0)
    s.add_argument("--connect-timeout", type=float, default=10.0)
    args = parser.parse_args()
    receive(args) if args.mode == "receive" else send(args)


if __name__ == "__main__":
    main()
