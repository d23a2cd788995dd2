"""commsgd_torch.compressor_hook (fp16, bf16, sign, qsgd, random_k) on forked gloo ranks, against references
computed here from what each rank contributed."""
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commsgd_torch
from helpers import Bucket, run_ranks

# Parameter shapes of one bucket: odd sizes, a single value, a 4-D weight, an empty parameter.
SHAPES = [(33, 17), (33,), (1,), (8, 3, 3, 3), (0,), (10, 65), (10,)]
HEADER = 40  # the verdict all_gather rounds start with: 5 u64 per rank (compress/agree.hpp; fp16/bf16: first only)


def _grads(rank, step, special=True):
    """Normal values at mixed scales, with zeros, -0, fp16 subnormals and exact fp16/bf16 ties mixed in."""
    g = torch.Generator().manual_seed(100 * step + rank)
    out = []
    for s in SHAPES:
        t = torch.randn(s, generator=g) * torch.exp2(torch.randint(-20, 8, s, generator=g).float())
        out.append(t)
    if special:
        flat = out[0].view(-1)
        flat[:8] = torch.tensor([0.0, -0.0, 2.0 ** -24 * 1.5, -(2.0 ** -20), 1.0 + 2.0 ** -11,
                                 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8, 60000.0])
    return out


def _layers(grads):
    return [int(t.numel()) for t in grads]


def _flat(grads):
    return torch.cat([t.reshape(-1) for t in grads])


def _gather(t):
    """Every rank's copy of t, in rank order."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return parts


def _rank_order_sum(parts):
    out = torch.zeros_like(parts[0])
    for p in parts:
        out = out + p
    return out


def _bits(t):
    return t.numpy().view(np.uint32).tobytes()


def _ring_sent(m, n, i, esz=4):
    if n <= 1:
        return 0
    chunk = [m * (j + 1) // n - m * j // n for j in range(n)]
    return esz * (2 * m - chunk[(i + 1) % n] - chunk[(i + 2) % n])


def _ring_reference(parts, dtype):
    """comm/narrow_ring.hpp's sum, value by value: the partial sum of chunk j (values [d j / n, d (j+1) / n))
    starts at rank j and takes ranks j+1, ..., j-1 in turn, rounded to dtype after every addition."""
    n, d = len(parts), parts[0].numel()
    rnd = lambda t: t.to(dtype).to(torch.float32)
    out = torch.empty_like(parts[0])
    for j in range(n):
        lo, hi = d * j // n, d * (j + 1) // n
        acc = parts[j][lo:hi].clone()
        for hop in range(1, n):
            acc = rnd(acc) + parts[(j + hop) % n][lo:hi]
        out[lo:hi] = rnd(acc)
    return out


def _expected_bytes(kind, d, layers, n, rank, levels=8, k=0, first=True):
    """cost/compress.hpp's table, written out independently."""
    peers = n - 1
    if kind in ("fp16", "bf16"):
        return (peers * HEADER if first else 0) + _ring_sent(d, n, rank, esz=2)
    if kind == "sign":
        return peers * (HEADER + 4 * layers + (d + 7) // 8)
    if kind == "qsgd":
        return peers * (HEADER + 4 * layers + (d * (1 + levels.bit_length()) + 7) // 8)
    return peers * HEADER + _ring_sent(k, n, rank)


def _one_round(state, grads):
    """The hook's result and the bytes this rank sent for it, checked against the state's own count and
    the library's cost function."""
    before = state.traffic()["bytes_sent"]
    out = commsgd_torch.compressor_hook(state, Bucket([t.clone() for t in grads])).wait().clone()
    sent = state.traffic()["bytes_sent"] - before
    return out, sent


def _state(kind, **options):
    s = commsgd_torch.CompressorState(kind=kind, **options)
    s.iter = s.start_iter  # straight to the compressed phase: these buckets never change layout
    return s


# ---- each kind against its reference ---------------------------------------------------------------------

def _half(rank, world, kind):
    dtype = torch.float16 if kind == "fp16" else torch.bfloat16
    s = _state(kind)
    for step in range(3):
        grads = _grads(rank, step)
        out, sent = _one_round(s, grads)
        # Each rank contributes its gradient / n rounded to 16 bits (PyTorch's fp16 hook divides first too).
        mine = (_flat(grads) / world).to(dtype).to(torch.float32)
        ref = _ring_reference(_gather(mine), dtype)
        assert _bits(out) == _bits(ref), f"{kind} step {step}"
        d = sum(_layers(grads))
        assert sent == _expected_bytes(kind, d, len(SHAPES), world, rank, first=step == 0)
        assert sent == s.wire_bytes(0)
        # Half a float ring's bytes after the first round: what PyTorch's fp16 hook moves.
        if step > 0:
            assert sent == _ring_sent(d, world, rank) // 2
            assert sent == commsgd_torch._C.compressor_wire_bytes(kind, d, len(SHAPES), 8, 0, world, rank)
    return True


@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_half_is_the_ring_sum_of_the_rounded_values(kind):
    for world in (1, 2, 3, 4, 8):  # and after the first round, exactly PyTorch's fp16 hook's bytes
        run_ranks(_half, world, (kind,))


def _sign_reference(p, sizes):
    """EF-SignSGD's decoded message: per layer, mean |p| (summed in double, in order, rounded once to float)
    with p's sign bit."""
    out = np.empty(len(p), dtype=np.float32)
    off = 0
    for size in sizes:
        seg = p[off:off + size]
        total = 0.0
        for v in seg.tolist():
            total += abs(v)
        scale = np.float32(total / size) if size else np.float32(0)
        out[off:off + size] = np.where(np.signbit(seg), -scale, scale)
        off += size
    return torch.from_numpy(out)


def _sign(rank, world, layerwise):
    s = _state("sign", layerwise=layerwise)
    grads = _grads(rank, 0)
    layers = _layers(grads) if layerwise else [sum(_layers(grads))]
    p = _flat(grads) + torch.zeros(1)  # p = g + e with e = +0: -0 goes as +0
    out, sent = _one_round(s, grads)
    mine = _sign_reference(p.numpy(), layers)
    ref = _rank_order_sum(_gather(mine)) / world
    assert _bits(out) == _bits(ref)
    # Error feedback: what the message did not carry stays, exactly p - decoded.
    assert _bits(s.residual(0)) == _bits(p - mine)
    assert sent == _expected_bytes("sign", p.numel(), len(layers), world, rank) == s.wire_bytes(0)
    # The next round sends the sign of g + e + r (r, the residual's low part, added where it is not zero).
    grads = _grads(rank, 1)
    low = s.residual_low(0)
    p = _flat(grads) + s.residual(0)
    p = torch.where(low != 0, p + low, p)
    out, _ = _one_round(s, grads)
    ref = _rank_order_sum(_gather(_sign_reference(p.numpy(), layers))) / world
    assert _bits(out) == _bits(ref)
    return True


@pytest.mark.parametrize("layerwise", [True, False])
def test_sign_is_the_scaled_sign_of_each_rank_summed(layerwise):
    run_ranks(_sign, 2, (layerwise,))


def _qsgd_levels_ok(decoded, p, sizes, levels):
    """Every decoded value is p's sign times float(norm * xi / s) with xi the floor or the ceiling of
    |p| s / norm, norm the layer's L2 norm (summed in double, rounded once to float)."""
    off = 0
    for size in sizes:
        seg = p[off:off + size].astype(np.float64)
        total = 0.0
        for v in seg.tolist():
            total += v * v
        norm = float(np.float32(math.sqrt(total)))
        x = np.abs(seg) * (levels / norm) if norm > 0 else np.zeros(size)
        lo = np.minimum(np.floor(x), levels)
        hi = np.minimum(lo + 1, levels)
        got = decoded[off:off + size]
        a = (norm * lo / levels).astype(np.float32)
        b = (norm * hi / levels).astype(np.float32)
        mag = np.abs(got)
        assert np.all((mag == a) | (mag == b)), f"layer at {off}: a value off the quantisation grid"
        nonzero = mag > 0  # a zero level decodes to p's signed zero, which the sum with +0 makes +0
        assert np.array_equal(np.signbit(got)[nonzero], np.signbit(seg)[nonzero])
        off += size


def _qsgd(rank, world, levels):
    s = _state("qsgd", levels=levels, seed=3)
    # Rank 1 sends zeros (every level 0, decoding to +0), so the result is exactly rank 0's decoded message.
    grads = _grads(rank, 0, special=False) if rank == 0 else [torch.zeros(sh) for sh in SHAPES]
    out, sent = _one_round(s, grads)
    if rank == 0:
        _qsgd_levels_ok((out * world).numpy(), _flat(grads).numpy(), _layers(grads), levels)
    assert sent == _expected_bytes("qsgd", sum(_layers(grads)), len(SHAPES), world, rank, levels)
    assert sent == s.wire_bytes(0)
    # Both ranks contribute: the sum is within one quantisation step per rank of the exact sum.
    grads = _grads(rank, 1, special=False)
    out, _ = _one_round(s, grads)
    p = _flat(grads)
    parts = _gather(p)
    exact = _rank_order_sum(parts).double()
    slack = torch.zeros_like(exact)
    off = 0
    for size in _layers(grads):
        for q in parts:
            slack[off:off + size] += q[off:off + size].double().norm() / levels
        off += size
    err = (out.double() * world - exact).abs()
    assert torch.all(err <= slack + 2.0 ** -22 * (exact.abs() + slack))
    outs = _gather(out)
    assert _bits(outs[0]) == _bits(outs[1])
    return True


@pytest.mark.parametrize("levels", [1, 4, 255])
def test_qsgd_decodes_onto_its_grid_within_one_step(levels):
    run_ranks(_qsgd, 2, (levels,))


def _random_k(rank, world, density):
    s = _state("random_k", density=density, seed=5)
    for step in range(3):
        grads = _grads(rank, step)
        p = _flat(grads) + (s.residual(0) if step else 0)
        out, sent = _one_round(s, grads)
        idx = torch.tensor(s.indices(0), dtype=torch.long)
        d = p.numel()
        k = math.ceil(density * d)
        assert len(idx) == k and torch.all(idx[1:] > idx[:-1])
        assert _bits(_rank_order_sum(_gather(idx.float())) / world) == _bits(idx.float())  # same on every rank
        ref = torch.zeros(d)
        ref[idx] = _rank_order_sum(_gather(p[idx])) / world
        assert _bits(out) == _bits(ref)
        kept = p.clone()
        kept[idx] = 0.0
        assert _bits(s.residual(0)) == _bits(kept)
        assert sent == _expected_bytes("random_k", d, 1, world, rank, k=k) == s.wire_bytes(0)
    return True


@pytest.mark.parametrize("density", [0.1, 1.0])
def test_random_k_sends_the_same_positions_on_every_rank(density):
    run_ranks(_random_k, 2, (density,))


# ---- state, errors, DDP ----------------------------------------------------------------------------------

OPTIONS = {"fp16": {"error_feedback": True}, "bf16": {"error_feedback": True}, "sign": {},
           "qsgd": {"levels": 4, "error_feedback": True, "seed": 9}, "random_k": {"density": 0.05, "seed": 2}}


def _round_trip(rank, world):
    for kind, o in OPTIONS.items():
        a = _state(kind, **o)
        for step in range(2):
            for index in range(2):
                commsgd_torch.compressor_hook(a, Bucket(_grads(rank, step), index, index == 1)).wait()
        saved = a.state_dict()
        b = _state(kind, **o)
        # A damaged stream raises and leaves the state as it was (no bucket half loaded).
        index, (sizes, blob, velocity) = next(iter(saved["buckets"].items()))
        damaged = dict(saved, buckets=dict(saved["buckets"]))
        damaged["buckets"][index] = (sizes, blob[:-9] + bytes([blob[-9] ^ 0x40]) + blob[-8:], velocity)
        with pytest.raises(commsgd_torch.CorruptData):
            b.load_state_dict(damaged)
        assert b.keys() == []
        b.load_state_dict(saved)
        for step in range(2, 4):
            for index in range(2):
                x = commsgd_torch.compressor_hook(a, Bucket(_grads(rank, step), index, index == 1)).wait()
                y = commsgd_torch.compressor_hook(b, Bucket(_grads(rank, step), index, index == 1)).wait()
                assert _bits(x) == _bits(y), f"{kind} step {step} bucket {index}"
        assert a.keys() == b.keys() == [0, 1]
        for index in range(2):
            assert _bits(a.residual(index)) == _bits(b.residual(index))
        other = _state("sign" if kind != "sign" else "fp16")
        with pytest.raises(commsgd_torch.InvalidArgument, match="state dict"):
            other.load_state_dict(saved)
    return True


def test_state_dict_round_trip_continues_bit_identically():
    run_ranks(_round_trip, 2)


def _bad_options(rank, world):
    cases = [(dict(kind="fp32"), "kind"), (dict(kind="qsgd", levels=0), "levels"),
             (dict(kind="qsgd", levels=65536), "levels"), (dict(kind="random_k", density=0.0), "density"),
             (dict(kind="random_k", density=1.5), "density"), (dict(kind="fp16", overflow="wrap"), "overflow"),
             (dict(kind="sign", levels=4), "levels"), (dict(kind="sign", start_iter=1), "start_iter"),
             (dict(kind="fp16", error_feedback=True, start_iter=1), "start_iter"),
             (dict(kind="fp16", start_iter=-1), "start_iter"), (dict(kind="qsgd", seed=-1), "seed"),
             (dict(kind="sign", momentum=1.0), "momentum"), (dict(kind="random_k", momentum=-0.1), "momentum")]
    for kwargs, word in cases:
        with pytest.raises(commsgd_torch.InvalidArgument, match=word):
            commsgd_torch.CompressorState(**kwargs)
    return True


def test_bad_options_raise_with_the_library_message():
    run_ranks(_bad_options, 2)


def _one_rank_wrong(rank, world):
    sizes = [(30,), (7,)]
    base = [torch.ones(sh) for sh in sizes]
    for kind in OPTIONS:
        s = _state(kind, **OPTIONS[kind])
        commsgd_torch.compressor_hook(s, Bucket(base)).wait()
        # A layout change on rank 1 only: both raise, rank 1 with the reason (a residual would be misplaced).
        grads = [torch.ones(sh) for sh in ([(29,), (8,)] if rank == 1 else sizes)]
        with pytest.raises(commsgd_torch.Error, match="changed its layout" if rank == 1 else ""):
            commsgd_torch.compressor_hook(s, Bucket(grads)).wait()
        # NaN on rank 0 only.
        grads = [torch.ones(sh) for sh in sizes]
        if rank == 0:
            grads[1][3] = float("nan")
        with pytest.raises(commsgd_torch.Error):
            commsgd_torch.compressor_hook(s, Bucket(grads)).wait()
        # The wrong dtype on rank 1 only.
        grads = [torch.ones(sh, dtype=torch.float64 if rank == 1 else torch.float32) for sh in sizes]
        with pytest.raises(commsgd_torch.Error, match="float32" if rank == 1 else ""):
            commsgd_torch.compressor_hook(s, Bucket(grads)).wait()
        # Nothing was lost: the next good round still works and agrees across ranks.
        out = commsgd_torch.compressor_hook(s, Bucket([t.clone() for t in base])).wait()
        outs = _gather(out)
        assert _bits(outs[0]) == _bits(outs[1])
    # fp16 refuses a value beyond its range (on one rank) unless told to clamp.
    s = _state("fp16")
    big = [torch.full((5,), 1e6 if rank == 0 else 1.0)]
    with pytest.raises(commsgd_torch.Error, match="65504" if rank == 0 else ""):
        commsgd_torch.compressor_hook(s, Bucket(big)).wait()
    c = _state("fp16", overflow="clamp")
    out = commsgd_torch.compressor_hook(c, Bucket(big)).wait()
    # Each rank sends its value / 2: 5e5 clamps to 65504, then 65504 + 0.5 travels as its nearest fp16, 65504.
    assert out.tolist() == [65504.0] * 5
    return True


def test_an_error_on_one_rank_raises_on_every_rank():
    run_ranks(_one_rank_wrong, 2)


def _ddp_train(rank, world, kind, options):
    torch.manual_seed(0)
    # DDP closes a bucket once it holds at least 1 MB (the first) or bucket_cap_mb: two buckets here.
    model = torch.nn.Sequential(torch.nn.Linear(784, 400), torch.nn.ReLU(), torch.nn.Linear(400, 400),
                                torch.nn.ReLU(), torch.nn.Linear(400, 400), torch.nn.ReLU(),
                                torch.nn.Linear(400, 10))
    ddp = DDP(model, bucket_cap_mb=0.25)
    state = commsgd_torch.CompressorState(kind=kind, start_iter=3, **options)
    ddp.register_comm_hook(state, commsgd_torch.compressor_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 784, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return losses[0], losses[-1], params.numpy().tobytes(), len(state.keys())


# The kinds whose per-bucket state (residual, draw counter) DDP's buckets must keep apart.
@pytest.mark.parametrize("kind,options", [("sign", {}), ("random_k", {"density": 0.1})])
def test_ddp_trains_and_keeps_replicas_identical(kind, options):
    out = run_ranks(_ddp_train, 2, (kind, options))
    for first, last, _, buckets in out:
        assert last < first - 0.05  # 15 steps of a deep narrow net from its initial loss of ln 10
        assert buckets >= 2
    assert out[0][2] == out[1][2]
