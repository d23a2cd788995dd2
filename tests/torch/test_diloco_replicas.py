"""DiLoCo over replicas of many ranks, on 4 processes (2 replicas x 2 ranks):

- FSDP2 inside (a 1-D shard mesh with the counterparts given, and HSDP's 2-D mesh): every rank's shards take, step
  by step, the bits of the C++ engine run on those shards alone over 2 thread ranks (comm::local) fed the same
  inner steps, for every code, streamed and not; the bytes are the engine's, metered, and cost/'s for the shard.
- Split replicas (DDP inside): the common model is, bit for bit, the one today's one-rank-per-replica class
  computes from the replicas' inner steps, and each rank holds half of the outer state.
- Refusals name the argument; checkpoints resume bit for bit and refuse another shard's state.
"""
import io

import pytest
import torch
import torch.distributed as dist

import commsgd_torch
from commsgd_torch import _C
from helpers import fully_shard, init_device_mesh, needs_fsdp2, run_ranks

pytestmark = needs_fsdp2()

STEPS = 13
H = 4
# The -fit code is chosen for the whole model over the replicas (59 values, 2 replicas: 3.47x below the ring for
# the gathered code, 2.95x for the region sums), not for a shard: a fit of 3 takes the gathered code, where a
# shard's own size (38 or 21 values) would be refused.
CODES = ["dense", "fp16", "bf16", "int8", "e3m0", "topk-0.2-c16-2bit-b0.95", "topk-0.2-c16-2bit-b0.95-senders",
         "topk-0.2-c16-b0.95-shared", "topk-0.2-c16-b0.95-regions", "topk-0.2-c16-b0.95-fit3"]
SETTINGS = [(1, 0, 0.0), (2, 2, 0.5)]  # (fragments, delay, alpha)


class _Net(torch.nn.Module):
    """Three layers: the last too small to shard over two ranks (rank 1 of a replica holds none of it)."""

    def __init__(self, width=5):
        super().__init__()
        self.a = torch.nn.Linear(7, width)
        self.b = torch.nn.Linear(width, 3, bias=False)
        self.c = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def _local(p):
    return p.to_local() if hasattr(p, "to_local") else p


def _engine_order(opt):
    """This rank's values in the engine's order: fragment after fragment, each parameter's local values."""
    return torch.cat([_local(p).detach().reshape(-1) for f in range(opt.num_fragments)
                      for p in opt.fragment_parameters(f)]).float().clone()


def _loss(model, x):
    return ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()


def _sharded_run(rank, world, derived, code, fragments, delay, alpha):
    """One rank of FSDP2 replicas under DiLoCo; returns what the parent checks against the engine."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    replica = rank // 2
    torch.manual_seed(100 + rank)  # different starts: construction must broadcast replica 0's shards
    model = _Net()
    for m in (model.a, model.b, model.c):
        fully_shard(m, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    inner = torch.optim.AdamW(model.parameters(), lr=0.05)
    # The counterparts: given, or the replicate dimension of the mesh the shard mesh was sliced from.
    group = None if derived else mesh.get_group("replicate")
    opt = commsgd_torch.DiLoCo(model, inner, process_group=group, sync_every=H, fragments=fragments, delay=delay,
                               alpha=alpha, compression=code)
    snaps, globals_, sent, after = [_engine_order(opt)], [], [], []
    g = torch.Generator().manual_seed(7 + replica)  # the replica's data: its two ranks draw the same batch
    for _ in range(STEPS):
        x = torch.randn(16, 7, generator=g)
        opt.zero_grad()
        _loss(model, x).backward()
        inner.step()
        snaps.append(_engine_order(opt))  # what the engine sees after the inner step
        inner.step = lambda *a, **k: None  # noqa: E731 (the step is taken; DiLoCo.step runs the schedule)
        opt.step()
        del inner.step
        globals_.append(torch.cat([_local(t).reshape(-1) for t in opt.global_parameters()]).float())
        after.append(_engine_order(opt))
        sent.append(opt.bytes_sent)
    lengths = [sum(_local(p).numel() for p in opt.fragment_parameters(f)) for f in range(opt.num_fragments)]
    opt.finish()
    wire = opt._engine.traffic()["bytes_sent"] - opt.stats()["broadcast_bytes"]
    # The outer state this rank keeps: its common model and outer momentum (and residuals) of its shards only.
    state = sum(opt._engine.global_model(f).numel() for f in range(opt.num_fragments))
    assert all(opt.outer_velocity(f).numel() in (0, lengths[f]) for f in range(opt.num_fragments))
    return {"snaps": torch.stack(snaps), "globals": torch.stack(globals_), "sent": torch.tensor(sent),
            "after": torch.stack(after), "lengths": lengths, "wire": wire, "counted": opt.bytes_sent,
            "stats": opt.stats(), "state": state, "whole": sum(p.numel() for p in model.parameters()),
            "code": opt.compression}


def _sharded_codes(rank, world, derived, settings, codes):
    out = []
    for fragments, delay, alpha in settings:
        for code in codes:
            buf = io.BytesIO()
            torch.save(_sharded_run(rank, world, derived, code, fragments, delay, alpha), buf)
            out.append(buf.getvalue())
    return out


def _check_against_engine(runs, code, fragments, delay, alpha):
    """Ranks (0, 2) hold shard 0 and (1, 3) shard 1: each pair against the engine on that shard."""
    code = _C.diloco_code_chosen(code, runs[0]["whole"], 2)
    assert all(r["code"] == code for r in runs)
    for shard in (0, 1):
        pair = [runs[shard], runs[shard + 2]]
        lengths = pair[0]["lengths"]
        assert pair[1]["lengths"] == lengths
        want = _C.diloco_over_threads([r["snaps"] for r in pair], lengths, H, fragments, delay, alpha,
                                      "contiguous", 0.7, 0.9, code)
        for r, (run, (globals_, sent)) in enumerate(zip(pair, want)):
            where = f"{code}, P={fragments}, delay={delay}: shard {shard}, replica {r}"
            assert torch.equal(run["globals"].view(torch.int32), globals_.view(torch.int32)), where
            assert torch.equal(run["sent"], sent), where
            # Counted as the wire carried it, and as cost/ sizes a round of this shard's fragments.
            assert run["wire"] == run["counted"], where
            if (fragments, delay, alpha) == (1, 0, 0.0):
                # After each outer step the shards restart from the common model (FSDP2 gathers from them).
                for step in range(H - 1, STEPS, H):
                    assert torch.equal(run["after"][step], run["globals"][step]), f"{where}, step {step + 1}"
                assert not torch.equal(run["after"][0], run["globals"][0])
        # Both replicas hold one common shard.
        assert torch.equal(pair[0]["globals"], pair[1]["globals"])
    # The replicas stepped apart between rounds: their local shards differ after the first inner step.
    assert not torch.equal(runs[0]["snaps"][1], runs[2]["snaps"][1])
    # Each rank's outer state is its shards: about half the model, and the two shards make it whole.
    assert runs[0]["state"] + runs[1]["state"] == runs[0]["whole"]
    assert runs[0]["stats"]["replica_ranks"] == 2


# The group derived from the mesh is the given one whatever the code: a dense, a block and a top-k code show it.
MESH_CODES = ["dense", "int8", "topk-0.2-c16-2bit-b0.95-senders"]
_RUNS = {}


def _runs(derived):
    """Every rank's runs of each code and setting (the mesh's: MESH_CODES), run once for the tests that read
    them."""
    if derived not in _RUNS:
        codes = MESH_CODES if derived else CODES
        _RUNS[derived] = run_ranks(_sharded_codes, 4, (derived, SETTINGS, codes), timeout=600)
    return _RUNS[derived]


@pytest.mark.parametrize("derived", [False, True], ids=["group-given", "group-from-mesh"])
def test_fsdp2_replicas_are_the_engine_on_each_shard(derived):
    by_rank = _runs(derived)
    failed = []
    i = 0
    for fragments, delay, alpha in SETTINGS:
        for code in MESH_CODES if derived else CODES:
            runs = [torch.load(io.BytesIO(r[i])) for r in by_rank]
            i += 1
            try:
                _check_against_engine(runs, code, fragments, delay, alpha)
            except AssertionError as e:
                failed.append(f"{code} P={fragments}: {e}")
    assert not failed, "\n".join(failed)


def test_the_bytes_a_replica_sends_do_not_grow_with_its_ranks():
    """A replica of 2 FSDP2 ranks sends over the slow links what a replica of one sends for the whole model,
    within the bytes each shard's own blocks round to: dense exactly by the ring's count, int8 by blocks."""
    assert SETTINGS[0] == (1, 0, 0.0)  # one fragment, no delay: the given group's first runs
    by_rank = _runs(False)
    for i, code in enumerate(CODES):
        runs = [torch.load(io.BytesIO(r[i])) for r in by_rank]
        code = _C.diloco_code_chosen(code, runs[0]["whole"], 2)
        replica = runs[0]["counted"] + runs[1]["counted"]
        rounds = runs[0]["stats"]["exchanges_started"]
        whole = sum(_C.diloco_round_traffic(code, runs[0]["whole"], 2, 0, k == 0)["bytes_sent"]
                    for k in range(rounds))
        parts = sum(_C.diloco_round_traffic(code, n, 2, 0, k == 0)["bytes_sent"]
                    for n in (sum(runs[0]["lengths"]), sum(runs[1]["lengths"])) for k in range(rounds))
        assert replica == parts, code
        # The whole model's message against its two shards': the same, but for each shard's own block scales,
        # verdicts and packing.
        assert abs(replica - whole) <= rounds * 64, (code, replica, whole)


class _Wide(_Net):
    """Layers wide enough that a replica's two ranks split every code's blocks and chunks between them."""

    def __init__(self):
        super().__init__(width=61)


def _split_run(rank, world, codes, fragments, delay, alpha):
    replica, local = rank // 2, rank % 2
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group, in one order
    counterparts = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    replica_group, group = pairs[replica], counterparts[local]
    out = []
    for code in codes:
        torch.manual_seed(100 + replica)  # the replica's ranks start alike (as DDP makes them)
        model = _Wide()
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=replica_group)
        inner = torch.optim.AdamW(ddp.parameters(), lr=0.05)
        opt = commsgd_torch.DiLoCo(model, inner, process_group=group, replica_group=replica_group, sync_every=H,
                                   fragments=fragments, delay=delay, alpha=alpha, compression=code)
        flat = lambda: torch.cat([p.detach().reshape(-1) for p in opt._order]).clone()  # noqa: E731
        snaps, globals_, sent = [flat()], [], []
        g = torch.Generator().manual_seed(7 + rank)  # each rank its own half of the replica's batch
        for _ in range(STEPS):
            x = torch.randn(8, 7, generator=g)
            opt.zero_grad()
            _loss(ddp, x).backward()
            inner.step()
            snaps.append(flat())
            inner.step = lambda *a, **k: None  # noqa: E731
            opt.step()
            del inner.step
            globals_.append(torch.cat([t.reshape(-1) for t in opt.global_parameters()]))
            sent.append(opt.bytes_sent)
        buf = io.BytesIO()
        torch.save({"snaps": torch.stack(snaps), "globals": torch.stack(globals_), "sent": sent,
                    "state": opt._flat.numel(), "whole": snaps[0].numel(),
                    "layers": [sum(p.numel() for p in m.parameters(recurse=False)) for m in (model.a, model.b,
                                                                                           model.c)],
                    "final": flat(), "code": opt.compression}, buf)
        opt.finish()
        out.append(buf.getvalue())
    return out


# The -fit code: every rank chooses for the whole model over the 2 replicas (the gathered -senders code, 8.6x
# below the ring), not for the part it exchanges, so a split replica is the one-rank engine of that code.
SPLIT_CODES = ["dense", "fp16", "bf16", "int8", "e3m0", "topk-0.2-c16-2bit-b0.95-senders", "topk-0.2-c16-b0.95-fit5"]


@pytest.mark.parametrize("fragments,delay,alpha", SETTINGS)
def test_split_replicas_give_the_bits_of_one_rank_replicas(fragments, delay, alpha):
    """Replicas of two DDP ranks each exchange half of every fragment: the common model is that of the
    one-rank-per-replica engine fed the replicas' inner steps, bit for bit (2 replicas: the ring's sum of two
    is exact whatever its chunks), and each rank holds half the outer state."""
    by_rank = run_ranks(_split_run, 4, (SPLIT_CODES, fragments, delay, alpha), timeout=600)
    failed = []
    for i, code in enumerate(SPLIT_CODES):
        runs = [torch.load(io.BytesIO(r[i])) for r in by_rank]
        try:
            # A replica's ranks hold one model (DDP inside, the parts gathered after each outer step).
            for a, b in ((0, 1), (2, 3)):
                assert torch.equal(runs[a]["snaps"], runs[b]["snaps"]), "a replica's ranks differ"
            want = _C.diloco_over_threads([runs[0]["snaps"], runs[2]["snaps"]], runs[0]["layers"], H, fragments,
                                          delay, alpha, "strided", 0.7, 0.9, code)
            # global_parameters() is in fragment order; the engine's strided fragments are too.
            for r in range(4):
                assert torch.equal(runs[r]["globals"].view(torch.int32), want[r // 2][0].view(torch.int32)), \
                    f"rank {r}"
            assert runs[0]["state"] + runs[1]["state"] == runs[0]["whole"]
            assert 0 < runs[0]["state"] < runs[0]["whole"] and 0 < runs[1]["state"] < runs[0]["whole"]
            assert all(r["code"] == _C.diloco_code_chosen(code, runs[0]["whole"], 2) for r in runs)
        except AssertionError as e:
            failed.append(f"{code}: {e}")
    assert not failed, "\n".join(failed)


def _refusals(rank, world):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    found = []

    def refused(name, make):
        try:
            make()
        except commsgd_torch.InvalidArgument as e:
            found.append((name, f"'{name}'" in str(e)))
        else:
            found.append((name, False))

    model = _Net()
    fully_shard(model, mesh=mesh["shard"])
    inner = torch.optim.AdamW(model.parameters())
    alone = _Net()
    fully_shard(alone, mesh=init_device_mesh("cpu", (4,)))  # a mesh of its own: no replicate dimension to use
    refused("process_group", lambda: commsgd_torch.DiLoCo(alone, torch.optim.AdamW(alone.parameters())))
    hsdp = _Net()
    fully_shard(hsdp, mesh=mesh)  # HSDP: its every-step all-reduce is what DiLoCo replaces
    refused("model", lambda: commsgd_torch.DiLoCo(hsdp, torch.optim.AdamW(hsdp.parameters())))
    # The replica's own ranks are not counterparts.
    refused("process_group", lambda: commsgd_torch.DiLoCo(model, inner, process_group=mesh.get_group("shard")))
    refused("replica_group", lambda: commsgd_torch.DiLoCo(model, inner, process_group=mesh.get_group("replicate"),
                                                           replica_group=mesh.get_group("shard")))
    plain = _Wide()
    plain_inner = torch.optim.AdamW(plain.parameters())
    refused("compression", lambda: commsgd_torch.DiLoCo(plain, plain_inner,
                                                         process_group=mesh.get_group("replicate"),
                                                         replica_group=mesh.get_group("shard"),
                                                         compression="topk-0.1"))
    refused("process_group", lambda: commsgd_torch.DiLoCo(plain, plain_inner, replica_group=mesh.get_group("shard")))
    return found


def test_replica_shapes_refuse_what_does_not_fit_naming_the_argument():
    for found in run_ranks(_refusals, 4):
        assert found and all(ok for _, ok in found), found


def _checkpoint(rank, world):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))

    def build():
        torch.manual_seed(3)
        model = _Net()
        for m in (model.a, model.b, model.c):
            fully_shard(m, mesh=mesh["shard"])
        fully_shard(model, mesh=mesh["shard"])
        inner = torch.optim.AdamW(model.parameters(), lr=0.05)
        return model, commsgd_torch.DiLoCo(model, inner, process_group=mesh.get_group("replicate"),
                                           sync_every=H, fragments=2, delay=1, compression="topk-0.3-c8-b0.9")

    def train(model, opt, steps, first):
        out = []
        for s in range(first, first + steps):
            x = torch.randn(16, 7, generator=torch.Generator().manual_seed(1000 * s + rank // 2))
            opt.zero_grad()
            _loss(model, x).backward()
            opt.step()
            out.append(torch.cat([_local(t).reshape(-1) for t in opt.global_parameters()]))
        return out

    model, opt = build()
    train(model, opt, 6, 0)
    buf = io.BytesIO()  # a copy, as a checkpoint on disk is: the inner optimizer's state moves on in place
    torch.save(opt.state_dict(), buf)
    saved = (torch.load(io.BytesIO(buf.getvalue()), weights_only=False),
             {k: _local(v).clone() for k, v in model.state_dict().items()})
    after = train(model, opt, 7, 6)
    model2, opt2 = build()
    with torch.no_grad():
        for k, v in model2.state_dict().items():
            _local(v).copy_(saved[1][k])
    opt2.load_state_dict(saved[0])
    again = train(model2, opt2, 7, 6)
    same = all(torch.equal(a, b) for a, b in zip(after, again))
    # Another shard's state (rank 0 and 1 hold shards 0 and 1 of replica 0) is refused, naming it.
    states = [None] * world
    dist.all_gather_object(states, saved[0])
    other = states[rank ^ 1]
    try:
        opt2.load_state_dict(other)
        refused = False
    except commsgd_torch.InvalidArgument as e:
        refused = "'state_dict'" in str(e) and "sharded" in str(e)
    return same, refused


def test_sharded_checkpoints_resume_bit_for_bit_and_refuse_another_shard():
    for same, refused in run_ranks(_checkpoint, 4):
        assert (same, refused) == (True, True)
