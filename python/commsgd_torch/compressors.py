"""commsgd's compressors as a DDP communication hook: fp16, bf16, EF-SignSGD, QSGD and random-k.

    state = commsgd_torch.CompressorState(None, "qsgd", levels=4)
    ddp.register_comm_hook(state, commsgd_torch.compressor_hook)

Each DDP bucket gets its own compressor (keyed by the bucket's index, as PyTorch's PowerSGD hook keys its
state), so error feedback and the step counter that keys the random draws are per bucket. The hook returns
the bucket's mean over ranks, as DDP expects: every rank decodes every rank's message and sums them in rank
order, so all ranks get the same bits. Bytes are metered (state.traffic()).

Options by kind (anything else raises InvalidArgument):
    fp16, bf16  error_feedback=False, overflow="refuse" (or "clamp": send the largest finite value instead)
    sign        error_feedback=True, layerwise=True (one scale per parameter, else one per bucket)
    qsgd        levels=8, error_feedback=False, seed=0, layerwise=True (one norm per parameter)
    randomk     density=0.01, error_feedback=True, seed=0
    all         start_iter=2: iterations averaged densely first. DDP rebuilds its buckets at its second
                iteration, and a bucket whose layout changes once compressed raises (its residual would land
                on other parameters), so start_iter must be >= 2.
"""
import torch
import torch.distributed as dist

from . import _C

__all__ = ["CompressorState", "compressor_hook", "KINDS"]

KINDS = ("fp16", "bf16", "sign", "qsgd", "randomk")

_DEFAULTS = {
    "fp16": {"error_feedback": False, "overflow": "refuse"},
    "bf16": {"error_feedback": False, "overflow": "refuse"},
    "sign": {"error_feedback": True, "layerwise": True},
    "qsgd": {"levels": 8, "error_feedback": False, "seed": 0, "layerwise": True},
    "randomk": {"density": 0.01, "error_feedback": True, "seed": 0},
}


class CompressorState:
    """Per-bucket compressors of one kind (one of KINDS) and their settings; see the module's docstring."""

    def __init__(self, process_group=None, kind="fp16", start_iter=2, **options):
        if kind not in _DEFAULTS:
            raise _C.InvalidArgument(
                f"commsgd: argument 'kind' = {kind!r} is not one of {', '.join(KINDS)}")
        unknown = sorted(set(options) - set(_DEFAULTS[kind]))
        if unknown:
            raise _C.InvalidArgument(
                f"commsgd: option {unknown[0]!r} does not apply to kind {kind!r}; its options are "
                f"{', '.join(sorted(_DEFAULTS[kind]))} and start_iter")
        if int(start_iter) < 2:
            raise _C.InvalidArgument(
                f"commsgd: argument 'start_iter' = {start_iter} is outside the allowed range [2, inf) (DDP "
                "rebuilds its buckets at iteration 1)")
        o = dict(_DEFAULTS[kind], **options)
        self.kind = kind
        self.options = o
        self.start_iter = int(start_iter)
        self.iter = 0
        group = process_group if process_group is not None else dist.new_group(backend="gloo")
        self._c = _C.Compressor(group, kind, bool(o.get("error_feedback", False)), str(o.get("overflow", "refuse")),
                                int(o.get("levels", 8)), float(o.get("density", 0.01)), int(o.get("seed", 0)),
                                bool(o.get("layerwise", False)))

    def maybe_increase_iter(self, bucket):
        if bucket.is_last():
            self.iter += 1

    def exchange(self, bucket):
        buf = bucket.buffer()
        if self.iter < self.start_iter:
            self._c.average(buf)
        else:
            buf = self._c.exchange(buf, bucket.index(), [int(t.numel()) for t in bucket.gradients()])
        self.maybe_increase_iter(bucket)
        return buf

    def traffic(self):
        """Bytes and messages this rank sent and received since construction or reset_traffic()."""
        return self._c.traffic()

    def reset_traffic(self):
        self._c.reset_traffic()

    def keys(self):
        return self._c.keys()

    def residual(self, index):
        """Bucket `index`'s error-feedback residual (empty without error feedback)."""
        return self._c.residual(index)

    def residual_low(self, index):
        """Its low part: residual + residual_low is exactly what the messages held back."""
        return self._c.residual_low(index)

    def wire_bytes(self, index):
        """Bytes this rank sent in bucket `index`'s last compressed round (cost/compress.hpp's model)."""
        return self._c.wire_bytes(index)

    def steps(self, index):
        return self._c.steps(index)

    def indices(self, index):
        """randomk: the positions bucket `index` sent in its last round, the same on every rank."""
        return self._c.indices(index)

    def state_dict(self):
        return {"kind": self.kind, "options": dict(self.options), "iter": self.iter,
                "buckets": self._c.state_dict()}

    def load_state_dict(self, state):
        if state.get("kind") != self.kind or state.get("options") != self.options:
            raise _C.InvalidArgument(
                f"commsgd: the state dict is of kind {state.get('kind')!r} with options {state.get('options')}, "
                f"this state is {self.kind!r} with {self.options}")
        self._c.load_state_dict(state["buckets"])
        self.iter = state["iter"]


def compressor_hook(state, bucket):
    """DDP communication hook: the bucket's compressed round, averaged over ranks (state: CompressorState)."""
    fut = torch.futures.Future()
    fut.set_result(state.exchange(bucket))
    return fut
