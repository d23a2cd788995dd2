"""commsgd's compressors as a DDP communication hook: fp16, bf16, EF-SignSGD, QSGD and random-k.

    state = commsgd_torch.CompressorState(kind="qsgd", levels=4)
    ddp.register_comm_hook(state, commsgd_torch.compressor_hook)

The hook returns a future at once (the round runs on the state's exchange thread, so DDP overlaps it with
the rest of backward); its value is the averaged bucket. fp16 and bf16 are a ring all-reduce
with 16-bit values on the wire and float sums (compress/half.hpp): the bytes of PyTorch's fp16 hook.

Each DDP bucket gets its own compressor (keyed by the bucket's index, as PyTorch's PowerSGD hook keys its
state), so error feedback and the step counter that keys the random draws are per bucket. The hook returns
the bucket's mean over ranks, as DDP expects: every rank decodes every rank's message and sums them in rank
order, so all ranks get the same bits. Bytes are metered (state.traffic()).

Options by kind (anything else raises InvalidArgument):
    fp16, bf16  error_feedback=False, overflow="refuse" (or "clamp": send the largest finite value instead)
    sign        error_feedback=True, layerwise=True (one scale per parameter, else one per bucket)
    qsgd        levels=8, error_feedback=False, seed=0, layerwise=True (one norm per parameter)
    random_k     density=0.01, error_feedback=True, seed=0
    all         start_iter=2: iterations averaged densely first. DDP rebuilds its buckets at its second
                iteration, and a bucket whose layout changes once compressed raises (its residual would land
                on other parameters), so start_iter must be >= 2 where a bucket keeps state (error feedback
                or momentum); fp16 and bf16 without either may start at 0.
                momentum=0.0: > 0 (in [0, 1)) keeps a local momentum u <- m u + g per bucket and sends u
                through the compressor (with its error feedback), for an optimizer run without momentum:
                EF-SignSGD and random-k diverge with momentum 0.9 in the optimizer and converge with it here.
                During the dense warm-up the hook returns momentum SGD's update, and compression starts from
                that momentum.
"""
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from . import _C
from ._state import IterCounted, own_group

__all__ = ["CompressorState", "compressor_hook", "KINDS"]

KINDS = ("fp16", "bf16", "sign", "qsgd", "random_k")

_DEFAULTS = {
    "fp16": {"error_feedback": False, "overflow": "refuse"},
    "bf16": {"error_feedback": False, "overflow": "refuse"},
    "sign": {"error_feedback": True, "layerwise": True},
    "qsgd": {"levels": 8, "error_feedback": False, "seed": 0, "layerwise": True},
    "random_k": {"density": 0.01, "error_feedback": True, "seed": 0},
}


class CompressorState(IterCounted):
    r"""State of :func:`compressor_hook`: one compressor of one kind per DDP bucket, and their settings.

    Args:
        process_group: the group the exchanges run on; ``None`` makes a new gloo group of all ranks (a
            collective call).
        kind: one of :data:`KINDS`.
        start_iter: iterations averaged densely before compression starts (see the module's docstring for
            the allowed range).
        options: the kind's options, and ``momentum`` for every kind (see the module's docstring).
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, *, kind: str = "fp16",
                 start_iter: int = 2, **options: Any) -> None:
        if kind not in _DEFAULTS:
            raise _C.InvalidArgument(
                f"commsgd: argument 'kind' = {kind!r} is not one of {', '.join(KINDS)}")
        unknown = sorted(set(options) - set(_DEFAULTS[kind]) - {"momentum"})
        if unknown:
            raise _C.InvalidArgument(
                f"commsgd: option {unknown[0]!r} does not apply to kind {kind!r}; its options are "
                f"{', '.join(sorted(_DEFAULTS[kind]))}, momentum and start_iter")
        o = dict(_DEFAULTS[kind], **options)
        momentum = float(o.pop("momentum", 0.0))
        stateless = kind in ("fp16", "bf16") and not o.get("error_feedback") and momentum == 0.0
        if int(start_iter) < (0 if stateless else 2):
            raise _C.InvalidArgument(
                f"commsgd: argument 'start_iter' = {start_iter} is outside the allowed range "
                f"[{0 if stateless else 2}, inf) (DDP rebuilds its buckets at iteration 1)")
        o["momentum"] = momentum
        self.kind = kind
        self.options = o
        self.start_iter = int(start_iter)
        self.iter = 0
        self.process_group = own_group(process_group)
        self._c = _C.Compressor(self.process_group, kind, bool(o.get("error_feedback", False)), str(o.get("overflow", "refuse")),
                                int(o.get("levels", 8)), float(o.get("density", 0.01)), int(o.get("seed", 0)),
                                bool(o.get("layerwise", False)), momentum)

    def exchange_async(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The bucket's round, posted to the state's exchange thread; returns its future at once."""
        buf = bucket.buffer()
        if self.iter < self.start_iter:
            fut = self._c.average_async(buf, bucket.index())
        else:
            fut = self._c.exchange_async(buf, bucket.index(), [int(t.numel()) for t in bucket.gradients()])
        self.maybe_increase_iter(bucket)
        return fut

    def keys(self) -> List[int]:
        """The buckets holding state, by DDP's bucket index."""
        return self._c.keys()

    def momentum_buffer(self, key: int) -> torch.Tensor:
        """Bucket `key`'s momentum u (empty without the hook's momentum)."""
        return self._c.momentum_buffer(key)

    def residual(self, key: int) -> torch.Tensor:
        """Bucket `key`'s error-feedback residual (empty without error feedback)."""
        return self._c.residual(key)

    def residual_low(self, key: int) -> torch.Tensor:
        """Its low part: residual + residual_low is exactly what the messages held back."""
        return self._c.residual_low(key)

    def wire_bytes(self, key: int) -> int:
        """Bytes this rank sent in bucket `key`'s last compressed round (cost/compress.hpp's model)."""
        return self._c.wire_bytes(key)

    def steps(self, key: int) -> int:
        """Compressed rounds bucket `key` has run."""
        return self._c.steps(key)

    def indices(self, key: int) -> List[int]:
        """random_k: the positions bucket `key` sent in its last round, the same on every rank."""
        return self._c.indices(key)

    def state_dict(self) -> Dict[str, Any]:
        c = self._c.state_dict()
        return {"kind": self.kind, "options": dict(self.options), "iter": self.iter,
                "buckets": c["buckets"], "warmup_velocity": c["warmup_velocity"]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("kind") != self.kind or state.get("options") != self.options:
            raise _C.InvalidArgument(
                f"commsgd: the state dict is of kind {state.get('kind')!r} with options {state.get('options')}, "
                f"this state is {self.kind!r} with {self.options}")
        self._c.load_state_dict({"buckets": state["buckets"],
                                 "warmup_velocity": state.get("warmup_velocity", {})})
        self.iter = state["iter"]


def compressor_hook(state: CompressorState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    r"""Average the bucket over ranks through the state's compressor (fp16, bf16, sign, qsgd or random-k).

    Until ``start_iter`` the bucket is averaged densely; then each rank's compressed message is exchanged
    and every rank decodes and sums all of them in rank order, so every rank gets the same bits. The round
    runs on the state's exchange thread and the hook returns at once.

    Args:
        state (CompressorState): the kind, its options and each bucket's compressor.
        bucket (dist.GradBucket): the flattened gradients of one DDP bucket.

    Returns:
        A future of the bucket's average over ranks.

    Example::
        >>> # xdoctest: +SKIP
        >>> state = CompressorState(kind="sign", momentum=0.9)
        >>> ddp_model.register_comm_hook(state, compressor_hook)
    """
    return state.exchange_async(bucket)
