#!/usr/bin/python3
"""Does DDP overlap commsgd's exchange with the rest of backward? Wall time per step of a 4-bucket model on
`--world` gloo processes, median over the timed steps, for each hook in three forms:

    backward only   DDP with a hook that hands the bucket back at once (no exchange)
    exchange only   the same buckets' exchanges alone, one after another, each waited for
    hook            DDP with the hook as registered: its future returns at once, the exchange runs on the
                    state's thread while backward goes on
    blocking hook   the same hook waited for inside the hook (what every commsgd hook did before)

Overlap shows as `hook` below `backward only + exchange only`; `blocking hook` is their sum. Each rank is
one process with one compute thread.

    PYTHONPATH=build/dev/python /usr/bin/python3 examples/torch_ddp/overlap.py
"""
import argparse
import datetime
import os
import statistics
import time
import traceback

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commsgd_torch

import bench  # fork_ranks: the ranks of one measurement


def model(width, layers):
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def make_state(kind, net):
    if kind == "fp16":
        return commsgd_torch.CompressorState(kind="fp16", start_iter=0), commsgd_torch.compressor_hook
    if kind == "topk":
        return (commsgd_torch.TopKState(model=net, density=0.01, selector="laplace_bisect", momentum=0.9),
                commsgd_torch.topk_hook)
    if kind == "powersgd":
        s = commsgd_torch.PowerSGDState(matrix_approximation_rank=4, start_powerSGD_iter=2)
        return s, commsgd_torch.powersgd_hook
    raise ValueError(kind)


def noop_hook(_, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def blocking(hook):
    def run(state, bucket):
        out = hook(state, bucket).wait()
        fut = torch.futures.Future()
        fut.set_result(out)
        return fut
    return run


def timed_steps(ddp, x, steps, warmup):
    times = []
    for s in range(warmup + steps):
        ddp.zero_grad()
        loss = ddp(x).square().mean()
        dist.barrier()
        t0 = time.perf_counter()
        loss.backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:])


def rank_main(rank, world, a, store, queue):
    try:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
        x = torch.randn(a.batch, a.width, generator=torch.Generator().manual_seed(rank))
        bucket_mb = a.width * a.width * 4 / 2 ** 20 * 1.01  # about one layer a bucket
        out = {}
        for kind in a.hooks.split(","):
            row = {}
            net = model(a.width, a.layers)
            ddp = DDP(net, bucket_cap_mb=bucket_mb)
            ddp.register_comm_hook(None, noop_hook)
            row["backward only"] = timed_steps(ddp, x, a.steps, a.warmup)
            # Capture the buckets DDP hands a hook, then time their exchanges alone.
            net = model(a.width, a.layers)
            state, hook = make_state(kind, net)
            captured = []

            def capture(st, bucket):
                captured.append(bucket)
                return hook(st, bucket)
            ddp = DDP(net, bucket_cap_mb=bucket_mb)
            ddp.register_comm_hook(state, capture)
            for _ in range(3):  # past the bucket rebuild and any warm-up
                ddp.zero_grad()
                ddp(x).square().mean().backward()
            last_step = []  # the buckets of the last step: back from the last to bucket 0
            for b in reversed(captured):
                last_step.insert(0, b)
                if b.index() == 0:
                    break
            times = []
            for s in range(a.warmup + a.steps):
                dist.barrier()
                t0 = time.perf_counter()
                for b in last_step:
                    hook(state, b).wait()
                times.append(time.perf_counter() - t0)
            row["exchange only"] = statistics.median(times[a.warmup:])
            row["buckets"] = len(last_step)
            for label, h in (("hook", hook), ("blocking hook", blocking(hook))):
                net = model(a.width, a.layers)
                state, _ = make_state(kind, net)
                ddp = DDP(net, bucket_cap_mb=bucket_mb)
                ddp.register_comm_hook(state, h)
                row[label] = timed_steps(ddp, x, a.steps, a.warmup)
            out[kind] = row
        dist.destroy_process_group()
        queue.put((rank, "ok", out))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--hooks", default="fp16,topk,powersgd")
    a = p.parse_args()
    results = bench.fork_ranks(a.world, rank_main, (a,))
    print(f"{a.world} ranks, {a.layers} layers of {a.width} x {a.width}, batch {a.batch}; rank 0, median "
          f"ms per backward over {a.steps} steps")
    print("| hook | buckets | backward only | exchange only | sum | hook (overlapped) | blocking hook | "
          "hook / sum |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, r in results[0].items():
        total = r["backward only"] + r["exchange only"]
        print(f"| {kind} | {r['buckets']} | {1e3 * r['backward only']:.1f} | {1e3 * r['exchange only']:.1f} | "
              f"{1e3 * total:.1f} | {1e3 * r['hook']:.1f} | {1e3 * r['blocking hook']:.1f} | "
              f"{r['hook'] / total:.2f} |")


if __name__ == "__main__":
    main()
