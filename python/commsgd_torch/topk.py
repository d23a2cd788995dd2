"""Top-k sparsification with error feedback as a DDP communication hook.

Each bucket sends its k largest entries (after adding what earlier rounds held back) as (index, value) pairs,
or a dense all-reduce where that moves fewer bytes. With ``momentum`` > 0 the hook keeps momentum SGD's
momentum itself and the optimizer runs without it (see docs/pytorch.md, Momentum).
"""
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _C
from ._C import InvalidArgument
from ._cuda_topk import CudaTopK
from ._state import check_model, own_group

__all__ = ["SELECTORS", "TopKState", "topk_hook"]

SELECTORS = ("exact", "radix", "laplace_bisect", "hierarchical", "sampled")


class TopKState:
    r"""State of :func:`topk_hook`: per DDP bucket, top-k with error feedback and its settings.

    Args:
        process_group: the group the exchanges run on; ``None`` makes a new gloo group of all ranks (a
            collective call). Pass an NCCL group to exchange CUDA buckets over NCCL.
        model: the module DDP wraps; its parameters' order names each bucket's state.
        density: in (0, 1]; each bucket (or parameter, with ``layerwise``) sends k = ceil(density * size).
        selector: how the CPU threshold is found, one of :data:`SELECTORS`.
        momentum: in [0, 1); > 0 keeps a local momentum u <- m u + g and sends the top-k of u plus the
            residual. Run the optimizer without momentum then.
        momentum_rule: ``"dgc"`` zeroes u where sent (DGC's masking; better at small densities) or
            ``"keep"`` lets it run on (what is applied adds up to momentum SGD's updates).
        start_iter: iterations averaged densely (no residual kept) before top-k starts. With momentum they
            return momentum SGD's update and top-k starts from that momentum.
        warmup_momentum: ``False`` leaves momentum out of the dense iterations.
        layerwise: select per parameter instead of over the whole bucket.
        dgc_warmup_steps_per_stage: > 0 runs DGC's density warm-up (25 %, 6.25 %, 1.56 %, 0.39 %) first,
            this many iterations a stage; CPU buckets only.

    CUDA buckets take commsgd's batched device step (float32, float16 or bfloat16, always exact top-k, ties to
    the lower index), exchanged by an all-gather over ``process_group``; see docs/pytorch.md, CUDA buckets.
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, *, model: torch.nn.Module,
                 density: float = 0.01, selector: str = "laplace_bisect", momentum: float = 0.0,
                 momentum_rule: str = "dgc", start_iter: int = 0, warmup_momentum: bool = True,
                 layerwise: bool = False, dgc_warmup_steps_per_stage: int = 0) -> None:
        check_model(model, "TopKState")
        # By data pointer for DDP's buckets (their parameters are new Python objects); by identity for
        # sharded ones (commsgd_torch.hsdp), whose DTensor parameters all report a null data pointer.
        self._index = {p.data_ptr(): i for i, p in enumerate(model.parameters())}
        self._by_id = {id(p): i for i, p in enumerate(model.parameters())}
        self.process_group = own_group(process_group)
        self._c = _C.TopK(self.process_group, selector, float(density), float(momentum), str(momentum_rule),
                          int(start_iter), int(dgc_warmup_steps_per_stage), bool(warmup_momentum),
                          bool(layerwise))
        self._cuda = CudaTopK(self.process_group, float(density), float(momentum), str(momentum_rule),
                              int(start_iter), int(dgc_warmup_steps_per_stage), bool(warmup_momentum),
                              bool(layerwise))

    @property
    def iter(self) -> int:
        """Iterations this state has exchanged (a bucket's last round ends one)."""
        return self._cuda.iteration if self._cuda.used else self._c.iteration()

    def _bucket_params(self, bucket: dist.GradBucket) -> Tuple[List[int], List[int]]:
        params = bucket.parameters()
        shards = getattr(bucket, "shard_sizes", None)
        try:
            if shards is not None:
                return [self._by_id[id(p)] for p in params], shards()
            return [self._index[p.data_ptr()] for p in params], [p.numel() for p in params]
        except KeyError:
            raise InvalidArgument("commsgd: a bucket holds a parameter that is not among the parameters of "
                                  "the model given to TopKState") from None

    def exchange(self, bucket: dist.GradBucket) -> torch.Tensor:
        """The bucket's average over ranks, waited for (the hook itself does not wait)."""
        idx, sizes = self._bucket_params(bucket)
        side = self._cuda if bucket.buffer().is_cuda else self._c
        return side.exchange(bucket.buffer(), idx, sizes, bucket.is_last())

    def exchange_async(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The bucket's round, posted to the state's exchange thread; its future at once."""
        idx, sizes = self._bucket_params(bucket)
        side = self._cuda if bucket.buffer().is_cuda else self._c
        return side.exchange_async(bucket.buffer(), idx, sizes, bucket.is_last())

    def traffic(self) -> Dict[str, int]:
        """Bytes and messages this rank sent and received since construction or reset_traffic(); CUDA
        buckets' exchanges counted as 8 bytes per pair to each peer (dense rounds as a ring all-reduce)."""
        t = self._c.traffic()
        for k, v in self._cuda.counters.items():
            t[k] += v
        return t

    def reset_traffic(self) -> None:
        self._c.reset_traffic()
        self._cuda.counters = dict.fromkeys(self._cuda.counters, 0)

    def compute_seconds(self) -> float:
        """Seconds this rank spent selecting and in error feedback so far (CPU buckets only: the device
        step is not waited for)."""
        return self._c.compute_seconds()

    def keys(self) -> List[str]:
        """The buckets holding state, each named by its parameters' indices in the model."""
        return sorted(self._c.keys() + self._cuda.keys())

    def _either(self, name: str, key: str) -> Any:
        got = getattr(self._cuda, name)(key)
        return got if got is not None else getattr(self._c, name)(key)

    def residual(self, key: str) -> Optional[torch.Tensor]:
        """The bucket's residual (float32, on the bucket's device), or None."""
        return self._either("residual", key)

    def last_sent(self, key: str) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(indices, values) of the bucket's last message, or None."""
        return self._either("last_sent", key)

    def momentum_buffer(self, key: str) -> Optional[torch.Tensor]:
        """The bucket's momentum u (None without momentum or before its first top-k round)."""
        return self._either("momentum_buffer", key)

    def cuda_report(self, key: str) -> Optional[Dict[str, Any]]:
        """A CUDA bucket's device step figures (steps committed and refused, per tensor its threshold and how
        its steps were searched), or None."""
        return self._cuda.report(key)

    def state_dict(self) -> Dict[str, Any]:
        d = self._c.state_dict()
        d["cuda"] = self._cuda.state_dict()
        return d

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._c.load_state_dict(state)
        if "cuda" in state:
            self._cuda.load_state_dict(state["cuda"])


def topk_hook(state: TopKState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    r"""Average the bucket over ranks by sending each rank's top-k entries, with error feedback.

    The round runs on the state's own exchange thread (one round in flight at a time, in bucket order), so
    the hook returns at once and DDP goes on with backward. What a rank does not send stays in its residual
    and is added to the next round's gradient.

    Args:
        state (TopKState): the density, selector, momentum and the per-bucket residuals.
        bucket (dist.GradBucket): the flattened gradients of one DDP bucket.

    Returns:
        A future of the bucket's average over ranks; an error in the exchange completes it with that error
        on every rank.

    Example::
        >>> # xdoctest: +SKIP
        >>> state = TopKState(model=model, density=0.01, momentum=0.9)
        >>> ddp_model.register_comm_hook(state, topk_hook)
    """
    return state.exchange_async(bucket)
