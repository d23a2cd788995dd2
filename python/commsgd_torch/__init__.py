"""commsgd for PyTorch DDP: communication hooks backed by the commsgd library.

    import commsgd_torch
    state = commsgd_torch.TopKState(model, density=0.01, selector="laplace_bisect")
    ddp.register_comm_hook(state, commsgd_torch.topk_hook)

    ps = commsgd_torch.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=10)
    ddp.register_comm_hook(ps, commsgd_torch.powersgd_hook)

    auto = commsgd_torch.AutoState(ddp, optimizer)     # picks dense, fp16, PowerSGD or top-k for this run
    ddp.register_comm_hook(auto, commsgd_torch.auto_hook)

    ls = commsgd_torch.LocalSGD(model, lr=0.1, period=8, warmup_steps=20)
    ddp.register_comm_hook(ls, commsgd_torch.local_sgd_hook)
    ...; optimizer.step(); ls.step(loss=loss.item())

Every hook returns a future at once: the state's exchange runs on a thread of its own (one round in flight
per state, in bucket order, the GIL released), so DDP overlaps it with the rest of backward as it does its own
allreduce. The future's value is the averaged bucket; an error in the exchange completes the future with that
error on every rank, and DDP's backward (or fut.wait()) raises it. Reading a state (traffic(), residual(), state_dict(), ...) waits for its rounds first.

Momentum: give it to the hook and run the optimizer without it (TopKState(momentum=0.9),
CompressorState(..., momentum=0.9), SGD(momentum=0)). The hook sends momentum SGD's updates with error
feedback, so what is applied adds up to dense momentum SGD's updates; momentum left in the optimizer is
applied to the compressed average instead, which lags (top-k) or diverges (sign, random-k).

Each state talks over its own process group (by default a new gloo group of all ranks, made with
torch.distributed.new_group, so creating a state is collective), and counts the bytes this rank sent and
received in it: state.traffic().

Errors raise commsgd_torch.Error (a RuntimeError) or one of its subclasses (InvalidArgument, a
ValueError-like argument error; NonFinite; SizeMismatch; CommError; CorruptData; Unsupported), carrying the
library's message. An error on one rank inside an exchange makes the exchange raise on every rank.
"""
import torch
import torch.distributed as dist

from ._C import (CommError, CorruptData, Error, InvalidArgument, NonFinite, SizeMismatch, Unsupported)
from . import _C
from .powersgd import PowerSGDState, powersgd_hook
from .compressors import KINDS, CompressorState, compressor_hook
from .cuda_topk import CudaTopK

__all__ = ["TopKState", "topk_hook", "LocalSGD", "local_sgd_hook", "PowerSGDState", "powersgd_hook", "CompressorState", "compressor_hook", "KINDS", "AutoState", "auto_hook", "Error", "InvalidArgument", "NonFinite",
           "SizeMismatch", "CommError", "CorruptData", "Unsupported", "SELECTORS"]

SELECTORS = ("exact", "radix", "laplace_bisect", "hierarchical", "sampled")


def _own_group(process_group):
    if process_group is not None:
        return process_group
    return dist.new_group(backend="gloo")


class TopKState:
    """Top-k with error feedback per DDP bucket, exchanged sparsely (dense when that moves fewer bytes).

    model: the module wrapped by DDP (its parameters name the buckets' state).
    density: in (0, 1]; k = ceil(density * bucket size).
    selector: one of SELECTORS.
    momentum: momentum correction when > 0, in [0, 1): the hook keeps a local momentum u <- m u + g and sends
        the top-k of u plus the residual (run the optimizer without momentum).
    momentum_rule: "dgc" (DGC's momentum factor masking: u zeroed where sent; trains better at small
        densities) or "keep" (u runs on where sent: what is applied adds up to momentum SGD's updates).
    dense_warmup_steps: iterations averaged densely (no sparsification, no residual) before top-k starts;
        with momentum they return momentum SGD's update, and top-k starts from that momentum (without it,
        the first iterations ran with no momentum at all and top-k started from none: the early lag).
    warmup_momentum: False leaves momentum out of the dense warm-up (as before; for comparison).
    layerwise: True selects per parameter (k = ceil(density * size) each, as DGC does), False over the
        whole bucket.
    dgc_warmup_steps_per_stage: > 0 runs DGC's density warm-up (25 %, 6.25 %, 1.56 %, 0.39 %) first.

    CUDA buckets (a model on the GPU) take commsgd's batched top-k step on the device, in float32, float16 or
    bfloat16, exchanged by an all-gather over the state's process group (gloo by default; pass an NCCL group
    as process_group to use NCCL). There `selector` does not apply (the device step is always exact top-k,
    ties to the lowest index) and dgc_warmup_steps_per_stage must be 0; see docs/pytorch.md, CUDA buckets.
    """

    def __init__(self, model, density=0.01, selector="laplace_bisect", momentum=0.0, dense_warmup_steps=0,
                 dgc_warmup_steps_per_stage=0, process_group=None, momentum_rule="dgc",
                 warmup_momentum=True, layerwise=False):
        self._index = {p.data_ptr(): i for i, p in enumerate(model.parameters())}
        group = _own_group(process_group)
        self._c = _C.TopK(group, selector, float(density), float(momentum),
                          str(momentum_rule), int(dense_warmup_steps), int(dgc_warmup_steps_per_stage),
                          bool(warmup_momentum), bool(layerwise))
        self._cuda = CudaTopK(group, float(density), float(momentum), str(momentum_rule), int(dense_warmup_steps),
                              int(dgc_warmup_steps_per_stage), bool(warmup_momentum), bool(layerwise))

    def bucket_params(self, bucket):
        params = bucket.parameters()
        try:
            idx = [self._index[p.data_ptr()] for p in params]
        except KeyError:
            raise InvalidArgument("commsgd: a bucket holds a parameter that is not among the model's "
                                  "parameters given to TopKState") from None
        return idx, [p.numel() for p in params]

    def exchange(self, bucket):
        """The bucket's average over ranks, waiting for it (the hook uses exchange_async)."""
        idx, sizes = self.bucket_params(bucket)
        if bucket.buffer().is_cuda:
            return self._cuda.exchange(bucket.buffer(), idx, sizes, bucket.is_last())
        return self._c.exchange(bucket.buffer(), idx, sizes, bucket.is_last())

    def exchange_async(self, bucket):
        """The bucket's round, posted to the state's exchange thread; returns its future at once."""
        idx, sizes = self.bucket_params(bucket)
        if bucket.buffer().is_cuda:
            return self._cuda.exchange_async(bucket.buffer(), idx, sizes, bucket.is_last())
        return self._c.exchange_async(bucket.buffer(), idx, sizes, bucket.is_last())

    def traffic(self):
        """Bytes and messages this rank sent and received since construction or reset_traffic(); CUDA buckets'
        exchanges counted as 8 bytes per pair to each peer (dense warm-up rounds as a ring all-reduce)."""
        t = self._c.traffic()
        for k, v in self._cuda.counters.items():
            t[k] += v
        return t

    def reset_traffic(self):
        self._c.reset_traffic()
        self._cuda.counters = dict.fromkeys(self._cuda.counters, 0)

    def iteration(self):
        return self._cuda.iteration if self._cuda.used else self._c.iteration()

    def compute_seconds(self):
        """Seconds this rank spent in the sparsifier (selection and error feedback) so far; CPU buckets only
        (the CUDA step runs on the device, unwaited for)."""
        return self._c.compute_seconds()

    def keys(self):
        return sorted(self._c.keys() + self._cuda.keys())

    def _either(self, name, key):
        got = getattr(self._cuda, name)(key)
        return got if got is not None else getattr(self._c, name)(key)

    def residual(self, key):
        """The bucket's residual (float32; on the bucket's device for a CUDA bucket), or None."""
        return self._either("residual", key)

    def last_sent(self, key):
        return self._either("last_sent", key)

    def momentum(self, key):
        """The bucket's local momentum u (None without momentum or before its first compressed round)."""
        return self._either("momentum", key)

    def cuda_report(self, key):
        """A CUDA bucket's device step figures (steps committed and refused, per tensor its threshold and how
        its steps were searched), or None."""
        return self._cuda.report(key)

    def state_dict(self):
        d = self._c.state_dict()
        d["cuda"] = self._cuda.state_dict()
        return d

    def load_state_dict(self, state):
        self._c.load_state_dict(state)
        if "cuda" in state:
            self._cuda.load_state_dict(state["cuda"])


def topk_hook(state, bucket):
    """DDP communication hook: the bucket's top-k exchange averaged over ranks (state: TopKState)."""
    return state.exchange_async(bucket)


class LocalSGD:
    """Local SGD for DDP (commsgd's sync::local_sgd): gradients are averaged for `warmup_steps` iterations,
    then every step is local and models are averaged every `period` steps (or adaptively, ADACOMM), with an
    optional elastic correction ('none', 'at_sync', 'every_step'; strength alpha).

    Call step(loss) after every optimizer.step(); lr is read from `optimizer` when given.
    """

    def __init__(self, model, lr=0.01, period=4, warmup_steps=0, adaptive=False, max_period=64,
                 correction="none", alpha=0.5, optimizer=None, process_group=None):
        self._params = [p for p in model.parameters()]
        self._optimizer = optimizer
        self._lr = lr
        self._c = _C.LocalSGD(_own_group(process_group), float(lr), int(period), int(warmup_steps),
                              bool(adaptive), int(max_period), str(correction), float(alpha))

    def in_warmup(self):
        return self._c.in_warmup()

    def step(self, loss=float("nan")):
        lr = self._optimizer.param_groups[0]["lr"] if self._optimizer is not None else self._lr
        return self._c.step(self._params, float(loss), float(lr))

    def finish(self):
        self._c.finish(self._params)

    def current_period(self):
        return self._c.current_period()

    def traffic(self):
        return self._c.traffic()

    def reset_traffic(self):
        self._c.reset_traffic()


def local_sgd_hook(state, bucket):
    """DDP communication hook for LocalSGD: averages during warm-up, leaves gradients local afterwards."""
    buf = bucket.buffer()
    if state.in_warmup():
        return state._c.average_async(buf)
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


from .auto import AutoState, auto_hook  # noqa: E402  (auto.py builds on TopKState above)
