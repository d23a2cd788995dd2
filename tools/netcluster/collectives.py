#!/usr/bin/env python3
"""collectives.py: gloo's collectives measured beside the cost model, the torch.distributed twin of
bench/link_model (which does the same for comm::mpi). Run once per rank, as `netcluster run` starts it:

  netcluster run --name X -- /usr/bin/python3 tools/netcluster/collectives.py --rate 100mbit \
      [--sizes 1k,16k,256k,1m,4m,16m,64m] [--ops all_reduce,all_gather,ring16] [--seconds 2] \
      [--link-model build/dev/bench/link_model] [--latency 50e-6]

S is each rank's input in wire bytes, as in link_model:
  all_reduce  dist.all_reduce (SUM) of S/4 float32 values
  all_gather  dist.all_gather of S bytes (uint8) from every rank
  ring16      dist.all_reduce (SUM) of S/2 float16 values: a 16-bit all-reduce on gloo's own algorithm
              (gloo sums half on the CPU; if a torch refuses it, the op falls back to what PyTorch's fp16
              compression hook does, cast to half, all_reduce, cast back, and says so on stderr).
The timing is link_model's: a barrier before every call, a first call left out (it sets up the connections
and buffers), then as many calls as fill --seconds by the first call's time (3 to 200); each call's figure is
its slowest rank's time, and the row holds their median.

The model columns come from `link_model --predict` (called, not re-implemented: the formula has one home,
include/commsgd/comm/simulated.hpp). ring16 is charged as link_model's ring16: a ring all-reduce of S/2 values
of 2 bytes. Rank 0 prints CSV with link_model's columns: op,ranks,bytes,reps,measured_s and its model_* ones.
"""
import argparse
import csv
import io
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def parse_size(s):
    scale = {"k": 1024, "m": 1024 * 1024}.get(s[-1:], 1)
    digits = s[:-1] if scale != 1 else s
    if not digits.isdigit() or int(digits) == 0:
        raise SystemExit(f"collectives.py: size '{s}' is not a size; expected e.g. 1k, 64k, 16m")
    return int(digits) * scale


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", required=True, help="the link rate, as link_model takes it: 100mbit, 1gbit")
    p.add_argument("--sizes", default="1k,16k,256k,1m,4m,16m,64m")
    p.add_argument("--ops", default="all_reduce,all_gather,ring16")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--latency", default="50e-6")
    p.add_argument("--link-model", default=os.path.join(REPO, "build/dev/bench/link_model"))
    p.add_argument("--header", action=argparse.BooleanOptionalAction, default=True)
    a = p.parse_args()
    a.sizes = [parse_size(s) for s in a.sizes.split(",")]
    a.ops = a.ops.split(",")
    for op in a.ops:
        if op not in ("all_reduce", "all_gather", "ring16"):
            raise SystemExit(f"collectives.py: '--ops' has '{op}'; allowed: all_reduce, all_gather, ring16")
    if not a.seconds > 0:
        raise SystemExit(f"collectives.py: '--seconds' = {a.seconds} is outside (0, inf)")
    return a


def predictions(args, n):
    """The model columns' names, and {(op, bytes): their values} from link_model --predict."""
    cmd = [args.link_model, "--predict", "--ranks", str(n), "--rate", args.rate, "--latency", args.latency,
           "--ops", ",".join(args.ops), "--sizes", ",".join(str(s) for s in args.sizes)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    cols = [c for c in rows[0] if c.startswith("model_")]
    return cols, {(r["op"], int(r["bytes"])): [r[c] for c in cols] for r in rows}


def half_all_reduce_works():
    try:
        t = torch.zeros(4, dtype=torch.float16)
        dist.all_reduce(t)
        return True
    except RuntimeError as e:
        if dist.get_rank() == 0:
            print(f"collectives.py: gloo refuses float16 all_reduce ({e}); ring16 times PyTorch's fp16 hook's "
                  "path instead: cast to half, cast to float, all_reduce float, cast back", file=sys.stderr)
        return False


def make_op(op, size, n, half_ok):
    if op == "all_reduce":
        x = torch.zeros(size // 4, dtype=torch.float32)
        return lambda: dist.all_reduce(x)
    if op == "all_gather":
        mine = torch.zeros(size, dtype=torch.uint8)
        out = [torch.empty(size, dtype=torch.uint8) for _ in range(n)]
        return lambda: dist.all_gather(out, mine)
    g = torch.zeros(size // 2, dtype=torch.float32)
    if half_ok:
        h = g.to(torch.float16)
        return lambda: dist.all_reduce(h)

    def hook_path():  # what a torch without half in gloo would have to do
        h = g.to(torch.float16).to(torch.float32)
        dist.all_reduce(h)
        g.copy_(h)
    return hook_path


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    cols, model = predictions(args, n) if rank == 0 else (None, None)
    half_ok = half_all_reduce_works() if "ring16" in args.ops else True
    if rank == 0 and args.header:
        print(",".join(["op", "ranks", "bytes", "reps", "measured_s"] + cols), flush=True)
    slowest = torch.zeros(1, dtype=torch.float64)
    for op in args.ops:
        for size in args.sizes:
            once = make_op(op, size, n, half_ok)
            dist.barrier()
            t0 = time.perf_counter()
            once()
            first = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(first)
            first = first.item() / n
            reps = min(200, max(3, int(args.seconds / max(first, 1e-6))))
            times = []
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                once()
                slowest[0] = time.perf_counter() - t0
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                times.append(slowest.item())
            del once
            if rank == 0:
                times.sort()
                print(",".join([op, str(n), str(size), str(reps), f"{times[len(times) // 2]:.6g}"] +
                               model[(op, size)]), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
