"""What the states share: the process group they talk over, the model check and their readings."""
from datetime import timedelta
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from ._C import InvalidArgument


def group_timeout(group: Optional[dist.ProcessGroup]) -> Optional[timedelta]:
    """The deadline `group` (None: the default group) was made with, or None where torch does not say. A
    group made from it must be given it: torch gives a new group its own default, 30 minutes, so a peer that
    died would hold the others that long instead of the deadline the trainer chose."""
    g = dist.group.WORLD if group is None else group
    try:
        if hasattr(g, "_get_backend"):  # torch 2: the options are the CPU backend's
            return g._get_backend(torch.device("cpu")).options._timeout
        return g.options._timeout
    except Exception:  # a backend that reports no options
        return None


def gloo_group_like(group: Optional[dist.ProcessGroup], ranks: Optional[List[int]] = None) -> dist.ProcessGroup:
    """A new gloo group of `ranks` (None: every rank) with `group`'s deadline. Collective."""
    return dist.new_group(ranks=ranks, backend="gloo", **_deadline_of(group))


def gloo_subgroup(group: Optional[dist.ProcessGroup], ranks: List[int]) -> dist.ProcessGroup:
    """A new gloo group of `ranks`, with `group`'s deadline, made by those ranks alone: the other ranks make
    their own subgroups at the same time (every replica its own, every shard's counterparts theirs)."""
    return dist.new_group(ranks=sorted(ranks), backend="gloo", use_local_synchronization=True, **_deadline_of(group))


def _deadline_of(group: Optional[dist.ProcessGroup]) -> Dict[str, timedelta]:
    """new_group's timeout argument for `group`'s deadline, or none where torch does not say."""
    timeout = group_timeout(group)
    return {} if timeout is None else {"timeout": timeout}


def own_group(process_group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    """The group a state talks over: the one given, or a new gloo group of all ranks with the default group's
    deadline (so that a state's traffic is its own and counted apart from DDP's). Making one is collective:
    every rank constructs the state at the same point."""
    if process_group is None:
        return gloo_group_like(None)
    if not isinstance(process_group, dist.ProcessGroup):
        raise InvalidArgument(f"commsgd: argument 'process_group' is a {type(process_group).__name__}, "
                              "expected a torch.distributed ProcessGroup or None")
    return process_group


def check_model(model: object, owner: str) -> torch.nn.Module:
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgument(f"commsgd: argument 'model' of {owner} is a {type(model).__name__}, expected "
                              "a torch.nn.Module")
    return model


class Metered:
    """The traffic readings of a state whose rounds run in the compiled part (`self._c`)."""

    _c: Any

    def traffic(self) -> Dict[str, int]:
        """Bytes and messages this rank sent and received in the state's group since construction or
        reset_traffic(), once the rounds posted so far are done."""
        return self._c.traffic()

    def reset_traffic(self) -> None:
        self._c.reset_traffic()


class IterCounted(Metered):
    """A state that counts iterations as PyTorch's states do (`iter`, bumped at each iteration's last bucket)
    and runs a bucket's round through exchange_async()."""

    iter: int

    def maybe_increase_iter(self, bucket: dist.GradBucket) -> None:
        if bucket.is_last():
            self.iter += 1

    def exchange_async(self, bucket: dist.GradBucket) -> "torch.futures.Future[torch.Tensor]":
        raise NotImplementedError

    def exchange(self, bucket: dist.GradBucket) -> torch.Tensor:
        """The bucket's round, waited for (the hook itself does not wait)."""
        return self.exchange_async(bucket).wait()
