"""AllReduceMeter: what this rank sends and receives in ``torch.distributed.all_reduce``, for comparing
PyTorch's own hooks (DDP's allreduce, PowerSGD, post-local SGD, PeriodicModelAverager: they all call it) with
commsgd's states, whose ``traffic()`` counts the same way. Each call is charged as a ring all-reduce over the
call's group, by the rule of ``comm::metered`` (``comm/traffic.hpp``, through ``_C.ring_all_reduce_traffic``):
about 2 (n - 1) / n of the buffer each way.

    meter = AllReduceMeter()        # wraps torch.distributed.all_reduce until close()
    ... train ...
    meter.traffic()["bytes_sent"]

``on`` pauses counting (an evaluation's all-reduce, say); ``count(tensor)`` charges a call the meter cannot
see (a hook that all-reduces a narrowed copy through another path).
"""
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from . import _C

__all__ = ["AllReduceMeter"]

_KEYS = ("bytes_sent", "bytes_received", "messages_sent", "messages_received")


class AllReduceMeter:
    """Counts this rank's ring all-reduce traffic; see the module's text."""

    def __init__(self, install: bool = True, on: bool = True) -> None:
        self.on = on
        self._original: Optional[Any] = None
        self.reset()
        if install:
            self.install()

    def reset(self) -> None:
        self._t: Dict[str, int] = dict.fromkeys(_KEYS, 0)

    @property
    def bytes_sent(self) -> int:
        return self._t["bytes_sent"]

    def traffic(self) -> Dict[str, int]:
        """bytes_sent, bytes_received, messages_sent, messages_received: this rank's totals so far."""
        return dict(self._t)

    def count(self, tensor: torch.Tensor, element_size: Optional[int] = None,
              group: Optional[dist.ProcessGroup] = None) -> None:
        """Charges one all-reduce of `tensor` (its values at `element_size` bytes each, default its own) over
        `group` (default: the default group; a single process when none is initialised)."""
        if not self.on:
            return
        if dist.is_initialized():
            n, rank = dist.get_world_size(group), dist.get_rank(group)
        else:
            n, rank = 1, 0
        t = _C.ring_all_reduce_traffic(tensor.numel(), element_size or tensor.element_size(), n, rank)
        for k in _KEYS:
            self._t[k] += t[k]

    def install(self) -> None:
        """Wraps torch.distributed.all_reduce (once; install() again does nothing)."""
        if self._original is not None:
            return
        self._original = dist.all_reduce
        dist.all_reduce = self._all_reduce

    def close(self) -> None:
        """Puts torch.distributed.all_reduce back, if this meter's wrapper is still the one installed."""
        if self._original is not None and getattr(dist.all_reduce, "__self__", None) is self:
            dist.all_reduce = self._original
        self._original = None

    def __enter__(self) -> "AllReduceMeter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _all_reduce(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.count(tensor, group=kwargs.get("group", args[1] if len(args) > 1 else None))
        return self._original(tensor, *args, **kwargs)
