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

from . import _torchft
from ._C import CommError, NonFinite
from .diloco import DiLoCo, _bad, _chooses_by_ranks, _code_name

__all__ = ["FaultTolerantDiLoCo", "ReplicaGroup"]


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
    return _torchft.replica_group(timeout)


class FaultTolerantDiLoCo(DiLoCo):
    r""":class:`DiLoCo` whose rounds run over the replicas alive, on a torchft ``Manager``: a replica that dies
    is dropped from the next round and the others go on; one that restarts (or a new one) joins at a round
    boundary with the live state; a round whose exchange fails changes nothing of the outer state.

    Each round (after every ``sync_every`` inner steps; streamed, each fragment's, see Streaming below):

    1. **Quorum.** ``manager.start_quorum()``: the lighthouse's members for this round. When they changed,
       torchft rebuilds the gloo group and the engine moves onto it (the round's mean is over these
       replicas). A replica behind the others (it restarted, joined, failed the last round or was left out of
       it) is healed inside the quorum: it takes a live peer's shared state (common model, outer momentum,
       step count) with its own residuals. Its inner optimizer's state stays its own, and so do its steps
       when they are at most two rounds' (a failed or missed round's and this one's): the local model becomes
       the healed common model plus this replica's steps since its own common model was last set, which this
       round's exchange carries (a round or two late). A replica with more (it trained on alone) restarts
       from the common model, and its steps count in ``stats()["steps_dropped"]``. When the quorum formed but
       this replica's part of it failed (rebuilding the group, a heal's transfer), the round fails as an
       exchange does (below), its error in ``last_error``, and the next step asks for a quorum again.
    2. **Weights.** When the membership changed, one 8-byte all-reduce of the inner steps each replica has
       taken since its model was last set; where they differ, the engine scales each pseudo-gradient by
       ``n w_r / sum(w)`` before its code (``set_weight``), so that the outer step takes the mean weighted by
       the steps each delivered (a replica healed in the middle of a round brings a step or two, not
       ``sync_every``; ``stats()["weight_e6"]`` is the last round's weight in millionths). In a steady
       membership nothing is added: the round is the plain engine's, bit for bit, and a replica that carries
       a failed round's steps weighs as much as the others.
    3. **Exchange.** The engine's round. A peer that dies in it fails it on the others (gloo's error when
       the peer's connections close, or the round's deadline when they do not, see ``deadline_multiple``):
       the engine keeps its outer state as it was, the error goes to the Manager, and the local model keeps
       the round's steps. If every live replica failed the round, the next exchange carries them; if some
       committed it, this replica is one round behind and heals at the next quorum, its steps carried as in 1.
       A pseudo-gradient with NaN or inf is refused on every replica alike: the round fails on each, and
       :meth:`step` raises :class:`commsgd_torch.NonFinite` after the commit, so that a trainer that catches
       it (and mends its model) goes on with every Manager at the same step.
    4. **Commit.** ``manager.should_commit()``: a replica whose exchange succeeded counts the round; one
       whose exchange failed does not, so no two live replicas ever hold different common models after a
       round they both committed (:meth:`global_hash` is a hash of it, for checks and logs).

    The lighthouse's ``join_timeout_ms`` must outlast a round. It counts from the earliest replica waiting,
    and a replica that a round left out (it came late) waits from that round on: with a shorter timeout every
    later round forms as soon as ``min_replicas`` have arrived and leaves out the last to come, whose steps
    then always arrive a round late. ``stats()["rounds_missed"]`` counts such rounds, and the first one
    warns. A replica that died stops heartbeating and is not waited for, whatever the timeout.

    Fewer replicas than the Manager's ``min_replica_size`` for longer than its ``quorum_timeout`` raises
    :class:`commsgd_torch.CommError` on every live replica, naming the last membership; a quorum request that
    fails otherwise (the lighthouse or the Manager's server does not answer) raises one that says so.

    The Manager must be built with ``pg=commsgd_torch.ReplicaGroup(...)``, ``use_async_quorum=False`` (the
    quorum and any healing happen at the round boundary, before the exchange) and, unless every replica
    builds the same initial model, ``init_sync=True`` (replicas then start from one replica's model). Every
    private part of torchft this class relies on is in ``commsgd_torch._torchft``, checked against the
    torchft it was tested with (``_torchft.TESTED``) when the class is built.

    **Streaming** (``fragments``, ``delay``, ``alpha``, ``keep_delay_steps`` as :class:`DiLoCo`): each
    fragment's exchange is a round of its own. The quorum comes at the step its exchange starts, the commit at
    the step it is applied, ``delay`` steps later; ``delay`` must be shorter than the gap between two
    fragments' starts, so that no exchange is in flight at a quorum and a change of membership never meets
    one: an exchange in flight always finishes on the group it started on, and a peer that died in it fails
    it on every survivor whose collective had not completed. Those do not commit the fragment's round; a
    survivor whose collective completed applies and commits it, and the others heal from it at the next
    fragment's quorum (its shared state holds every fragment's common model and momentum), their steps
    carried as in 1. Steps are counted per fragment (``steps_delivered`` is the fewest any fragment
    delivered), and the weights of 2. use the steps of the fragment that starts. The ``delay`` steps taken
    while a fragment's exchange is in flight are delivered by its next exchange with ``keep_delay_steps``
    (the merge keeps them whole); otherwise the merge sets the fragment to the new common model (with
    ``alpha`` of the local one), and they are not delivered: ``stats()["steps_merged"]`` is the most any
    fragment lost so.

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
            is the last round's, ``stats()["failed_exchange_ms"]`` how long the last failed exchange took.
    """

    #: The host engine: it rebuilds its group when the membership changes and saves shared and local parts.
    _DEVICE_ROUND = False

    # A sharded rank's counterparts are the Manager's group of this rank in every replica, rebuilt with the
    # membership: none is looked for at construction.
    _COUNTERPARTS_AT_CONSTRUCTION = False

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer, *, manager: Any,
                 sync_every: int = 100, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 compression: str = "dense", fragments: Any = 1, delay: int = 0, alpha: float = 0.0,
                 keep_delay_steps: bool = False, deadline_multiple: float = 4.0, deadline_floor: float = 1.0,
                 deadline_ceiling: Optional[float] = None) -> None:
        if _chooses_by_ranks(_code_name(compression)):
            raise _bad("compression", compression, "a code that does not choose by the number of replicas (no "
                       "-fit): here replicas leave and join")
        view = _torchft.ManagerView(manager)
        group = view.group
        if not hasattr(group, "generation"):
            raise _bad("manager", type(manager).__name__,
                       "a torchft.Manager built with pg=commsgd_torch.ReplicaGroup()")
        if view.async_quorum:
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
        self.failed_exchange_s = 0.0  # how long the last failed exchange ran before it failed
        self.manager = manager
        self._view = view
        self._group = group
        self._bound = -1  # the group generation the engine runs on (-1: its solo group)
        self._since: List[int] = []  # per fragment: inner steps its next exchange carries
        self._launched: List[int] = []  # per fragment: the steps its exchange in flight carries
        self._delivered: List[int] = []  # per fragment: steps that reached the common model
        self._fresh_quorum = False  # this round's quorum already happened (this replica joined in it)
        self._starting = True  # heals while constructed are counted apart
        self.rounds_committed = 0
        self.rounds_failed = 0
        self.heals = 0  # heals after construction (a restarted replica's first one, and init_sync's, apart)
        self.heals_at_start = 0
        self.rounds_missed = 0  # rounds this replica was alive for but not in (healed afterwards)
        self._last_ok = True  # the last round's exchange succeeded (a failed one is healed, not missed)
        self.steps_dropped = 0  # inner steps lost to heals from more than a round behind
        self.last_error: Optional[BaseException] = None
        super().__init__(model, inner_optimizer, process_group=None, sync_every=sync_every, outer_lr=outer_lr,
                         outer_momentum=outer_momentum, fragments=fragments, delay=delay, alpha=alpha,
                         keep_delay_steps=keep_delay_steps, compression=compression)
        self._starting = False

    @property
    def steps_delivered(self) -> int:
        """Inner steps of this replica that reached the common model (every fragment of them)."""
        return min(self._delivered) if self._delivered else 0

    # --- membership ----------------------------------------------------------------------------------------

    def _attach(self, layer_sizes: List[int], num_fragments: int, layout: str) -> None:
        # The engine starts on a group of this replica alone, from its own model, so that it can answer a
        # peer's recovery from the first quorum on; the quorum then moves it onto the replicas' group.
        starts = sorted(p * self.sync_every // num_fragments for p in range(num_fragments))
        gap = min(b - a for a, b in zip(starts, starts[1:] + [starts[0] + self.sync_every]))
        if self.delay >= gap:
            raise _bad("delay", self.delay, f"[0, {gap}) with {num_fragments} fragments every {self.sync_every} "
                       "steps: an exchange must be applied before the next fragment's starts, so that no quorum "
                       "meets one in flight")
        self._since, self._launched, self._delivered = ([0] * num_fragments for _ in range(3))
        self._merged = [0] * num_fragments  # steps taken while its exchange was in flight, merged away at its end
        self._started_at = [0.0] * num_fragments  # when each fragment's last exchange started
        self._engine = self._make_engine(_solo_group(), layer_sizes, num_fragments, layout)
        self._engine.start(self._flat, broadcast=False)
        self._broadcast_bytes = 0
        self._world, self._rank = 1, 0
        self.manager.register_state_dict_fn("commsgd_diloco", self._load_peer, self._state_for_peer)
        failed = self._quorum()
        if failed is not None:
            raise failed  # no round to fail yet: this replica cannot start
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
        self._fresh_quorum = self.heals_at_start > 0 and self._engine.steps() > 0

    def _quorum(self) -> Optional[CommError]:
        """This round's quorum; the engine moved onto its group. Returns the error of this replica's part of
        a quorum that formed but failed for it (the round then fails); raises when none formed."""
        failed = self._view.start_quorum(self._group.members)
        self._rebind()
        return failed

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

    def _global_flat(self) -> torch.Tensor:
        """The common model laid out as the engine's flat tensor (fragment by fragment, run by run)."""
        out = torch.empty_like(self._flat)
        for p in range(self.num_fragments):
            values, at = self._engine.global_model(p), 0
            for off, n in self._engine.fragment_runs(p):
                out[off:off + n] = values[at:at + n]
                at += n
        return out

    def _load_peer(self, state: Dict[str, Any]) -> None:
        """A live peer's shared state, with this replica's own residuals; the local model restarts from it,
        carrying this replica's steps when they are at most two rounds' (see the class)."""
        self._rebind()  # the shared part names the group size it was saved in: this quorum's
        with torch.no_grad():
            steps = self._flat - self._global_flat()  # this replica's progress since its model was set
        own = self._engine.save("local")
        self._engine.load_parts(bytes(state["shared"].numpy().tobytes()), own)
        self._engine.start(self._flat, broadcast=False)  # the loaded common model stands
        most = max(self._since)
        carry = 0 < most <= 2 * self.sync_every
        with torch.no_grad():
            self._flat.copy_(self._global_flat())
            if carry:
                self._flat.add_(steps)
        self._store_fragments(range(self.num_fragments))
        if not carry:
            self.steps_dropped += most
            self._since = [0] * self.num_fragments
        if self._starting:
            self.heals_at_start += 1
        else:
            self.heals += 1

    # --- the loop's calls ----------------------------------------------------------------------------------

    def step(self, closure: Any = None) -> Any:
        """One inner step; at a round boundary, the round over the replicas alive (see the class).

        Raises:
            commsgd_torch.NonFinite: on every replica, after the round's commit, when some replica's
                pseudo-gradient is not finite.
            commsgd_torch.CommError: when no quorum of enough replicas formed, or the quorum request failed.
        """
        loss = self.inner_optimizer.step() if closure is None else self.inner_optimizer.step(closure)
        self._since = [n + 1 for n in self._since]
        touched = self._engine.touched_next()
        if not touched:
            self._engine.advance(self._flat)
            return loss
        applying = self._engine.applied_next()
        starting = touched if self.delay == 0 else [p for p in touched if p not in applying]
        self._round(self._engine.advance, touched, starting, applying, weigh_always=False)
        return loss

    def finish(self) -> None:
        """The round of the steps taken since the last round boundary (as :meth:`step`'s, its weights always
        taken, since they differ; streamed, the exchanges in flight applied and every fragment that moved
        exchanged once more), so that they reach the common model; nothing when training ended on a boundary,
        where that round has run. Every replica calls it after the same number of steps. A replica whose last
        round failed warns and runs none (its steps stay local: ``stats()["steps_unsent"]``): which fragments
        the others exchange depends on a round it does not hold.

        Raises:
            As :meth:`step`.
        """
        every = list(range(self.num_fragments))
        flying = any(self._engine.in_flight(p) for p in every)
        if not self._last_ok:
            warnings.warn("FaultTolerantDiLoCo.finish: this replica's last round failed, so it runs no final "
                          f"round; {max(self._since)} inner steps stay local", RuntimeWarning, stacklevel=2)
            return
        if not flying and self.num_fragments == 1 and self._engine.steps() % self.sync_every == 0:
            return
        # An exchange in flight had its quorum when it started, and its commit is this one: no new quorum
        # (which could not rebind the engine under it). It is waited for first, so that the weights' all-reduce
        # does not meet its collectives on the group.
        self._engine.drain()
        self._round(self._engine.finish, every, every, every, weigh_always=True, quorum=not flying)

    def _round(self, exchange: Any, touched: List[int], starting: List[int], applying: List[int],
               weigh_always: bool, quorum: bool = True) -> None:
        """A round's part at this step: for the fragments `starting`, the quorum and the weights; then
        `exchange(flat)` (touching `touched`) under the deadline; for the fragments `applying`, the commit."""
        failed: Optional[BaseException] = None
        refused: Optional[NonFinite] = None
        changed = False
        if starting:
            if not quorum:  # no quorum has brought the replicas together: they may come far apart
                changed = True
            elif not self._fresh_quorum:
                generation, healed = self._bound, self.heals
                failed = self._quorum()  # on failure the engine stays before this step: the next asks again
                changed = self._bound != generation
                if self.heals > healed and self._last_ok:
                    self._missed()
            else:
                changed = True
            self._fresh_quorum = False
            self.deadline = self._deadline(changed)
            self._engine.set_timeout(self.deadline)
        if failed is None:
            self._load_fragments(touched)
            began = time.monotonic()
            try:
                if starting:
                    since = sum(self._since[p] for p in starting)
                    if (changed or weigh_always) and self._world > 1:
                        self._weigh(since)
                    else:  # the same members as the last round: the plain mean
                        self._engine.set_weight(1.0)
                    for p in starting:  # (finish: on top of an exchange in flight)
                        self._launched[p], self._since[p] = self._launched[p] + self._since[p], 0
                        self._started_at[p] = began
                exchange(self._flat)
                if applying and not changed:  # from its start: streamed, the delay's steps included
                    self._exchange_s.append(time.monotonic() - min(self._started_at[p] for p in applying))
            except NonFinite as e:  # refused on every replica alike: the round fails on each
                refused = self._named(e)
                failed = refused
            except (CommError, RuntimeError) as e:  # gloo's errors are RuntimeErrors
                failed = e
                self.failed_exchange_s = time.monotonic() - began
            finally:
                self._store_fragments(touched)
        if applying or failed is not None:
            self._commit(failed, applying)
        if refused is not None:
            raise refused from None

    def _commit(self, failed: Optional[BaseException], applying: List[int]) -> None:
        """The Manager's commit of this step's round; the applied fragments' steps counted as delivered, or
        kept for their next exchange."""
        ok = failed is None
        if not ok:
            self.last_error = failed
            self.manager.report_error(failed)
        self._last_ok = ok
        committed = self.manager.should_commit()
        if ok and not committed and self._replica_ranks() > 1:
            # Another rank of this replica failed its part of the round: the replica does not commit it, and
            # is healed at the next quorum if the others did.
            self._last_ok = ok = False
        elif ok and not committed:
            raise CommError("FaultTolerantDiLoCo: the round's exchange succeeded but the Manager did not commit "
                            f"it (participants {self.manager.num_participants()}, minimum "
                            f"{self._view.min_replicas})")
        for p in range(self.num_fragments):
            if ok and p in applying:
                self._delivered[p] += self._launched[p]
                if self.delay and not self.keep_delay_steps:
                    # The merge sets the fragment to the new common model (alpha of its local one mixed in): the
                    # steps taken while its exchange was in flight are not carried whole, so none count.
                    self._merged[p] += self._since[p]
                    self._since[p] = 0
            else:  # not exchanged: the local model keeps the steps, and the fragment's next exchange carries them
                self._since[p] += self._launched[p]
            self._launched[p] = 0
        if ok:
            self.rounds_committed += 1
        else:
            self.rounds_failed += 1

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
        # in every round heals and sends its steps a round late until the timeout outlasts a round.
        self.rounds_missed += 1
        if self.rounds_missed == 1:
            warnings.warn("FaultTolerantDiLoCo: this replica was alive but left out of a round (the lighthouse "
                          "formed it before this replica arrived) and was healed, its steps sent a round late; "
                          "set the lighthouse's join_timeout_ms above a round's duration, since it counts "
                          "from the first replica waiting", RuntimeWarning, stacklevel=4)

    @staticmethod
    def step_weight(since: int, total: float, n: int) -> float:
        """This replica's weight ``n w / sum(w)`` from its steps `since` and the sum over the `n` replicas, 1
        where every replica delivers the same steps (so that the round is the plain engine's bit for bit)."""
        if total <= 0 or abs(total - n * since) < 0.5:
            return 1.0
        return min(float(n), n * since / total)

    def _weigh(self, since: int) -> None:
        """Weighs this replica's pseudo-gradient by n w / sum(w) in the engine, w = `since` the inner steps each
        replica delivers this round (the engine's set_weight: a mean weighted by steps)."""
        w = torch.tensor([float(since)], dtype=torch.float64)
        self._group.current.allreduce([w]).wait(timedelta(seconds=self.deadline))
        self._engine.set_weight(self.step_weight(since, float(w.item()), self._world))

    def global_hash(self) -> str:
        """A 16-hex-digit hash of the common model's bits: equal on every replica that committed a round."""
        h = hashlib.blake2b(digest_size=8)
        for p in range(self.num_fragments):
            h.update(self._engine.global_model(p).numpy().tobytes())
        return h.hexdigest()

    def stats(self) -> Dict[str, int]:
        s = super().stats()
        s.update(rounds_committed=self.rounds_committed, rounds_failed=self.rounds_failed, heals=self.heals,
                 heals_at_start=self.heals_at_start, rounds_missed=self.rounds_missed,
                 deadline_ms=round(self.deadline * 1000), failed_exchange_ms=round(self.failed_exchange_s * 1000),
                 replicas=self._world, steps_delivered=self.steps_delivered, steps_dropped=self.steps_dropped,
                 steps_merged=max(self._merged) if self._merged else 0,
                 steps_unsent=max(self._since) if self._since else 0,
                 weight_e6=round(self._engine.weight() * 1e6))
        return s
