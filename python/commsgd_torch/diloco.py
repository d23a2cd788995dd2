"""DiLoCo for PyTorch: H inner steps of any optimizer on every rank, then an outer Nesterov step on the average
of the ranks' pseudo-gradients (old minus new), optionally streamed in fragments and compressed.

Pure Python over torch.distributed: no DDP underneath, no compiled code (only the error types come from _C).
"""
import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import torch
import torch.distributed as dist

from ._C import InvalidArgument, NonFinite

__all__ = ["DiLoCo", "COMPRESSIONS"]

#: The compressions a rank's pseudo-gradient can travel in; ``"topk:<density>"`` takes a density in (0, 1].
COMPRESSIONS = ("none", "fp16", "bf16", "int8", "fp4", "topk:<density>")

#: Elements per block of the int8 and fp4 codes (one float32 scale each).
BLOCK = 256

# E3M0 magnitudes, by 3-bit code: 0 is zero, code c in 1..7 is 2^-(c - 1) times the block's scale.
_FP4_MAGNITUDES = [0.0] + [2.0 ** -e for e in range(7)]


class _BadArgument(InvalidArgument, ValueError):
    """A bad argument of DiLoCo: a ValueError, as PyTorch's optimizers raise, and commsgd_torch.InvalidArgument."""


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bad(name: str, value: Any, allowed: str) -> _BadArgument:
    return _BadArgument(f"DiLoCo: argument '{name}' is {value!r}; allowed: {allowed}")


# ---------------------------------------------------------------------------------------------------------------
# Codes of a flat float32 vector into a uint8 message, and back. Every message starts with a 4-byte header (the
# sender's count of non-finite entries, as a float32) so that a refusal needs no collective of its own.

def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def _read(msg: torch.Tensor, start: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    size = torch.tensor([], dtype=dtype).element_size()
    return msg[start:start + count * size].clone().view(dtype)


def _blocks(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    nb = max(1, (n + BLOCK - 1) // BLOCK)
    if nb * BLOCK != n:
        x = torch.cat([x, x.new_zeros(nb * BLOCK - n)])
    return x.view(nb, BLOCK)


def _scales(xb: torch.Tensor) -> torch.Tensor:
    return xb.abs().amax(dim=1)


def _int8_encode(x: torch.Tensor) -> torch.Tensor:
    xb = _blocks(x)
    scale = _scales(xb)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(xb / safe[:, None] * 127.0).clamp_(-127, 127).to(torch.int8)
    return torch.cat([_as_bytes(scale), _as_bytes(q)])


def _int8_decode(msg: torch.Tensor, n: int) -> torch.Tensor:
    nb = max(1, (n + BLOCK - 1) // BLOCK)
    scale = _read(msg, 0, nb, torch.float32)
    q = _read(msg, 4 * nb, nb * BLOCK, torch.int8).view(nb, BLOCK)
    return (q.to(torch.float32) * (scale / 127.0)[:, None]).view(-1)[:n]


def _fp4_encode(x: torch.Tensor) -> torch.Tensor:
    xb = _blocks(x)
    scale = _scales(xb)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    m = xb.abs() / safe[:, None]
    e = torch.round(-torch.log2(m))  # the nearest power of two in log2: 2^-e, e >= 0 (m = 0: e = +inf)
    code = torch.where(e <= 6, e + 1, torch.zeros_like(e)).to(torch.uint8)  # 2^-7 and below: zero
    nib = (code | ((xb < 0).to(torch.uint8) << 3)).view(-1)  # BLOCK is even: whole bytes
    packed = nib[0::2] | (nib[1::2] << 4)
    return torch.cat([_as_bytes(scale), packed])


def _fp4_decode(msg: torch.Tensor, n: int) -> torch.Tensor:
    nb = max(1, (n + BLOCK - 1) // BLOCK)
    scale = _read(msg, 0, nb, torch.float32)
    packed = msg[4 * nb:4 * nb + nb * BLOCK // 2]
    nib = torch.stack([packed & 15, packed >> 4], dim=1).view(nb, BLOCK)
    table = torch.tensor(_FP4_MAGNITUDES, dtype=torch.float32, device=msg.device)
    mag = table[(nib & 7).long()] * scale[:, None]
    return torch.where((nib >> 3) == 1, -mag, mag).view(-1)[:n]


def _encode(kind: str, x: torch.Tensor) -> torch.Tensor:
    """The message of a flat float32 vector in `kind` (fp16, bf16, int8, fp4), without the header."""
    if kind == "fp16":
        return _as_bytes(x.to(torch.float16))
    if kind == "bf16":
        return _as_bytes(x.to(torch.bfloat16))
    if kind == "int8":
        return _int8_encode(x)
    if kind == "fp4":
        return _fp4_encode(x)
    raise AssertionError(kind)


def _decode(kind: str, msg: torch.Tensor, n: int) -> torch.Tensor:
    """The float32 vector of n elements that _encode(kind, .) made `msg` (without the header) of."""
    if kind == "fp16":
        return _read(msg, 0, n, torch.float16).to(torch.float32)
    if kind == "bf16":
        return _read(msg, 0, n, torch.bfloat16).to(torch.float32)
    if kind == "int8":
        return _int8_decode(msg, n)
    if kind == "fp4":
        return _fp4_decode(msg, n)
    raise AssertionError(kind)


def _parse_compression(compression: str):
    if not isinstance(compression, str):
        raise _bad("compression", compression, "one of " + ", ".join(repr(c) for c in COMPRESSIONS))
    if compression.startswith("topk:"):
        text = compression[len("topk:"):]
        try:
            density = float(text)
        except ValueError:
            raise _bad("compression", compression, "'topk:<density>' with a density in (0, 1]") from None
        if not (0.0 < density <= 1.0):
            raise _bad("compression", compression, "'topk:<density>' with a density in (0, 1]")
        return "topk", density
    if compression in ("none", "fp16", "bf16", "int8", "fp4"):
        return compression, None
    raise _bad("compression", compression, "one of " + ", ".join(repr(c) for c in COMPRESSIONS))


def _group_rank0(group: Optional[dist.ProcessGroup]) -> int:
    """The global rank of the group's rank 0 (what dist.broadcast's src names)."""
    if group is None or group is dist.group.WORLD:
        return 0
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, 0)
    return dist.distributed_c10d._get_global_rank(group, 0)  # torch 1.13


class _Exchange:
    """One fragment's exchange, from its start to its outer step: the collective in flight (or its result),
    the step it is due at, and the residual top-k leaves behind once the exchange is accepted."""

    def __init__(self, due: int, started: int) -> None:
        self.due = due
        self.started = started
        self.work: Any = None
        self.buffer: Optional[torch.Tensor] = None          # dense: the all_reduce buffer
        self.gathered: Optional[List[torch.Tensor]] = None  # compressed: every rank's message
        self.mean: Optional[torch.Tensor] = None            # once finished: the averaged pseudo-gradient
        self.counts: Optional[List[int]] = None             # once finished: non-finite entries per rank
        self.residual: Optional[torch.Tensor] = None


class DiLoCo:
    r"""Low-communication data parallelism: every rank takes ``sync_every`` steps of its own optimizer, then the
    ranks average their pseudo-gradients (the global model minus their local model) and an outer SGD with
    Nesterov momentum moves the global model, from which every rank restarts (Douillard et al., 2023:
    DiLoCo; with ``fragments`` and ``delay``, Streaming DiLoCo, 2025).

    A wrapper around the inner optimizer, as :class:`torch.distributed.optim.PostLocalSGDOptimizer` is: the
    training loop calls :meth:`step` after ``loss.backward()`` in place of the inner optimizer's ``step``, and
    :meth:`zero_grad` as usual. No DDP underneath: each rank's gradients stay local.

    The outer step of a fragment, on every rank alike (the sign: old minus new, so that it acts as a gradient)::

        delta = mean over ranks of C_r(theta_global - theta_local_r)   # C_r: this rank's compression
        v = mu * v + delta
        theta_global = theta_global - eta * (delta + mu * v)         # torch.optim.SGD(nesterov=True)
        theta_local = alpha * theta_local + (1 - alpha) * theta_global

    with ``eta = outer_lr`` and ``mu = outer_momentum``; the outer optimizer is a real
    :class:`torch.optim.SGD` over the global copy (:attr:`outer_optimizer`, one parameter group per fragment).
    ``outer_lr=1, outer_momentum=0`` is plain model averaging (local SGD); one rank with
    ``outer_momentum=0`` is Lookahead (k = ``sync_every``, its alpha = ``outer_lr``).

    **Schedule.** The inner steps are counted from 1. The parameters are cut into ``fragments`` = P groups
    (strided: the j-th module that owns parameters, in ``model.modules()`` order, goes to fragment j mod P; or
    the groups given). Fragment p starts an exchange after inner step t when ``(t - t_p) mod H == 0``, with
    ``t_p = p * H // P`` and H = ``sync_every`` (so its first round is t_p steps long when p > 0), and applies
    it ``delay`` inner steps later, the ranks' local steps overlapping the exchange (``async_op=True``).
    With P = 1 and ``delay = 0``: every H steps, the whole model.

    **What travels.** ``"none"``: the float32 pseudo-gradient, summed by ``dist.all_reduce``. Every other
    compression: each rank's message, gathered by ``dist.all_gather`` and decoded and summed in float32 in
    rank order (identical on every rank):

    - ``"fp16"``, ``"bf16"``: the pseudo-gradient cast (2 bytes an element).
    - ``"int8"``: blocks of 256 elements, each a float32 scale s = max|x| and round(127 x / s) in int8;
      decoded as q s / 127, so each element is within s / 254 of its value (1 byte + 4 / 256).
    - ``"fp4"``: E3M0, blocks of 256 with a float32 scale s = max|x|: each element a sign and a 3-bit code,
      0 for zero and c in 1..7 for 2^-(c-1) s. Rounding is to the nearest in log2: e = round(-log2(|x| / s));
      e in 0..6 is sent as 2^-e s (within (sqrt(2) - 1) |x| of x), e >= 7 as zero (|x| < 2^-6.5 s). Half a
      byte + 4 / 256.
    - ``"topk:<density>"``: top-k with error feedback. A residual e per fragment: e <- e + delta; the k =
      ceil(density n) entries of e largest in magnitude are sent (values float32, indices int32: 8 bytes
      each) and zeroed in e, so what was sent plus the new residual is exactly e + delta.

    Each message carries a 4-byte header (the sender's count of non-finite entries), the dense buffer one
    float per rank, so that a non-finite pseudo-gradient is refused on every rank without a collective of
    its own.

    **Bytes.** :meth:`stats` counts what this rank sends by the ring algorithms' rules: an ``all_reduce`` of
    B bytes sends 2 (n - 1) B / n, an ``all_gather`` of B-byte messages (n - 1) B. Dense DiLoCo sends about
    8 (n - 1) / n bytes a parameter once every H steps, where DDP sends them every step; streaming divides
    the busiest step's bytes by P, not the total. A code c times smaller than float32 (fp16/bf16 2, int8 3.9,
    fp4 7.8, top-k 1 / (2 density)) sends 2 c / n times fewer bytes than ``"none"``, because a gather
    grows with n - 1 where a ring all-reduce does not. Memory: a float32 global copy of the parameters and
    the outer momentum (2x the parameters), a float32 residual with top-k, and the messages in flight.

    **Errors.** Bad arguments raise ``ValueError`` (also ``commsgd_torch.InvalidArgument``) naming the
    argument, its value and what is allowed. A non-finite pseudo-gradient on any rank makes every rank raise
    :class:`commsgd_torch.NonFinite` naming the rank, the fragment and the count, and changes nothing of the
    outer state (global copy, outer momentum, residuals: that exchange is dropped). The inner step taken in
    the same call stays taken and counted.

    **Devices.** The code is device-agnostic (tensors follow the parameters; collectives on the group
    given), so NCCL with CUDA parameters should work; only CPU with gloo is tested here.

    Args:
        model (torch.nn.Module): the local model; its parameters that require gradients are synchronised
            (buffers such as BatchNorm's running statistics stay local). Rank 0's parameters are broadcast at
            construction, so every rank starts from the same model: constructing is collective.
        inner_optimizer (torch.optim.Optimizer): the rank's own optimizer over ``model``'s parameters (AdamW
            in the papers); its state stays local. Schedule its learning rate directly.
        process_group (ProcessGroup, optional): the group to average over; ``None``: the default group.
        sync_every (int): H, the inner steps between two exchanges of a fragment, at least 1.
        outer_lr (float): eta, the outer learning rate, finite and > 0 (0.7 in the paper).
        outer_momentum (float): mu, the outer Nesterov momentum, in [0, 1) (0.9 in the paper; 0: none).
        fragments (int or sequence): P >= 1 strided fragments, or the fragments themselves: a sequence of
            modules or of iterables of parameters, covering every trainable parameter exactly once.
        delay (int): tau, the inner steps an exchange overlaps before it is applied, in [0, sync_every).
        alpha (float): the weight of the local parameters in the merge after an outer step, in [0, 1] (0:
            every rank restarts from the global model).
        compression (str): ``"none"``, ``"fp16"``, ``"bf16"``, ``"int8"``, ``"fp4"`` or
            ``"topk:<density>"`` with a density in (0, 1]: the code of each rank's pseudo-gradient.

    Example::
        >>> # xdoctest: +SKIP
        >>> model = Net()
        >>> inner = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.1)
        >>> opt = commsgd_torch.DiLoCo(model, inner, sync_every=100, outer_lr=0.7, outer_momentum=0.9,
        ...                            fragments=4, delay=5, compression="fp4")
        >>> for x, y in loader:
        ...     opt.zero_grad()
        ...     loss_fn(model(x), y).backward()
        ...     opt.step()
        >>> opt.finish()  # one last exchange of everything: every rank holds the global model
        >>> torch.save({"model": model.state_dict(), "diloco": opt.state_dict()}, path)
    """

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer, *,
                 process_group: Optional[dist.ProcessGroup] = None, sync_every: int = 100,
                 outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 fragments: Union[int, Sequence[Union[torch.nn.Module, Iterable[torch.nn.Parameter]]]] = 1,
                 delay: int = 0, alpha: float = 0.0, compression: str = "none") -> None:
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
        self._kind, self._density = _parse_compression(compression)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise _bad("model", type(model).__name__, "a module with at least one parameter that requires grad")
        groups = self._fragments(model, params, fragments)

        self.model = model
        self.inner_optimizer = inner_optimizer
        self.process_group = process_group
        self.sync_every = sync_every
        self.outer_lr = float(outer_lr)
        self.outer_momentum = float(outer_momentum)
        self.delay = delay
        self.alpha = float(alpha)
        self.compression = compression
        self._world = dist.get_world_size(process_group)
        self._rank = dist.get_rank(process_group)
        names = {id(p): n for n, p in model.named_parameters()}
        self._names = [[names.get(id(p), "?") for p in g] for g in groups]
        self._local = groups
        self._offsets = [sync_every * p // len(groups) for p in range(len(groups))]

        broadcast = 0
        with torch.no_grad():
            if self._world > 1:
                src = _group_rank0(process_group)
                for p in params:
                    dist.broadcast(p.data, src=src, group=process_group)
                    broadcast += p.numel() * p.element_size()
            self._global = [[p.detach().to(torch.promote_types(p.dtype, torch.float32)).clone() for p in g]
                            for g in groups]
        self.outer_optimizer = torch.optim.SGD([{"params": g} for g in self._global], lr=self.outer_lr,
                                               momentum=self.outer_momentum, nesterov=self.outer_momentum > 0)
        self._residual: List[Optional[torch.Tensor]] = [None] * len(groups)
        if self._kind == "topk":
            self._residual = [torch.zeros(sum(p.numel() for p in g), dtype=torch.float32, device=g[0].device)
                              for g in groups]
        self._pending: Dict[int, _Exchange] = {}
        self._t = 0
        self._stats = {"inner_steps": 0, "outer_steps": 0, "bytes_sent": 0, "payload_bytes": 0,
                       "peak_step_bytes": 0, "broadcast_bytes": broadcast}

    @staticmethod
    def _fragments(model: torch.nn.Module, params: List[torch.nn.Parameter], fragments) -> List[List[Any]]:
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
            return [[p for j, layer in enumerate(layers) if j % fragments == f for p in layer]
                    for f in range(fragments)]
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
        return given

    # --- the loop's calls ----------------------------------------------------------------------------------

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """The inner optimizer's ``zero_grad`` (with its own default for ``set_to_none`` when not given)."""
        if set_to_none is None:
            self.inner_optimizer.zero_grad()
        else:
            self.inner_optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        """One inner step, then the exchanges due after it: those started ``delay`` steps ago are applied,
        and the fragments whose turn it is start theirs (and, with ``delay = 0``, apply them at once).

        Args:
            closure (Callable, optional): passed to the inner optimizer's ``step``.

        Returns:
            What the inner optimizer's ``step`` returned (the loss, with a closure).

        Raises:
            commsgd_torch.NonFinite: on every rank, when some rank's pseudo-gradient is not finite.
        """
        loss = self.inner_optimizer.step() if closure is None else self.inner_optimizer.step(closure)
        self._t += 1
        self._stats["inner_steps"] = self._t
        for p in sorted(self._pending):
            if self._pending[p].due <= self._t:
                self._apply(p)
        sent = 0
        for p in self.schedule(self._t):
            sent += self._start(p)
            if self.delay == 0:
                self._apply(p)
        self._stats["peak_step_bytes"] = max(self._stats["peak_step_bytes"], sent)
        return loss

    def schedule(self, step: int) -> List[int]:
        """The fragments whose exchange starts after inner step ``step`` (counted from 1)."""
        return [p for p, t_p in enumerate(self._offsets) if step >= 1 and (step - t_p) % self.sync_every == 0]

    def finish(self) -> None:
        """Applies the exchanges in flight, then exchanges every fragment once more and applies it at once, so
        that every rank holds the global model (with ``alpha = 0``). Collective; for the end of training."""
        for p in sorted(self._pending):
            self._apply(p)
        sent = 0
        for p in range(len(self._local)):
            sent += self._start(p)
            self._apply(p)
        self._stats["peak_step_bytes"] = max(self._stats["peak_step_bytes"], sent)

    # --- readings -----------------------------------------------------------------------------------------

    @property
    def num_fragments(self) -> int:
        return len(self._local)

    @property
    def inner_steps(self) -> int:
        """Inner steps taken (calls of :meth:`step`)."""
        return self._t

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank has sent in exchanges (by the ring algorithms' count; see :meth:`stats`)."""
        return self._stats["bytes_sent"]

    def stats(self) -> Dict[str, int]:
        """This rank's counters: ``inner_steps``; ``outer_steps`` (fragment exchanges applied);
        ``bytes_sent`` (by the ring algorithms: 2 (n - 1) B / n for an all_reduce of B bytes, (n - 1) B for
        an all_gather of B-byte messages); ``payload_bytes`` (the sizes B of this rank's messages);
        ``peak_step_bytes`` (the most ``bytes_sent`` started after one inner step); ``broadcast_bytes`` (the
        parameters rank 0 broadcast at construction, counted apart)."""
        return dict(self._stats)

    def fragment_parameters(self, p: int) -> List[torch.nn.Parameter]:
        """The local parameters of fragment ``p``."""
        return list(self._local[p])

    def global_parameters(self) -> List[torch.Tensor]:
        """The global model (the outer optimizer's parameters), in ``model.parameters()`` order of each
        fragment, fragment after fragment: equal on every rank after each outer step."""
        return [g for group in self._global for g in group]

    def residual(self, p: int) -> Optional[torch.Tensor]:
        """Fragment ``p``'s top-k residual (flat float32), or None without top-k."""
        return self._residual[p]

    # --- an exchange ---------------------------------------------------------------------------------------

    def _start(self, p: int) -> int:
        """Starts fragment p's exchange; returns the bytes it sends."""
        n = self._world
        with torch.no_grad():
            delta = torch.cat([(g - l.detach().to(g.dtype)).reshape(-1)
                               for g, l in zip(self._global[p], self._local[p])])
            bad = int((~torch.isfinite(delta)).sum().item())
            ex = _Exchange(due=self._t + self.delay, started=self._t)
            if self._kind == "none":
                flags = delta.new_zeros(n)
                flags[self._rank] = bad
                ex.buffer = torch.cat([delta, flags])
                size = ex.buffer.numel() * ex.buffer.element_size()
                sent = 2 * (n - 1) * size // n
                if n > 1:
                    ex.work = dist.all_reduce(ex.buffer, group=self.process_group, async_op=True)
            else:
                x = delta.to(torch.float32)
                header = _as_bytes(torch.tensor([float(bad)], dtype=torch.float32, device=x.device))
                if self._kind == "topk":
                    e = self._residual[p] + x
                    k = min(e.numel(), max(1, math.ceil(self._density * e.numel() - 1e-9)))
                    idx = torch.topk(e.abs(), k, sorted=False).indices
                    values = e[idx]
                    ex.residual = e.index_fill_(0, idx, 0.0)
                    body = torch.cat([_as_bytes(values), _as_bytes(idx.to(torch.int32))])
                else:
                    body = _encode(self._kind, x)
                msg = torch.cat([header, body])
                size = msg.numel()
                sent = (n - 1) * size
                ex.gathered = [torch.empty_like(msg) for _ in range(n)]
                if n > 1:
                    ex.work = dist.all_gather(ex.gathered, msg, group=self.process_group, async_op=True)
                else:
                    ex.gathered[0].copy_(msg)
        self._pending[p] = ex
        self._stats["payload_bytes"] += size
        self._stats["bytes_sent"] += sent
        return sent

    def _finish(self, p: int, ex: _Exchange) -> None:
        """Waits for the exchange's collective and decodes it into the mean pseudo-gradient and the counts."""
        if ex.mean is not None:
            return
        if ex.work is not None:
            ex.work.wait()
            ex.work = None
        n = self._world
        numel = sum(g.numel() for g in self._global[p])
        with torch.no_grad():
            if ex.buffer is not None:
                ex.counts = [int(c) for c in ex.buffer[numel:].tolist()]
                ex.mean = ex.buffer[:numel] / n
                ex.buffer = None
                return
            acc = torch.zeros(numel, dtype=torch.float32, device=ex.gathered[0].device)
            counts = []
            for msg in ex.gathered:
                counts.append(int(_read(msg, 0, 1, torch.float32).item()))
                body = msg[4:]
                if self._kind == "topk":
                    k = body.numel() // 8
                    values = _read(body, 0, k, torch.float32)
                    idx = _read(body, 4 * k, k, torch.int32).long()
                    acc.index_add_(0, idx, values)
                else:
                    acc += _decode(self._kind, body, numel)
            ex.counts = counts
            ex.mean = acc / n
            ex.gathered = None

    def _apply(self, p: int) -> None:
        ex = self._pending.pop(p)
        self._finish(p, ex)
        bad = [(r, c) for r, c in enumerate(ex.counts) if c != 0]
        if bad:
            numel = sum(g.numel() for g in self._global[p])
            where = "; ".join(f"rank {r}: {c} of {numel} entries NaN or infinite" for r, c in bad)
            mine = ""
            if ex.counts[self._rank]:
                names = [name for name, l, g in zip(self._names[p], self._local[p], self._global[p])
                         if not bool(torch.isfinite(l.detach()).all()) or not bool(torch.isfinite(g).all())]
                mine = f" (here, on rank {self._rank}, in parameter(s) {', '.join(names) or '?'})"
            raise NonFinite(f"DiLoCo: the pseudo-gradient (global minus local parameters) of fragment {p}, "
                            f"started after inner step {ex.started}, is not finite ({where}){mine}; every rank "
                            "refuses this exchange and keeps its global model, outer momentum and residuals")
        with torch.no_grad():
            off = 0
            for g in self._global[p]:
                g.grad = ex.mean[off:off + g.numel()].view_as(g).to(g.dtype)
                off += g.numel()
            self.outer_optimizer.step()
            for g in self._global[p]:
                g.grad = None
            if ex.residual is not None:
                self._residual[p] = ex.residual
            for l, g in zip(self._local[p], self._global[p]):
                if self.alpha == 0.0:
                    l.copy_(g)
                else:
                    l.copy_(torch.lerp(g, l.detach().to(g.dtype), self.alpha))
        self._stats["outer_steps"] += 1

    # --- checkpoints ---------------------------------------------------------------------------------------

    def _config(self) -> Dict[str, Any]:
        return {"sync_every": self.sync_every, "fragments": [[tuple(g.shape) for g in group] for group in self._global],
                "delay": self.delay, "compression": self.compression, "world_size": self._world}

    def state_dict(self) -> Dict[str, Any]:
        """Everything a resume needs besides the model's own ``state_dict()``: the inner and outer optimizers'
        states, the global copy, the step counter, the residuals, the exchanges in flight (waited for: their
        collectives complete here, so every rank calls this at the same step) and the counters. Tensors are
        copies, except those of the inner optimizer's own ``state_dict()``."""
        pending = {}
        for p, ex in self._pending.items():
            self._finish(p, ex)
            pending[p] = {"due": ex.due, "started": ex.started, "mean": ex.mean.clone(), "counts": list(ex.counts),
                          "residual": None if ex.residual is None else ex.residual.clone()}
        return {
            "config": self._config(),
            "step": self._t,
            "inner": self.inner_optimizer.state_dict(),
            "outer": self.outer_optimizer.state_dict(),
            "global": [[g.detach().clone() for g in group] for group in self._global],
            "residuals": [None if r is None else r.clone() for r in self._residual],
            "pending": pending,
            "stats": dict(self._stats),
        }

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
        for p in list(self._pending):  # the exchanges in flight here are superseded
            self._finish(p, self._pending.pop(p))
        self.inner_optimizer.load_state_dict(state_dict["inner"])
        self.outer_optimizer.load_state_dict(state_dict["outer"])
        with torch.no_grad():
            for group, saved in zip(self._global, state_dict["global"]):
                for g, s in zip(group, saved):
                    g.copy_(s)
        self._residual = [None if r is None else r.to(self._global[i][0].device).clone()
                          for i, r in enumerate(state_dict["residuals"])]
        self._pending = {}
        for p, e in state_dict["pending"].items():
            ex = _Exchange(due=e["due"], started=e["started"])
            device = self._global[p][0].device
            ex.mean = e["mean"].to(device).clone()
            ex.counts = list(e["counts"])
            ex.residual = None if e["residual"] is None else e["residual"].to(device).clone()
            self._pending[int(p)] = ex
        self._t = int(state_dict["step"])
        self._stats = dict(state_dict["stats"])

    def __repr__(self) -> str:
        return (f"DiLoCo(sync_every={self.sync_every}, outer_lr={self.outer_lr}, "
                f"outer_momentum={self.outer_momentum}, fragments={self.num_fragments}, delay={self.delay}, "
                f"alpha={self.alpha}, compression={self.compression!r}, inner={type(self.inner_optimizer).__name__})")
