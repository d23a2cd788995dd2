#!/usr/bin/python3
"""PowerSGD's compression time: commsgd's compress::powersgd against PyTorch's powerSGD_hook, in one process.

Both run on the same bucket (the layers of a model, random normal gradients), the same rank, with error
feedback and warm start, on the CPU with the same number of threads (torch.set_num_threads(--threads);
commsgd's round is single-threaded, so --threads 1 is the like-for-like setting). Two views:

  compute  the computation of a round without communication. commsgd: _C.powersgd_compute_seconds, the
           compressor on a one-rank comm::local (its all-reduces return at once). PyTorch: the body of
           powerSGD_hook step for step (error feedback add and clone, concatenation of the dense layers,
           orthogonalisation of Q, P = M Q, orthogonalisation of P, Q = M^T P, division, P Q^T, residual)
           with its own _orthogonalize, the all-reduces left out.
  hook     the whole hook on a one-process gloo group: powerSGD_hook against commsgd_torch.powersgd_hook
           (all-reduces over one rank included, the same for both).

The two sides are timed alternately (PyTorch's --rounds rounds, then commsgd's, --repeats times, after a
warm-up), so a change in the machine's load falls on both; each figure is the median over the repeats and the
ratio is the median of the per-repeat ratios, PyTorch's time over commsgd's (above 1: commsgd is faster).

    PYTHONPATH=build/dev/python /usr/bin/python3 examples/torch_ddp/powersgd_bench.py
"""
import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

import commsgd_torch
from commsgd_torch import _C

MODELS = {
    # The Fashion-MNIST MLP of examples/fashion_mnist (784-256-128-10), as nn.Linear stores it.
    "fashion_mnist_mlp": [(256, 784), (256,), (128, 256), (128,), (10, 128), (10,)],
    # One transformer block at BERT-base width (768, 4 x 768 feed-forward): 7.1M parameters.
    "transformer_block_768": [(768, 768), (768,), (768, 768), (768,), (768, 768), (768,), (768, 768), (768,),
                              (768,), (768,), (3072, 768), (3072,), (768, 3072), (768,), (768,), (768,)],
    # A 4096-wide MLP layer pair: 33.6M parameters.
    "mlp_4096": [(4096, 4096), (4096,), (4096, 4096), (4096,)],
}


class Bucket:
    def __init__(self, buffer, shapes):
        self._buffer = buffer
        self._views, off = [], 0
        for s in shapes:
            n = 1
            for d in s:
                n *= d
            self._views.append(buffer[off:off + n].view(s))
            off += n

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._views

    def parameters(self):
        return self._views

    def index(self):
        return 0

    def is_last(self):
        return True


def matrix_shapes(shapes):
    out = []
    for s in shapes:
        rows = s[0]
        n = 1
        for d in s:
            n *= d
        out.append((rows, n // rows))
    return out


class TorchCompute:
    """powerSGD_hook's computation for one bucket, without its all-reduces (world size 1)."""

    def __init__(self, shapes, rank, warm_start=True):
        self.shapes, self.rank = shapes, rank
        self.error = None
        self.p = self.q = None

    def round(self, input_tensor):
        rank = self.rank
        if self.error is None:
            self.error = torch.zeros_like(input_tensor)
        else:
            input_tensor.add_(self.error)
        input_tensor_cp = torch.clone(input_tensor).detach()
        tensors = Bucket(input_tensor, self.shapes).gradients()
        to_compress, uncompressed = [], []
        p_size = q_size = 0
        for t in tensors:
            m = t.view(t.shape[0], -1)
            n, k = m.shape
            r = min(n, k, rank)
            if psgd._should_compress(n, k, r, 2)[0]:
                to_compress.append(m)
                p_size += n * r
                q_size += k * r
            else:
                uncompressed.append(t)
        unc = torch.cat([t.view(-1) for t in uncompressed]) if uncompressed else torch.tensor([])
        fresh = self.p is None
        if fresh:
            self.p = torch.empty(p_size)
            self.q = torch.empty(q_size)
        groups = defaultdict(list)
        for t in to_compress:
            groups[t.shape].append(t)
        mats, ps, qs = [], [], []
        pi = qi = 0
        for ts in groups.values():
            for t in ts:
                t = t.unsqueeze(0)
                _, n, k = t.shape
                r = min(n, k, rank)
                mats.append(t)
                ps.append(self.p[pi:pi + n * r].view(1, n, r))
                qs.append(self.q[qi:qi + k * r].view(1, k, r))
                pi += n * r
                qi += k * r
        if fresh:
            for q in qs:
                q.copy_(torch.randn(*q.shape))
        for q in qs:
            psgd._orthogonalize(q, 0)
        for t, q, p in zip(mats, qs, ps):
            torch.bmm(t, q, out=p)
        idx = 0
        for t in uncompressed:  # the all-reduced dense values copied back (world 1: themselves)
            t.copy_(unc[idx:idx + t.numel()].view_as(t))
            idx += t.numel()
        for p in ps:
            psgd._orthogonalize(p, 0)
        for t, p, q in zip(mats, ps, qs):
            torch.bmm(t.transpose(1, 2), p, out=q)
        self.q.div_(1)
        for p, q, t in zip(ps, qs, mats):
            torch.bmm(p, q.transpose(1, 2), out=t)
        self.error = input_tensor_cp - input_tensor
        return input_tensor


def once(fn, rounds):
    t0 = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - t0) / rounds


def alternate(theirs, ours, a):
    """theirs() and ours() return seconds per round; returns (median theirs, median ours, median ratio)."""
    t, o = [], []
    theirs()
    ours()
    for _ in range(a.repeats):
        t.append(theirs())
        o.append(ours())
    return statistics.median(t), statistics.median(o), statistics.median(x / y for x, y in zip(t, o))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--hook", action="store_true", help="also time the whole hooks on a one-process group")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.hook:
        store = os.path.join(tempfile.mkdtemp(), "store")
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    print(f"threads {torch.get_num_threads()}, torch {torch.__version__}")
    print("| model | parameters | r | view | PyTorch ms | commsgd ms | ratio (PyTorch / commsgd) |")
    print("|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        shapes = MODELS[name]
        mshapes = matrix_shapes(shapes)
        n = sum(r * c for r, c in mshapes)
        g = torch.Generator().manual_seed(1)
        base = torch.randn(n, generator=g)
        for rank in [int(x) for x in a.ranks.split(",")]:
            tc = TorchCompute(shapes, rank)
            buf = base.clone()
            for _ in range(a.warmup):
                tc.round(buf)

            # No copy of the gradient between rounds: the hook leaves P Q^T in the bucket and adds the
            # residual M - P Q^T back next round, so every round compresses the same M. commsgd times its
            # rounds itself, in C++ (no Python call per round), after its own warm-up rounds.
            def ours():
                return _C.powersgd_compute_seconds(base, mshapes, rank, a.warmup, a.rounds)

            t, o, ratio = alternate(lambda: once(lambda: tc.round(buf), a.rounds), ours, a)
            print(f"| {name} | {n} | {rank} | compute | {t * 1e3:.3f} | {o * 1e3:.3f} | {ratio:.2f} |",
                  flush=True)
            if a.hook:
                st = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                        start_powerSGD_iter=2)
                st.iter = 2
                ostate = commsgd_torch.PowerSGDState(process_group=dist.group.WORLD,
                                                     matrix_approximation_rank=rank, start_powerSGD_iter=2)
                ostate.iter = 2
                hb, ob = base.clone(), base.clone()

                def torch_hook():
                    psgd.powerSGD_hook(st, Bucket(hb, shapes)).wait()

                def our_hook():
                    commsgd_torch.powersgd_hook(ostate, Bucket(ob, shapes)).wait()

                for _ in range(a.warmup):
                    torch_hook()
                    our_hook()
                t, o, ratio = alternate(lambda: once(torch_hook, a.rounds), lambda: once(our_hook, a.rounds),
                                        a)
                print(f"| {name} | {n} | {rank} | hook | {t * 1e3:.3f} | {o * 1e3:.3f} | {ratio:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
