"""FaultTolerantDiLoCo on torchft's Manager and lighthouse, replicas as processes of this machine: with no
failure it is the plain engine bit for bit; a replica killed while the others are in the round's exchange is
dropped and the others finish their rounds; a killed replica that restarts joins at a round boundary and
holds the others' common model bits; a replica frozen in an exchange fails the round at the adaptive deadline;
a replica late to a round is left out of it and its late steps reach the common model a round late; a
replica that joins in the middle of a round weighs by the steps it brings, as the weighted mean's formula
says; a non-finite pseudo-gradient fails the round alike on every replica, which go on; finish() runs the
last partial round as the plain engine does; fewer replicas than the minimum is a clear error on every live
replica, not a hang. tests/torch/test_fault_tolerant_links.py runs replicas on the emulated cluster's links."""
import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
from datetime import timedelta

import pytest
import torch

from helpers import SIZES, Dot, fresh_context, no_errors, reap, run_ranks

import commsgd_torch  # noqa: E402

# Every test skips alone on torch 1.13 (torchft needs torch 2), so that run_pytest.py counts them; on torch 2
# a missing torchft fails them (ImportError), as run_pytest.py fails any skip for want of a package.
pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason=f"torchft needs torch 2 (this is torch {torch.__version__}): the newest-"
                                       "torch suite runs it")

H = 4


def _grads(replica, step):
    g = torch.Generator().manual_seed(1000 * replica + step)
    return [torch.randn(n, generator=g) for n in SIZES]


def _replica(idx, lighthouse, steps, code, min_replicas, kill_at_round, queue, pace=0.0, late=None,
             group_s=5.0, signal_to_self=signal.SIGKILL, rejoin=None, restarted=False, quorum_s=15.0, start=None,
             nan_at=None, finish=False, stream=None, fail_quorum=None):
    """One replica: `steps` inner steps of SGD on Dot with its own gradients; each round's (step, hash,
    replicas) reported. With `kill_at_round`, SIGKILLs itself once that round's quorum is formed, while the
    others go into the round's exchange (`signal_to_self` SIGSTOP: freezes there, its sockets open). With
    `late` = (round, seconds), sleeps that long before that round's boundary step. Each report holds the
    longest step's seconds. `rejoin` = (event, end step) shared with a replica that restarts: the others
    train on until it has joined (at most 120 s), then every replica stops at the end step it set, four
    round boundaries past the one it joined at, so that a slow restart never finds the others gone. `start`: a
    barrier the first replicas pass once each one's Manager heartbeats and again as each asks for its first
    quorum, so that the first quorum holds them all (with a minimum below n, a replica slow to start on a
    loaded machine would miss it). `nan_at`: a NaN in
    this replica's gradient at that step; every replica catches the round's NonFinite, this one mends its
    model from the common one, and all go on. Reports also hold the calls of step() (`calls`), the steps at
    which NonFinite was caught, and each weighted round's inputs and result (`weighted`). `finish`: calls
    finish() after the last step. `stream`: FaultTolerantDiLoCo's streaming options (fragments, delay, alpha,
    keep_delay_steps). `fail_quorum` = (first step, last step): this replica's part of the quorum fails at every
    step in that span (as a failed rebuild of its group would), without asking the lighthouse."""
    try:
        from torchft import Manager
        from torchft.checkpointing.http_transport import HTTPTransport

        class Transport(HTTPTransport):  # the checkpoint's address: this machine's loopback, not its name
            def address(self):
                return super().address().replace(socket.gethostname(), "127.0.0.1", 1)
        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        timeout = timedelta(seconds=20)
        store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                           timeout=timeout)
        manager = Manager(pg=commsgd_torch.ReplicaGroup(timeout=timedelta(seconds=group_s)),
                          min_replica_size=min_replicas,
                          load_state_dict=None, state_dict=None, use_async_quorum=False, replica_id=f"r{idx}",
                          store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
                          lighthouse_addr=lighthouse, hostname="127.0.0.1", timeout=timeout,
                          quorum_timeout=timedelta(seconds=quorum_s), connect_timeout=timeout,
                          checkpoint_transport=Transport(timeout=timeout, num_chunks=0), init_sync=True)
        if start is not None:
            start.wait(timeout=60)
            # And again at the first quorum request (made in the constructor): between the two, a replica
            # descheduled on two loaded cores can fall behind the others by more than the join timeout.
            first_quorum = manager.start_quorum

            def start_together(*a, **k):
                manager.start_quorum = first_quorum
                start.wait(timeout=60)
                return first_quorum(*a, **k)
            manager.start_quorum = start_together
        torch.manual_seed(idx)  # every replica a different start: init_sync gives them one replica's
        model = Dot(SIZES)
        for p in model.parameters():
            torch.nn.init.normal_(p)
        inner = torch.optim.SGD(model.parameters(), lr=0.05)
        opt = commsgd_torch.FaultTolerantDiLoCo(model, inner, manager=manager, sync_every=H, outer_lr=0.7,
                                                outer_momentum=0.9, compression=code, **_streamed(model, stream),
                                                # Streamed, the ceiling: these tests are of the rounds, and the
                                                # 1 s floor is short for replicas on two loaded cores.
                                                **({"deadline_multiple": 0.0} if stream else {}))
        weighted = []
        opt._engine = _Recorder(opt._engine, weighted)
        if fail_quorum is not None:
            real_quorum = opt._view.start_quorum

            def failing_quorum(members):
                if fail_quorum[0] <= calls <= fail_quorum[1]:  # calls: this step() call's number
                    return commsgd_torch.CommError("injected: rebuilding the group failed")
                return real_quorum(members)
            opt._view.start_quorum = failing_quorum
        rounds, longest, calls, refused = [], 0.0, 0, []
        if rejoin is not None and restarted:
            rejoin[1].value = max(steps, (opt.inner_steps // H + 4) * H)
            rejoin[0].set()
        give_up = time.monotonic() + 120

        def more():
            if rejoin is None:
                return opt.inner_steps < steps
            if not rejoin[0].is_set():
                return time.monotonic() < give_up
            return opt.inner_steps < rejoin[1].value

        while more():
            s = opt.inner_steps + 1
            opt.zero_grad()
            model(_grads(idx, s)).backward()
            if s == nan_at:
                next(model.parameters()).grad[0] = float("nan")
            before = opt.rounds_committed
            if kill_at_round is not None and s == kill_at_round * H:
                original = manager.start_quorum

                def start_and_die(*a, **k):
                    original(*a, **k)
                    os.kill(os.getpid(), signal_to_self)
                manager.start_quorum = start_and_die
            if late is not None and s == late[0] * H:
                time.sleep(late[1])
            began = time.monotonic()
            calls += 1
            try:
                opt.step()
            except commsgd_torch.NonFinite:
                refused.append(s)
                with torch.no_grad():  # the mend: this replica's local model from the common one
                    for p, g in zip(model.parameters(), opt.global_parameters()):
                        p.copy_(g.view_as(p))
            longest = max(longest, time.monotonic() - began)
            time.sleep(pace)  # the restart test: time for the restarted replica to start before the others end
            if opt.rounds_committed > before:
                rounds.append((opt.inner_steps, opt.global_hash(), opt.stats()["replicas"]))
        if finish:
            before = opt.rounds_committed
            opt.finish()
            if opt.rounds_committed > before:
                rounds.append((opt.inner_steps, opt.global_hash(), opt.stats()["replicas"]))
        queue.put((idx, "ok", {"rounds": rounds, "stats": opt.stats(), "error": repr(opt.last_error), "longest": longest,
                               "calls": calls, "refused": refused, "weighted": weighted,
                               "global": [t.numpy().tobytes() for t in opt.global_parameters()]}))
        manager.shutdown(wait=False)
    except BaseException:
        queue.put((idx, "error", traceback.format_exc()))


class _Recorder:
    """The engine, its rounds whose weight is not 1 recorded: the step, this replica's weight, and the local
    model, common model and outer velocity before the round with the common model after it."""

    def __init__(self, engine, out):
        self._engine, self._out = engine, out

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def advance(self, flat):
        e = self._engine
        if not e.touched_next() or e.weight() == 1.0:
            return e.advance(flat)
        # numpy copies: tensors through a queue are shared by a file descriptor that dies with this process
        before = (flat.numpy().copy(), e.global_model(0).numpy().copy(), e.outer_velocity(0).numpy().copy())
        e.advance(flat)
        self._out.append({"step": e.steps(), "weight": e.weight(), "local": before[0], "global": before[1],
                          "velocity": before[2], "after": e.global_model(0).numpy().copy()})


def _run(n, steps, code="dense", min_replicas=1, kill=None, restart=None, late=None, join_timeout_ms=5000,
         pace=0.0, group_s=5.0, freeze=False, quorum_s=15.0, timeout=120, nan=None, finish=False, stream=None,
         fail_quorum=None):
    """n replicas; `kill` = (replica, round) it dies in; `restart` = the replica started again once that one
    has died; `late` = (replica, round, seconds) it comes late to; `nan` = (replica, step) whose gradient holds
    a NaN; `fail_quorum` = (replica, first step, last step) whose quorum part fails in that span; `pace`: seconds each replica sleeps after
    each step; `group_s`: ReplicaGroup's timeout; `freeze`: the `kill` replica is SIGSTOPped instead (and
    killed at the end); `quorum_s`: the Managers' quorum timeout. Returns {replica: report} of those that
    finished, and [(replica, traceback)] of those that failed."""
    from torchft.coordination import LighthouseServer
    # A join timeout longer than a round (FaultTolerantDiLoCo's docstring says why): a replica that is late
    # but alive is waited for that long; a dead one stops heartbeating (1 s) and is not.
    server = LighthouseServer(bind="[::]:0", min_replicas=min_replicas, join_timeout_ms=join_timeout_ms,
                              quorum_tick_ms=50,
                              heartbeat_timeout_ms=1000)
    # Started clean: this process runs the lighthouse (threads of torchft's runtime), which a forked child must
    # not inherit. A run with a restart spawns its replicas: the restart's timing is what the restart tests
    # were written for (a replica from the preloaded server is back within a round and joins at another step).
    ctx = mp.get_context("spawn") if restart is not None else fresh_context()
    queue = ctx.Queue()
    procs = {}
    rejoin = (ctx.Event(), ctx.Value("i", 0)) if restart is not None else None
    start = ctx.Barrier(n)
    try:
        for i in range(n):
            k = kill[1] if kill and kill[0] == i else None
            slow = late[1:] if late and late[0] == i else None
            procs[i] = ctx.Process(target=_replica, args=(i, server.address(), steps, code, min_replicas, k, queue, pace,
                                                          slow, group_s, signal.SIGSTOP if freeze else signal.SIGKILL,
                                                          rejoin, False, quorum_s, start,
                                                          nan[1] if nan and nan[0] == i else None, finish,
                                                          stream,
                                                          fail_quorum[1:] if fail_quorum and fail_quorum[0] == i
                                                          else None))
            procs[i].start()
        expected = n - (1 if kill else 0)  # a frozen replica never reports either
        if restart is not None:
            procs[kill[0]].join(timeout=timeout)
            again = ctx.Process(target=_replica, args=(restart, server.address(), steps, code, min_replicas, None,
                                                       queue, pace, None, group_s, signal.SIGKILL, rejoin, True,
                                                       quorum_s))
            again.start()
            procs["again"] = again
            expected += 1
        out, errors = {}, []
        for _ in range(expected):
            idx, status, res = queue.get(timeout=timeout)
            if status == "ok":
                out[idx] = res
            else:
                errors.append((idx, res))
        return out, errors
    finally:
        reap(procs.values())
        server.shutdown()


def _agree(out):
    """No two replicas that committed a round at the same step hold different common models after it (a replica
    that failed or missed a round commits none there, and is healed later)."""
    seen = {}
    for i, rep in out.items():
        for step, h, _ in rep["rounds"]:
            assert seen.setdefault(step, (i, h))[1] == h, f"step {step}: replica {i} and {seen[step][0]} differ"


def _plain(rank, world, code, steps, finish=False, stream=None):
    """The plain engine (commsgd_torch.DiLoCo) on the same gradients, every replica starting from replica 0's
    model (what init_sync gives the fault-tolerant run)."""
    torch.manual_seed(0)
    model = Dot(SIZES)
    for p in model.parameters():
        torch.nn.init.normal_(p)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = commsgd_torch.DiLoCo(model, inner, sync_every=H, outer_lr=0.7, outer_momentum=0.9, compression=code,
                               **_streamed(model, stream))
    for s in range(1, steps + 1):
        opt.zero_grad()
        model(_grads(rank, s)).backward()
        opt.step()
    if finish:
        opt.finish()
    return [t.numpy().tobytes() for t in opt.global_parameters()]


@pytest.mark.parametrize("code", ["dense", "topk-0.1-c64-2bit-b0.9"])  # a dense code and a sparse one
def test_without_failures_it_is_the_plain_engine_bit_for_bit(code):
    out, errors = _run(3, 5 * H, code, min_replicas=3)
    no_errors(errors)
    plain = run_ranks(_plain, 3, (code, 5 * H), spawn=True)
    # init_sync hands every replica the primary's model, the lowest replica id's (r0): the plain run starts
    # every rank from replica 0's.
    hashes = {i: [r[1] for r in out[i]["rounds"]] for i in out}
    assert len(hashes[0]) == 5
    assert hashes[0] == hashes[1] == hashes[2]
    assert all(r[2] == 3 for r in out[0]["rounds"])
    assert out[0]["global"] == plain[0]
    for i, rep in out.items():  # only init_sync's heals at the start: none after it, every step delivered
        assert rep["stats"]["heals"] == 0 and rep["stats"]["heals_at_start"] == (0 if i == 0 else 1), rep["stats"]
        assert rep["stats"]["steps_delivered"] == rep["calls"] == 5 * H and rep["stats"]["steps_dropped"] == 0


def test_finish_runs_the_round_of_the_last_steps_as_the_plain_engine_does():
    steps = 3 * H + 2
    out, errors = _run(3, steps, "dense", min_replicas=3, finish=True)
    no_errors(errors)
    plain = run_ranks(_plain, 3, ("dense", steps, True), spawn=True)
    for rep in out.values():
        assert [s for s, _, _ in rep["rounds"]] == [H, 2 * H, 3 * H, steps], rep["rounds"]
        assert rep["stats"]["steps_delivered"] == rep["calls"] == steps and rep["stats"]["steps_unsent"] == 0
        assert rep["global"] == plain[0]


def _streamed(model, stream):
    """The streaming options with `fragments` = P as P groups of Dot's parameters (it is one module)."""
    opts = dict(stream or {})
    if "fragments" in opts:
        params = list(model.parameters())
        cut = [len(params) * f // opts["fragments"] for f in range(opts["fragments"] + 1)]
        opts["fragments"] = [params[a:b] for a, b in zip(cut, cut[1:])]
    return opts


def _check_streamed_steps(rep, steps, stream):
    """Every step taken reached both fragments' common model, except, without keep_delay_steps, the delay's
    steps of each applied exchange, which the merge leaves out (up to one a fragment's exchange)."""
    st = rep["stats"]
    assert rep["calls"] == steps, rep
    if stream.get("keep_delay_steps"):
        assert st["steps_delivered"] == steps and st["steps_merged"] == 0, st
    else:
        exchanges = -(-st["rounds_committed"] // stream["fragments"])  # the most any fragment applied
        assert exchanges - 1 <= st["steps_merged"] // stream["delay"] <= exchanges, st
        assert st["steps_delivered"] + st["steps_merged"] == steps, st


STREAMS = [("dense", {"fragments": 2, "delay": 1, "alpha": 0.5}),
           ("topk-0.1-c64-2bit-b0.9", {"fragments": 2, "delay": 1, "keep_delay_steps": True})]


@pytest.mark.parametrize("code,stream", STREAMS)
def test_streamed_without_failures_it_is_the_plain_streamed_engine_bit_for_bit(code, stream):
    steps = 5 * H
    out, errors = _run(3, steps, code, min_replicas=3, finish=True, stream=stream)
    no_errors(errors)
    plain = run_ranks(_plain, 3, (code, steps, True, stream), spawn=True)
    _agree(out)
    for rep in out.values():
        # A commit per fragment's exchange (two a round; the last one in flight committed by finish, with
        # the final exchanges); every step reached both fragments.
        assert rep["stats"]["rounds_committed"] == 2 * steps // H and rep["stats"]["rounds_failed"] == 0
        _check_streamed_steps(rep, steps, stream)
        assert rep["global"] == plain[0]


@pytest.mark.parametrize("code,stream", STREAMS)
def test_streamed_a_replica_killed_with_a_fragment_in_flight_fails_it_alike_and_the_others_go_on(code, stream):
    # Replica 2 dies once fragment 0's quorum of round 3 has formed: the survivors start that exchange with it
    # and find it gone when they apply it a step later. Both fail it (or, had their collective completed,
    # both commit it), the next fragment's quorum drops the dead one, and nothing a survivor took is lost.
    steps = 8 * H
    out, errors = _run(3, steps, code, min_replicas=2, kill=(2, 3), finish=True, stream=stream)
    no_errors(errors)
    assert sorted(out) == [0, 1]
    _agree(out)
    a, b = out[0], out[1]
    assert a["rounds"][0][2] == 3 and a["rounds"][-1][2] == 2
    assert 3 * H + 1 not in [s for s, _, _ in a["rounds"] + b["rounds"]]  # fragment 0's exchange of round 3
    assert a["stats"]["rounds_failed"] >= 1 and b["stats"]["rounds_failed"] >= 1
    for rep in (a, b):
        assert rep["stats"]["heals"] == 0 and rep["stats"]["steps_dropped"] == 0, rep["stats"]
        _check_streamed_steps(rep, steps, stream)
    assert a["global"] == b["global"]


def test_streaming_refuses_a_delay_that_would_meet_a_quorum_in_flight():
    from torchft import Manager  # noqa: F401  (the refusal comes before any Manager call)
    group = commsgd_torch.ReplicaGroup(timeout=timedelta(seconds=1))
    manager = type("M", (_FakeManager,), {})()
    manager._pg = group
    model = Dot(SIZES)
    with pytest.raises(ValueError, match=r"delay.*\[0, 2\) with 2 fragments every 4 steps"):
        commsgd_torch.FaultTolerantDiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), manager=manager,
                                          sync_every=4, **_streamed(model, {"fragments": 2, "delay": 2}))


def test_a_code_chosen_by_the_number_of_replicas_is_refused_where_replicas_come_and_go():
    model = Dot(SIZES)
    with pytest.raises(ValueError, match=r"'compression' is 'topk-0.01-c64-fit10'.*no -fit"):
        commsgd_torch.FaultTolerantDiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), manager=None,
                                          compression="topk-0.01-c64-fit10")


def test_finish_after_a_failed_last_round_runs_none_and_reports_the_steps_unsent():
    # Replica 2 dies in the last round's quorum: both survivors fail that exchange, and their finish() has no
    # round to run on (which fragments to send depends on a round they do not hold): H steps stay local.
    out, errors = _run(3, 4 * H, "dense", min_replicas=2, kill=(2, 4), finish=True)
    no_errors(errors)
    assert sorted(out) == [0, 1]
    for rep in out.values():
        assert rep["stats"]["rounds_failed"] == 1 and rep["stats"]["steps_unsent"] == H, rep["stats"]
        assert rep["stats"]["steps_delivered"] == rep["calls"] - H == 3 * H, rep["stats"]
    assert out[0]["global"] == out[1]["global"]


def test_a_replica_killed_in_a_round_is_dropped_and_the_others_go_on():
    out, errors = _run(3, 8 * H, "e3m0", min_replicas=2, kill=(2, 3))
    no_errors(errors)
    assert sorted(out) == [0, 1]
    a, b = out[0], out[1]
    assert a["stats"]["inner_steps"] == b["stats"]["inner_steps"] == 8 * H
    _agree(out)
    assert a["rounds"][0][2] == 3 and a["rounds"][-1][2] == 2  # three replicas, then the two survivors
    assert a["stats"]["rounds_committed"] >= 6  # the round the peer died in may be lost, not more
    assert a["global"] == b["global"]
    for rep in (a, b):  # a round the peer's death failed is carried by the next: no step lost, no heal
        assert rep["stats"]["heals"] == 0 and rep["stats"]["steps_dropped"] == 0, rep["stats"]
        assert rep["stats"]["steps_delivered"] == rep["calls"] == 8 * H, rep["stats"]


def test_a_killed_replica_restarts_and_joins_with_the_same_bits():
    # Paced, so that the others do not spin through rounds while the restarted replica starts.
    out, errors = _run(3, 8 * H, "dense", min_replicas=2, kill=(2, 3), restart=2, pace=0.1)
    no_errors(errors)
    assert sorted(out) == [0, 1, 2]
    joined = out[2]
    assert joined["stats"]["heals_at_start"] == 1 and joined["stats"]["heals"] == 0, joined["stats"]
    assert joined["rounds"], "the restarted replica committed no round"
    assert all(replicas >= 2 for _, _, replicas in joined["rounds"])
    _agree(out)
    assert out[0]["stats"]["rounds_missed"] == out[1]["stats"]["rounds_missed"] == 0  # no survivor left out
    assert out[0]["stats"]["heals"] == out[1]["stats"]["heals"] == 0
    assert out[0]["rounds"][-1][2] == 3  # back to three replicas at the end
    assert out[0]["global"] == joined["global"]
    # The joiner healed at the others' boundary and exchanged after its first step: its pseudo-gradient holds
    # one step where the others' hold H, and the outer step takes their mean weighted by steps.
    _check_weighted_round(out, {0: H, 1: H, 2: 1})


def _check_weighted_round(out, steps):
    """The round whose weights were not 1 on every replica: each replica's weight is n w / sum(w) for the
    steps `steps` each delivered, and the common model after it is the Nesterov outer step (lr 0.7, momentum
    0.9) on the weighted mean of the pseudo-gradients, sum w_r (global - local_r) / sum w."""
    rounds = {i: out[i]["weighted"] for i in steps}
    assert all(len(r) == 1 for r in rounds.values()), {i: [w["step"] for w in r] for i, r in rounds.items()}
    n, total = len(steps), sum(steps.values())
    mine = {i: {k: torch.from_numpy(v).double() if k in ("local", "global", "velocity", "after") else v
                for k, v in r[0].items()} for i, r in rounds.items()}
    assert len({w["step"] for w in mine.values()}) == 1
    for i, w in mine.items():
        assert w["weight"] == pytest.approx(n * steps[i] / total, rel=1e-6), (i, w["weight"])
    g, v = mine[0]["global"], mine[0]["velocity"]
    assert all(torch.equal(w["global"], mine[0]["global"]) for w in mine.values())

    def outer(mean):
        return g - 0.7 * (mean + 0.9 * (0.9 * v + mean))

    expected = outer(sum(steps[i] * (g - w["local"]) for i, w in mine.items()) / total)
    for w in mine.values():
        torch.testing.assert_close(w["after"], expected, rtol=1e-5, atol=1e-6)
    plain = outer(sum(g - w["local"] for w in mine.values()) / n)  # what the unweighted mean would give
    assert (plain - expected).abs().max() > 1e-3


def test_a_frozen_replica_fails_the_round_by_the_adaptive_deadline_not_the_groups():
    # Replica 2 freezes (SIGSTOP) once round 3's quorum is formed: its sockets stay open, so only a deadline
    # ends the others' wait in the exchange. The group's timeout is 30 s; the exchanges before took
    # milliseconds, so the deadline is the floor, 1 s.
    out, errors = _run(3, 8 * H, "dense", min_replicas=2, kill=(2, 3), freeze=True, group_s=30.0)
    no_errors(errors)
    assert sorted(out) == [0, 1]
    _agree(out)
    for rep in out.values():
        assert rep["stats"]["rounds_failed"] == 1 and rep["stats"]["inner_steps"] == 8 * H
        # The failed exchange ran for the 1 s deadline, not the group's 30 s; the step around it adds the
        # next quorum once the lighthouse has dropped the frozen replica (1 s without heartbeats).
        assert 900 <= rep["stats"]["failed_exchange_ms"] <= 3000, rep["stats"]["failed_exchange_ms"]
        assert rep["longest"] < 12.0, rep["longest"]
        assert rep["stats"]["deadline_ms"] == 1000
        # Both survivors failed the round alike: the next exchange carried its steps, none lost, no heal.
        assert rep["stats"]["steps_delivered"] == rep["calls"] == 8 * H and rep["stats"]["heals"] == 0
    assert out[0]["global"] == out[1]["global"]


def test_a_late_replica_is_left_out_of_the_round_and_its_late_steps_arrive_a_round_later():
    # The lighthouse's join timeout is the round's deadline: replica 2 comes 4 s late to round 3; the others
    # wait 2 s for it, run that round without it and go on (a round a second). It joins a later round behind
    # them, is healed with its round-3 steps kept (they are one round's), and that round's exchange carries
    # them.
    steps = 12 * H
    out, errors = _run(3, steps, "dense", min_replicas=2, late=(2, 3, 4.0), join_timeout_ms=2000, pace=0.25)
    no_errors(errors)
    assert sorted(out) == [0, 1, 2]
    _agree(out)
    a, late = out[0], out[2]
    by_step = {step: replicas for step, _, replicas in a["rounds"]}
    assert by_step[2 * H] == 3 and by_step[3 * H] == 2 and by_step[steps] == 3
    assert late["stats"]["rounds_missed"] == 1 and a["stats"]["rounds_missed"] == out[1]["stats"]["rounds_missed"] == 0
    assert 3 * H not in [step for step, _, _ in late["rounds"]]  # it committed nothing at round 3
    # Every step of every replica reached the common model, the late one's round-3 steps a round or two late
    # (the heal moved its step count to the others', so it took fewer).
    assert late["stats"]["heals"] == 1 and late["stats"]["steps_dropped"] == 0, late["stats"]
    assert late["stats"]["steps_delivered"] == late["calls"] < steps, (late["stats"], late["calls"])
    assert a["stats"]["steps_delivered"] == a["calls"] == steps
    assert a["global"] == out[1]["global"] == late["global"]


def test_a_replica_whose_quorum_part_fails_asks_again_and_drops_steps_beyond_two_rounds():
    # Replica 2's part of the quorum fails at every step from 2H to 5H (its group cannot be rebuilt): each of
    # those steps is a failed round and the next asks again, while the others go on without it. When its quorum
    # works again it is behind and heals; its steps since its last commit are more than two rounds', so they
    # are dropped (counted), not carried into the others' mean.
    steps = 8 * H
    # Paced, so that the others form rounds without it meanwhile (the lighthouse waits 1 s for it each time).
    out, errors = _run(3, steps, "dense", min_replicas=2, fail_quorum=(2, 2 * H, 5 * H), join_timeout_ms=1000,
                       pace=0.1)
    no_errors(errors)
    assert sorted(out) == [0, 1, 2]
    _agree(out)
    bad = out[2]["stats"]
    assert bad["rounds_failed"] == 3 * H + 1, bad  # one a step of the span
    assert bad["heals"] == 1 and bad["steps_dropped"] > 2 * H, bad
    assert "injected" in out[2]["error"]
    assert out[2]["calls"] > steps  # the failed steps did not move its engine: it took more calls to the end
    for i in (0, 1):
        assert out[i]["stats"]["steps_delivered"] == out[i]["calls"] == steps, out[i]["stats"]
        assert out[i]["stats"]["heals"] == 0
    assert out[0]["global"] == out[1]["global"] == out[2]["global"]


def test_a_non_finite_pseudo_gradient_fails_the_round_alike_and_every_replica_goes_on():
    # Replica 1's gradient holds a NaN at step 3H - 1, so its pseudo-gradient of round 3 does: every replica
    # refuses that round, raises NonFinite after the commit, and (replica 1 having mended its model) the
    # next rounds commit on all three with one common model; no replica falls behind or heals.
    out, errors = _run(3, 6 * H, "int8", min_replicas=3, nan=(1, 3 * H - 1))
    no_errors(errors)
    assert sorted(out) == [0, 1, 2]
    _agree(out)
    for rep in out.values():
        assert rep["refused"] == [3 * H], rep["refused"]
        assert rep["stats"]["rounds_failed"] == 1 and rep["stats"]["rounds_committed"] == 5, rep["stats"]
        assert rep["stats"]["heals"] == 0, rep["stats"]
        assert "NonFinite" in rep["error"], rep["error"]
    assert [s for s, _, _ in out[0]["rounds"]] == [H, 2 * H, 4 * H, 5 * H, 6 * H]
    assert out[0]["global"] == out[1]["global"] == out[2]["global"]


def test_below_the_minimum_every_live_replica_fails_clearly():
    out, errors = _run(3, 8 * H, "dense", min_replicas=3, kill=(2, 2), quorum_s=6.0, timeout=90)
    assert sorted(i for i, _ in errors) == [0, 1], (out, errors)
    for _, tb in errors:
        assert "CommError" in tb and "no quorum of at least 3 replicas" in tb, tb
        assert "the last membership was replicas [0, 1, 2]" in tb, tb


class _FakeManager:
    """The surface of torchft's Manager that the adapter reads, each part replaceable."""

    def __init__(self, quorum_raises=None, errored=None, configure_error=None):
        self._pg = type("Group", (), {"members": [0, 1], "configure_error": configure_error})()
        self._use_async_quorum, self._min_replica_size, self._replica_id = False, 2, "r0"
        self._raises, self._errored = quorum_raises, errored

    def start_quorum(self):
        if self._raises is not None:
            raise self._raises

    def errored(self):
        return self._errored

    should_commit = report_error = register_state_dict_fn = num_participants = lambda *a: None


def test_the_torchft_adapter_names_what_moved_and_what_failed(monkeypatch):
    from commsgd_torch import _torchft
    from torchft.manager import ExceptionWithTraceback

    moved = _FakeManager()
    del moved._use_async_quorum
    with pytest.raises(ImportError, match=r"no longer has Manager\._use_async_quorum.*tested with torchft 0\.2\.0"):
        _torchft.ManagerView(moved)

    # Which part of a quorum failed, from what torchft raised or recorded.
    def failed(**kw):
        return _torchft.ManagerView(_FakeManager(**kw)).start_quorum([0, 1])

    with pytest.raises(commsgd_torch.CommError, match=r"no quorum of at least 2 replicas.*replicas \[0, 1\]"):
        failed(quorum_raises=TimeoutError("Timeout expired"))
    with pytest.raises(commsgd_torch.CommError, match="the quorum request failed.*ConnectionError: refused"):
        failed(quorum_raises=ConnectionError("refused"))
    assert failed() is None

    def recorded(where):
        try:
            where()
        except Exception as e:  # torchft records the exception with the traceback of where it happened
            return ExceptionWithTraceback(e)

    def recv_checkpoint():
        raise OSError("peer gone")

    def send_checkpoint():
        raise OSError("reset")

    def elsewhere():
        raise ValueError("bad")

    heal = failed(errored=recorded(recv_checkpoint))
    assert isinstance(heal, commsgd_torch.CommError) and "healing: fetching a live replica's state failed: " \
        "OSError: peer gone" in str(heal), heal
    assert "sending this replica's state" in str(failed(errored=recorded(send_checkpoint)))
    assert "rebuilding the group of replicas [0, 1] failed" in str(
        failed(errored=recorded(elsewhere), configure_error=RuntimeError("x")))
    assert "the quorum failed: ValueError: bad" in str(failed(errored=recorded(elsewhere)))

    # A gloo group whose reconfiguration takes other parameters is refused by name.
    import torchft.process_group as tpg

    class Moved(tpg.ProcessGroupGloo):
        def configure(self, store_addr, replica_id, rank, world_size, quorum_id=None, global_ranks=None):
            pass

    monkeypatch.setattr(tpg, "ProcessGroupGloo", Moved)
    with pytest.raises(ImportError, match=r"no longer has ProcessGroupGloo\.configure\(store_addr, .*it takes"):
        commsgd_torch.ReplicaGroup()
