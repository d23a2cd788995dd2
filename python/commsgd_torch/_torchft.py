"""Every tie to torchft's internals in one place: the private attributes of its Manager that
:class:`commsgd_torch.FaultTolerantDiLoCo` reads, the method of its gloo group it overrides, and the shape of the
errors its quorum leaves. Checked when first used against the torchft this package was tested with, so that a
torchft that moved one of them fails at once with its name and both versions, not later with a wrong round.
"""
import inspect
from datetime import timedelta
from importlib import metadata
from typing import Any, List, Optional

from ._C import CommError

# The torchft release the adapter was written against and CI runs (scripts/test_torch_pypi.sh pins it).
TESTED = "0.2.0"

# What the adapter relies on: the Manager's attributes set in its constructor, its methods, and the gloo
# group's reconfiguration (`configure`'s parameters by name and order, `_create_pg` called once per group).
_MANAGER_ATTRIBUTES = ("_pg", "_use_async_quorum", "_min_replica_size", "_replica_id")
_MANAGER_METHODS = ("start_quorum", "should_commit", "errored", "report_error", "register_state_dict_fn",
                    "num_participants")
_CONFIGURE_PARAMETERS = ["store_addr", "replica_id", "rank", "world_size", "quorum_id", "group_rank",
                         "group_world_size", "global_ranks"]


def version() -> str:
    try:
        return metadata.version("torchft")
    except metadata.PackageNotFoundError:
        return "unknown"


def _moved(what: str) -> ImportError:
    return ImportError(f"commsgd_torch.FaultTolerantDiLoCo: torchft {version()} no longer has {what}, which this "
                       f"package relies on (tested with torchft {TESTED}); install torchft=={TESTED}")


def _process_group_module() -> Any:
    try:
        import torchft.process_group as pg
    except ImportError as e:  # torchft is optional
        raise ImportError("commsgd_torch.FaultTolerantDiLoCo needs torchft (pip install torchft; torch 2.x)") from e
    gloo = getattr(pg, "ProcessGroupGloo", None)
    if gloo is None or not callable(getattr(gloo, "_create_pg", None)):
        raise _moved("torchft.process_group.ProcessGroupGloo._create_pg")
    params = list(inspect.signature(gloo.configure).parameters)[1:]
    if params[:len(_CONFIGURE_PARAMETERS)] != _CONFIGURE_PARAMETERS:
        raise _moved(f"ProcessGroupGloo.configure({', '.join(_CONFIGURE_PARAMETERS)}) (it takes "
                     f"({', '.join(params)}))")
    return pg


def replica_group(timeout: timedelta) -> Any:
    """torchft's reconfigurable gloo group, remembering each group the Manager builds on it: ``current`` (the
    last built), ``generation`` (how many were built), ``members`` (their global ranks), and
    ``configure_error`` (what the last reconfiguration raised, or None)."""
    base = _process_group_module().ProcessGroupGloo

    class _ReplicaGroup(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(timeout=timeout)
            self.timeout_s = timeout.total_seconds()
            self.generation = 0
            self.current: Optional[Any] = None
            self.members: List[int] = []
            self.configure_error: Optional[BaseException] = None

        def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int, *args: Any,
                      **kwargs: Any) -> None:
            self.configure_error = None
            try:
                super().configure(store_addr, replica_id, rank, world_size, *args, **kwargs)
            except BaseException as e:
                self.configure_error = e
                raise
            named = dict(zip(_CONFIGURE_PARAMETERS[4:], args))
            named.update(kwargs)
            ranks = named.get("global_ranks")
            self.members = list(ranks) if ranks else list(range(world_size))

        def _create_pg(self, store: Any, rank: int, world_size: int) -> Any:
            made = super()._create_pg(store, rank, world_size)
            self.current = made
            self.generation += 1
            return made

    return _ReplicaGroup()


class ManagerView:
    """The parts of a torchft Manager that FaultTolerantDiLoCo reads beyond its public methods."""

    def __init__(self, manager: Any) -> None:
        missing = [a for a in _MANAGER_ATTRIBUTES + _MANAGER_METHODS if not hasattr(manager, a)]
        if missing:
            raise _moved(f"Manager.{', Manager.'.join(missing)}")
        self.manager = manager

    @property
    def group(self) -> Any:
        return self.manager._pg

    @property
    def async_quorum(self) -> bool:
        return bool(self.manager._use_async_quorum)

    @property
    def min_replicas(self) -> int:
        return int(self.manager._min_replica_size)

    @property
    def replica_id(self) -> str:
        return str(self.manager._replica_id)

    def start_quorum(self, members: List[int]) -> Optional[CommError]:
        """The Manager's quorum. Raises a CommError when no quorum formed; returns one naming the part that
        failed when the quorum formed but this replica's part of it did not (the group's rebuilding, a heal's
        transfer), which the Manager has recorded: its round then fails and the next quorum tries again."""
        try:
            self.manager.start_quorum()
        except TimeoutError as e:  # the lighthouse formed no quorum within the Manager's quorum_timeout
            raise CommError(f"FaultTolerantDiLoCo: no quorum of at least {self.min_replicas} replicas within the "
                            f"Manager's quorum_timeout ({e}); the last membership was replicas "
                            f"{members or [self.replica_id]}") from e
        except Exception as e:  # the Manager's own server or the lighthouse did not answer
            raise CommError(f"FaultTolerantDiLoCo: the quorum request failed (the lighthouse or this replica's "
                            f"Manager server did not answer): {type(e).__name__}: {e}") from e
        err = self.manager.errored()
        if err is None:
            return None
        cause = getattr(err, "original_exception", err)
        trace = getattr(err, "stack_trace", "")
        if self.group.configure_error is not None:
            part = f"rebuilding the group of replicas {self.group.members}"
        elif "recv_checkpoint" in trace or "_checkpoint_metadata" in trace:
            part = "healing: fetching a live replica's state"
        elif "send_checkpoint" in trace:
            part = "sending this replica's state to a replica that heals"
        else:
            part = "the quorum"
        return CommError(f"FaultTolerantDiLoCo: {part} failed: {type(cause).__name__}: {cause}")
