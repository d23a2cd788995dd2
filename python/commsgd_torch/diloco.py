"""DiLoCo for PyTorch: H inner steps of any optimizer on every rank, then an outer Nesterov step on the average
of the ranks' pseudo-gradients (old minus new), optionally streamed in fragments and compressed.

A thin layer over the C++ engine (include/commsgd/sync/diloco.hpp, through commsgd_torch._C): the schedule, the
codes and their wire formats, the outer step, the merge, the refusal of non-finite values and the checkpoint
are the engine's; this class keeps the parameters where the engine can work on them and gives it the shape of
a PyTorch optimizer wrapper.
"""
import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import torch
import torch.distributed as dist

from . import _C, _device_round, _replica
from ._C import InvalidArgument, NonFinite
from ._state import gloo_group_like, gloo_subgroup

__all__ = ["DiLoCo", "COMPRESSIONS"]

#: The codes a rank's pseudo-gradient can travel in. Top-k takes a density in (0, 1] and, optionally, a chunk
#: (top-k per chunk of that many values, indices in the bits a chunk needs), 2-bit values against a scale per
#: chunk, and a decay in [0, 1] of its residual each round: SparseLoCo's recipe is
#: ``"topk-0.01-c4096-2bit-b0.95"`` with ``outer_lr=1, outer_momentum=0``.
#: The engine's list (cost/diloco.hpp), read through the extension so that it is never written twice.
COMPRESSIONS = tuple(_C.diloco_code_forms())


class _BadArgument(InvalidArgument, ValueError):
    """A bad argument of DiLoCo: a ValueError, as PyTorch's optimizers raise, and commsgd_torch.InvalidArgument."""


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bad(name: str, value: Any, allowed: str) -> _BadArgument:
    return _BadArgument(f"DiLoCo: argument '{name}' is {value!r}; allowed: {allowed}")


def _code_name(compression: Any) -> str:
    """The engine's name of a code (cost/diloco.hpp), or a ValueError naming the argument."""
    if isinstance(compression, str):
        try:
            return _C.diloco_code_name(compression)
        except InvalidArgument:
            pass
    raise _bad("compression", compression, _C.diloco_codes_allowed())


def _chooses_by_ranks(code: str) -> bool:
    """Whether an engine's code name is a -fit<x> code, whose exchange is chosen by the number of ranks."""
    return code.rsplit("-", 1)[-1].startswith("fit")


def _group_ranks(group: Optional[dist.ProcessGroup]) -> List[int]:
    """The global ranks of a group's members, in group rank order."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    if hasattr(dist, "get_process_group_ranks"):
        return list(dist.get_process_group_ranks(group))
    ranks = dist.distributed_c10d._pg_group_ranks[group]  # torch 1.13: {global rank: group rank}
    return [g for g, _ in sorted(ranks.items(), key=lambda item: item[1])]


class DiLoCo:
    r"""Low-communication data parallelism: every rank takes ``sync_every`` steps of its own optimizer, then the
    ranks average their pseudo-gradients (the global model minus their local model) and an outer SGD with
    Nesterov momentum moves the global model, from which every rank restarts (Douillard et al., 2023:
    DiLoCo; with ``fragments`` and ``delay``, Streaming DiLoCo, 2025).

    A wrapper around the inner optimizer, as :class:`torch.distributed.optim.PostLocalSGDOptimizer` is: the
    training loop calls :meth:`step` after ``loss.backward()`` in place of the inner optimizer's ``step``, and
    :meth:`zero_grad` as usual. No DDP underneath: each rank's gradients stay local.

    It runs commsgd's C++ engine (``sync::diloco``): what a C++ trainer gets from
    ``include/commsgd/sync/diloco.hpp`` is what this class does, bit for bit (a test holds them equal). The
    outer step of a fragment, on every rank alike (the sign: old minus new, so that it acts as a gradient)::

        delta = mean over ranks of C_r(theta_global - theta_local_r)   # C_r: this rank's code
        v = mu * v + delta
        theta_global = theta_global - eta * (delta + mu * v)         # torch.optim.SGD(nesterov=True)'s rule
        theta_local = theta_global + alpha * (theta_local - theta_global)

    with ``eta = outer_lr`` and ``mu = outer_momentum``. ``outer_lr=1, outer_momentum=0`` is plain model
    averaging (local SGD); one rank with ``outer_momentum=0`` is Lookahead (k = ``sync_every``, its alpha =
    ``outer_lr``).

    **Schedule.** Inner steps are counted from 1. The parameters are cut into ``fragments`` = P groups
    (strided: the j-th module that owns parameters, in ``model.modules()`` order, goes to fragment j mod P; or
    the groups given). Fragment p starts an exchange after inner step t when t >= t_p and
    ``(t - t_p) mod H == 0``, with ``t_p = p * H // P`` and H = ``sync_every`` (so a round is H whole steps,
    the first one too, and fragment p > 0 first syncs after t_p steps), and applies it ``delay`` inner steps
    later, the ranks' local steps overlapping the exchange, which runs on the engine's own thread without the
    GIL. With P = 1 and ``delay = 0``: every H steps, the whole model.

    **Codes** (``compression``; sizes for d values, the names and sizes are the engine's, cost/diloco.hpp):

    - ``"dense"``: float32, summed by a ring all-reduce (4 d bytes).
    - ``"fp16"``, ``"bf16"``: a ring all-reduce with 16-bit values on the wire and float sums (2 d).
    - ``"int8"``: blocks of 256 values, each a float32 scale s = max|x| and round(127 x / s) (d + 4 d / 256),
      gathered from every rank and summed in float32 in rank order.
    - ``"e3m0"``: 4-bit floats, blocks of 256 with a float32 scale s = max|x|: a sign and a 3-bit exponent,
      k = 0 for zero and k in 1..7 for 2^(k-7) s, the power of two nearest |x| (d / 2 + 4 d / 256), gathered.
    - ``"topk-<density>"``: top-k with error feedback. A residual e per fragment: e <- e + delta; the k =
      ceil(density d) entries of e largest in magnitude (ties to the lowest index) are sent as float32 values
      and indices in the bits d needs (4 k + k ceil(log2 d) / 8 bytes) and zeroed in e, so what was sent plus
      the new residual is exactly e + delta. Suffixes: ``-c<chunk>`` takes the top-k of each chunk of that
      many values (indices relative to the chunk: 12 bits for 4096); ``-2bit`` sends each value as its sign
      and one bit, +-0.5 s or +-1.5 s against s, the chunk's mean magnitude sent (what that rounds off stays
      in e); ``-b<decay>`` scales e by decay in [0, 1] before delta is added; ``-senders`` takes each
      value's mean over the ranks that sent it rather than over all of them; ``-shared`` (not with
      ``-2bit`` or ``-senders``) has every rank send its values at one set of indices, chunk j's chosen in
      round t by rank (j + t) mod n from its own e, and sums them by a bf16 ring: a rank sends about
      1.5 k + 4 k bytes a round whatever n while the chunks are at least n, where the gathered codes send
      (n - 1) messages, and every value is a mean over all ranks; ``-regions`` (not with ``-2bit``,
      ``-senders`` or ``-shared``) sends each rank's own top-k of chunk c to rank c mod n, which sums them,
      takes each value's mean over the ranks that sent it and cuts the chunk to its k largest before
      every rank gathers the cut (bf16 values both ways, about 7 k bytes a rank whatever n; what a cut drops
      stays in the residuals of the ranks that picked it). SparseLoCo:
      ``"topk-0.01-c4096-2bit-b0.95"`` with ``outer_lr=1.0, outer_momentum=0.0``, the decayed residual in
      place of the outer momentum.

    Each gathered code's round also gathers a 40-byte verdict from every rank (the fp16 and bf16 rings in
    their first round), so that a non-finite pseudo-gradient, or ranks set up differently, is refused on
    every rank without a collective of its own.

    **Bytes.** :meth:`stats` counts what this rank sends by the collectives' algorithms (comm/traffic.hpp):
    a ring all-reduce of B bytes sends about 2 (n - 1) B / n, an all-gather of B-byte messages (n - 1) B.
    Memory: the engine's float32 global copy and outer momentum (2x the parameters), the messages in flight,
    and the top-k residual.

    **Errors.** Bad arguments raise ``ValueError`` (also ``commsgd_torch.InvalidArgument``) naming the
    argument, its value and what is allowed. A non-finite pseudo-gradient on any rank makes every rank raise
    :class:`commsgd_torch.NonFinite` naming the fragment, and changes nothing of the outer state (global copy,
    outer momentum, residuals: that exchange is dropped). The inner step taken in the same call stays taken
    and counted.

    **Devices.** float32 parameters on the CPU are used in place: at construction they move into one flat
    tensor and each parameter becomes a view of it. float32 parameters on one CUDA device take the device
    round (:attr:`device_round`) where the package has its CUDA part and the code has one (``dense``,
    ``int8``, ``e3m0``, the gathered top-k codes with chunks of at most 4096 values; not ``keep_delay_steps``):
    they become views of one flat device tensor, the common model, outer momentum and residuals stay on the
    device, the round's kernels encode and apply there (the host engine's bits), and only the messages move:
    over an NCCL group where ``process_group`` is NCCL, else over gloo through page-locked host buffers of the
    message's size. Its state_dict is saved between exchanges (after :meth:`finish`, or with ``delay=0``).
    Other parameters (another dtype, the 16-bit and flat-in-n codes, ``device_round=False``) stay where they
    are; the host engine works on a float32 host copy (pinned when CUDA is present), and after each inner step
    the fragments it touches then are copied to it and back, so a step without an exchange copies nothing.
    The engine exchanges over a group of the same ranks of its own, made at construction, so that its
    collectives and the trainer's never share a group.

    Args:
        model (torch.nn.Module): the local model; its parameters that require gradients are synchronised
            (buffers such as BatchNorm's running statistics stay local). Rank 0's parameters are broadcast at
            construction, so every rank starts from the same model: constructing is collective.
        inner_optimizer (torch.optim.Optimizer): the rank's own optimizer over ``model``'s parameters (AdamW
            in the papers); its state stays local. Schedule its learning rate directly.
        process_group (ProcessGroup, optional): the ranks to average over, one per replica; ``None``: every
            rank (or, with FSDP2 parameters on ``mesh["shard"]`` of a (replicate, shard) mesh, the mesh's
            replicate dimension).
        sync_every (int): H, the inner steps between two exchanges of a fragment, at least 1.
        outer_lr (float): eta, the outer learning rate, finite and > 0 (0.7 in the paper).
        outer_momentum (float): mu, the outer Nesterov momentum, in [0, 1) (0.9 in the paper; 0: none).
        fragments (int or sequence): P >= 1 strided fragments, or the fragments themselves: a sequence of
            modules or of iterables of parameters, covering every trainable parameter exactly once.
        delay (int): tau, the inner steps an exchange overlaps before it is applied, in [0, sync_every).
        alpha (float): the weight of the local parameters in the merge after an outer step, in [0, 1] (0:
            every rank restarts from the global model).
        keep_delay_steps (bool): the merge keeps the ``delay`` inner steps taken while the exchange
            travelled, whole: ``theta <- theta_global + (theta - theta_at_exchange_start)`` (alpha must be 0).
            For top-k codes with error feedback, whose residual sends later what a round did not: alpha > 0
            keeps part of that in the local model too, and the next round sends it again.
        compression (str): the code of each rank's pseudo-gradient, a name of one of the forms in
            :data:`COMPRESSIONS` (``"dense"``, ``"int8"``, ``"topk-0.01-c4096-2bit-b0.95"``, ...). A
            ``-fit<x>`` code is chosen here for the model's size and the number of replicas (the gathered
            ``-2bit-senders`` code while the replicas send at least x times fewer bytes than float32's ring,
            else ``-regions``); :attr:`compression` then names the code taken.
        replica_group (ProcessGroup, optional): the ranks of this rank's replica when each of them holds the
            whole model (DDP inside): they split every outer round, each exchanging 1/L of every fragment with
            its counterparts in ``process_group``, and gather the result. FSDP2 parameters (DTensors) need
            none: each rank exchanges its shards. docs/diloco.md, "Replicas of many ranks".
        device_round (bool, optional): CUDA parameters' outer round on their device (see Devices): ``None``
            where it can, ``True`` to insist (``ValueError`` saying why it cannot), ``False`` for the host
            engine.

    Example::
        >>> # xdoctest: +SKIP
        >>> model = Net()
        >>> inner = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.1)
        >>> opt = commsgd_torch.DiLoCo(model, inner, sync_every=100, outer_lr=0.7, outer_momentum=0.9,
        ...                            fragments=4, delay=5, compression="e3m0")
        >>> for x, y in loader:
        ...     opt.zero_grad()
        ...     loss_fn(model(x), y).backward()
        ...     opt.step()
        >>> opt.finish()  # the exchanges in flight, and a last one of every fragment that has moved
        >>> torch.save({"model": model.state_dict(), "diloco": opt.state_dict()}, path)
    """

    #: Whether float32 CPU parameters are used in place (False: every parameter takes the host-copy path that
    #: CUDA parameters take; the tests use it to check that path without a GPU).
    _IN_PLACE = True

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer, *,
                 process_group: Optional[dist.ProcessGroup] = None, sync_every: int = 100,
                 outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 fragments: Union[int, Sequence[Union[torch.nn.Module, Iterable[torch.nn.Parameter]]]] = 1,
                 delay: int = 0, alpha: float = 0.0, compression: str = "dense",
                 replica_group: Optional[dist.ProcessGroup] = None, keep_delay_steps: bool = False,
                 device_round: Optional[bool] = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise _bad("model", type(model).__name__, "a torch.nn.Module")
        if not isinstance(inner_optimizer, torch.optim.Optimizer):
            raise _bad("inner_optimizer", type(inner_optimizer).__name__, "a torch.optim.Optimizer")
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise _bad("sync_every", sync_every, "a whole number >= 1")
        if not _real(outer_lr) or not math.isfinite(outer_lr) or outer_lr <= 0:
            raise _bad("outer_lr", outer_lr, "a finite number > 0")
        if not _real(outer_momentum) or not (0.0 <= outer_momentum < 1.0):
            raise _bad("outer_momentum", outer_momentum, "[0, 1)")
        if isinstance(delay, bool) or not isinstance(delay, int) or not (0 <= delay < sync_every):
            raise _bad("delay", delay, f"a whole number in [0, sync_every) = [0, {sync_every})")
        if not _real(alpha) or not (0.0 <= alpha <= 1.0):
            raise _bad("alpha", alpha, "[0, 1]")
        if not isinstance(keep_delay_steps, bool):
            raise _bad("keep_delay_steps", keep_delay_steps, "True or False")
        if keep_delay_steps and alpha != 0:
            raise _bad("alpha", alpha, "0 with keep_delay_steps=True (the two are two merges)")
        if device_round is not None and not isinstance(device_round, bool):
            raise _bad("device_round", device_round, "True, False or None")
        code = _code_name(compression)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise _bad("model", type(model).__name__, "a module with at least one parameter that requires grad")
        # The engine's layers, in flat order (a module's parameters, or a group given), its P and layout.
        layers, num_fragments, layout = self._fragments(model, params, fragments)
        sharded = sum(_replica.is_sharded(p) for p in params)
        if sharded and sharded != len(params):
            raise _bad("model", f"a module with {sharded} DTensor parameters of {len(params)}",
                       "every trainable parameter a DTensor (FSDP2's fully_shard) or none")
        if replica_group is not None and not isinstance(replica_group, dist.ProcessGroup):
            raise _bad("replica_group", type(replica_group).__name__, "a ProcessGroup or None")
        if replica_group is not None and dist.get_world_size(replica_group) > 1 and \
                not hasattr(dist, "get_process_group_ranks"):
            raise _bad("replica_group", "a group of several ranks", f"None on torch {torch.__version__}: replicas "
                       "of several ranks need torch 2 or newer")
        if sharded and replica_group is not None:
            raise _bad("replica_group", "a group", "None with FSDP2 parameters (the mesh says which ranks share "
                       "a replica)")

        self.model = model
        self.inner_optimizer = inner_optimizer
        self.process_group = process_group
        self.sync_every = sync_every
        self.outer_lr = float(outer_lr)
        self.outer_momentum = float(outer_momentum)
        self.delay = delay
        self.alpha = float(alpha)
        self.keep_delay_steps = keep_delay_steps
        self.compression = code
        self.replica_group = replica_group
        names = {id(p): n for n, p in model.named_parameters()}
        self._order = [p for layer in layers for p in layer]
        self._names = {id(p): names.get(id(p), "?") for p in self._order}
        self._fragment_params = self._by_fragment(layers, num_fragments, layout)
        self._plan: Optional[_replica.Plan] = None
        if sharded or (replica_group is not None and dist.get_world_size(replica_group) > 1):
            self._init_replica(process_group, replica_group)
            return
        total = sum(p.numel() for p in self._order)
        layer_sizes = [sum(p.numel() for p in layer) for layer in layers]
        if _chooses_by_ranks(code):  # chosen for the model over the ranks (no group is asked for otherwise)
            self.compression = _C.diloco_code_chosen(code, total, dist.get_world_size(process_group))
        self._device = self._device_of(layer_sizes, num_fragments, layout, device_round)
        if self._device is not None:
            self._in_place = True
            self._flat = torch.empty(total, dtype=torch.float32, device=self._device)
        else:
            self._in_place = DiLoCo._IN_PLACE and all(p.device.type == "cpu" and p.dtype == torch.float32
                                                      for p in self._order)
            pin = not self._in_place and torch.cuda.is_available()
            self._flat = torch.empty(total, dtype=torch.float32, pin_memory=pin)
        self._views = []
        off = 0
        for p in self._order:
            self._views.append(self._flat[off:off + p.numel()].view(p.shape))
            off += p.numel()
        with torch.no_grad():
            for p, v in zip(self._order, self._views):
                v.copy_(p.detach())
                if self._in_place:
                    p.data = v
        self._attach(layer_sizes, num_fragments, layout)
        self._copy_out(range(len(self._order)))

    #: Whether this class may take the device round (a membership engine's subclass rebuilds groups and saves
    #: parts, which the host engine does).
    _DEVICE_ROUND = True

    def _device_of(self, layer_sizes: List[int], num_fragments: int, layout: str,
                   wanted: Optional[bool]) -> Optional[torch.device]:
        """The CUDA device whose round this DiLoCo runs (_device_round.py), or None for the host engine."""
        if wanted is False:
            return None
        devices = {p.device for p in self._order}
        why = None
        if len(devices) != 1 or next(iter(devices)).type != "cuda" or \
                any(p.dtype != torch.float32 for p in self._order):
            why = "its parameters are not all float32 CUDA tensors of one device"
        elif not type(self)._DEVICE_ROUND:
            why = f"{type(self).__name__} runs the host engine"
        elif self.keep_delay_steps:
            why = "keep_delay_steps runs on the host engine"
        else:
            runs = _C.diloco_fragment_runs(layer_sizes, num_fragments, layout)
            why = _device_round.refusal(self.compression, [sum(n for _, n in r) for r in runs])
        if why is None:
            return next(iter(devices))
        if wanted:
            raise _bad("device_round", True, f"False or None here: {why}")
        return None

    @property
    def device_round(self) -> bool:
        """Whether the outer round runs on the parameters' CUDA device (else on the host engine)."""
        return getattr(self, "_device", None) is not None

    #: Whether the counterparts of a sharded rank come from its mesh or the process group given (False: from
    #: elsewhere, a membership engine's group; no group is checked at construction).
    _COUNTERPARTS_AT_CONSTRUCTION = True

    def _init_replica(self, process_group: Optional[dist.ProcessGroup],
                      replica_group: Optional[dist.ProcessGroup]) -> None:
        """A replica of many ranks (_replica.py): the engine holds this rank's shards or part, one layer per
        fragment, and exchanges them with this rank's counterparts."""
        order = {id(p): i for i, p in enumerate(self._order)}
        if replica_group is None:
            plan = _replica.sharded_plan(self._order, self._fragment_params, order, process_group, _bad,
                                         self._COUNTERPARTS_AT_CONSTRUCTION)
        else:
            plan = _replica.split_plan(self._fragment_params, order, self.compression, process_group,
                                       gloo_subgroup(replica_group, _replica.group_ranks(replica_group)), _bad)
        self._plan = plan
        self.process_group = plan.counterparts
        # A -fit code is chosen for the whole model, alike everywhere.
        if _chooses_by_ranks(self.compression) and plan.counterparts is not None:
            self.compression = _C.diloco_code_chosen(self.compression, sum(p.numel() for p in self._order),
                                                     dist.get_world_size(plan.counterparts))
        self._in_place = False
        self._flat = torch.zeros(sum(plan.lengths), dtype=torch.float32)
        self._offsets = [sum(plan.lengths[:f]) for f in range(len(plan.lengths))]
        every = range(len(plan.lengths))
        self._load_fragments(every)
        self._attach(plan.lengths, len(plan.lengths), "contiguous")  # replica 0's shards or parts everywhere
        self._store_fragments(every)
        self._refresh(every)

    def _refresh(self, fragments: Iterable[int]) -> None:
        """Split replicas: the fragments' new parts from every rank of the replica, into the parameters."""
        plan = self._plan
        if plan is None or plan.kind != "split":
            return
        for f in fragments:
            own = self._flat[self._offsets[f]:self._offsets[f] + plan.lengths[f]]
            _replica.write_whole(plan, self._order, f, _replica.gather_fragment(plan, f, own))

    def _make_engine(self, group: Any, layer_sizes: List[int], num_fragments: int, layout: str) -> Any:
        return _C.DiLoCoEngine(group, layer_sizes, self.sync_every, num_fragments, self.delay, self.alpha, layout,
                               self.outer_lr, self.outer_momentum, self.compression, self.keep_delay_steps)

    def _attach(self, layer_sizes: List[int], num_fragments: int, layout: str) -> None:
        """Makes the engine over the ranks of ``process_group`` and starts it from rank 0's parameters."""
        self._world = dist.get_world_size(self.process_group)
        self._rank = dist.get_rank(self.process_group)
        # The engine's own group: its thread's collectives never interleave with the trainer's. Counterparts
        # make theirs alone (each shard's or part's group at the same time as the others').
        ranks = _group_ranks(self.process_group)
        if self.device_round:
            # NCCL moves the device's messages where the trainer's group is NCCL; gloo through host buffers.
            nccl = dist.get_backend(self.process_group) == "nccl"
            self._engine_group = dist.new_group(ranks=ranks, backend="nccl") if nccl else \
                gloo_group_like(self.process_group, ranks)
            self._engine = _device_round.DeviceEngine(
                self._engine_group, layer_sizes, self.sync_every, num_fragments, self.delay, self.alpha, layout,
                self.outer_lr, self.outer_momentum, self.compression, self._device)
        else:
            make = gloo_group_like if self._plan is None else gloo_subgroup
            self._engine_group = make(self.process_group, ranks)
            self._engine = self._make_engine(self._engine_group, layer_sizes, num_fragments, layout)
        self._engine.start(self._flat)
        self._broadcast_bytes = self._engine.traffic()["bytes_sent"]

    @staticmethod
    def _by_fragment(layers: List[List[torch.nn.Parameter]], P: int, layout: str) -> List[List[Any]]:
        if layout == "strided":
            return [[p for j, layer in enumerate(layers) if j % P == f for p in layer] for f in range(P)]
        return [list(layer) for layer in layers]

    @staticmethod
    def _fragments(model: torch.nn.Module, params: List[torch.nn.Parameter], fragments) -> Any:
        if isinstance(fragments, bool):
            raise _bad("fragments", fragments, "a whole number >= 1 or a sequence of modules or parameter lists")
        if isinstance(fragments, int):
            if fragments < 1:
                raise _bad("fragments", fragments, "a whole number >= 1")
            owners = [[p for p in m.parameters(recurse=False) if p.requires_grad] for m in model.modules()]
            owners = [o for o in owners if o]
            seen, layers = set(), []
            for o in owners:  # a parameter shared by two modules belongs to the first
                o = [p for p in o if id(p) not in seen]
                seen.update(id(p) for p in o)
                if o:
                    layers.append(o)
            if fragments > len(layers):
                raise _bad("fragments", fragments,
                           f"at most the {len(layers)} modules of the model that own parameters")
            return layers, fragments, "strided"
        try:
            given = [list(f.parameters()) if isinstance(f, torch.nn.Module) else list(f) for f in fragments]
        except TypeError:
            raise _bad("fragments", fragments, "a whole number >= 1 or a sequence of modules or parameter lists") \
                from None
        given = [[p for p in f if p.requires_grad] for f in given]
        ids = [id(p) for f in given for p in f]
        if not given or any(not f for f in given) or len(ids) != len(set(ids)) or \
                set(ids) != {id(p) for p in params}:
            raise _bad("fragments", f"a sequence of {len(given)} groups",
                       "non-empty groups covering every trainable parameter of the model exactly once")
        return given, len(given), "contiguous"

    # --- where the parameters live ---------------------------------------------------------------------------

    def _indices(self, fragments: Iterable[int]) -> List[int]:
        wanted = set()
        for f in fragments:
            wanted.update(id(p) for p in self._fragment_params[f])
        return [i for i, p in enumerate(self._order) if id(p) in wanted]

    def _copy_in(self, indices: Iterable[int]) -> None:
        """The parameters at `indices` into the engine's flat tensor (nothing to do when it holds them)."""
        if self._in_place:
            return
        with torch.no_grad():
            for i in indices:
                self._views[i].copy_(self._order[i].detach(), non_blocking=False)

    def _load_fragments(self, fragments: Iterable[int]) -> None:
        """The fragments' values this rank holds, into the engine's flat tensor (nothing to do in place)."""
        if self._plan is not None:
            _replica.move(self._plan, self._order, self._flat, list(fragments), self._offsets, into_engine=True)
        else:
            self._copy_in(self._indices(fragments))

    def _store_fragments(self, fragments: Iterable[int]) -> None:
        """The engine's values of the fragments back into the parameters this rank holds."""
        if self._plan is not None:
            _replica.move(self._plan, self._order, self._flat, list(fragments), self._offsets, into_engine=False)
        else:
            self._copy_out(self._indices(fragments))

    def _copy_out(self, indices: Iterable[int]) -> None:
        if self._in_place:
            return
        with torch.no_grad():
            for i in indices:
                self._order[i].copy_(self._views[i])

    # --- the loop's calls ----------------------------------------------------------------------------------

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """The inner optimizer's ``zero_grad`` (with its own default for ``set_to_none`` when not given)."""
        if set_to_none is None:
            self.inner_optimizer.zero_grad()
        else:
            self.inner_optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        """One inner step, then the engine's schedule after it: the exchanges started ``delay`` steps ago are
        applied, and the fragments whose turn it is start theirs (and, with ``delay = 0``, apply them at once).

        Args:
            closure (Callable, optional): passed to the inner optimizer's ``step``.

        Returns:
            What the inner optimizer's ``step`` returned (the loss, with a closure).

        Raises:
            commsgd_torch.NonFinite: on every rank, when some rank's pseudo-gradient is not finite.
        """
        loss = self.inner_optimizer.step() if closure is None else self.inner_optimizer.step(closure)
        if self._plan is not None:
            self._replica_call(self._engine.advance, self._engine.touched_next(), self._engine.applied_next())
            return loss
        touched = [] if self._in_place else self._indices(self._engine.touched_next())
        self._call_engine(self._engine.advance, touched)
        return loss

    def finish(self) -> None:
        """Applies the exchanges in flight, then exchanges once more every fragment that has moved since its
        last exchange was applied (every fragment with ``alpha > 0``) and applies it at once, so that every
        rank holds the global model (with ``alpha = 0``). Collective; for the end of training."""
        if self._plan is not None:
            every = list(range(self.num_fragments))
            self._replica_call(self._engine.finish, every, every)
            return
        self._call_engine(self._engine.finish, range(len(self._order)))

    def _replica_call(self, call: Any, touched: List[int], applied: List[int]) -> None:
        """call(flat) for a replica of many ranks: the touched fragments' shards or parts copied in and out,
        and, split, the applied fragments gathered whole on every rank of the replica (even when the exchange
        was refused, so that the replica's ranks meet in the same collectives)."""
        self._load_fragments(touched)
        try:
            call(self._flat)
        except NonFinite as e:
            raise self._named(e) from None
        finally:
            self._store_fragments(touched)
            self._refresh(applied)

    def _call_engine(self, call: Any, indices: Iterable[int]) -> None:
        """call(flat) with the parameters at `indices` copied in before and out after (nothing to copy in
        place), the engine's refusal named with this rank's parameters."""
        indices = list(indices)
        self._copy_in(indices)
        try:
            call(self._flat)
        except NonFinite as e:
            raise self._named(e) from None
        finally:
            self._copy_out(indices)

    def close(self) -> None:
        """Waits for the exchanges in flight without applying them, so that the script may end, or call
        ``dist.destroy_process_group()``, on any step: every rank must call it (their collectives run
        together). Garbage collection does the same; :meth:`finish` applies them instead."""
        self._engine.drain()

    def _named(self, error: NonFinite) -> NonFinite:
        """The engine's refusal, with the names of this rank's parameters that hold NaN or inf."""
        bad = [self._names[id(p)] for p in self._order
               if not bool(torch.isfinite(_replica.local(p).detach()).all())]
        where = f" (here, on rank {self._rank}, in parameter(s) {', '.join(bad)})" if bad else ""
        return NonFinite(f"DiLoCo: {error}{where}; every rank refuses this exchange and keeps its global model, "
                         "outer momentum and residuals")

    # --- readings -----------------------------------------------------------------------------------------

    @property
    def num_fragments(self) -> int:
        return len(self._fragment_params)

    @property
    def inner_steps(self) -> int:
        """Inner steps taken (calls of :meth:`step`)."""
        return self._engine.steps()

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank has sent in exchanges (by the collectives' algorithms; see :meth:`stats`)."""
        return self._engine.bytes_sent()

    def set_timeout(self, seconds: float) -> None:
        """A deadline for each operation of the exchanges from the next one on: a peer that has not answered
        within ``seconds`` fails the exchange on this rank with :class:`CommError` (0: the process group's own
        deadline, the one it was made with). For a deadline that follows the network, such as a multiple of
        recent exchange times; every rank should set the same."""
        self._engine.set_timeout(float(seconds))

    def timeout(self) -> float:
        """The deadline of each of the exchange's operations, in seconds (0 where torch does not report the
        process group's)."""
        return self._engine.timeout()

    def stats(self) -> Dict[str, int]:
        """This rank's counters: ``inner_steps``; ``exchanges_started`` and ``outer_steps`` (fragment
        exchanges started and applied); ``bytes_sent`` (what this rank sent in exchanges: a ring all-reduce
        of B bytes about 2 (n - 1) B / n, an all-gather of B-byte messages (n - 1) B, comm/traffic.hpp);
        ``broadcast_bytes`` (the parameters rank 0 broadcast at construction, counted apart);
        ``replica_ranks`` (L, the ranks of this rank's replica) and ``engine_values`` (the values of the model
        this rank's engine holds, and keeps a common copy, outer momentum and residual of: the whole model, or
        its shards or part, about 1/L of it)."""
        return {"inner_steps": self._engine.steps(), "exchanges_started": self._engine.exchanges_started(),
                "outer_steps": self._engine.exchanges_applied(), "bytes_sent": self._engine.bytes_sent(),
                "broadcast_bytes": self._broadcast_bytes,
                "replica_ranks": 1 if self._plan is None else self._plan.replica_size,
                "engine_values": self._flat.numel()}

    def fragment_parameters(self, p: int) -> List[torch.nn.Parameter]:
        """The local parameters of fragment ``p``."""
        return list(self._fragment_params[p])

    def global_parameters(self) -> List[torch.Tensor]:
        """A copy of the global model (the engine's), one tensor per parameter shaped like it, in
        :meth:`fragment_parameters` order, fragment after fragment: equal on every rank after each outer
        step. With FSDP2 parameters each is a DTensor sharded as its parameter is (this rank's shard of the
        global model); in a split replica the parts are gathered from the replica's ranks (collective over
        ``replica_group``)."""
        if self._plan is not None:
            return self._replica_globals()
        out = []
        for f, params in enumerate(self._fragment_params):
            flat = self._engine.global_model(f)
            off = 0
            for p in params:
                out.append(flat[off:off + p.numel()].view(p.shape).to(p.dtype))
                off += p.numel()
        return out

    def _replica_globals(self) -> List[torch.Tensor]:
        plan, out = self._plan, []
        for f, params in enumerate(self._fragment_params):
            values = self._engine.global_model(f)
            if plan.kind == "split":
                values = _replica.gather_fragment(plan, f, values)
            off = 0
            for p in params:
                if plan.kind == "split":
                    out.append(values[off:off + p.numel()].view(p.shape).to(p.dtype))
                    off += p.numel()
                    continue
                shard = _replica.local(p)
                t = values[off:off + shard.numel()].view(shard.shape).to(shard.dtype)
                off += shard.numel()
                out.append(type(p).from_local(t, p.device_mesh, p.placements, shape=p.shape, stride=p.stride(),
                                              run_check=False))
        return out

    def outer_velocity(self, p: int) -> torch.Tensor:
        """A copy of fragment ``p``'s outer momentum v (flat float32, in :meth:`fragment_parameters` order;
        empty before its first outer step and without momentum)."""
        return self._engine.outer_velocity(p)

    def residual(self, p: int) -> Optional[torch.Tensor]:
        """A copy of fragment ``p``'s top-k residual (flat float32), or None without top-k."""
        return self._engine.residual(p)

    # --- checkpoints ---------------------------------------------------------------------------------------

    def _config(self) -> Dict[str, Any]:
        config = {"sync_every": self.sync_every,
                  "fragments": [[tuple(p.shape) for p in g] for g in self._fragment_params],
                  "delay": self.delay, "compression": self.compression, "world_size": self._world}
        if self._plan is not None:  # which shards or part this rank holds: a checkpoint is not resharded
            config[self._plan.kind] = self._plan.config
        return config

    def state_dict(self) -> Dict[str, Any]:
        """Everything a resume needs besides the model's own ``state_dict()``: the inner optimizer's state and
        the engine's (its step counter, global copy, outer momentum, residuals, and the exchanges in flight,
        waited for: their collectives complete here, so every rank calls this at the same step)."""
        blob = self._engine.save()
        return {"config": self._config(), "inner": self.inner_optimizer.state_dict(),
                "engine": torch.frombuffer(bytearray(blob), dtype=torch.uint8) if hasattr(torch, "frombuffer")
                else torch.tensor(list(blob), dtype=torch.uint8),
                "broadcast_bytes": self._broadcast_bytes}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` saved, into a DiLoCo built alike (same model, schedule,
        compression and world size); load the model's ``state_dict()`` beside it.

        Args:
            state_dict (dict): a :meth:`state_dict` of this rank.
        """
        mine = self._config()
        if state_dict.get("config") != mine:
            raise _bad("state_dict", f"a state of configuration {state_dict.get('config')}",
                       f"a state of this DiLoCo's configuration {mine}")
        self._engine.load(bytes(state_dict["engine"].numpy().tobytes()))
        self.inner_optimizer.load_state_dict(state_dict["inner"])
        self._broadcast_bytes = int(state_dict.get("broadcast_bytes", 0))
        if self._plan is not None:
            self._load_fragments(range(self.num_fragments))
        self._engine.start(self._flat)  # attaches the loaded state; broadcasts nothing

    def __repr__(self) -> str:
        return (f"DiLoCo(sync_every={self.sync_every}, outer_lr={self.outer_lr}, "
                f"outer_momentum={self.outer_momentum}, fragments={self.num_fragments}, delay={self.delay}, "
                f"alpha={self.alpha}, keep_delay_steps={self.keep_delay_steps}, compression={self.compression!r}, inner={type(self.inner_optimizer).__name__})")
