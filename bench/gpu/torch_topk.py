#!/usr/bin/env python3
"""Times torch.topk(x.abs(), k) on the distributions, sizes and densities of select_gpu_bench.

The numbers come from torch's own generators, not the benchmark's hash, but follow the same definitions
(laplace, gaussian, relu_like: 13 % zeros and a product of two exponentials), so the times compare like with
like. CUDA events, warm-up, median of many repetitions over several buffers.

usage: torch_topk.py [--out FILE.json] [--reps R] [--buffers B] [--sizes 20,24,26,28] [--quick]
"""
import argparse
import json
import math
import statistics

import torch


def generate(dist, n, gen):
    u = torch.rand(n, device="cuda", generator=gen).clamp_(min=1e-7)
    sign = torch.where(torch.rand(n, device="cuda", generator=gen) < 0.5, -1.0, 1.0)
    if dist == "laplace":
        return sign * -torch.log(u) * 1e-3
    if dist == "gaussian":
        return torch.randn(n, device="cuda", generator=gen) * 1e-3
    if dist == "relu_like":
        u2 = torch.rand(n, device="cuda", generator=gen).clamp_(min=1e-7)
        v = sign * torch.log(u) * torch.log(u2) * 1e-3
        return torch.where(torch.rand(n, device="cuda", generator=gen) < 0.13, 0.0, v)
    raise ValueError(dist)


def time_ms(fn, buffers, warmup, reps):
    for i in range(warmup):
        fn(buffers[i % len(buffers)])
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for i in range(reps):
        b = buffers[(warmup + i) % len(buffers)]
        start.record()
        fn(b)
        stop.record()
        stop.synchronize()
        out.append(start.elapsed_time(stop))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="torch_topk.json")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--buffers", type=int, default=4)
    p.add_argument("--sizes", default="20,24,26,28")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    sizes = [20, 24] if a.quick else [int(s) for s in a.sizes.split(",")]
    reps = 5 if a.quick else a.reps
    gen = torch.Generator(device="cuda")
    gen.manual_seed(12345)
    results = []
    for lg in sizes:
        n = 1 << lg
        for dist in ("laplace", "gaussian", "relu_like"):
            buffers = [generate(dist, n, gen) for _ in range(a.buffers)]
            for density in (1e-4, 1e-3, 1e-2):
                k = min(n, math.ceil(density * n))
                ms = time_ms(lambda x: torch.topk(x.abs(), k, sorted=False), buffers, 3, reps)
                results.append({"distribution": dist, "method": "torch_topk", "n": n, "density": density, "k": k,
                                "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
                                "count": k, "ok": True})
                print(f"{dist:9s} n=2^{lg} density={density:g} torch_topk median {statistics.median(ms):.4f} ms",
                      flush=True)
            del buffers
            torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "reps": reps,
                   "results": results}, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
