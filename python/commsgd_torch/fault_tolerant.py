"""DiLoCo that keeps training while replicas fail, leave and rejoin: each round runs over the replicas a
torchft Manager finds alive (its lighthouse's quorum), instead of over a fixed group that one lost peer stops.

Membership is torchft's (PyPI ``torchft``; it runs on CPUs with gloo): a lighthouse keeps the quorum by
heartbeats, each replica's Manager asks it for the members of a round, rebuilds the gloo group when they
change, and hands a live replica's state to one that is behind. The rounds, the codes and the outer step are
commsgd's engine (sync/diloco.hpp), rebound to each new group.
"""
import collections
import hashlib
import math
import statistics
import time
import warnings
from datetime import timedelta
from typing import Any, Deque, Dict, List, Optional

import torch

from . import _C
from ._C import CommError, NonFinite
from .diloco import DiLoCo, _bad

__all__ = ["FaultTolerantDiLoCo", "ReplicaGroup"]


def _torchft() -> Any:
    try:
        import torchft.process_group as pg
    except ImportError as e:  # torchft is optional
        raise ImportError("commsgd_torch.FaultTolerantDiLoCo needs torchft (pip install torchft; torch 2.x)") from e
    return pg


def _solo_group() -> Any:
    """A gloo group of this process alone: the engine's home until the first quorum."""
    store = torch.distributed.HashStore()
    pg = torch.distributed.ProcessGroup(store, 0, 1)
    backend = torch.distributed.ProcessGroupGloo(store, 0, 1, timedelta(seconds=60))
    pg._set_default_backend(torch.distributed.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), torch.distributed.ProcessGroup.BackendType.GLOO, backend)
    return pg


def ReplicaGroup(timeout: timedelta = timedelta(seconds=30)) -> Any:
    """torchft's reconfigurable gloo group (``torchft.ProcessGroupGloo``), for the Manager that a
    :class:`FaultTolerantDiLoCo` runs on. It remembers each group the Manager builds (its members' global
    ranks, this replica's rank and the group's size) so that the engine can be moved onto it.

    Args:
        timeout (timedelta): gloo's deadline for every operation of a round: a peer that vanished without
            closing its connections (a pulled cable) fails the round after this long.
    """
    base = _torchft().ProcessGroupGloo

    class _ReplicaGroup(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(timeout=timeout)
            self.timeout_s = timeout.total_seconds()
            self.generation = 0
            self.current: Optional[Any] = None
            self.members: List[int] = []

        def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int, *args: Any,
                      **kwargs: Any) -> None:
            super().configure(store_addr, replica_id, rank, world_size, *args, **kwargs)
            # The positional ones after world_size: quorum_id, group_rank, group_world_size, global_ranks.
            ranks = kwargs.get("global_ranks", args[3] if len(args) > 3 else None)
            self.members = list(ranks) if ranks else list(range(world_size))

        def _create_pg(self, store: Any, rank: int, world_size: int) -> Any:
            made = super()._create_pg(store, rank, world_size)
            self.current = made
            self.generation += 1
            return made

    return _ReplicaGroup()


class FaultTolerantDiLoCo(DiLoCo):
    r""":class:`DiLoCo` whose rounds run over the replicas alive, on a torchft ``Manager``: a replica that dies
    is dropped from the next round and the others go on; one that restarts (or a new one) joins at a round
    boundary with the live state; a round whose exchange fails changes nothing of the outer state.

    Each round (after every ``sync_every`` inner steps):

    1. **Quorum.** ``manager.start_quorum()``: the lighthouse's members for this round. When they changed,
       torchft rebuilds the gloo group and the engine moves onto it (the round's mean is over these
       replicas). A replica behind the others (it restarted, joined, or failed the last round) is healed
       inside the quorum: it takes a live peer's shared state (common model, outer momentum, step count) with
       its own residuals, and restarts its local model from the common one. Its inner optimizer's state
       stays its own.
    2. **Weights.** When the membership changed, one 8-byte all-reduce of the inner steps each replica has
       taken since its model was last set; where they differ, the engine scales each pseudo-gradient by
       ``n w_r / sum(w)`` before its code (``set_weight``), so that the outer step takes the mean weighted by
       the steps each delivered
       (a replica healed in the middle of a round brings a step or two, not ``sync_every``). In a steady
       membership nothing is added: the round is the plain engine's, bit for bit.
    3. **Exchange.** The engine's round. A peer that dies in it fails it on the others (gloo's error when
       the peer's connections close, or the round's deadline when they do not, see ``deadline_multiple``):
       the engine keeps its outer state as it was, the error goes to the Manager, and the local model keeps
       the round's steps, which the next exchange carries.
    4. **Commit.** ``manager.should_commit()``: a replica whose exchange succeeded counts the round; one
       whose exchange failed is one round behind and is healed at the next quorum, so no two live replicas
       ever hold different common models after a round they both committed (:meth:`global_hash` is a hash
       of it, for checks and logs).

    The lighthouse's ``join_timeout_ms`` must outlast a round. It counts from the earliest replica waiting,
    and a replica that a round left out (it came late) waits from that round on: with a shorter timeout every
    later round forms as soon as ``min_replicas`` have arrived and leaves out the last to come, which heals
    and loses its inner steps. ``stats()["rounds_missed"]`` counts such rounds, and the first one warns. A
    replica that died stops heartbeating and is not waited for, whatever the timeout.

    Fewer replicas than the Manager's ``min_replica_size`` for longer than its ``quorum_timeout`` raises
    :class:`commsgd_torch.CommError` on every live replica, naming the last membership.

    The Manager must be built with ``pg=commsgd_torch.ReplicaGroup(...)``, ``use_async_quorum=False`` (the
    quorum and any healing happen at the round boundary, before the exchange) and, unless every replica
    builds the same initial model, ``init_sync=True`` (replicas then start from one replica's model).
    Streaming (``fragments > 1``, ``delay > 0``) and ``alpha > 0`` are not supported yet: an exchange in
    flight across a change of membership has no group to finish on.

    Args:
        model, inner_optimizer, sync_every, outer_lr, outer_momentum, compression: as :class:`DiLoCo`.
        manager (torchft.Manager): this rank's Manager. A replica of one rank: ``rank=0, world_size=1``. An
            FSDP2 replica of L ranks (the model's parameters DTensors sharded over the replica's own ranks):
            each rank its own Manager with ``rank`` and ``world_size=L`` in the replica, on the replica's store.
            torchft then builds the group of this rank's counterparts (the same rank in every replica), which
            the engine exchanges this rank's shards over, and heals each rank from its counterpart in a live
            replica: a replica that comes back heals every shard. The replica commits a round only when every
            rank's part succeeded (torchft's vote); a rank whose part succeeded in a round its replica did not
            commit counts it as failed and is healed at the next quorum if the others committed it.
        deadline_multiple, deadline_floor, deadline_ceiling: the exchange's deadline (each of its operations
            fails after it without an answer from a peer): ``deadline_multiple`` times the median of the last
            8 exchanges in a steady membership, within [``deadline_floor``, ``deadline_ceiling``] seconds;
            the ceiling (default: :func:`ReplicaGroup`'s ``timeout``) before there are any and in a round
            whose membership changed. ``deadline_multiple=0``: always the ceiling. ``stats()["deadline_ms"]``
            is the last round's.
    """

    # A sharded rank's counterparts are the Manager's group of this rank in every replica, rebuilt with the
    # membership: none is looked for at construction.
    _COUNTERPARTS_AT_CONSTRUCTION = False

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer, *, manager: Any,
                 sync_every: int = 100, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 compression: str = "dense", deadline_multiple: float = 4.0, deadline_floor: float = 1.0,
                 deadline_ceiling: Optional[float] = None) -> None:
        group = getattr(manager, "_pg", None)
        if not hasattr(group, "generation"):
            raise _bad("manager", type(manager).__name__,
                       "a torchft.Manager built with pg=commsgd_torch.ReplicaGroup()")
        if getattr(manager, "_use_async_quorum", False):
            raise _bad("manager", "a Manager with use_async_quorum=True",
                       "use_async_quorum=False (the quorum and healing happen at the round boundary)")
        if not (math.isfinite(deadline_multiple) and deadline_multiple >= 0):
            raise _bad("deadline_multiple", deadline_multiple, "[0, inf) (0: the fixed deadline, the ceiling)")
        ceiling = group.timeout_s if deadline_ceiling is None else deadline_ceiling
        if not (math.isfinite(ceiling) and ceiling > 0):
            raise _bad("deadline_ceiling", deadline_ceiling, "(0, inf), or None: ReplicaGroup's timeout")
        if not (math.isfinite(deadline_floor) and 0 < deadline_floor <= ceiling):
            raise _bad("deadline_floor", deadline_floor, f"(0, {ceiling}] (at most the ceiling)")
        self._deadline_opts = (deadline_multiple, deadline_floor, ceiling)
        self._exchange_s: Deque[float] = collections.deque(maxlen=8)  # the last steady exchanges' seconds
        self.deadline = ceiling  # the last exchange's
        self.manager = manager
        self._group = group
        self._bound = -1  # the group generation the engine runs on (-1: its solo group)
        self._since = 0  # inner steps since the local model was last set from the common one
        self._fresh_quorum = False  # this round's quorum already happened (this replica joined in it)
        self.rounds_committed = 0
        self.rounds_failed = 0
        self.heals = 0
        self.rounds_missed = 0  # rounds this replica was alive for but not in (healed afterwards)
        self._last_ok = True  # the last round's exchange succeeded (a failed one is healed, not missed)
        self.steps_delivered = 0  # inner steps of this replica that reached the common model
        self.last_error: Optional[BaseException] = None
        super().__init__(model, inner_optimizer, process_group=None, sync_every=sync_every, outer_lr=outer_lr,
                         outer_momentum=outer_momentum, fragments=1, delay=0, alpha=0.0,
                         compression=compression)

    # --- membership ----------------------------------------------------------------------------------------

    def _attach(self, layer_sizes: List[int], num_fragments: int, layout: str) -> None:
        # The engine starts on a group of this replica alone, from its own model, so that it can answer a
        # peer's recovery from the first quorum on; the quorum then moves it onto the replicas' group.
        self._engine = self._make_engine(_solo_group(), layer_sizes, num_fragments, layout)
        self._engine.start(self._flat, broadcast=False)
        self._broadcast_bytes = 0
        self._world, self._rank = 1, 0
        self.manager.register_state_dict_fn("commsgd_diloco", self._load_peer, self._state_for_peer)
        healed = self.heals
        self._quorum()
        if self._engine.steps() == 0:
            # The first quorum of the run (init_sync gave every replica one replica's model): counted as a
            # committed step, so that the Manager, which heals every replica behind the primary while its step
            # is 0, does not undo the first round's local steps again at the first round's quorum. First a
            # barrier of the members: a commit withdraws the state this replica offers, and a replica healing
            # from it may not have fetched it yet (at a round's boundary the exchange is that barrier).
            if self._world > 1:
                self._group.current.allreduce([torch.zeros(1, dtype=torch.float64)]).wait()
            self.manager.should_commit()
        # Healed here: the others are at this round's boundary, waiting for this replica in its exchange.
        self._fresh_quorum = self.heals > healed and self._engine.steps() > 0

    def _quorum(self) -> None:
        try:
            self.manager.start_quorum()
        except Exception as e:  # torchft raises its own types (a timeout, a runtime error)
            raise CommError(f"FaultTolerantDiLoCo: no quorum of at least {self.manager._min_replica_size} "
                            f"replicas within the Manager's quorum_timeout ({e}); the last membership was "
                            f"replicas {self._group.members or [self.manager._replica_id]}") from e
        err = self.manager.errored()
        if err is not None:
            raise CommError(f"FaultTolerantDiLoCo: the quorum failed: {err}")
        self._rebind()

    def _rebind(self) -> None:
        if self._group.generation != self._bound and self._group.current is not None:
            self._engine.rebind(self._group.current)
            self._bound = self._group.generation
            self._world, self._rank = self._group.current.size(), self._group.current.rank()

    def _state_for_peer(self) -> Dict[str, Any]:
        # Called in the quorum, after torchft rebuilt the group and before this replica's start_quorum returns:
        # the shared part names the group size, which must be the new group's, as the receiver's is.
        self._rebind()
        blob = self._engine.save("shared")
        return {"shared": torch.frombuffer(bytearray(blob), dtype=torch.uint8)}

    def _load_peer(self, state: Dict[str, Any]) -> None:
        """A live peer's shared state, with this replica's own residuals; the local model restarts from it."""
        self._rebind()  # the shared part names the group size it was saved in: this quorum's
        own = self._engine.save("local")
        self._engine.load_parts(bytes(state["shared"].numpy().tobytes()), own)
        self._engine.start(self._flat, broadcast=False)  # the loaded common model stands
        with torch.no_grad():
            self._flat.copy_(self._engine.global_model(0))
        self._store_fragments(range(self.num_fragments))
        self._since = 0
        self.heals += 1

    # --- the loop's calls ----------------------------------------------------------------------------------

    def step(self, closure: Any = None) -> Any:
        """One inner step; at a round boundary, the round over the replicas alive (see the class)."""
        loss = self.inner_optimizer.step() if closure is None else self.inner_optimizer.step(closure)
        self._since += 1
        if not self._engine.touched_next():
            self._engine.advance(self._flat)
            return loss
        if not self._fresh_quorum:
            generation, healed = self._bound, self.heals
            self._quorum()
            changed = self._bound != generation
            if self.heals > healed and self._last_ok:
                self._missed()
        else:
            changed = True
        self._fresh_quorum = False
        touched = self._engine.touched_next()
        self._load_fragments(touched)
        ok = True
        self.deadline = self._deadline(changed)
        self._engine.set_timeout(self.deadline)
        began = time.monotonic()
        try:
            if changed and self._world > 1:
                self._weigh()
            else:  # the same members as the last round: the plain mean
                self._engine.set_weight(1.0)
            self._engine.advance(self._flat)
            if not changed:
                self._exchange_s.append(time.monotonic() - began)
        except NonFinite as e:
            raise self._named(e) from None
        except (CommError, RuntimeError) as e:  # gloo's errors are RuntimeErrors
            ok = False
            self.last_error = e
            self.manager.report_error(e)
        finally:
            self._store_fragments(touched)
        self._last_ok = ok
        committed = self.manager.should_commit()
        if committed and ok:
            self.rounds_committed += 1
            self.steps_delivered += self._since
            self._since = 0
        elif ok and self._replica_ranks() > 1:
            # Another rank of this replica failed its part of the round: the replica does not commit it, and
            # is healed at the next quorum if the others did.
            self._last_ok = False
            self.rounds_failed += 1
        elif ok:
            raise CommError("FaultTolerantDiLoCo: the round's exchange succeeded but the Manager did not commit "
                            f"it (participants {self.manager.num_participants()}, minimum "
                            f"{self.manager._min_replica_size})")
        else:
            self.rounds_failed += 1
        return loss

    def _replica_ranks(self) -> int:
        return 1 if self._plan is None else self._plan.replica_size

    def _deadline(self, changed: bool) -> float:
        """The round's deadline for each operation of its exchange: the multiple of the median of the last
        steady exchanges, within [floor, ceiling]; the ceiling until there are some, and for a round whose
        membership changed (a replica healing in the quorum makes the others wait in the exchange for its
        transfer)."""
        multiple, floor, ceiling = self._deadline_opts
        if changed or multiple == 0 or not self._exchange_s:
            return ceiling
        return min(ceiling, max(floor, multiple * statistics.median(self._exchange_s)))

    def _missed(self) -> None:
        # Alive, its last exchange fine, and still behind: the lighthouse formed a round without it. Its
        # join timeout counts from the earliest replica waiting, and a replica left out waits from then on,
        # so each later round forms as soon as the minimum has arrived and leaves out the last: one replica
        # in every round heals and loses its steps until the timeout outlasts a round.
        self.rounds_missed += 1
        if self.rounds_missed == 1:
            warnings.warn("FaultTolerantDiLoCo: this replica was alive but left out of a round (the lighthouse "
                          "formed it before this replica arrived) and was healed, losing its inner steps; "
                          "set the lighthouse's join_timeout_ms above a round's duration, since it counts "
                          "from the first replica waiting", RuntimeWarning, stacklevel=3)

    def _weigh(self) -> None:
        """Weighs this replica's pseudo-gradient by n w / sum(w) in the engine, w the inner steps each replica
        delivers this round (the engine's set_weight: a mean weighted by steps)."""
        w = torch.tensor([float(self._since)], dtype=torch.float64)
        self._group.current.allreduce([w]).wait(timedelta(seconds=self.deadline))
        total = float(w.item())
        n = self._world
        equal = total <= 0 or abs(total - n * self._since) < 0.5  # every replica delivers the same steps
        self._engine.set_weight(1.0 if equal else min(float(n), n * self._since / total))

    def finish(self) -> None:
        """Nothing in flight to apply (no delay); the local model stands as the last round left it."""

    def global_hash(self) -> str:
        """A 16-hex-digit hash of the common model's bits: equal on every replica that committed a round."""
        return hashlib.blake2b(self._engine.global_model(0).numpy().tobytes(), digest_size=8).hexdigest()

    def stats(self) -> Dict[str, int]:
        s = super().stats()
        s.update(rounds_committed=self.rounds_committed, rounds_failed=self.rounds_failed, heals=self.heals,
                 rounds_missed=self.rounds_missed, deadline_ms=round(self.deadline * 1000),
                 replicas=self._world, steps_delivered=self.steps_delivered)
        return s
