"""commsgd's compressors as a DDP communication hook: fp16, bf16, EF-SignSGD, QSGD and random-k.

    state = commsgd_torch.CompressorState(None, "qsgd", levels=4)
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
    randomk     density=0.01, error_feedback=True, seed=0
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
        group = process_group if process_group is not None else dist.new_group(backend="gloo")
        self._c = _C.Compressor(group, kind, bool(o.get("error_feedback", False)), str(o.get("overflow", "refuse")),
                                int(o.get("levels", 8)), float(o.get("density", 0.01)), int(o.get("seed", 0)),
                                bool(o.get("layerwise", False)), momentum)

    def maybe_increase_iter(self, bucket):
        if bucket.is_last():
            self.iter += 1

    def exchange(self, bucket):
        """The bucket's round, waiting for it (the hook uses exchange_async)."""
        return self.exchange_async(bucket).wait()

    def exchange_async(self, bucket):
        """The bucket's round, posted to the state's exchange thread; returns its future at once."""
        buf = bucket.buffer()
        if self.iter < self.start_iter:
            fut = self._c.average_async(buf, bucket.index())
        else:
            fut = self._c.exchange_async(buf, bucket.index(), [int(t.numel()) for t in bucket.gradients()])
        self.maybe_increase_iter(bucket)
        return fut

    def traffic(self):
        """Bytes and messages this rank sent and received since construction or reset_traffic()."""
        return self._c.traffic()

    def reset_traffic(self):
        self._c.reset_traffic()

    def keys(self):
        return self._c.keys()

    def velocity(self, index):
        """Bucket `index`'s momentum u (empty without the hook's momentum)."""
        return self._c.velocity(index)

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
        c = self._c.state_dict()
        return {"kind": self.kind, "options": dict(self.options), "iter": self.iter,
                "buckets": c["buckets"], "warmup_velocity": c["warmup_velocity"]}

    def load_state_dict(self, state):
        if state.get("kind") != self.kind or state.get("options") != self.options:
            raise _C.InvalidArgument(
                f"commsgd: the state dict is of kind {state.get('kind')!r} with options {state.get('options')}, "
                f"this state is {self.kind!r} with {self.options}")
        self._c.load_state_dict({"buckets": state["buckets"],
                                 "warmup_velocity": state.get("warmup_velocity", {})})
        self.iter = state["iter"]


def compressor_hook(state, bucket):
    """DDP communication hook: the bucket's compressed round, averaged over ranks (state: CompressorState)."""
    return state.exchange_async(bucket)
