"""The DDP communication hooks of commsgd_torch, on 2 forked ranks of a gloo group."""
import copy
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commsgd_torch
import commsgd_torch._build
from helpers import SIZES, Dot, FakeBucket, mlp, run_ranks


def _ddp_grads(rank, model, xs, hook_state=None, hook=None, steps=3):
    ddp = DDP(model, bucket_cap_mb=0.01)  # several buckets, so the bucket rebuild happens too
    if hook is not None:
        ddp.register_comm_hook(hook_state, hook)
    out = []
    for s in range(steps):
        ddp.zero_grad()
        ddp(xs[s]).backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def _density_one(rank, world, integer):
    g = torch.Generator().manual_seed(100 + rank)
    xs = []
    for s in range(3):
        if integer:
            xs.append([torch.randint(-1000, 1000, (n,), generator=g).float() for n in SIZES])
        else:
            xs.append([torch.randn(n, generator=g) * 10 ** torch.randint(-3, 3, (1,), generator=g).item()
                       for n in SIZES])
    ref = _ddp_grads(rank, Dot(SIZES), xs)
    for selector in ("exact", "radix", "laplace_bisect"):
        model = Dot(SIZES)
        state = commsgd_torch.TopKState(model=model, density=1.0, selector=selector)
        got = _ddp_grads(rank, model, xs, state, commsgd_torch.topk_hook)
        for s in range(3):
            for a, b in zip(ref[s], got[s]):
                if integer:
                    assert torch.equal(a, b), (selector, s)
                else:
                    assert torch.allclose(a, b, rtol=2e-7 * world, atol=0), (selector, s)
        assert state.traffic()["bytes_sent"] > 0
    return True


@pytest.mark.parametrize("integer", [True, False])
def test_density_one_equals_ddp_allreduce(integer):
    run_ranks(_density_one, 2, (integer,))


def _bits(t):
    return t.contiguous().view(torch.int32)


def _conservation(rank, world, selector, momentum):
    torch.manual_seed(7 + rank)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (300, 1, 77, 2048)]
    model = torch.nn.ParameterList(params)
    state = commsgd_torch.TopKState(model=model, density=0.05, selector=selector, momentum=momentum)
    residual = {i: torch.zeros(p.numel()) for i, p in enumerate(params)}  # per parameter, as expected
    # Bucketings change midway, as DDP's rebuild does: each parameter's residual must follow it.
    layouts = [[[3, 2, 1, 0]], [[3, 2, 1, 0]], [[0, 1], [2, 3]], [[2, 3], [0, 1]], [[1], [3, 0, 2]]]
    for layout in layouts:
        for j, members in enumerate(layout):
            grads = []
            for i in members:  # heavy-tailed, with zeros and a -0
                g = torch.distributions.StudentT(2.0).sample((params[i].numel(),))
                g[::17] = 0.0
                g[::29] = -0.0
                grads.append(g)
            bucket = FakeBucket([params[i] for i in members], grads, last=j == len(layout) - 1)
            before = torch.cat([residual[i] for i in members])
            p = torch.cat(grads) + before  # what the sparsifier must split, bit for bit
            state.exchange(bucket)
            key = ",".join(str(i) for i in members)
            after = state.residual(key)
            idx, val = state.last_sent(key)
            if momentum == 0.0:
                sent = torch.zeros(p.numel(), dtype=torch.bool)
                sent[idx] = True
                assert torch.equal(_bits(val), _bits(p[idx])), key
                assert torch.equal(_bits(after[~sent]), _bits(p[~sent])), key
                assert torch.all(_bits(after[sent]) == 0), key  # +0 where sent
            assert idx.numel() >= math.ceil(0.05 * p.numel()) or idx.numel() == int((p != 0).sum())
            off = 0
            for i in members:
                residual[i] = after[off:off + params[i].numel()].clone()
                off += params[i].numel()
    assert sorted(state.keys()) == ["1", "3,0,2"]
    return True


@pytest.mark.parametrize("selector", commsgd_torch.SELECTORS)
def test_error_feedback_conserves_every_element(selector):
    run_ranks(_conservation, 2, (selector, 0.0))


def test_error_feedback_with_momentum_follows_rebuilds():
    run_ranks(_conservation, 2, ("exact", 0.9))


def _train(rank, model, hook_state, batches, lr=0.05, opt_state=None):
    ddp = DDP(model)
    ddp.register_comm_hook(hook_state, commsgd_torch.topk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return opt


def _round_trip(rank, world, selector):
    torch.manual_seed(0)
    model = mlp()
    g = torch.Generator().manual_seed(11 + rank)
    batches = [(torch.rand(32, 784, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(8)]
    kw = dict(density=0.02, selector=selector, momentum=0.5, dgc_warmup_steps_per_stage=1)
    state = commsgd_torch.TopKState(model=model, **kw)
    opt = _train(rank, model, state, batches[:4])
    saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), copy.deepcopy(state.state_dict()))
    _train(rank, model, state, batches[4:], opt_state=opt.state_dict())
    # A fresh model, optimizer and hook, loaded from the saved state, continue the same way.
    model2 = mlp()
    model2.load_state_dict(saved[0])
    state2 = commsgd_torch.TopKState(model=model2, **kw)
    state2.load_state_dict(saved[2])
    _train(rank, model2, state2, batches[4:], opt_state=saved[1])
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(_bits(a.detach()), _bits(b.detach()))
    assert state.state_dict()["iteration"] == state2.state_dict()["iteration"] == 8
    return True


@pytest.mark.parametrize("selector", ["laplace_bisect", "radix"])
def test_state_dict_round_trip_continues_bit_identically(selector):
    run_ranks(_round_trip, 2, (selector,))


def _bad_construction(rank, world):
    model = mlp()
    for density in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(commsgd_torch.InvalidArgument, match="density"):
            commsgd_torch.TopKState(model=model, density=density, process_group=dist.group.WORLD)
    with pytest.raises(commsgd_torch.InvalidArgument, match="selector.*'fastest'"):
        commsgd_torch.TopKState(model=model, selector="fastest", process_group=dist.group.WORLD)
    with pytest.raises(commsgd_torch.InvalidArgument, match="momentum"):
        commsgd_torch.TopKState(model=model, momentum=1.0, process_group=dist.group.WORLD)
    with pytest.raises(commsgd_torch.InvalidArgument, match="period"):
        commsgd_torch.LocalSGDState(model=model, period=0, process_group=dist.group.WORLD)
    with pytest.raises(commsgd_torch.InvalidArgument, match="correction"):
        commsgd_torch.LocalSGDState(model=model, correction="sideways", process_group=dist.group.WORLD)
    with pytest.raises(commsgd_torch.InvalidArgument, match="'start_iter' = -1"):
        commsgd_torch.TopKState(model=model, start_iter=-1, process_group=dist.group.WORLD)
    with pytest.raises(commsgd_torch.InvalidArgument, match="'start_iter' = -2"):
        commsgd_torch.LocalSGDState(model=model, start_iter=-2, process_group=dist.group.WORLD)
    assert issubclass(commsgd_torch.InvalidArgument, RuntimeError)
    return True


def test_bad_arguments_raise_with_the_library_message():
    run_ranks(_bad_construction, 2)


def _wrong_types(rank, world):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    makers = [lambda **kw: commsgd_torch.TopKState(**kw), lambda **kw: commsgd_torch.LocalSGDState(**kw),
              lambda **kw: commsgd_torch.AutoState(optimizer=opt, **kw)]
    for make in makers:
        # Caught before anything collective runs, so each rank raises alone.
        with pytest.raises(commsgd_torch.InvalidArgument, match="argument 'model' of .* is a list"):
            make(model=list(model.parameters()), process_group=dist.group.WORLD)
        with pytest.raises(commsgd_torch.InvalidArgument, match="argument 'process_group' is a str"):
            make(model=model, process_group="gloo")
    for make in (lambda g: commsgd_torch.PowerSGDState(g), lambda g: commsgd_torch.CompressorState(g)):
        with pytest.raises(commsgd_torch.InvalidArgument, match="argument 'process_group' is a int"):
            make(3)
    with pytest.raises(TypeError):  # everything but the group is keyword-only
        commsgd_torch.TopKState(None, model)
    return True


def test_wrong_types_name_the_argument():
    run_ranks(_wrong_types, 2)


def _wrong_bucket(rank, world):
    state = commsgd_torch.CompressorState(dist.group.WORLD, kind="sign", start_iter=2)
    for bad, words in ((torch.zeros(8, dtype=torch.float64), "has dtype Double, the allowed dtype is float32"),
                       (torch.zeros(16)[::2], "is not contiguous")):
        # Both ranks hand the same bad bucket: the exchange itself must say which argument is wrong.
        with pytest.raises(commsgd_torch.InvalidArgument, match=f"argument 'bucket' {words}"):
            state._c.average(bad, 0)
    return True


def test_bad_bucket_tensors_name_the_argument():
    run_ranks(_wrong_bucket, 2)


def _bad_bucket_on_one_rank(rank, world):
    params = [torch.nn.Parameter(torch.zeros(100)), torch.nn.Parameter(torch.zeros(20))]
    state = commsgd_torch.TopKState(model=torch.nn.ParameterList(params), density=0.1, selector="radix")
    grads = [torch.randn(100), torch.randn(20)]
    # float64 on rank 1 only: rank 1 raises about the dtype, rank 0 learns of it and raises too.
    bad = FakeBucket(params, [g.double() if rank == 1 else g for g in grads])
    with pytest.raises(commsgd_torch.Error) as e:
        state.exchange(bad)
    assert ("float32" in str(e.value)) if rank == 1 else ("rank 1" in str(e.value))
    # NaN on rank 0 only: both raise NonFinite.
    g0 = [g.clone() for g in grads]
    if rank == 0:
        g0[0][5] = float("nan")
    with pytest.raises(commsgd_torch.NonFinite):
        state.exchange(FakeBucket(params, g0))
    # Nothing is left broken: the next good exchange works and agrees on both ranks.
    out = state.exchange(FakeBucket(params, grads))
    gathered = [torch.zeros_like(out) for _ in range(world)]
    dist.all_gather(gathered, out)
    assert torch.equal(gathered[0], gathered[1])
    return True


def test_bad_bucket_on_one_rank_raises_on_every_rank():
    run_ranks(_bad_bucket_on_one_rank, 2)


def _nan_through_ddp(rank, world):
    torch.manual_seed(0)
    model = mlp()
    ddp = DDP(model)
    ddp.register_comm_hook(commsgd_torch.TopKState(model=model, density=0.01), commsgd_torch.topk_hook)
    x = torch.rand(8, 784)
    if rank == 0:
        x[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="commsgd: .*non-finite"):
        torch.nn.functional.cross_entropy(ddp(x), torch.zeros(8, dtype=torch.long)).backward()
    return True


def test_nan_gradient_inside_ddp_raises_and_nothing_hangs():
    run_ranks(_nan_through_ddp, 2)


def _local_sgd(rank, world, correction):
    torch.manual_seed(0)
    model = mlp()
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ls = commsgd_torch.LocalSGDState(model=model, lr=0.05, period=3, start_iter=2, correction=correction, optimizer=opt)
    ddp.register_comm_hook(ls, commsgd_torch.local_sgd_hook)
    g = torch.Generator().manual_seed(5 + rank)
    averaged = []
    for step in range(9):
        x, y = torch.rand(16, 784, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        averaged.append(ls.step(loss.item()))
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        both = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(both, flat)
        same = torch.equal(both[0], both[1])
        # Warm-up steps and plain sync points leave identical models; local steps do not.
        if step < 2 or (averaged[-1] and correction == "none"):
            assert same, step
        elif not averaged[-1]:
            assert not same, step
    # Sync points: the first local step (t = 2), then every 3 steps.
    assert averaged == [False, False, True, False, False, True, False, False, True]
    assert ls.traffic()["bytes_sent"] > 0
    return True


@pytest.mark.parametrize("correction", ["none", "at_sync"])
def test_local_sgd_schedule_and_averaging(correction):
    run_ranks(_local_sgd, 2, (correction,))


def _adaptive(rank, world):
    torch.manual_seed(0)
    model = mlp()
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ls = commsgd_torch.LocalSGDState(model=model, lr=0.05, period=2, start_iter=1, adaptive=True, max_period=6,
                                correction="every_step", optimizer=opt)
    ddp.register_comm_hook(ls, commsgd_torch.local_sgd_hook)
    g = torch.Generator().manual_seed(5 + rank)
    periods = []
    for step in range(12):
        x, y = torch.rand(16, 784, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        ls.step(loss.item())
        periods.append(ls.current_period())
    assert all(1 <= p <= 6 for p in periods)
    # The adaptive rule needs the loss at a sync point: NaN is refused with the library's message on every
    # rank at the next sync point (within max_period steps).
    with pytest.raises(commsgd_torch.InvalidArgument, match="loss"):
        for _ in range(8):
            opt.zero_grad()
            ddp(torch.rand(4, 784)).sum().backward()
            opt.step()
            ls.step(float("nan"))
    return periods


def test_local_sgd_adaptive_interval_runs_and_refuses_a_nan_loss():
    a, b = run_ranks(_adaptive, 2)
    assert a == b  # every rank computes the same interval from the same averaged loss


def test_import_refuses_another_torch(tmp_path):
    """A package built for one torch release raises ImportError naming both under another (here: a copy whose
    _build.py claims another release), rather than failing on an undefined symbol."""
    copy = tmp_path / "commsgd_torch"
    shutil.copytree(os.path.dirname(commsgd_torch.__file__), copy)
    build = (copy / "_build.py").read_text()
    (copy / "_build.py").write_text(build.replace(f'TORCH_VERSION = "{commsgd_torch._build.TORCH_VERSION}"',
                                                  'TORCH_VERSION = "0.9.1"'))
    run = subprocess.run([sys.executable, "-c", "import commsgd_torch"], cwd=tmp_path, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert run.returncode != 0
    assert "ImportError: commsgd_torch" in run.stderr and "built against torch 0.9.1" in run.stderr
    assert f"torch {torch.__version__} is installed" in run.stderr


def _meter(rank, world):
    original = dist.all_reduce
    with commsgd_torch.AllReduceMeter() as meter:
        dist.all_reduce(torch.ones(1001))                     # counted: a ring over both ranks
        meter.on = False
        dist.all_reduce(torch.ones(5000))                     # paused
        meter.on = True
        own = [dist.new_group([r]) for r in range(world)][rank]
        dist.all_reduce(torch.ones(300), group=own)           # a group of one: nothing leaves the rank
        dist.all_reduce(torch.ones(64, dtype=torch.float64))  # its own element size
        meter.count(torch.ones(10), element_size=2)           # a call it cannot see, charged by hand
        got = meter.traffic()
    assert dist.all_reduce is original, "close() did not put all_reduce back"
    return got


def test_all_reduce_meter_counts_a_ring_per_call_over_its_group():
    ring = commsgd_torch._C.ring_all_reduce_traffic
    for rank, got in enumerate(run_ranks(_meter, 2)):
        want = {k: ring(1001, 4, 2, rank)[k] + ring(64, 8, 2, rank)[k] + ring(10, 2, 2, rank)[k]
                for k in ("bytes_sent", "bytes_received", "messages_sent", "messages_received")}
        assert got == want
        assert got["bytes_sent"] > 0
