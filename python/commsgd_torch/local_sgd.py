"""Local SGD for DDP (commsgd's sync::local_sgd): gradients averaged for the first iterations, then local
steps with the models averaged every ``period`` steps (or adaptively, ADACOMM's rule)."""
from typing import Dict, Optional

import torch
import torch.distributed as dist

from . import _C
from ._state import Metered, check_model, own_group

__all__ = ["LocalSGDState", "local_sgd_hook"]


class LocalSGDState(Metered):
    r"""State of :func:`local_sgd_hook` and the model averaging that follows each optimizer step.

    Call :meth:`step` after every ``optimizer.step()``.

    Args:
        process_group: the group the averages run on; ``None`` makes a new gloo group of all ranks (a
            collective call).
        model: the module DDP wraps; its parameters are averaged in place.
        lr: the learning rate the adaptive rule compares against, when ``optimizer`` is not given.
        period: local steps between two averages (the first period when ``adaptive``).
        start_iter: iterations whose gradients are averaged (plain DDP) before local steps start.
        adaptive: ADACOMM's rule: the period follows the loss and the learning rate, up to ``max_period``.
        max_period: the longest adaptive period.
        correction: ``"none"``, ``"at_sync"`` or ``"every_step"``: pull each model toward the last average
            (EASGD's elastic correction) with strength ``alpha``.
        alpha: the correction's strength, in (0, 1].
        optimizer: when given, its first parameter group's ``lr`` is read at every step.
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, *, model: torch.nn.Module,
                 lr: float = 0.01, period: int = 4, start_iter: int = 0, adaptive: bool = False,
                 max_period: int = 64, correction: str = "none", alpha: float = 0.5,
                 optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        check_model(model, "LocalSGDState")
        self._params = list(model.parameters())
        self._optimizer = optimizer
        self._lr = lr
        self.process_group = own_group(process_group)
        self._c = _C.LocalSGD(self.process_group, float(lr), int(period), int(start_iter), bool(adaptive),
                              int(max_period), str(correction), float(alpha))

    @property
    def iter(self) -> int:
        """Optimizer steps taken so far (calls of :meth:`step`)."""
        return self._c.steps()

    def in_warmup(self) -> bool:
        """True while gradients are still averaged (before ``start_iter``)."""
        return self._c.in_warmup()

    def step(self, loss: float = float("nan")) -> bool:
        """After the optimizer's step: averages the models when due. Returns True when it did."""
        lr = self._optimizer.param_groups[0]["lr"] if self._optimizer is not None else self._lr
        return self._c.step(self._params, float(loss), float(lr))

    def finish(self) -> None:
        """Averages the models once more, so that every rank ends with the same one."""
        self._c.finish(self._params)

    def current_period(self) -> int:
        return self._c.current_period()


def local_sgd_hook(state: LocalSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    r"""Average gradients until local SGD starts, then leave them local.

    Before ``start_iter`` the bucket is averaged over ranks on the state's exchange thread; afterwards the
    hook hands DDP the bucket as it is, and :meth:`LocalSGDState.step` averages the models instead.

    Args:
        state (LocalSGDState): the schedule and the models' averaging.
        bucket (dist.GradBucket): the flattened gradients of one DDP bucket.

    Returns:
        A future of the averaged bucket (before ``start_iter``) or of the bucket unchanged.

    Example::
        >>> # xdoctest: +SKIP
        >>> state = LocalSGDState(model=model, period=8, start_iter=20, optimizer=optimizer)
        >>> ddp_model.register_comm_hook(state, local_sgd_hook)
        >>> # each iteration: loss.backward(); optimizer.step(); state.step(loss.item())
    """
    return state._c.exchange_async(bucket.buffer())
