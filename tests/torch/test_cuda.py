"""TopKState's CUDA buckets (commsgd_torch._cuda): 2 spawned gloo ranks sharing cuda:0, and NCCL on one rank.

Ranks are spawned, not forked: a process that has touched CUDA cannot fork a child that uses it. Every test
that needs a GPU skips where torch sees none or the package was built without nvcc."""
import io
import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commsgd_torch
from commsgd_torch import _cuda_topk as cuda_topk
import helpers
from helpers import SIZES, Dot, FakeBucket, mlp

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA or cuda_topk._cuda is None,
                         reason="no CUDA device" if not HAS_CUDA else "commsgd_torch built without _cuda (no nvcc)")


def run_ranks(fn, world=2, args=(), backend="gloo", timeout=240):
    """fn(rank, world, *args) on `world` spawned ranks sharing cuda:0; their results (no CUDA tensors) by rank."""
    return helpers.run_ranks(fn, world, args, timeout, backend=backend, spawn=True,
                             cuda_device=0 if HAS_CUDA else None)



def _bits(t):
    return t.contiguous().view(torch.int32)


def _heavy(n, generator):
    """Heavy-tailed values with zeros, -0s and ties."""
    g = torch.distributions.StudentT(2.0).sample((n,)) if generator is None else torch.randn(n, generator=generator)
    g[::17] = 0.0
    g[::29] = -0.0
    g[5::97] = 3.0
    return g


def _check_split(before, g, sent_idx, sent_val, after):
    """Error feedback, bit for bit: the pairs sent are p = old residual + gradient where sent, the residual
    keeps p elsewhere and +0 where sent (so sent + new residual == old residual + gradient)."""
    p = before + g.float()
    sent = torch.zeros(p.numel(), dtype=torch.bool, device=p.device)
    sent[sent_idx] = True
    assert int(sent.sum()) == sent_idx.numel()  # distinct indices
    assert torch.equal(_bits(sent_val), _bits(p[sent_idx]))
    assert torch.equal(_bits(after[~sent]), _bits(p[~sent]))
    assert torch.all(_bits(after[sent]) == 0)
    dense = torch.zeros_like(p)
    dense[sent_idx] = sent_val
    assert torch.equal(dense + after, p)


# --- density 1: DDP's own allreduce ---------------------------------------------------------------------------

def _ddp_grads(model, xs, state=None, hook=None, steps=3):
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=0.01)  # several buckets, and their rebuild
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    out = []
    for s in range(steps):
        ddp.zero_grad()
        ddp(xs[s]).backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def _density_one(rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    g = torch.Generator().manual_seed(100 + rank)
    xs = [[(torch.randn(n, generator=g) * 10 ** torch.randint(-3, 3, (1,), generator=g).item()).cuda()
           for n in SIZES] for _ in range(3)]
    ref = _ddp_grads(Dot(SIZES).cuda(), xs, None, allreduce_hook)
    model = Dot(SIZES).cuda()
    state = commsgd_torch.TopKState(model=model, density=1.0)
    got = _ddp_grads(model, xs, state, commsgd_torch.topk_hook)
    for s in range(3):
        for a, b in zip(ref[s], got[s]):
            assert torch.equal(a, b), s
    assert state.traffic()["bytes_sent"] > 0
    return True


@gpu
def test_density_one_equals_ddp_allreduce_hook():
    run_ranks(_density_one, 2)


# --- sparse: replicas and error feedback ----------------------------------------------------------------------

def _sparse(rank, world):
    torch.manual_seed(0)
    model = mlp().cuda()
    ddp = DDP(model, device_ids=[0])
    ddp.register_comm_hook(commsgd_torch.TopKState(model=model, density=0.01), commsgd_torch.topk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(11 + rank)
    for _ in range(6):
        x, y = torch.rand(32, 784, generator=g).cuda(), torch.randint(0, 10, (32,), generator=g).cuda()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    # One step's split, and the average every rank builds from every rank's message.
    torch.manual_seed(7 + rank)
    params = [torch.nn.Parameter(torch.zeros(n, device="cuda")) for n in (300, 1, 77, 2048)]
    state = commsgd_torch.TopKState(model=torch.nn.ParameterList(params), density=0.05)
    key = "0,1,2,3"
    for step in range(3):
        grads = [_heavy(p.numel(), None).cuda() for p in params]
        bucket = FakeBucket(params, grads)
        before = state.residual(key)
        before = torch.zeros(bucket.buffer().numel(), device="cuda") if before is None else before
        out = state.exchange(bucket)
        idx, val = state.last_sent(key)
        assert idx.numel() == math.ceil(0.05 * bucket.buffer().numel())
        _check_split(before, bucket.buffer(), idx, val, state.residual(key))
        all_idx = [torch.zeros_like(idx) for _ in range(world)]
        all_val = [torch.zeros_like(val) for _ in range(world)]
        dist.all_gather(all_idx, idx)
        dist.all_gather(all_val, val)
        expect = torch.zeros_like(out)
        for i, v in zip(all_idx, all_val):
            expect.index_add_(0, i, v)
        assert torch.equal(_bits(out), _bits(expect / world)), step
    # Bytes, not tensors: a tensor crosses the result queue as a shared-memory handle that dies with its rank.
    return [p.detach().cpu().numpy().tobytes() for p in model.parameters()]


@gpu
def test_sparse_replicas_stay_identical_and_error_feedback_splits_exactly():
    a, b = run_ranks(_sparse, 2)
    assert len(a) == len(b) == len(list(mlp().parameters()))
    for x, y in zip(a, b):
        assert x == y


# --- the CUDA step against the CPU's exact selector -----------------------------------------------------------

def _against_cpu(rank, world, layerwise):
    sizes = (300, 1, 77, 2048, 4096)
    cpu = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    dev = [torch.nn.Parameter(torch.zeros(n, device="cuda")) for n in sizes]
    kw = dict(density=0.03, selector="exact", layerwise=layerwise)
    s_cpu = commsgd_torch.TopKState(model=torch.nn.ParameterList(cpu), **kw)
    s_dev = commsgd_torch.TopKState(model=torch.nn.ParameterList(dev), **kw)
    g = torch.Generator().manual_seed(3)
    key = ",".join(str(i) for i in range(len(sizes)))
    for step in range(4):
        grads = [_heavy(n, g) for n in sizes]
        a = s_cpu.exchange(FakeBucket(cpu, grads))
        b = s_dev.exchange(FakeBucket(dev, [x.cuda() for x in grads]))
        assert torch.equal(_bits(a), _bits(b.cpu())), step
        ia, va = s_cpu.last_sent(key)
        ib, vb = s_dev.last_sent(key)
        oa, ob = ia.argsort(), ib.cpu().argsort()
        assert torch.equal(ia[oa], ib.cpu()[ob]), step
        assert torch.equal(_bits(va[oa]), _bits(vb.cpu()[ob])), step
        assert torch.equal(_bits(s_cpu.residual(key)), _bits(s_dev.residual(key).cpu())), step
    return True


@gpu
@pytest.mark.parametrize("layerwise", [False, True])
def test_cuda_step_equals_cpu_exact_selector(layerwise):
    run_ranks(_against_cpu, 1, (layerwise,))


# --- 16-bit buckets -------------------------------------------------------------------------------------------

def _half(rank, world, name):
    dtype = getattr(torch, name)
    torch.manual_seed(0)
    model = mlp().cuda().to(dtype)
    ddp = DDP(model, device_ids=[0])
    state = commsgd_torch.TopKState(model=model, density=0.05)
    ddp.register_comm_hook(state, commsgd_torch.topk_hook)
    g = torch.Generator().manual_seed(5 + rank)
    for _ in range(3):
        x = torch.rand(16, 784, generator=g).cuda().to(dtype)
        ddp.zero_grad()
        ddp(x).float().square().mean().backward()
        for p in model.parameters():
            assert p.grad.dtype == dtype and torch.isfinite(p.grad).all()
    params = [torch.nn.Parameter(torch.zeros(n, device="cuda", dtype=dtype)) for n in (500, 3, 1200)]
    state = commsgd_torch.TopKState(model=torch.nn.ParameterList(params), density=0.05, momentum=0.0)
    for _ in range(3):
        grads = [torch.randn(p.numel(), generator=g).to(dtype).cuda() for p in params]
        bucket = FakeBucket(params, grads)
        before = state.residual("0,1,2")
        before = torch.zeros(bucket.buffer().numel(), device="cuda") if before is None else before
        out = state.exchange(bucket)
        assert out.dtype == dtype
        idx, val = state.last_sent("0,1,2")
        _check_split(before, bucket.buffer(), idx, val, state.residual("0,1,2"))
    return True


@gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_and_bfloat16_buckets(name):
    run_ranks(_half, 2, (name,))


# --- NCCL -----------------------------------------------------------------------------------------------------

def _nccl(rank, world):
    assert dist.get_backend() == "nccl"
    torch.manual_seed(0)
    model = mlp().cuda()
    ddp = DDP(model, device_ids=[0])
    state = commsgd_torch.TopKState(model=model, density=0.02, momentum=0.9, start_iter=2,
                                    process_group=dist.group.WORLD)
    ddp.register_comm_hook(state, commsgd_torch.topk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(5):
        x, y = torch.rand(32, 784, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    assert state.iter == 5
    for p in model.parameters():
        assert torch.isfinite(p).all()
    # On one rank the average is what was sent: sent + new residual == old residual + gradient.
    params = [torch.nn.Parameter(torch.zeros(n, device="cuda")) for n in (100, 900)]
    s = commsgd_torch.TopKState(model=torch.nn.ParameterList(params), density=0.1, process_group=dist.group.WORLD)
    before = torch.zeros(1000, device="cuda")
    for _ in range(3):
        bucket = FakeBucket(params, [torch.randn(p.numel(), device="cuda") for p in params])
        out = s.exchange(bucket)
        after = s.residual("0,1")
        assert torch.equal(out + after, before + bucket.buffer())
        before = after
    return True


@gpu
@pytest.mark.skipif(not dist.is_nccl_available(), reason="torch has no NCCL")
def test_nccl_process_group():
    run_ranks(_nccl, 1, backend="nccl")


# --- NaN ------------------------------------------------------------------------------------------------------

def _nan(rank, world):
    params = [torch.nn.Parameter(torch.zeros(n, device="cuda")) for n in (100, 20)]
    state = commsgd_torch.TopKState(model=torch.nn.ParameterList(params), density=0.1)
    g = torch.Generator().manual_seed(rank)
    good = lambda: [torch.randn(p.numel(), generator=g).cuda() for p in params]  # noqa: E731
    state.exchange(FakeBucket(params, good()))
    before = state.residual("0,1")
    bad = good()
    if rank == 0:
        bad[0][5] = float("nan")
    out = state.exchange(FakeBucket(params, bad))
    assert not torch.isfinite(out).all()  # every rank: rank 0's message is NaN
    if rank == 0:
        assert torch.equal(_bits(state.residual("0,1")), _bits(before))
        with pytest.raises(commsgd_torch.NonFinite, match="non-finite"):
            state.exchange(FakeBucket(params, good()))
    else:
        assert not torch.isfinite(state.exchange(FakeBucket(params, good()))).all()
    out = state.exchange(FakeBucket(params, good()))  # nothing is left broken
    both = [torch.zeros_like(out) for _ in range(world)]
    dist.all_gather(both, out)
    assert torch.isfinite(out).all() and torch.equal(both[0], both[1])
    return True


@gpu
def test_nan_gradient_is_refused_and_reported_at_the_next_exchange():
    run_ranks(_nan, 2)


# --- checkpoints ----------------------------------------------------------------------------------------------

def _round_trip(rank, world):
    torch.manual_seed(0)
    model = mlp().cuda()
    kw = dict(density=0.02, momentum=0.5, layerwise=True)
    state = commsgd_torch.TopKState(model=model, **kw)
    ddp = DDP(model, device_ids=[0])
    ddp.register_comm_hook(state, commsgd_torch.topk_hook)
    g = torch.Generator().manual_seed(11 + rank)
    for _ in range(3):
        ddp.zero_grad()
        x, y = torch.rand(32, 784, generator=g).cuda(), torch.randint(0, 10, (32,), generator=g).cuda()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
    buf = io.BytesIO()
    torch.save(state.state_dict(), buf)
    buf.seek(0)
    state2 = commsgd_torch.TopKState(model=model, **kw)
    state2.load_state_dict(torch.load(buf, weights_only=False))
    assert state2.keys() == state.keys() and state.keys()
    for key in state.keys():
        assert torch.equal(_bits(state.residual(key)), _bits(state2.residual(key))), key
        assert torch.equal(_bits(state.momentum_buffer(key)), _bits(state2.momentum_buffer(key))), key
    assert state2.iter == state.iter == 3
    return True


@gpu
def test_state_dict_round_trip_restores_the_residual():
    run_ranks(_round_trip, 2)


# --- without a GPU --------------------------------------------------------------------------------------------

class _CudaLike:
    """What TopKState reads of a CUDA bucket's buffer before it needs a device."""
    is_cuda = True
    dtype = torch.float32

    def numel(self):
        return 10


class _StubBucket(FakeBucket):
    def buffer(self):
        return _CudaLike()


def _no_device(rank, world):
    params = [torch.nn.Parameter(torch.zeros(10))]
    commsgd_torch.TopKState(model=torch.nn.ParameterList(params), density=0.1)  # constructing never needs CUDA
    state = commsgd_torch.TopKState(model=torch.nn.ParameterList(params), density=0.1, dgc_warmup_steps_per_stage=2)
    stub = _StubBucket(params, [torch.zeros(10)])
    if cuda_topk._cuda is not None:
        with pytest.raises(commsgd_torch.Unsupported, match="dgc_warmup_steps_per_stage"):
            state.exchange_async(stub)
    cuda_topk._cuda = None  # as where the package was built without nvcc
    with pytest.raises(commsgd_torch.Unsupported, match="without its CUDA part.*nvcc"):
        state.exchange_async(stub)
    return True


def test_cuda_bucket_without_the_cuda_part_says_what_to_do():
    run_ranks(_no_device, 1)


# --- DiLoCo on CUDA parameters: the device round and the host-copy path, against the engine on threads ----------

cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
device_round = pytest.mark.skipif(not HAS_CUDA or cuda_topk._cuda is None or
                                  not hasattr(cuda_topk._cuda, "DiLoCoFragment"),
                                  reason="no CUDA device" if not HAS_CUDA else "commsgd_torch built without _cuda")


def _on_device(code):
    """Whether a code runs on the device round (on these small models, whose fragments fit one top-k chunk of
    4096): dense, int8, e3m0 and the gathered top-k codes; fp16, bf16, -shared and -regions stay on the host."""
    if code in ("dense", "int8", "e3m0"):
        return True
    return code.startswith("topk-") and "-shared" not in code and "-regions" not in code


def _codes():
    import test_diloco_conformance as conf
    return list(dict.fromkeys(conf.CODES + ["topk-0.1"]))


def _check_codes(by_rank, codes, fragments, delay, alpha, where):
    import test_diloco_conformance as conf
    failed = []
    for i, code in enumerate(codes):
        runs = [torch.load(io.BytesIO(r[i])) for r in by_rank]
        try:
            assert all(r["device_round"] == (where == "cuda" and _on_device(code)) for r in runs), \
                f"device_round is {runs[0]['device_round']}"
            conf.check_agreement(runs, code, fragments, delay, alpha)
        except AssertionError as e:
            failed.append(f"{code}: {e}")
    assert not failed, "\n".join(failed)


@cuda_only
@pytest.mark.parametrize("where", ["cuda", "cuda-copy"])
@pytest.mark.parametrize("fragments,delay,alpha", [(1, 0, 0.0), (2, 2, 0.5)])
def test_diloco_on_cuda_parameters_agrees_with_the_engine_bit_for_bit(fragments, delay, alpha, where):
    """Every code on CUDA parameters, the device round where the code has one ("cuda") and the host engine
    ("cuda-copy"): the global model after every step and the bytes, bit for bit the engine on threads'."""
    if where == "cuda" and (cuda_topk._cuda is None or not hasattr(cuda_topk._cuda, "DiLoCoFragment")):
        pytest.skip("commsgd_torch built without _cuda: no device round")
    import test_diloco_conformance as conf
    codes = _codes()
    by_rank = run_ranks(conf._run_codes, 2, (codes, fragments, delay, alpha, where, False))
    _check_codes(by_rank, codes, fragments, delay, alpha, where)


@device_round
@pytest.mark.skipif(not dist.is_nccl_available(), reason="torch has no NCCL")
def test_diloco_under_an_nccl_process_group_agrees_with_the_engine():
    """The trainer's group is NCCL (one rank): the device round's messages travel over NCCL from the device."""
    import test_diloco_conformance as conf
    codes = ["dense", "int8", "topk-0.1-c64-2bit-b0.95-senders", "fp16"]
    by_rank = run_ranks(conf._run_codes, 1, (codes, 2, 1, 0.0, "cuda", False), backend="nccl")
    _check_codes(by_rank, codes, 2, 1, 0.0, "cuda")


def _refusal(rank, world, code):
    """A NaN on rank 1 before an exchange: every rank refuses it with NonFinite and keeps its outer state;
    the next exchange, finite again, is taken."""
    import test_diloco_conformance as conf
    torch.manual_seed(5)
    model = conf._Net().cuda()
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = commsgd_torch.DiLoCo(model, inner, sync_every=3, compression=code, device_round=True)
    g = torch.Generator().manual_seed(3 + rank)

    def step():
        x = torch.randn(8, 7, generator=g).cuda()
        opt.zero_grad()
        ((model(x) - 1.0) ** 2).mean().backward()
        opt.step()

    for _ in range(3):  # one exchange taken
        step()
    before = [t.clone() for t in opt.global_parameters()]
    residual = opt.residual(0)
    residual = None if residual is None else residual.clone()
    step()
    step()
    if rank == 1:
        with torch.no_grad():
            model.a.weight[1, 2] = float("nan")
    refused = False
    try:
        step()
    except commsgd_torch.NonFinite as e:
        refused = "rank 1" in str(e) or "sum" in str(e)
    after = opt.global_parameters()
    kept = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(before, after))
    if residual is not None:
        kept = kept and torch.equal(_bits(residual), _bits(opt.residual(0)))
    with torch.no_grad():  # finite again: the next round is taken on every rank
        for p, q in zip(model.parameters(), opt.global_parameters()):
            p.copy_(q)
    for _ in range(3):
        step()
    moved = not all(torch.equal(_bits(a), _bits(b)) for a, b in zip(before, opt.global_parameters()))
    return refused, kept, moved, opt.stats()["outer_steps"]


@device_round
@pytest.mark.parametrize("code", ["dense", "int8", "topk-0.2-c16-2bit-b0.95-senders"])
def test_device_round_refuses_a_nan_on_every_rank_and_keeps_its_state(code):
    for refused, kept, moved, outer_steps in run_ranks(_refusal, 2, (code,)):
        assert refused and kept and moved
        assert outer_steps == 2


def _resume(rank, world, code):
    """A device round's state_dict, saved between exchanges, resumes the same bits; one saved with an
    exchange in flight is refused."""
    import test_diloco_conformance as conf

    def build(seed):
        torch.manual_seed(seed)
        model = conf._Net().cuda()
        inner = torch.optim.AdamW(model.parameters(), lr=0.01)
        return model, inner, commsgd_torch.DiLoCo(model, inner, sync_every=3, fragments=2, delay=1,
                                                  compression=code, device_round=True)

    def run(model, opt, steps, seed):
        g = torch.Generator().manual_seed(seed + rank)
        out = []
        for _ in range(steps):
            x = torch.randn(8, 7, generator=g).cuda()
            opt.zero_grad()
            ((model(x) - 1.0) ** 2).mean().backward()
            opt.step()
            out.append(torch.cat([t.reshape(-1).cpu() for t in opt.global_parameters()]))
        return out

    model, inner, opt = build(1)
    run(model, opt, 6, 10)
    in_flight = any(opt._engine.in_flight(p) for p in range(opt.num_fragments))
    refused = False
    if in_flight:
        try:
            opt.state_dict()
        except commsgd_torch.Unsupported:
            refused = True
    run(model, opt, 2, 20)  # steps 7, 8: the exchanges of steps 6 and 7 applied, none started
    assert not any(opt._engine.in_flight(p) for p in range(opt.num_fragments))
    # Through bytes, as a checkpoint goes: the inner optimizer's state_dict holds its live tensors.
    blob = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, blob)
    blob.seek(0)
    saved = torch.load(blob)
    want = run(model, opt, 9, 30)
    model2, inner2, opt2 = build(2)
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    got = run(model2, opt2, 9, 30)
    same = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(want, got))
    return in_flight and refused, same


@device_round
@pytest.mark.parametrize("code", ["e3m0", "topk-0.2-c16-2bit-b0.95"])
def test_device_round_state_dict_resumes_the_same_bits(code):
    for refused_in_flight, same in run_ranks(_resume, 2, (code,)):
        assert refused_in_flight
        assert same
