"""Consecutive error-feedback accumulators on the GPU, and torch.topk timed on them in step order.

  sequence.py make --out DIR --log-n 26 --steps 8 --density 1e-3   synthetic sequence (the trainer's dump format)
  sequence.py time --out FILE.json DIR [DIR ...]                    torch.topk(|p|, k) per step, in order
                                                                    (|p| formed before timing)

The synthetic sequence runs error feedback exactly (torch.topk picks what is sent): g_t has a fixed
per-coordinate scale exp(N(0, 1)) (parameters of different layers and roles) times relu_like noise (13 %
zeros, a product of two exponentials), p_t = g_t + e_(t-1), e_t = p_t with the sent entries zeroed. The
first `--burn-in` steps build the pile-up below the threshold and are not written.
"""
import argparse
import json
import os
import sys

import torch


def relu_like(n, gen):
    u1 = torch.rand(n, device="cuda", generator=gen)
    u2 = torch.rand(n, device="cuda", generator=gen)
    u3 = torch.rand(n, device="cuda", generator=gen)
    v = torch.log(u1.clamp_min(1e-12)) * torch.log(u2.clamp_min(1e-12)) * 1e-3
    v = torch.where(torch.rand(n, device="cuda", generator=gen) < 0.5, v, -v)
    return torch.where(u3 < 0.13, torch.zeros_like(v), v)


def make(args):
    n = 1 << args.log_n
    k = max(1, int(-(-args.density * n // 1)))
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    scale = torch.exp(torch.randn(n, device="cuda", generator=gen))
    e = torch.zeros(n, device="cuda")
    os.makedirs(args.out, exist_ok=True)
    lines = [
        "# synthetic error-feedback accumulators p_t = g_t + e_(t-1), raw little-endian float32, one file per step",
        f"n {n}", f"density {args.density}", "method exact", "scheme synthetic:relu_like:lognormal-scale",
        "ranks 1", "batch 0", "lr 0", "# file step sent",
    ]
    for t in range(args.burn_in + args.steps):
        p = scale * relu_like(n, gen) + e
        idx = torch.topk(p.abs(), k, sorted=False).indices
        if t >= args.burn_in:
            name = f"accumulator-{t}.f32"
            p.cpu().numpy().tofile(os.path.join(args.out, name))
            lines.append(f"file {name} {t} {k}")
        e = p.clone()
        e[idx] = 0.0
    with open(os.path.join(args.out, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.steps} accumulators of n = 2^{args.log_n} to {args.out}")


def read_manifest(d):
    n, density, files = 0, 0.0, []
    with open(os.path.join(d, "manifest.txt")) as f:
        for line in f:
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            if w[0] == "n":
                n = int(w[1])
            elif w[0] == "density":
                density = float(w[1])
            elif w[0] == "file":
                files.append(os.path.join(d, w[1]))
    return n, density, files


def time_dir(d, sweeps):
    import numpy as np

    n, density, files = read_manifest(d)
    k = max(1, int(-(-density * n // 1)))
    # |x| is formed before timing: the timed call is the selection alone (values + int64 indices).
    xs = [torch.from_numpy(np.fromfile(f, dtype=np.float32)).cuda().abs() for f in files]
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for x in xs[:3]:
        torch.topk(x, k, sorted=False)
    per_step = [[] for _ in xs]
    ok = True
    for _ in range(sweeps):
        for i, x in enumerate(xs):
            start.record()
            values, indices = torch.topk(x, k, sorted=False)
            stop.record()
            stop.synchronize()
            per_step[i].append(start.elapsed_time(stop))
            ok = ok and values.numel() == k and indices.numel() == k
    med = [sorted(v)[len(v) // 2] for v in per_step]
    return {"dir": os.path.basename(os.path.normpath(d)), "n": n, "k": k, "density": density,
            "method": "torch_topk", "per_step_ms": med, "ok": bool(ok), "outputs": "|x| values + int64 indices"}


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--log-n", type=int, default=26)
    m.add_argument("--steps", type=int, default=8)
    m.add_argument("--burn-in", type=int, default=12)
    m.add_argument("--density", type=float, default=1e-3)
    m.add_argument("--seed", type=int, default=17)
    t = sub.add_parser("time")
    t.add_argument("--out", required=True)
    t.add_argument("--sweeps", type=int, default=11)
    t.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    if args.cmd == "make":
        make(args)
        return
    res = [time_dir(d, args.sweeps) for d in args.dirs]
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "results": res}, f,
                  indent=1)
    for r in res:
        print(f"{r['dir']}: n={r['n']} k={r['k']} torch_topk per call (median over steps) "
              f"{sorted(r['per_step_ms'])[len(r['per_step_ms']) // 2]:.4f} ms")


if __name__ == "__main__":
    sys.exit(main())
