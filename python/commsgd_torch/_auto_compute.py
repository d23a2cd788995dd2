"""AutoState's measurement of each candidate's local work: the casts, products and selections a candidate adds
to a step, timed on this machine on tensors of the model's bucket shapes (commsgd_torch.auto)."""
import time
from typing import Any, Callable, List, Sequence, Tuple

import torch

__all__ = ["candidate_compute", "matrices", "timed"]


def timed(fn: Callable[[], Any], repeats: int = 7) -> float:
    # The least of several timings after an untimed call: a first call pays one-time costs (thread pools,
    # first touch) and a busy machine preempts some calls; either would make the candidate timed first look
    # dearer than it is, enough to pick a compressed exchange on a free network.
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matrices(params: Sequence[torch.Tensor]) -> List[Tuple[int, int]]:
    """The 2-D views PowerSGD compresses (rows = first dimension), as cost/'s bucket shape wants them."""
    return [(p.shape[0], p.numel() // p.shape[0]) for p in params if p.dim() > 1]


def candidate_compute(name: str, buckets: Sequence[Tuple[int, List[Tuple[int, int]]]], world: int,
                      seed: int = 0) -> List[Tuple[float, float]]:
    """(call_s, async_s) per bucket of a candidate's local work on `world` ranks, timed here on tensors of
    the buckets' shapes, ((numel, [(rows, cols), ...]), ...): what AutoState predicts from."""
    out = []
    for numel, mats in buckets:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
        if name == "dense":
            out.append((timed(lambda: x.div(world)), 0.0))
        elif name in ("fp16", "bf16"):
            dt = torch.float16 if name == "fp16" else torch.bfloat16
            low = x.to(dt)
            out.append((timed(lambda: x.to(dt).div_(world)), timed(lambda: x.copy_(low))))
        elif name.startswith("powersgd"):
            r = int(name.split("-r")[1])
            ms = [torch.randn(a, b) for a, b in mats if (a + b) * r < a * b]
            qs = [torch.randn(b, r) for a, b in mats if (a + b) * r < a * b]

            def first():
                return [m @ q for m, q in zip(ms, qs)]
            ps = first()

            def rest():
                for m, p in zip(ms, ps):
                    p, _ = torch.linalg.qr(p)
                    q = m.t() @ p
                    m.copy_(p @ q.t())
            out.append((timed(first), timed(rest)))
        else:  # top-k: posted at once; selection (torch.topk, an upper bound of the library's) off-thread
            k = max(1, int(float(name.split("-", 1)[1]) * numel + 0.999999))
            out.append((0.0, timed(lambda: torch.topk(x.abs(), k, sorted=False))))
    return out
