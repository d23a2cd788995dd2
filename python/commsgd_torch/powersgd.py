"""PowerSGD for DDP backed by commsgd's compress::powersgd, a drop-in for PyTorch's powerSGD_hook.

    state = commsgd_torch.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=10)
    ddp.register_comm_hook(state, commsgd_torch.powersgd_hook)

The settings mean what they mean in torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState:
the same rule leaves layers dense, the same Gram-Schmidt, warm start and error feedback on compressed layers,
and with initial_q="torch" the same initial Q as PyTorch's hook for the same random_seed (its numpy draw of a
torch seed per bucket, then torch.randn per compressed layer in its order). Differences: dense layers keep no
residual (they travel exactly), a zero column is left zero instead of becoming NaN, a layer's all-zero Q is
drawn afresh, and without warm start the later draws are commsgd's own. The hook returns a future of the mean
over ranks at once (the round runs on the state's exchange thread, so DDP overlaps it with backward); bytes
are metered (state.traffic()).
"""
from collections import OrderedDict

import numpy as np
import torch
import torch.distributed as dist

from . import _C

__all__ = ["PowerSGDState", "powersgd_hook", "torch_initial_q"]


def _shapes(tensors):
    """Each gradient as PyTorch's hook views it: tensor.view(shape[0], -1)."""
    out = []
    for t in tensors:
        rows = t.shape[0] if t.dim() > 0 else 1
        out.append((int(rows), int(t.numel() // rows) if rows else 0))
    return out


def torch_initial_q(shapes, rank, min_compression_rate, seed_source):
    """The initial Q PyTorch's powerSGD_hook draws for a bucket of these shapes, in commsgd's layout.

    seed_source: the numpy RandomState of the state (PyTorch draws one torch seed from it per new bucket).
    PyTorch draws torch.randn(1, cols, r) per compressed layer, grouped by shape in order of first
    appearance; commsgd takes them in gradient order, each cols x r row-major."""
    layers = _C.powersgd_compressed_layers(shapes, rank, min_compression_rate)
    groups = OrderedDict()
    for layer, r in layers:
        groups.setdefault(shapes[layer], []).append((layer, r))
    draws = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_source.randint(1_000_000_000))
        for members in groups.values():
            for layer, r in members:
                draws[layer] = torch.randn(1, shapes[layer][1], r, device="cpu", dtype=torch.float32)
    if not layers:
        return torch.zeros(0)
    return torch.cat([draws[layer].reshape(-1) for layer, _ in layers])


class PowerSGDState:
    """PowerSGD's settings and per-bucket state; the arguments are PyTorch's PowerSGDState's.

    initial_q: "torch" draws the initial Q as PyTorch's hook does (to compare with it); "commsgd" uses the
    library's own seeded draw.
    """

    def __init__(self, process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=1_000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0, initial_q="torch"):
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise _C.InvalidArgument(
                f"commsgd: argument 'start_powerSGD_iter' = {start_powerSGD_iter} is outside the allowed "
                "range [2, inf) with error feedback or warm start (DDP rebuilds its buckets at iteration 1)")
        if initial_q not in ("torch", "commsgd"):
            raise _C.InvalidArgument(
                f"commsgd: argument 'initial_q' = {initial_q!r} is not 'torch' or 'commsgd'")
        group = process_group if process_group is not None else dist.new_group(backend="gloo")
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.min_compression_rate = float(min_compression_rate)
        self.start_powerSGD_iter = int(start_powerSGD_iter)
        self.initial_q = initial_q
        self.iter = 0
        self.rng = np.random.RandomState(random_seed)
        self._c = _C.PowerSGD(group, self.matrix_approximation_rank, self.min_compression_rate,
                              float(orthogonalization_epsilon), int(random_seed), bool(use_error_feedback),
                              bool(warm_start))

    def maybe_increase_iter(self, bucket):
        if bucket.is_last():
            self.iter += 1

    def exchange(self, bucket):
        """The bucket's round, waiting for it (the hook uses exchange_async)."""
        return self.exchange_async(bucket).wait()

    def exchange_async(self, bucket):
        """The bucket's round, posted to the state's exchange thread; returns its future at once."""
        buf = bucket.buffer()
        if self.iter < self.start_powerSGD_iter:
            fut = self._c.average_async(buf)
            self.maybe_increase_iter(bucket)
            return fut
        index = bucket.index()
        shapes = _shapes(bucket.gradients())
        if not self._c.has(index):
            q = None
            if self.initial_q == "torch":
                q = torch_initial_q(shapes, self.matrix_approximation_rank, self.min_compression_rate,
                                    self.rng)
            self._c.create(index, shapes, q)
        fut = self._c.exchange_async(buf, index, shapes)
        self.maybe_increase_iter(bucket)
        return fut

    def traffic(self):
        """Bytes and messages this rank sent and received since construction or reset_traffic()."""
        return self._c.traffic()

    def reset_traffic(self):
        self._c.reset_traffic()

    def payload(self, index):
        """(dense values, P values, Q values) bucket `index` hands its three all-reduces per round."""
        return self._c.payload(index)

    def residual(self, index):
        return self._c.residual(index)

    def state_dict(self):
        return {"iter": self.iter, "rng": self.rng.get_state(), "buckets": self._c.state_dict()}

    def load_state_dict(self, state):
        self._c.load_state_dict(state["buckets"])
        self.iter = state["iter"]
        self.rng.set_state(state["rng"])


def powersgd_hook(state, bucket):
    """DDP communication hook: the bucket's PowerSGD round, averaged over ranks (state: PowerSGDState)."""
    return state.exchange_async(bucket)
