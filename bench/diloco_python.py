"""One DiLoCo outer round's local work: the old pure-Python DiLoCo (commit da5a14f) against the engine through
the extension (commsgd_torch._C.DiLoCoEngine), in one process, per code and size (issue 43, item 4).

The pure-Python round is that commit's _start / _finish / _apply on one fragment of d float32 values, with the
functions it needs copied below unchanged (the codes' encode and decode, the delta by torch.cat, the header
count, top-k with its residual, the decode of every gathered message summed, torch.optim.SGD(nesterov=True)
as the outer step, the copy back). The collective is skipped (no network): with n = 1, as that code did, the
message is copied into the one gathered slot; with n > 1 every slot gets a copy of this rank's message (and
dense, whose all_reduce is skipped, keeps this rank's buffer).

The engine's round is DiLoCoEngine.advance() on a 1-process gloo group (FileStore), sync_every = 1, one
fragment, delay 0: exactly one round a call, decoding one message (n = 1). Compare it with the Python round
at n = 1; bench/diloco_bench.cpp has the engine's n = 4 round.

Between rounds, untimed, the local parameters take an SGD-like step x -= 1e-3 g (g fixed, normal(0, 1)), so every
pseudo-gradient is non-zero. Each timing is one round (time.perf_counter), after one untimed warm-up round;
min / median / max of the repeats.

    PYTHONPATH=<build>/python python3 bench/diloco_python.py --sizes 20,24,26 --repeats 5,5,3 --out diloco-python.json
"""
import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import List, Optional

import torch
import torch.distributed as dist

# --- copied from python/commsgd_torch/diloco.py at da5a14f --------------------------------------------------

#: Elements per block of the int8 and fp4 codes (one float32 scale each).
BLOCK = 256

# E3M0 magnitudes, by 3-bit code: 0 is zero, code c in 1..7 is 2^-(c - 1) times the block's scale.
_FP4_MAGNITUDES = [0.0] + [2.0 ** -e for e in range(7)]


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def _read(msg: torch.Tensor, start: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    size = torch.tensor([], dtype=dtype).element_size()
    return msg[start:start + count * size].clone().view(dtype)


def _blocks(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    nb = max(1, (n + BLOCK - 1) // BLOCK)
    if nb * BLOCK != n:
        x = torch.cat([x, x.new_zeros(nb * BLOCK - n)])
    return x.view(nb, BLOCK)


def _scales(xb: torch.Tensor) -> torch.Tensor:
    return xb.abs().amax(dim=1)


def _int8_encode(x: torch.Tensor) -> torch.Tensor:
    xb = _blocks(x)
    scale = _scales(xb)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(xb / safe[:, None] * 127.0).clamp_(-127, 127).to(torch.int8)
    return torch.cat([_as_bytes(scale), _as_bytes(q)])


def _int8_decode(msg: torch.Tensor, n: int) -> torch.Tensor:
    nb = max(1, (n + BLOCK - 1) // BLOCK)
    scale = _read(msg, 0, nb, torch.float32)
    q = _read(msg, 4 * nb, nb * BLOCK, torch.int8).view(nb, BLOCK)
    return (q.to(torch.float32) * (scale / 127.0)[:, None]).view(-1)[:n]


def _fp4_encode(x: torch.Tensor) -> torch.Tensor:
    xb = _blocks(x)
    scale = _scales(xb)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    m = xb.abs() / safe[:, None]
    e = torch.round(-torch.log2(m))  # the nearest power of two in log2: 2^-e, e >= 0 (m = 0: e = +inf)
    code = torch.where(e <= 6, e + 1, torch.zeros_like(e)).to(torch.uint8)  # 2^-7 and below: zero
    nib = (code | ((xb < 0).to(torch.uint8) << 3)).view(-1)  # BLOCK is even: whole bytes
    packed = nib[0::2] | (nib[1::2] << 4)
    return torch.cat([_as_bytes(scale), packed])


def _fp4_decode(msg: torch.Tensor, n: int) -> torch.Tensor:
    nb = max(1, (n + BLOCK - 1) // BLOCK)
    scale = _read(msg, 0, nb, torch.float32)
    packed = msg[4 * nb:4 * nb + nb * BLOCK // 2]
    nib = torch.stack([packed & 15, packed >> 4], dim=1).view(nb, BLOCK)
    table = torch.tensor(_FP4_MAGNITUDES, dtype=torch.float32, device=msg.device)
    mag = table[(nib & 7).long()] * scale[:, None]
    return torch.where((nib >> 3) == 1, -mag, mag).view(-1)[:n]


def _encode(kind: str, x: torch.Tensor) -> torch.Tensor:
    """The message of a flat float32 vector in `kind` (fp16, bf16, int8, fp4), without the header."""
    if kind == "fp16":
        return _as_bytes(x.to(torch.float16))
    if kind == "bf16":
        return _as_bytes(x.to(torch.bfloat16))
    if kind == "int8":
        return _int8_encode(x)
    if kind == "fp4":
        return _fp4_encode(x)
    raise AssertionError(kind)


def _decode(kind: str, msg: torch.Tensor, n: int) -> torch.Tensor:
    """The float32 vector of n elements that _encode(kind, .) made `msg` (without the header) of."""
    if kind == "fp16":
        return _read(msg, 0, n, torch.float16).to(torch.float32)
    if kind == "bf16":
        return _read(msg, 0, n, torch.bfloat16).to(torch.float32)
    if kind == "int8":
        return _int8_decode(msg, n)
    if kind == "fp4":
        return _fp4_decode(msg, n)
    raise AssertionError(kind)


class _Exchange:
    def __init__(self, due: int, started: int) -> None:
        self.due = due
        self.started = started
        self.work = None
        self.buffer: Optional[torch.Tensor] = None
        self.gathered: Optional[List[torch.Tensor]] = None
        self.mean: Optional[torch.Tensor] = None
        self.counts: Optional[List[int]] = None
        self.residual: Optional[torch.Tensor] = None


class PythonRound:
    """da5a14f's DiLoCo reduced to one fragment of one parameter, rank 0 of `world`, no network: _start,
    _finish and _apply as that commit wrote them, the collective replaced by copies (see the module doc)."""

    def __init__(self, local: torch.Tensor, kind: str, density: Optional[float], world: int) -> None:
        self._kind, self._density = kind, density
        self._world, self._rank = world, 0
        self._local = [[local]]
        self._global = [[local.detach().to(torch.promote_types(local.dtype, torch.float32)).clone()]]
        self.outer_optimizer = torch.optim.SGD([{"params": g} for g in self._global], lr=0.7, momentum=0.9,
                                               nesterov=True)
        self._residual: List[Optional[torch.Tensor]] = [None]
        if kind == "topk":
            self._residual = [torch.zeros(local.numel(), dtype=torch.float32)]
        self._t = 0
        self.alpha = 0.0

    def round(self) -> None:  # DiLoCo.step's schedule with sync_every = 1, delay = 0, after the inner step
        self._t += 1
        ex = self._start(0)
        self._finish(0, ex)
        self._apply(0, ex)

    def _start(self, p: int) -> _Exchange:
        n = self._world
        with torch.no_grad():
            delta = torch.cat([(g - l.detach().to(g.dtype)).reshape(-1)
                               for g, l in zip(self._global[p], self._local[p])])
            bad = int((~torch.isfinite(delta)).sum().item())
            ex = _Exchange(due=self._t, started=self._t)
            if self._kind == "none":
                flags = delta.new_zeros(n)
                flags[self._rank] = bad
                ex.buffer = torch.cat([delta, flags])
                # n > 1: dist.all_reduce(ex.buffer) here (skipped: no network)
            else:
                x = delta.to(torch.float32)
                header = _as_bytes(torch.tensor([float(bad)], dtype=torch.float32, device=x.device))
                if self._kind == "topk":
                    e = self._residual[p] + x
                    k = min(e.numel(), max(1, math.ceil(self._density * e.numel() - 1e-9)))
                    idx = torch.topk(e.abs(), k, sorted=False).indices
                    values = e[idx]
                    ex.residual = e.index_fill_(0, idx, 0.0)
                    body = torch.cat([_as_bytes(values), _as_bytes(idx.to(torch.int32))])
                else:
                    body = _encode(self._kind, x)
                msg = torch.cat([header, body])
                ex.gathered = [torch.empty_like(msg) for _ in range(n)]
                # n > 1: dist.all_gather(ex.gathered, msg) here; no network: every slot gets this rank's message
                for slot in ex.gathered:
                    slot.copy_(msg)
        return ex

    def _finish(self, p: int, ex: _Exchange) -> None:
        n = self._world
        numel = sum(g.numel() for g in self._global[p])
        with torch.no_grad():
            if ex.buffer is not None:
                ex.counts = [int(c) for c in ex.buffer[numel:].tolist()]
                ex.mean = ex.buffer[:numel] / n
                ex.buffer = None
                return
            acc = torch.zeros(numel, dtype=torch.float32, device=ex.gathered[0].device)
            counts = []
            for msg in ex.gathered:
                counts.append(int(_read(msg, 0, 1, torch.float32).item()))
                body = msg[4:]
                if self._kind == "topk":
                    k = body.numel() // 8
                    values = _read(body, 0, k, torch.float32)
                    idx = _read(body, 4 * k, k, torch.int32).long()
                    acc.index_add_(0, idx, values)
                else:
                    acc += _decode(self._kind, body, numel)
            ex.counts = counts
            ex.mean = acc / n
            ex.gathered = None

    def _apply(self, p: int, ex: _Exchange) -> None:
        bad = [(r, c) for r, c in enumerate(ex.counts) if c != 0]
        if bad:
            raise RuntimeError(f"non-finite pseudo-gradient: {bad}")
        with torch.no_grad():
            off = 0
            for g in self._global[p]:
                g.grad = ex.mean[off:off + g.numel()].view_as(g).to(g.dtype)
                off += g.numel()
            self.outer_optimizer.step()
            for g in self._global[p]:
                g.grad = None
            if ex.residual is not None:
                self._residual[p] = ex.residual
            for l, g in zip(self._local[p], self._global[p]):
                if self.alpha == 0.0:
                    l.copy_(g)
                else:
                    l.copy_(torch.lerp(g, l.detach().to(g.dtype), self.alpha))

# --- the comparison ---------------------------------------------------------------------------------------

# (engine code, da5a14f's kind, its density)
CODES = [("dense", "none", None), ("fp16", "fp16", None), ("bf16", "bf16", None), ("int8", "int8", None),
         ("e3m0", "fp4", None), ("topk-0.01", "topk", 0.01)]


def stats(ts: List[float]) -> dict:
    return {"min_s": min(ts), "median_s": statistics.median(ts), "max_s": max(ts), "times_s": ts}


def time_rounds(inner_step, one_round, repeats: int) -> dict:
    inner_step()
    one_round()  # warm-up: the outer momentum is allocated in the first round
    ts = []
    for _ in range(repeats):
        inner_step()
        t0 = time.perf_counter()
        one_round()
        ts.append(time.perf_counter() - t0)
    return stats(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="20,24,26", help="log2 of d, comma-separated")
    ap.add_argument("--repeats", default="5,5,3", help="timed rounds per size (one number, or one per size)")
    ap.add_argument("--python-ranks", type=int, default=1, help="n of the Python round (1: like for like)")
    ap.add_argument("--codes", default=",".join(c for c, _, _ in CODES))
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    from commsgd_torch import _C

    store_path = os.path.join(tempfile.mkdtemp(prefix="diloco_python_"), "store")
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 1), rank=0, world_size=1)
    group = dist.new_group(ranks=[0], backend="gloo")

    load_start = os.getloadavg()
    wanted = args.codes.split(",")
    results = []
    sizes = [int(s) for s in args.sizes.split(",")]
    reps = [int(r) for r in args.repeats.split(",")]
    reps = reps * len(sizes) if len(reps) == 1 else reps
    for lg, repeats in zip(sizes, reps):
        d = 1 << lg
        gen = torch.Generator().manual_seed(42)
        x0 = 0.05 * torch.randn(d, generator=gen)
        g = torch.randn(d, generator=gen)
        for code, kind, density in CODES:
            if code not in wanted:
                continue
            row = {"d": d, "code": code, "python_kind": kind if density is None else f"topk:{density}",
                   "python_ranks": args.python_ranks}
            # The old pure-Python round.
            local = x0.clone()
            py = PythonRound(local, kind, density, args.python_ranks)
            row["python"] = time_rounds(lambda: local.add_(g, alpha=-1e-3), py.round, repeats)
            del py, local
            gc.collect()
            # The engine through the extension.
            flat = x0.clone()
            engine = _C.DiLoCoEngine(group, [d], 1, 1, 0, 0.0, "strided", 0.7, 0.9, code)
            engine.start(flat)
            row["engine"] = time_rounds(lambda: flat.add_(g, alpha=-1e-3), lambda: engine.advance(flat),
                                        repeats)
            row["python/engine"] = row["python"]["median_s"] / row["engine"]["median_s"]
            del engine, flat
            gc.collect()
            results.append(row)
            print(f"d=2^{lg} {code:10s} python {row['python']['median_s'] * 1e3:9.1f} ms  "
                  f"engine {row['engine']['median_s'] * 1e3:9.1f} ms  python/engine {row['python/engine']:6.2f}",
                  flush=True)
        del x0, g
        gc.collect()

    out = {"torch": torch.__version__, "torch_threads": torch.get_num_threads(), "python": sys.version,
           "extension": _C.__file__, "machine": platform.machine(), "repeats": dict(zip(sizes, reps)),
           "load_start": load_start, "load_end": os.getloadavg(), "results": results}
    dist.destroy_process_group()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
