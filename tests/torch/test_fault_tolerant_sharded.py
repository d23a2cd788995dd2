"""FaultTolerantDiLoCo on FSDP2 replicas of 2 ranks: each replica its own torch.distributed world of 2 processes
(FSDP2 on its 1-D mesh), each rank its own torchft Manager (rank, world_size 2) on the replica's store, one
lighthouse. Without failures every rank's shards are those of the plain sharded class, bit for bit; a replica
that loses a rank in a round is dropped and the others go on; the dead replica restarted heals every shard from
its counterparts and holds the others' common model, shard by shard."""
import multiprocessing as mp
import os
import signal
import socket
import tempfile
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from helpers import SIZES, Dot, fresh_context, no_errors, reap, run_ranks

import commsgd_torch  # noqa: E402

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason=f"torchft needs torch 2 (this is torch {torch.__version__}): the newest-"
                                       "torch suite runs it")

H = 4
L = 2  # ranks a replica


def _grads(replica, step):
    """The replica's gradients of a step: both of its ranks feed the same, so FSDP2's mean is them."""
    g = torch.Generator().manual_seed(1000 * replica + step)
    return [torch.randn(n, generator=g) for n in SIZES]


def _model(seed, mesh):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(seed)
    model = Dot(SIZES)
    for p in model.parameters():
        torch.nn.init.normal_(p)
    fully_shard(model, mesh=mesh)
    return model


def _shards(opt):
    return [t.to_local().numpy().tobytes() for t in opt.global_parameters()]


def _rank(idx, rank, folder, lighthouse, steps, code, kill_at_round, queue, until=None, restarted=False,
          start=None):
    """Rank `rank` of replica `idx`: `steps` inner steps (or, with `until` = (event, value), until the event
    is set and the step it names is reached: the restarted replica's rank 0 sets both once it has committed a
    round); each committed round's (step, hash of this rank's shards, replicas) reported. With
    `kill_at_round`, rank 1 SIGKILLs itself once that round's quorum is formed. `start`: a barrier the first
    replicas' ranks pass once their Managers heartbeat, so that the first quorum holds every replica."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torchft import Manager
        from torchft.checkpointing.http_transport import HTTPTransport

        class Transport(HTTPTransport):
            def address(self):
                return super().address().replace(socket.gethostname(), "127.0.0.1", 1)
        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        timeout = timedelta(seconds=20)
        # The replica's own world (FSDP2 inside it), and its store for the Managers, served by its rank 0.
        dist.init_process_group("gloo", init_method=f"file://{folder}/world", rank=rank, world_size=L,
                                timeout=timedelta(seconds=15))
        port = [0]
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
            port = [store.port]
        dist.broadcast_object_list(port, src=0)
        if rank != 0:
            store = dist.TCPStore("127.0.0.1", port[0], is_master=False, timeout=timeout)
        manager = Manager(pg=commsgd_torch.ReplicaGroup(timeout=timedelta(seconds=5)), min_replica_size=2,
                          load_state_dict=None, state_dict=None, use_async_quorum=False, replica_id=f"r{idx}",
                          store_addr="127.0.0.1", store_port=port[0], rank=rank, world_size=L,
                          lighthouse_addr=lighthouse, hostname="127.0.0.1", timeout=timeout,
                          quorum_timeout=timedelta(seconds=15), connect_timeout=timeout,
                          checkpoint_transport=Transport(timeout=timeout, num_chunks=0), init_sync=True)
        if start is not None:
            start.wait(timeout=60)
        mesh = init_device_mesh("cpu", (L,))
        # One start for every replica (the restarted replica's own is different: init_sync heals it).
        model = _model(100 + idx if restarted else 0, mesh)
        inner = torch.optim.SGD(model.parameters(), lr=0.05)
        opt = commsgd_torch.FaultTolerantDiLoCo(model, inner, manager=manager, sync_every=H, outer_lr=0.7,
                                                outer_momentum=0.9, compression=code)
        rounds = []
        give_up = time.monotonic() + 120

        def more():
            if until is None:
                return opt.inner_steps < steps
            if not until[0].is_set():
                return time.monotonic() < give_up
            return opt.inner_steps < until[1].value

        while more():
            s = opt.inner_steps + 1
            opt.zero_grad()
            model(_grads(idx, s)).backward()
            if kill_at_round is not None and rank == 1 and s == kill_at_round * H:
                original = manager.start_quorum

                def start_and_die(*a, **k):
                    original(*a, **k)
                    os.kill(os.getpid(), signal.SIGKILL)
                manager.start_quorum = start_and_die
            before = opt.rounds_committed
            opt.step()
            if until is not None:
                time.sleep(0.05)  # paced: time for a restarted replica to start before the others end
            if opt.rounds_committed > before:
                rounds.append((opt.inner_steps, opt.global_hash(), opt.stats()["replicas"]))
            if restarted and rank == 0 and not until[0].is_set() and opt.rounds_committed:
                until[1].value = (opt.inner_steps // H + 3) * H  # three more rounds for everyone
                until[0].set()
        queue.put(((idx, rank), "ok", {"rounds": rounds, "stats": opt.stats(), "shards": _shards(opt)}))
        manager.shutdown(wait=False)
    except BaseException:
        queue.put(((idx, rank), "error", traceback.format_exc()))


def _run(n, steps, code, kill=None, restart=False, timeout=150):
    """n replicas of L ranks; `kill` = (replica, round): its rank 1 dies in that round and the parent kills
    its rank 0 then; `restart`: that replica is started again afterwards. Returns ({(replica, rank): report},
    [((replica, rank), traceback)])."""
    from torchft.coordination import LighthouseServer
    server = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=5000, quorum_tick_ms=50,
                              heartbeat_timeout_ms=1000)
    # Clean children (this process runs the lighthouse's threads); spawned with a restart, whose timing the
    # restart test was written for.
    ctx = mp.get_context("spawn") if restart else fresh_context()
    queue = ctx.Queue()
    procs = {}
    until = (ctx.Event(), ctx.Value("i", 0)) if restart else None
    tmp = tempfile.TemporaryDirectory()
    first = ctx.Barrier(n * L)
    try:
        def start(idx, generation, kill_round):
            folder = os.path.join(tmp.name, f"r{idx}-{generation}")
            os.mkdir(folder)
            for rank in range(L):
                p = ctx.Process(target=_rank, args=(idx, rank, folder, server.address(), steps, code, kill_round,
                                                    queue, until, generation > 0,
                                                    first if generation == 0 else None))
                p.start()
                procs[(idx, rank, generation)] = p
        for i in range(n):
            start(i, 0, kill[1] if kill and kill[0] == i else None)
        expected = n * L
        if kill:
            expected -= L
            procs[(kill[0], 1, 0)].join(timeout=timeout)  # rank 1 died in its round: its replica goes with it
            procs[(kill[0], 0, 0)].kill()
            procs[(kill[0], 0, 0)].join(timeout=5)
            if restart:
                start(kill[0], 1, None)
                expected += L
        out, errors = {}, []
        deadline = time.monotonic() + timeout
        while len(out) + len(errors) < expected:
            key, status, res = queue.get(timeout=max(1.0, deadline - time.monotonic()))
            if kill and key[0] == kill[0] and status == "error" and not restart:
                continue  # the killed replica's rank 0 may report its end before the parent kills it
            if status == "ok":
                out[key] = res
            else:
                errors.append((key, res))
        return out, errors
    finally:
        reap(procs.values())
        server.shutdown()
        tmp.cleanup()


def _agree(out):
    """Rank r of every replica holds the same shard hash after each round they both committed."""
    seen = {}
    for (idx, rank), rep in out.items():
        for step, h, _ in rep["rounds"]:
            assert seen.setdefault((rank, step), (idx, h))[1] == h, f"rank {rank}, step {step}: replica {idx}"


def _plain(rank, world, code, steps):
    """The plain sharded class over 2 replicas x 2 ranks on the same gradients and the same start."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, L), mesh_dim_names=("replicate", "shard"))
    model = _model(0, mesh["shard"])
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = commsgd_torch.DiLoCo(model, inner, sync_every=H, outer_lr=0.7, outer_momentum=0.9, compression=code)
    for s in range(1, steps + 1):
        opt.zero_grad()
        model(_grads(rank // L, s)).backward()
        opt.step()
    return _shards(opt)


@pytest.mark.parametrize("code", ["dense", "topk-0.1-c64-2bit-b0.9"])
def test_sharded_replicas_without_failures_are_the_plain_sharded_class_bit_for_bit(code):
    out, errors = _run(2, 4 * H, code)
    no_errors(errors)
    _agree(out)
    plain = run_ranks(_plain, 4, (code, 4 * H), spawn=True)
    for (idx, rank), rep in out.items():
        assert len(rep["rounds"]) == 4 and all(r[2] == 2 for r in rep["rounds"]), rep["rounds"]
        assert rep["shards"] == plain[idx * L + rank], f"replica {idx}, rank {rank}"
    # The two ranks of a replica hold different shards: each is exchanged on its own.
    assert out[(0, 0)]["shards"] != out[(0, 1)]["shards"]


def test_a_replica_that_loses_a_rank_is_dropped_then_heals_every_shard_when_it_restarts():
    out, errors = _run(3, 0, "e3m0", kill=(2, 2), restart=True)
    no_errors(errors)
    assert sorted(out) == [(i, r) for i in range(3) for r in range(L)]
    _agree(out)
    a = out[(0, 0)]
    replicas = [r[2] for r in a["rounds"]]
    assert replicas[0] == 3 and 2 in replicas and replicas[-1] == 3, replicas  # three, two, three again
    for rank in range(L):
        joined = out[(2, rank)]
        assert joined["stats"]["heals_at_start"] == 1 and joined["rounds"], joined["stats"]
        assert joined["shards"] == out[(0, rank)]["shards"] == out[(1, rank)]["shards"], f"rank {rank}"
