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
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from . import _C
from ._state import IterCounted, own_group

__all__ = ["PowerSGDState", "powersgd_hook", "torch_initial_q"]


def _shapes(tensors: Sequence[torch.Tensor]) -> List[Tuple[int, int]]:
    """Each gradient as PyTorch's hook views it: tensor.view(shape[0], -1)."""
    out = []
    for t in tensors:
        rows = t.shape[0] if t.dim() > 0 else 1
        out.append((int(rows), int(t.numel() // rows) if rows else 0))
    return out


def torch_initial_q(shapes: Sequence[Tuple[int, int]], rank: int, min_compression_rate: float,
                    seed_source: np.random.RandomState) -> torch.Tensor:
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


class PowerSGDState(IterCounted):
    r"""State of :func:`powersgd_hook`: PowerSGD's settings and per-bucket factors and residuals.

    The positional arguments are those of PyTorch's ``PowerSGDState``, in its order, so this class replaces
    it in existing code. ``start_powerSGD_iter`` keeps PyTorch's name for what commsgd's other states call
    ``start_iter``.

    Args:
        process_group: the group the exchanges run on; ``None`` makes a new gloo group of all ranks (a
            collective call).
        matrix_approximation_rank: r, the rank of the factors.
        start_powerSGD_iter: iterations averaged densely before compression starts; >= 2 with error
            feedback or warm start, since DDP rebuilds its buckets at iteration 1.
        min_compression_rate: a layer is compressed only when it saves at least this factor.
        use_error_feedback: keep what compression lost and add it to the next round.
        warm_start: start each round's power iteration from the last round's Q.
        orthogonalization_epsilon: added in Gram-Schmidt's norms (0: as PyTorch's default).
        random_seed: the seed of the initial Q.
        compression_stats_logging_frequency: accepted for compatibility; commsgd meters its bytes
            instead (:meth:`traffic`).
        batch_tensors_with_same_shape: accepted for compatibility; every compressed layer of a bucket
            travels in one all-reduce anyway.
        initial_q: ``"torch"`` draws the initial Q as PyTorch's hook does (to compare with it);
            ``"commsgd"`` takes the library's own seeded draw.
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, matrix_approximation_rank: int = 1,
                 start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2,
                 use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0,
                 compression_stats_logging_frequency: int = 10_000, batch_tensors_with_same_shape: bool = False,
                 *, initial_q: str = "torch") -> None:
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise _C.InvalidArgument(
                f"commsgd: argument 'start_powerSGD_iter' = {start_powerSGD_iter} is outside the allowed "
                "range [2, inf) with error feedback or warm start (DDP rebuilds its buckets at iteration 1)")
        if initial_q not in ("torch", "commsgd"):
            raise _C.InvalidArgument(
                f"commsgd: argument 'initial_q' = {initial_q!r} is not 'torch' or 'commsgd'")
        self.process_group = own_group(process_group)
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.min_compression_rate = float(min_compression_rate)
        self.start_powerSGD_iter = int(start_powerSGD_iter)
        self.initial_q = initial_q
        self.iter = 0
        self.rng = np.random.RandomState(random_seed)
        self._c = _C.PowerSGD(self.process_group, self.matrix_approximation_rank, self.min_compression_rate,
                              float(orthogonalization_epsilon), int(random_seed), bool(use_error_feedback),
                              bool(warm_start))

    def exchange_async(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
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

    def payload(self, key: int) -> Tuple[int, int, int]:
        """(dense values, P values, Q values) bucket `key` (its index) hands its three all-reduces a round."""
        return self._c.payload(key)

    def residual(self, key: int) -> torch.Tensor:
        """Bucket `key`'s error-feedback residual."""
        return self._c.residual(key)

    def state_dict(self) -> Dict[str, Any]:
        # The numpy generator's state as a tensor and numbers: torch.load's default (weights_only, since torch
        # 2.6) refuses numpy objects in a checkpoint.
        _, keys, pos, has_gauss, gauss = self.rng.get_state()
        rng = {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
               "cached_gaussian": float(gauss)}
        return {"iter": self.iter, "rng": rng, "buckets": self._c.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._c.load_state_dict(state["buckets"])
        self.iter = state["iter"]
        rng = state["rng"]
        self.rng.set_state(("MT19937", rng["keys"].numpy().astype(np.uint32), rng["pos"], rng["has_gauss"],
                            rng["cached_gaussian"]))


def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    r"""Average the bucket over ranks through PowerSGD's rank-r factors, as PyTorch's ``powerSGD_hook``.

    For the first ``start_powerSGD_iter`` iterations the bucket is averaged densely. Then each matrix that
    compression pays for travels as P = M Q and Q = M^T P (orthogonalised in between), the others densely,
    in three all-reduces a round on the state's exchange thread; the hook returns at once.

    Args:
        state (PowerSGDState): the settings and each bucket's factors and residual.
        bucket (dist.GradBucket): the flattened gradients of one DDP bucket.

    Returns:
        A future of the bucket's average over ranks (the compressed layers' low-rank approximation).

    Example::
        >>> # xdoctest: +SKIP
        >>> state = PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=10)
        >>> ddp_model.register_comm_hook(state, powersgd_hook)
    """
    return state.exchange_async(bucket)
