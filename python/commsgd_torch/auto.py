"""AutoState and auto_hook: a DDP communication hook that picks, per run, the exchange that makes a step
fastest on this model and this network, among those that keep accuracy, and never a slower one than
DDP's own allreduce.

    state = commsgd_torch.AutoState(model=ddp, optimizer=optimizer)   # network measured, or network=(s, bytes/s)
    ddp.register_comm_hook(state, commsgd_torch.auto_hook)
    ... train as usual (momentum stays in the optimizer) ...
    print(state.choice(), state.log()[-1]["reason"])

How it chooses. The first `profile_steps` iterations run DDP's allreduce hook unchanged and time, on every
rank, the forward pass, when each bucket becomes ready during backward, how long each exchange takes and the
whole step. At iteration `profile_steps` every rank, together: measures the network (a small and a large
all-reduce on the state's own group, the slowest rank's figures) unless it was stated, times each
candidate's local work on its own buckets (casts for 16-bit, PowerSGD's products, top-k's selection),
predicts each candidate's step with cost/'s exchange seconds and the overlap model of DDP's reducer
(commsgd_torch._C.choose: bucket i's exchange starts when it is ready and the one before it is done; a
hook's synchronous part delays the rest of backward), weighs it by the steps the candidate needs to
dense's accuracy (a measured prior, see default_steps_factor), and takes rank 0's verdict so that every rank
switches to the same exchange. A compressed candidate is taken only when it weighs at least `margin` less
than dense.

Candidates, all of which keep accuracy at the densities given ("dense", "fp16", "bf16", "powersgd-r<k>",
"topk-<density>"): dense is PyTorch's allreduce hook, bit for bit; fp16 is PyTorch's fp16 compression hook
(bf16 PyTorch's bf16 hook, which needs NCCL), bit for bit; PowerSGD is commsgd's PowerSGDState with error
feedback, warm start and PyTorch's initial Q, started from the profiled iteration; top-k is commsgd's
TopKState (laplace_bisect), to which the optimizer's
momentum moves (its buffers seed top-k's local momentum and the optimizer then steps without momentum, the
recipe top-k needs to keep accuracy).

Re-checks: every `recheck_every` iterations after the choice, the median measured step of the chosen
exchange is compared, on every rank together, with the median dense step of the profile; when it is more
than `drift` slower, the state goes back to dense (the momentum comes back to the optimizer, averaged, with
top-k's held-back updates folded in) and says so in the log. state_dict() holds the choice, the profile, the
log and the chosen exchange's own state; load_state_dict() restores them.
"""
import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from . import _C
from ._C import InvalidArgument
from ._auto_compute import candidate_compute, matrices
from ._auto_network import measure_network
from ._auto_profile import median, summarize
from ._state import check_model, own_group
from .powersgd import PowerSGDState
from .topk import TopKState

__all__ = ["AutoState", "auto_hook", "DEFAULT_CANDIDATES", "default_steps_factor", "candidate_compute"]

DEFAULT_CANDIDATES = ("dense", "fp16", "powersgd-r1", "powersgd-r2", "powersgd-r4", "topk-0.01", "topk-0.001")


def default_steps_factor(name: str) -> float:
    """Steps a candidate needs to reach dense's accuracy, over dense's: the geometric mean of the ratios
    measured to DDP's final accuracy minus 1 and 2 points on Fashion-MNIST's MLP and CNN, 4 ranks, 1,000
    steps (bench/results/where-compression-pays-2026-11-24.md). A prior: pass steps_factor= to state yours."""
    if name.startswith("powersgd"):
        r = int(name.split("-r")[1])
        return 2.5 if r == 1 else 1.3 if r == 2 else 1.15
    if name.startswith("topk"):
        return 1.4 if float(name.split("-", 1)[1]) >= 0.01 else 1.65
    return 1.0


_log = logging.getLogger("commsgd_torch.auto")
# The exchange thread stamps the end of each dense round with the same clock (CLOCK_MONOTONIC).
_now = time.monotonic


def _global_rank(group: dist.ProcessGroup, rank: int) -> int:
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, rank)


class AutoState:
    r"""State of :func:`auto_hook`: the profile, the choice and the chosen exchange's own state.

    Args:
        process_group: the group the exchanges run on; ``None`` makes a new gloo group of all ranks (a
            collective call).
        model: the DDP-wrapped module (its forward pass is timed through hooks on it).
        optimizer: the ``torch.optim.SGD`` stepping it; needed when a top-k candidate is allowed, whose
            momentum moves into the hook.
        network: ``None`` to measure, or ``(latency_s, bandwidth_bytes_per_s)``.
        candidates: names as in :data:`DEFAULT_CANDIDATES`; ``"dense"`` is always among them.
        profile_steps: >= 3 iterations of dense allreduce measured before choosing (the first two are not
            timed: DDP rebuilds its buckets after the first).
        margin: in [0, 1): a compressed candidate must weigh this much less than dense.
        recheck_every: >= 0 iterations between re-checks of the chosen exchange (0: never).
        drift: >= 0: how much slower than dense's profiled step the chosen one may measure.
        seed: the seed of the candidates' timing inputs and of PowerSGD's initial Q.
        steps_factor: ``{name: steps to dense's accuracy over dense's}`` replacing
            :func:`default_steps_factor`'s priors; the choice weighs each predicted step by it.
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, *, model: torch.nn.Module,
                 optimizer: Optional[torch.optim.Optimizer] = None,
                 network: Optional[Tuple[float, float]] = None, candidates: Sequence[str] = DEFAULT_CANDIDATES,
                 profile_steps: int = 20, margin: float = 0.05, recheck_every: int = 200, drift: float = 0.10,
                 seed: int = 0, steps_factor: Optional[Dict[str, float]] = None) -> None:
        check_model(model, "AutoState")
        names = list(dict.fromkeys(["dense", *candidates]))
        for c in names:  # the library parses every name: an unknown one raises here, on every rank
            _C.exchange_seconds(c, 1, [], 2, 0.0, 1.0)
        if "bf16" in names and dist.get_backend() != "nccl":
            raise InvalidArgument("commsgd: argument 'candidates' holds 'bf16', which needs the nccl backend "
                                  f"(this group's backend is {dist.get_backend()})")
        if network is not None:
            latency, bandwidth = (float(v) for v in network)
            if not (latency >= 0 and latency != float("inf")):
                raise InvalidArgument(f"commsgd: argument 'network' latency = {latency} is outside the allowed "
                                      "range [0, inf)")
            if not bandwidth > 0:
                raise InvalidArgument(f"commsgd: argument 'network' bandwidth = {bandwidth} is outside the "
                                      "allowed range (0, inf]")
            network = (latency, bandwidth)
        if int(profile_steps) < 3:
            raise InvalidArgument(f"commsgd: argument 'profile_steps' = {profile_steps} is outside the allowed "
                                  "range [3, inf)")
        if not 0 <= float(margin) < 1:
            raise InvalidArgument(f"commsgd: argument 'margin' = {margin} is outside the allowed range [0, 1)")
        if int(recheck_every) < 0:
            raise InvalidArgument(f"commsgd: argument 'recheck_every' = {recheck_every} is outside the "
                                  "allowed range [0, inf)")
        if not float(drift) >= 0:
            raise InvalidArgument(f"commsgd: argument 'drift' = {drift} is outside the allowed range [0, inf)")
        if any(c.startswith("topk") for c in names) and optimizer is None:
            raise InvalidArgument("commsgd: argument 'optimizer' is None, and a top-k candidate needs it (its "
                                  "momentum moves into the hook)")
        factors = {c: default_steps_factor(c) for c in names}
        for c, f in (steps_factor or {}).items():
            if c not in names:
                raise InvalidArgument(f"commsgd: argument 'steps_factor' names '{c}', which is not among the "
                                      f"candidates {names}")
            if not (isinstance(f, (int, float)) and 0 < f < float("inf")):
                raise InvalidArgument(f"commsgd: argument 'steps_factor' of '{c}' = {f} is outside the allowed "
                                      "range (0, inf)")
            factors[c] = float(f)
        self.steps_factor = factors
        self.candidates, self.network, self.profile_steps = names, network, int(profile_steps)
        self.margin, self.recheck_every, self.drift, self.seed = float(margin), int(recheck_every), float(drift), seed
        self.model, self.optimizer = model, optimizer
        # Whether the hook's caller waits for each exchange before backward goes on (commsgd_torch.hsdp sets it:
        # FSDP2 runs the hook inside its post-backward), so that every exchange delays the rest of backward.
        self.blocking = False
        self.process_group = own_group(process_group)
        self.world = dist.get_world_size(self.process_group)
        self.rank = dist.get_rank(self.process_group)
        # Dense and 16-bit rounds of CPU buckets complete on this exchange thread, not through a Python
        # callback on c10d's (see _C.PytorchAllreduce); _round_marks pairs each with its profile record.
        self._allreduce = _C.PytorchAllreduce(self.process_group)
        self._round_marks = []
        self.iter = 0
        self._bucket = 0
        self._choice = "dense"
        self._decided_at = None
        self._inner = None
        self._log = []
        self._forced = None
        # Timings of the current iteration, and per iteration the profile's records.
        self._fwd_start = self._fwd_end = None
        self._periods, self._dense_periods = [], []
        self._steps = []  # per profiled iteration: forward_s, ready_s per bucket, done_s per bucket
        self._cur = None
        self._shapes = None
        self._hooks = [model.register_forward_pre_hook(self._on_forward_start),
                       model.register_forward_hook(self._on_forward_end)]

    # ---- what a script reads --------------------------------------------------------------------------

    def choice(self) -> str:
        """The exchange in use: ``"dense"`` until the profile is done, then the chosen candidate's name."""
        return self._choice

    def log(self) -> List[Dict[str, Any]]:
        """One record per decision: iteration, choice, predicted step seconds per candidate, the network,
        and the reason in words."""
        return list(self._log)

    def force(self, name: str) -> None:
        """Use `name` from the next bucket on, without profiling (the log records that it was forced)."""
        if name not in self.candidates:
            raise InvalidArgument(f"commsgd: argument 'name' = '{name}' is not one of {self.candidates}")
        self._forced = name

    # ---- timing ---------------------------------------------------------------------------------------

    def _on_forward_start(self, *_: Any) -> None:
        now = _now()
        if self._fwd_start is not None:
            period = now - self._fwd_start
            (self._dense_periods if self._choice == "dense" and self._decided_at is None else
             self._periods).append(period)
        self._fwd_start = now

    def _on_forward_end(self, *_: Any) -> None:
        self._fwd_end = _now()

    # ---- the hook -------------------------------------------------------------------------------------

    def _hook(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        first = self._bucket == 0
        last = bucket.is_last()
        if first:
            self._collect_rounds()
        if first and self._forced is not None:
            self._switch(self._forced, {c: float("nan") for c in self.candidates}, "forced by force()")
            self._forced = None
        elif first and self._decided_at is None and self.iter >= self.profile_steps:
            self._decide()
        elif (first and self._decided_at is not None and self.recheck_every > 0 and self._choice != "dense"
              and self.iter > self._decided_at and (self.iter - self._decided_at) % self.recheck_every == 0):
            self._recheck()
        if self._choice == "dense":
            fut = self._dense(bucket)
        elif self._choice in ("fp16", "bf16"):
            fut = self._half(bucket, self._choice)
        else:
            fut = self._inner.exchange_async(bucket)
        self._bucket += 1
        if last:
            self._bucket = 0
            self.iter += 1
        return fut

    def _dense(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        profiling = self._decided_at is None and 2 <= self.iter < self.profile_steps and self._fwd_end
        t0 = _now()
        mark = None
        if profiling:
            if self._bucket == 0:
                self._cur = {"forward_s": self._fwd_end - self._fwd_start, "ready_s": [], "done_s": []}
                if self.iter == 2:
                    self._shapes = []
            self._cur["ready_s"].append(t0 - self._fwd_end)
            if self.iter == 2:  # DDP's buckets are final from the second iteration on
                # A shard's bucket (commsgd_torch.hsdp) holds its parameters' shards, not the whole parameters.
                held = bucket.gradients() if hasattr(bucket, "shard_sizes") else bucket.parameters()
                self._shapes.append((bucket.buffer().numel(), matrices(held)))
            mark = (self._cur, self._fwd_end, bucket.is_last())
        if bucket.buffer().is_cuda:
            # PyTorch's hook as it is (its futures belong to the device's streams); unprofiled.
            return default_hooks.allreduce_hook(self.process_group, bucket)
        self._round_marks.append(mark)
        return self._allreduce.dense_async(bucket.buffer())

    def _half(self, bucket: dist.GradBucket, name: str) -> torch.futures.Future[torch.Tensor]:
        if bucket.buffer().is_cuda:
            hook = default_hooks.fp16_compress_hook if name == "fp16" else default_hooks.bf16_compress_hook
            return hook(self.process_group, bucket)
        self._round_marks.append(None)
        return self._allreduce.half_async(bucket.buffer(), "float16" if name == "fp16" else "bfloat16")

    def _collect_rounds(self) -> None:
        """The profile's done times of the rounds finished so far (all of the last iteration's are: DDP
        waited for them)."""
        if not self._round_marks:
            return
        for mark, done in zip(self._round_marks, self._allreduce.finished()):
            if mark is not None:
                cur, fwd_end, last = mark
                cur["done_s"].append(done - fwd_end)
                if last:
                    self._steps.append(cur)
        self._round_marks = []

    # ---- choosing -------------------------------------------------------------------------------------

    def _measure_network(self) -> Tuple[float, float]:
        return measure_network(self.process_group, self.world)

    def _decide(self) -> None:
        self._collect_rounds()
        steps = self._steps
        if not steps:  # nothing profiled (profile_steps too short for this run): stay dense, say so
            self._switch("dense", {}, "no profiled iteration")
            return
        p = summarize(steps, self._dense_periods, self.blocking)
        forward, backward, optimizer, ready, period = p.forward, p.backward, p.optimizer, p.ready, p.period
        latency, bandwidth = self.network if self.network is not None else self._measure_network()
        shapes = self._shapes[:p.buckets]
        compute = {c: candidate_compute(c, shapes, self.world, self.seed) for c in self.candidates}
        blocking = {c: self.blocking for c in self.candidates}
        verdict = _C.choose(self.candidates, forward, backward, optimizer, ready, shapes, compute, blocking,
                            self.world, latency, bandwidth, self.margin, self.steps_factor)
        # Rank 0's verdict, so that every rank switches to the same exchange.
        box = [(verdict["name"], dict(verdict["predicted"]), verdict["reason"], latency, bandwidth)]
        dist.broadcast_object_list(box, src=_global_rank(self.process_group, 0), group=self.process_group)
        name, predicted, reason, latency, bandwidth = box[0]
        self._profile = {"forward_s": forward, "backward_s": backward, "optimizer_s": optimizer,
                         "ready_s": ready, "shapes": shapes, "dense_period_s": period,
                         "latency_s": latency, "bandwidth_bytes_per_s": bandwidth}
        self._switch(name, predicted, reason)

    def _recheck(self) -> None:
        # Both figures are this rank's own: take the slowest rank's of each, so that every rank reads the
        # same two numbers and makes the same decision.
        measured = median(self._periods[-min(len(self._periods), 50):])
        dense = self._profile.get("dense_period_s", 0.0) if hasattr(self, "_profile") else 0.0
        box = torch.tensor([measured, dense], dtype=torch.float64)
        dist.all_reduce(box, op=dist.ReduceOp.MAX, group=self.process_group)
        measured, dense = float(box[0]), float(box[1])
        if dense > 0 and measured > dense * (1 + self.drift):
            self._back_to_dense(f"{self._choice} measured {measured * 1e3:.3f} ms a step, more than "
                                f"{1 + self.drift:.2f}x dense's {dense * 1e3:.3f} ms: back to dense")

    def _switch(self, name: str, predicted: Dict[str, float], reason: str) -> None:
        self._decided_at = self.iter
        self._periods = []
        rec = {"iteration": self.iter, "choice": name, "predicted_s": predicted, "reason": reason,
               "network": getattr(self, "_profile", {}).get("latency_s"),
               "bandwidth": getattr(self, "_profile", {}).get("bandwidth_bytes_per_s")}
        self._log.append(rec)
        _log.info("commsgd auto: iteration %d: %s (%s)", self.iter, name, reason)
        if name == self._choice and self._inner is not None:
            return
        self._choice = name
        self._inner = self._make_inner(name)

    def _make_inner(self, name: str, seeded: bool = True, momentum: Optional[float] = None) -> Any:
        if name.startswith("powersgd"):
            r = int(name.split("-r")[1])
            state = PowerSGDState(self.process_group, matrix_approximation_rank=r, start_powerSGD_iter=2,
                                  use_error_feedback=True, warm_start=True, random_seed=self.seed)
            state.iter = 2  # the profile was its dense warm-up: compress from now on
            return state
        if name.startswith("topk"):
            m = self._optimizer_momentum() if momentum is None else float(momentum)
            inner = TopKState(self.process_group, model=self._module(), density=float(name.split("-", 1)[1]),
                              selector="laplace_bisect", momentum=m, start_iter=0)
            if seeded and m > 0:
                velocity = {}
                for i, p in enumerate(self._module().parameters()):
                    buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
                    if buf is not None:
                        velocity[i] = buf.detach().reshape(-1).clone()
                        # The optimizer keeps no momentum from now on: top-k's hook applies it.
                        self.optimizer.state[p]["momentum_buffer"] = None
                inner.load_state_dict({"selector": "laplace_bisect", "iteration": 0, "buckets": {},
                                       "warmup_velocity": velocity})
            for g in self.optimizer.param_groups:
                g["momentum"] = 0.0
            self._moved_momentum = m
            return inner
        return None

    def _back_to_dense(self, reason: str) -> None:
        if self._choice.startswith("topk"):
            self._return_momentum()
        self._switch("dense", {}, reason)

    def _return_momentum(self) -> None:
        """Top-k's local momenta, averaged over ranks, become the optimizer's buffers again, and its held-back
        updates are folded in so that momentum applies them once in all: (1 - m) v adds v over the steps."""
        m = getattr(self, "_moved_momentum", 0.0)
        params = list(self._module().parameters())
        state = self._inner.state_dict()
        for g in self.optimizer.param_groups:
            g["momentum"] = m
        moved = {}
        for key, (idx, offsets, _) in state["buckets"].items():
            u = self._inner.momentum_buffer(key) if m > 0 else None
            v = self._inner.residual(key)
            for j, pi in enumerate(idx):
                n = params[pi].numel()
                part = (1 - m) * v[offsets[j]:offsets[j] + n]
                if u is not None:
                    part = part + u[offsets[j]:offsets[j] + n]
                moved[pi] = part
        for pi, p in enumerate(params):
            buf = moved.get(pi, torch.zeros(p.numel()))
            dist.all_reduce(buf, group=self.process_group)
            buf.div_(self.world)
            if m > 0:
                self.optimizer.state[p]["momentum_buffer"] = buf.reshape(p.shape).clone()
            else:
                with torch.no_grad():
                    p.sub_(buf.reshape(p.shape) * self.optimizer.param_groups[0]["lr"])

    def _optimizer_momentum(self) -> float:
        ms = {g.get("momentum", 0.0) for g in self.optimizer.param_groups}
        if len(ms) != 1:
            raise InvalidArgument(f"commsgd: the optimizer's parameter groups have momenta {sorted(ms)}; top-k "
                                  "needs one momentum")
        return float(ms.pop())

    def _module(self) -> torch.nn.Module:
        return getattr(self.model, "module", self.model)

    # ---- checkpoint -----------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        inner = self._inner.state_dict() if self._inner is not None else None
        return {"iteration": self.iter, "choice": self._choice, "decided_at": self._decided_at,
                "log": list(self._log), "profile": dict(getattr(self, "_profile", {})),
                "moved_momentum": getattr(self, "_moved_momentum", None), "inner": inner}

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        choice = d["choice"]
        if choice not in self.candidates:
            raise InvalidArgument(f"commsgd: saved state's choice '{choice}' is not one of {self.candidates}")
        self.iter, self._decided_at = int(d["iteration"]), d["decided_at"]
        self._log, self._profile = list(d["log"]), dict(d["profile"])
        self._choice = choice
        self._inner = self._make_inner(choice, seeded=False, momentum=d.get("moved_momentum"))
        if self._inner is not None and d["inner"] is not None:
            self._inner.load_state_dict(d["inner"])


def auto_hook(state: AutoState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    r"""Run the exchange that makes this run's step fastest among those that keep accuracy.

    For ``state.profile_steps`` iterations the bucket is averaged as DDP's own allreduce does, bit for bit,
    while the state times the step; then every rank switches to rank 0's choice (dense, fp16, bf16, PowerSGD
    or top-k) and re-checks it every ``recheck_every`` iterations.

    Args:
        state (AutoState): the profile, the choice and the chosen exchange's state.
        bucket (dist.GradBucket): the flattened gradients of one DDP bucket.

    Returns:
        A future of the bucket's average over ranks under the exchange in use.

    Example::
        >>> # xdoctest: +SKIP
        >>> state = AutoState(model=ddp_model, optimizer=optimizer)
        >>> ddp_model.register_comm_hook(state, auto_hook)
        >>> # after training: state.choice(), state.log()[-1]["reason"]
    """
    return state._hook(bucket)
