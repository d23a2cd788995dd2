"""The DiLoCo round of diloco_round_gpu_bench.cu written as torch ops on the same GPU, the way a trainer
without a fused round runs it: the pseudo-gradient, the code (int8 or 4-bit e3m0 in blocks of 256 with a
float scale each, the 4-bit codes packed two to a byte; top-k per chunk with torch.topk, 2-bit values and a
decayed residual), the n messages decoded and summed, the outer Nesterov step and the merge. Same sizes, ranks and rounds as the C++ benchmark; the network is not timed
there and is not here. With --ours (the C++ benchmark's CSV) it writes both side by side:

    python3 bench/gpu/diloco_round_torch.py --ours build/.../diloco-round-gpu.csv --out bench/results/x.md
"""
import argparse
import csv
import math
import statistics
import sys

import torch

BLOCK = 256


def encode(code, d):
    """One rank's message: the block scales and the codes (int8, or uint8 with two 4-bit codes)."""
    b = d.view(-1, BLOCK)
    s = b.abs().amax(dim=1, keepdim=True)
    safe = torch.where(s == 0, torch.ones_like(s), s)
    if code == "int8":
        return s, torch.round(b * (127.0 / safe)).to(torch.int8)
    r = b.abs() / safe
    k = torch.clamp(torch.round(torch.log2(r)) + 7, 0, 7)
    k = torch.where(r < 2.0 ** -7, torch.zeros_like(k), k).to(torch.uint8)
    c = k | (torch.signbit(b).to(torch.uint8) << 3)
    return s, c[:, 0::2] | (c[:, 1::2] << 4)


def decode(code, s, q):
    if code == "int8":
        return q.float() * (s / 127.0)
    c = torch.stack((q & 15, q >> 4), dim=2).view(q.shape[0], -1)
    k = (c & 7).float()
    mag = torch.where(k == 0, torch.zeros_like(k), s * torch.exp2(k - 7))
    return torch.where((c & 8) != 0, -mag, mag)


def parse_top_k(code):
    """"topk-<density>-c<chunk>-2bit-b<decay>-senders" -> (density, chunk, decay)."""
    parts = code.split("-")
    density = float(parts[1])
    chunk = next(int(p[1:]) for p in parts if p.startswith("c"))
    decay = next((float(p[1:]) for p in parts if p.startswith("b")), 1.0)
    return density, chunk, decay


def top_k_round(code, d, residual, ranks):
    """The chunked top-k with 2-bit values and a decayed residual, the n messages summed, the mean over the
    senders: SparseLoCo's recipe as torch ops."""
    density, chunk, decay = parse_top_k(code)
    p = (d + decay * residual).view(-1, chunk)
    k = max(1, math.ceil(density * chunk - 1e-9))
    idx = p.abs().topk(k, dim=1, sorted=False).indices
    val = p.gather(1, idx)
    s = val.abs().mean(dim=1, keepdim=True)
    sent = torch.where(val.abs() >= s, 1.5 * s, 0.5 * s).copysign(val)
    own = torch.zeros_like(p).scatter_(1, idx, sent)
    residual.copy_((p - own).view(-1))
    total = torch.zeros_like(p)
    count = torch.zeros_like(p)
    for _ in range(ranks):  # every rank's message is this rank's, as in the C++ benchmark
        total.scatter_add_(1, idx, sent)
        count.scatter_add_(1, idx, torch.ones_like(sent))
    return (total * torch.where(count > 0, ranks / count.clamp(min=1), torch.ones_like(count))).view(-1)


def one_round(code, x, g, v, ranks, residual=None, lr=0.7, mu=0.9):
    d = g - x
    if code.startswith("topk"):
        total = top_k_round(code, d, residual, ranks)
    elif code == "dense":
        total = d  # the all-reduce's sum stands in, as in the C++ benchmark
    else:
        msg = encode(code, d)
        gathered = [msg] * ranks  # every rank's message is this rank's: each costs the same to decode
        total = torch.zeros_like(d).view(-1, BLOCK)
        for s, q in gathered:
            total += decode(code, s, q)
        total = total.view(-1)
    mean = total / ranks
    v.mul_(mu).add_(mean)
    g.sub_(lr * (mean + mu * v))
    x.copy_(g)


def time_rounds(code, n, ranks, rounds, warmup, device):
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.rand(n, device=device, generator=gen) - 0.5
    g = x.clone()
    v = torch.zeros_like(x)
    residual = torch.zeros_like(x) if code.startswith("topk") else None
    out = []
    for t in range(warmup + rounds):
        x.add_(1e-3 * (torch.rand(n, device=device, generator=gen) - 0.5))
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            one_round(code, x, g, v, ranks, residual)
            b.record()
            b.synchronize()
            ms = a.elapsed_time(b)
        else:
            import time
            t0 = time.perf_counter()
            one_round(code, x, g, v, ranks, residual)
            ms = 1e3 * (time.perf_counter() - t0)
        if t >= warmup:
            out.append(ms)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", help="diloco_round_gpu_bench's CSV: its sizes, ranks and times")
    ap.add_argument("--log-n", default="26,28")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="the side-by-side table (markdown)")
    a = ap.parse_args()
    ours = {}
    codes = ("dense", "int8", "e3m0", "topk-0.01-c4096-2bit-b0.95-senders", "topk-0.03-c4096-2bit-b0.95-senders")
    cases = [(c, int(l), a.ranks) for l in a.log_n.split(",") for c in codes]
    if a.ours:
        with open(a.ours) as f:
            rows = list(csv.DictReader(f))
        ours = {(r["code"], int(r["log_n"])): r for r in rows}
        cases = [(r["code"], int(r["log_n"]), int(r["ranks"])) for r in rows]
    name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    lines = ["| code | N | ranks | ours median ms (min-max) | / floor | torch ops median ms (min-max) | torch / ours |",
             "|---|---|---|---|---|---|---|"]
    for code, log_n, ranks in cases:
        ms = time_rounds(code, 1 << log_n, ranks, a.rounds, a.warmup, a.device)
        med = statistics.median(ms)
        r = ours.get((code, log_n))
        if r:
            om = float(r["median_ms"])
            lines.append(f"| {code} | 2^{log_n} | {ranks} | {om:.3f} ({float(r['min_ms']):.3f}-{float(r['max_ms']):.3f}) "
                         f"| {om / float(r['floor_ms']):.2f}x | {med:.3f} ({min(ms):.3f}-{max(ms):.3f}) | {med / om:.1f}x |")
        else:
            lines.append(f"| {code} | 2^{log_n} | {ranks} | - | - | {med:.3f} ({min(ms):.3f}-{max(ms):.3f}) | - |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + f"\n\nDevice: {name}; torch {torch.__version__}; {a.rounds} timed rounds after {a.warmup}.\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
