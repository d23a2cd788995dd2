#!/usr/bin/env python3
"""Times torch.topk(|x|, k) on the distributions, sizes and densities of select_gpu_bench, and (--resnet-out)
a loop of torch.topk over ResNet-50's 161 parameter tensors as batched_gpu_bench uses them.

The numbers come from torch's own generators, not the benchmark's hash, but follow the same definitions
(laplace, gaussian, relu_like: 13 % zeros and a product of two exponentials), so the times compare like with
like. |x| is formed before timing: the timed call is torch.topk alone, which returns k values (of |x|) and k
int64 indices; both counts are checked. CUDA events, warm-up, median of many repetitions over several buffers.

usage: torch_topk.py [--out FILE.json] [--reps R] [--buffers B] [--sizes 20,24,26,28] [--quick]
                     [--resnet-out FILE.json] [--steps 100] [--warmup 20] [--skip-select]
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


def resnet50_lengths():
    """torchvision's resnet50 parameter tensors, in order (as resnet50_lengths() in batched_gpu_bench.cu)."""
    lengths = [64 * 3 * 7 * 7, 64, 64]
    inp = 64
    for blocks, w in zip((3, 4, 6, 3), (64, 128, 256, 512)):
        for b in range(blocks):
            lengths += [w * inp, w, w, w * w * 9, w, w, 4 * w * w, 4 * w, 4 * w]
            if b == 0:
                lengths += [4 * w * inp, 4 * w, 4 * w]
            inp = 4 * w
    lengths += [1000 * 2048, 1000]
    assert len(lengths) == 161 and sum(lengths) == 25557032, (len(lengths), sum(lengths))
    return lengths


def resnet_loop(steps, warmup, density, gen):
    """A loop of torch.topk(|x_t|, k_t) over the 161 tensors, one gradient drawn per step (untimed, with |x|)."""
    lengths = resnet50_lengths()
    ks = [min(n, math.ceil(density * n)) for n in lengths]
    n = sum(lengths)
    # The law of bench_common.cuh: a fixed per-coordinate scale exp(0.5 z), x8 on a fixed 0.2 % of the
    # coordinates, relu_like noise drawn fresh every step, an overall scale drifting by +-25 % over 64 steps.
    c = torch.exp(0.5 * torch.randn(n, device="cuda", generator=gen))
    c = torch.where(torch.rand(n, device="cuda", generator=gen) < 0.002, 8.0 * c, c)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms, ok = [], True
    for step in range(steps):
        drift = 1 + 0.25 * math.sin(2 * math.pi * (step % 64) / 64)
        x = generate("relu_like", n, gen).mul_(c).mul_(drift).abs_()
        parts = torch.split(x, lengths)
        torch.cuda.synchronize()
        start.record()
        out = [torch.topk(p, k, sorted=False) for p, k in zip(parts, ks)]
        stop.record()
        stop.synchronize()
        if step >= warmup:
            ms.append(start.elapsed_time(stop))
        ok = ok and all(v.numel() == k and i.numel() == k and i.dtype == torch.int64
                        for (v, i), k in zip(out, ks))
    return {"method": "loop_torch_topk", "tensors": len(lengths), "n": n, "density": density,
            "total_k": sum(ks), "steps": steps, "warmup": warmup, "timed": len(ms),
            "median_ms": statistics.median(ms), "p90_ms": sorted(ms)[max(0, math.ceil(0.9 * len(ms)) - 1)],
            "min_ms": min(ms), "ok": bool(ok), "outputs": "|x| values + int64 indices", "ms": ms}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="torch_topk.json")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--buffers", type=int, default=4)
    p.add_argument("--sizes", default="20,24,26,28")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--resnet-out", default=None, help="also time the ResNet-50 loop, written here")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--skip-select", action="store_true", help="only the ResNet-50 loop")
    a = p.parse_args()
    sizes = [20, 24] if a.quick else [int(s) for s in a.sizes.split(",")]
    reps = 5 if a.quick else a.reps
    gen = torch.Generator(device="cuda")
    gen.manual_seed(12345)
    results = []
    if a.resnet_out:
        steps, warmup = (40, 10) if a.quick else (a.steps, a.warmup)
        r = resnet_loop(steps, warmup, 1e-3, gen)
        with open(a.resnet_out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "results": [r]}, f,
                      indent=1)
        print(f"resnet50 loop of {r['tensors']} torch.topk: median {r['median_ms']:.4f} ms, "
              f"p90 {r['p90_ms']:.4f} ms, counts {'ok' if r['ok'] else 'WRONG'}; wrote {a.resnet_out}", flush=True)
        torch.cuda.empty_cache()
    if a.skip_select:
        return
    for lg in sizes:
        n = 1 << lg
        for dist in ("laplace", "gaussian", "relu_like"):
            # |x| formed here, before timing.
            abs_buffers = [generate(dist, n, gen).abs_() for _ in range(a.buffers)]
            for density in (1e-4, 1e-3, 1e-2):
                k = min(n, math.ceil(density * n))
                counts = []

                def topk(x):
                    values, indices = torch.topk(x, k, sorted=False)
                    counts.append((values.numel(), indices.numel()))

                ms = time_ms(topk, abs_buffers, 3, reps)
                ok = all(c == (k, k) for c in counts)
                results.append({"distribution": dist, "method": "torch_topk", "n": n, "density": density, "k": k,
                                "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
                                "count": counts[-1][0], "ok": ok, "outputs": "|x| values + int64 indices"})
                print(f"{dist:9s} n=2^{lg} density={density:g} torch_topk median {statistics.median(ms):.4f} ms",
                      flush=True)
            del abs_buffers
            torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "reps": reps,
                   "results": results}, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
