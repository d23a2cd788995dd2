"""commsgd_torch.DiLoCo on 2 forked ranks of a gloo group (1 rank for Lookahead): the outer step against
synchronous SGD, Lookahead and a hand-computed Nesterov, each compression against its bound or residual, the
streaming schedule and its bytes, checkpoints bit for bit, non-finite pseudo-gradients refused, training."""
import io
import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commsgd_torch
from helpers import SIZES, Dot, fashion_mnist, mlp, run_ranks


def _bits(t):
    return t.contiguous().view(-1).view(torch.int32)


def _same(a, b):
    return a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _inputs(step, rank, integer=False, low=-1000, high=1000):
    """The gradients of the Dot model at one step of one rank: any rank can make any other rank's."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    if integer:
        return [torch.randint(low, high, (n,), generator=g).float() for n in SIZES]
    return [torch.randn(n, generator=g) for n in SIZES]


def _shipped(rank, world, fn, *args):
    """Runs fn on a rank and returns its result serialised: tensors sent as they are would travel through
    shared memory that the rank's exit takes away before the parent reads it."""
    buf = io.BytesIO()
    torch.save(fn(rank, world, *args), buf)
    return buf.getvalue()


def _ranks(fn, world=2, args=(), **kw):
    """helpers.run_ranks for functions that return tensors."""
    return [torch.load(io.BytesIO(b)) for b in run_ranks(_shipped, world, (fn,) + tuple(args), **kw)]


def _flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _dot_step(model, opt, step, rank, integer=False, **kw):
    opt.zero_grad()
    model(_inputs(step, rank, integer, **kw)).backward()
    opt.step()


# --- arguments ----------------------------------------------------------------------------------------------

BAD = [
    ("sync_every", 0), ("sync_every", -3), ("sync_every", 2.5), ("sync_every", True),
    ("outer_lr", 0.0), ("outer_lr", -0.1), ("outer_lr", float("nan")), ("outer_lr", float("inf")), ("outer_lr", True),
    ("outer_momentum", -0.1), ("outer_momentum", 1.0), ("outer_momentum", float("nan")),
    ("fragments", 0), ("fragments", 9),  # the model has 3 layers
    ("delay", -1), ("delay", 4),  # sync_every is 4
    ("alpha", -0.01), ("alpha", 1.5), ("alpha", float("nan")), ("alpha", "0.5"),
    ("keep_delay_steps", 1), ("keep_delay_steps", "yes"), ("keep_delay_steps", None),
    ("compression", "gzip"), ("compression", "int4"), ("compression", "fp4"), ("compression", "none"),
    ("compression", "topk:0.1"), ("compression", "topk-0"),
    ("compression", "topk-1.5"),
    ("compression", "topk-"), ("compression", "topk-abc"), ("compression", 8),
    ("device_round", 1), ("device_round", "yes"),
]


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_bad_arguments_raise_value_error_naming_them(name, value):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 3),
                                torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kw = {"sync_every": 4, name: value}
    # Arguments are checked before any collective: no process group is needed to see them refused.
    with pytest.raises(ValueError) as info:
        commsgd_torch.DiLoCo(model, opt, **kw)
    assert isinstance(info.value, commsgd_torch.InvalidArgument)
    text = str(info.value)
    assert f"'{name}'" in text and repr(value) in text and "allowed" in text, text


def test_keep_delay_steps_refuses_a_second_merge():
    model = torch.nn.Linear(3, 3)
    with pytest.raises(commsgd_torch.InvalidArgument, match="'alpha' is 0.5.*keep_delay_steps"):
        commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=1), sync_every=4, delay=1,
                             alpha=0.5, keep_delay_steps=True)


@pytest.mark.parametrize("code", ["dense", "fp16"])
def test_device_round_insisted_on_says_why_it_cannot(code):
    """Parameters on the CPU have no device round: device_round=True is refused before any collective, with
    the reason; for a code the device round lacks, the code is named where a GPU and the CUDA part are."""
    model = torch.nn.Linear(3, 3)
    with pytest.raises(commsgd_torch.InvalidArgument, match="'device_round' is True.*not all float32 CUDA"):
        commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=1), compression=code,
                             device_round=True)
    from commsgd_torch import _device_round
    why = _device_round.refusal(code, [12])
    if _device_round._cuda is None:
        assert why is not None and "CUDA part" in why
    else:
        assert (why is None) == (code == "dense")
        assert code == "dense" or "16-bit" in why


def test_bad_model_optimizer_and_fragments():
    model = torch.nn.Linear(3, 3)
    with pytest.raises(ValueError, match="'inner_optimizer'"):
        commsgd_torch.DiLoCo(model, "sgd")
    with pytest.raises(ValueError, match="'model'"):
        commsgd_torch.DiLoCo([model.weight], torch.optim.SGD(model.parameters(), lr=1))
    other = torch.nn.Linear(3, 3)
    with pytest.raises(ValueError, match="'fragments'.*exactly once"):  # misses the bias
        commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=1), fragments=[[model.weight]])
    with pytest.raises(ValueError, match="'fragments'.*exactly once"):  # a foreign parameter
        commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=1),
                             fragments=[[model.weight, model.bias], [other.weight]])


# --- the codes ----------------------------------------------------------------------------------------------

# --- the outer step -----------------------------------------------------------------------------------------

def _h1_is_sync_sgd(rank, world):
    """Inner SGD lr 1, H = 1, outer lr 1, momentum 0 on integer gradients x_r: the local step gives w - x_r
    (exact), the pseudo-gradient w - (w - x_r) = x_r (exact), their mean (x_0 + x_1) / 2 (exact in float32:
    half-integers far below 2^23), the outer step w - 1 * mean: synchronous SGD with lr 1 on the average
    gradient, which DDP computes from the same gradients, bit for bit."""
    torch.manual_seed(5)
    model, ref = Dot(SIZES), Dot(SIZES)
    with torch.no_grad():
        for p, q in zip(model.ps, ref.ps):
            p.copy_(torch.randint(-100, 100, p.shape).float())
            q.copy_(p)
    opt = commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=1.0), sync_every=1, outer_lr=1.0,
                               outer_momentum=0.0)
    ddp = DDP(ref)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=1.0)
    for step in range(6):
        _dot_step(model, opt, step, rank, integer=True)
        _dot_step(ddp, ref_opt, step, rank, integer=True)
        for p, q, g in zip(model.ps, ref.ps, opt.global_parameters()):
            assert _same(p.detach(), q.detach()), step
            assert _same(p.detach(), g), step
        assert opt.stats()["outer_steps"] == step + 1
    return _flat(model.parameters())


def test_h1_plain_averaging_equals_synchronous_sgd_on_the_average():
    a, b = _ranks(_h1_is_sync_sgd, 2)
    assert _same(a, b)


def _lookahead(rank, world):
    """One rank, outer momentum 0: DiLoCo is Lookahead (k = H fast steps, then slow += lr (fast - slow) and
    fast = slow), bit for bit: slow - lr (slow - fast) and slow + lr (fast - slow) round alike."""
    torch.manual_seed(3)
    model = mlp()
    ref = mlp()
    ref.load_state_dict(model.state_dict())
    opt = commsgd_torch.DiLoCo(model, torch.optim.Adam(model.parameters(), lr=1e-3), sync_every=5, outer_lr=0.5,
                               outer_momentum=0.0)
    fast_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    slow = [p.detach().clone() for p in ref.parameters()]
    g = torch.Generator().manual_seed(11)
    for step in range(1, 23):
        x, y = torch.randn(16, 784, generator=g), torch.randint(0, 10, (16,), generator=g)
        for m, o in ((model, opt), (ref, fast_opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
        if step % 5 == 0:
            with torch.no_grad():
                for s, f in zip(slow, ref.parameters()):
                    s.add_(f - s, alpha=0.5)
                    f.copy_(s)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert _same(p.detach(), q.detach()), step
    assert opt.stats()["bytes_sent"] == 0 and opt.stats()["outer_steps"] == 4
    return True


def test_one_rank_equals_lookahead():
    run_ranks(_lookahead, 1)


def _nesterov(rank, world, H, rounds, eta, mu, lr):
    torch.manual_seed(2)
    model = Dot(SIZES)
    with torch.no_grad():
        for p in model.ps:
            p.normal_()
    opt = commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=lr), sync_every=H, outer_lr=eta,
                               outer_momentum=mu)
    # The hand reference, in float64: v <- mu v + delta; theta <- theta - eta (delta + mu v).
    theta = _flat(model.parameters()).double()
    v = torch.zeros_like(theta)
    step = 0
    for r in range(rounds):
        for _ in range(H):
            _dot_step(model, opt, step, rank)
            step += 1
        delta = sum(lr * _flat(_inputs(s, q)).double() for s in range(step - H, step) for q in range(world)) / world
        v = mu * v + delta
        theta = theta - eta * (delta + mu * v)
        got = _flat(opt.global_parameters()).double()
        assert torch.allclose(got, theta, rtol=1e-5, atol=1e-5), (r, (got - theta).abs().max())
        assert _same(_flat(model.parameters()), _flat(opt.global_parameters()))
    momentum = opt.outer_velocity(0).double()
    assert torch.allclose(momentum, v, rtol=1e-5, atol=1e-5)
    return _flat(model.parameters())


def test_outer_nesterov_matches_a_hand_computed_reference():
    a, b = _ranks(_nesterov, 2, (3, 4, 0.7, 0.9, 0.1))
    assert _same(a, b)


def _alpha_merge(rank, world):
    """With delay 1 and alpha 0.5, the fragment applied after step t is theta_global + 0.5 (theta_local -
    theta_global) in float32, theta_local being the model after step t's own inner step (which overlapped the
    exchange)."""
    model = Dot(SIZES)
    lr = 0.25
    opt = commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=lr), sync_every=3, delay=1,
                               alpha=0.5, outer_lr=0.7, outer_momentum=0.9)
    for step in range(1, 11):
        before = [p.detach().clone() for p in model.ps]
        _dot_step(model, opt, step, rank)
        if step in (4, 7, 10):  # started after 3, 6, 9
            for b, x, p, g in zip(before, _inputs(step, rank), model.ps, opt.global_parameters()):
                inner = b.add(x, alpha=-lr)
                assert _same(p.detach(), g + 0.5 * (inner - g)), step
        else:
            for b, x, p in zip(before, _inputs(step, rank), model.ps):
                assert _same(p.detach(), b.add(x, alpha=-lr)), step
    return True


def test_alpha_merges_the_local_steps_taken_during_the_exchange():
    run_ranks(_alpha_merge, 2)


def _keep_delay_steps(rank, world):
    """With delay 2 and keep_delay_steps, the fragment applied after step t is theta_global + (theta_local -
    theta_start) in float32, theta_start the model when the exchange started (after step t - 2) and theta_local
    the model after step t's own inner step: the two steps taken while it travelled, kept whole (where the
    model did not move, the common value's bits)."""
    model = Dot(SIZES)
    lr = 0.25
    opt = commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=lr), sync_every=3, delay=2,
                               keep_delay_steps=True, outer_lr=0.7, outer_momentum=0.9)
    start = None
    for step in range(1, 12):
        before = [p.detach().clone() for p in model.ps]
        _dot_step(model, opt, step, rank)
        if step in (5, 8, 11):  # started after 3, 6, 9
            for b, x, p, g, s in zip(before, _inputs(step, rank), model.ps, opt.global_parameters(), start):
                moved = b.add(x, alpha=-lr) - s
                want = torch.where(moved == 0, g, g + moved)
                assert _same(p.detach(), want), step
                assert not _same(p.detach(), g), step  # the steps were kept: not the common model
        else:
            for b, x, p in zip(before, _inputs(step, rank), model.ps):
                assert _same(p.detach(), b.add(x, alpha=-lr)), step
        if step in (3, 6, 9):
            start = [p.detach().clone() for p in model.ps]
    opt.finish()  # the last steps exchanged too: every rank ends on the common model
    assert _same(_flat(model.parameters()), _flat(opt.global_parameters()))
    return _flat(model.parameters())


def test_keep_delay_steps_merges_the_steps_taken_during_the_exchange_whole():
    a, b = _ranks(_keep_delay_steps, 2)
    assert _same(a, b)


# --- compressed pseudo-gradients ------------------------------------------------------------------------------

def _topk_conserves(rank, world, density):
    """Integer gradients (exact sums): per rank, residual before + pseudo-gradient = what was sent + residual
    after, element by element; what was sent is the top k of residual + pseudo-gradient; the global model
    moves by exactly the mean of what the ranks sent."""
    model = Dot(SIZES)
    opt = commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=1.0), sync_every=2, outer_lr=1.0,
                               outer_momentum=0.0, compression=f"topk-{density}")
    n = sum(SIZES)
    k = math.ceil(density * n)
    out = []
    step = 0
    for r in range(4):
        theta = _flat(opt.global_parameters())
        before = opt.residual(0).clone()
        for _ in range(2):
            _dot_step(model, opt, step, rank, integer=True, low=-50, high=50)
            step += 1
        delta = sum(_flat(_inputs(s, rank, True, -50, 50)) for s in (step - 2, step - 1))
        after = opt.residual(0)
        e = before + delta
        sent = e - after
        chosen = after == 0
        assert int((sent != 0).sum()) <= k
        assert torch.all(sent[~chosen] == 0) and _same(sent[chosen & (e != 0)], e[chosen & (e != 0)])
        assert _same(sent + after, e)  # conservation, bit for bit
        if int(chosen.sum()) < n:
            assert sent.abs().max() > 0 and sent[sent != 0].abs().min() >= after.abs().max()
        out.append((theta, sent, _flat(opt.global_parameters())))
    one_round = commsgd_torch._C.diloco_round_traffic(f"topk-{density}", n, world, rank, False)["bytes_sent"]
    # The verdict and k pairs to each other rank: float values, indices in the bits n values need, packed.
    assert one_round == (world - 1) * (40 + 4 * k + (k * (n - 1).bit_length() + 7) // 8)
    assert opt.stats()["bytes_sent"] == 4 * one_round
    return out


def test_topk_error_feedback_conserves_and_moves_by_the_mean_sent():
    a, b = _ranks(_topk_conserves, 2, (0.02,))
    for (theta, s0, after0), (theta1, s1, after1) in zip(a, b):
        assert _same(theta, theta1) and _same(after0, after1)
        assert _same(after0, theta.add((s0 + s1) / 2, alpha=-1.0))


# --- streaming --------------------------------------------------------------------------------------------------

def _layers(width=16, count=4):
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(count)])


def _streaming(rank, world, P, delay, compression, width=16):
    torch.manual_seed(0)
    H = 8
    model = _layers(width)
    opt = commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.05), sync_every=H, fragments=P,
                               delay=delay, compression=compression)
    assert [list(map(id, opt.fragment_parameters(p))) for p in range(P)] == \
        [[id(q) for j, layer in enumerate(model) if j % P == p for q in layer.parameters()] for p in range(P)]
    offsets = [p * H // P for p in range(P)]
    g = torch.Generator().manual_seed(rank)
    log = []
    for t in range(1, 4 * H + 1):
        starts = [p for p in range(P) if t >= offsets[p] and (t - offsets[p]) % H == 0]
        glob = [_flat(opt.global_parameters()[2 * p:2 * p + 2]) for p in range(P)] if P == 4 else None
        sent = opt.bytes_sent
        x = torch.randn(8, width, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        applied = [p for p in range(P) if (t - delay - offsets[p]) % H == 0 and t - delay >= 1]
        if P == 4:  # one layer a fragment: its global copy moves exactly when its exchange is applied
            moved = [p for p in range(P) if not _same(glob[p], _flat(opt.global_parameters()[2 * p:2 * p + 2]))]
            assert moved == applied, (t, moved, applied)
            for p in applied:
                assert _same(_flat(model[p].parameters()), _flat(opt.global_parameters()[2 * p:2 * p + 2]))
        log.append((t, starts, opt.bytes_sent - sent))
    return log, opt.stats()


def _ring(elements, rank=0):
    return commsgd_torch._C.ring_all_reduce_traffic(elements, 4, 2, rank)["bytes_sent"]


@pytest.mark.parametrize("delay", [0, 3])
def test_streaming_schedule_and_peak_bytes_fall_by_p(delay):
    one, _ = _ranks(_streaming, 2, (1, delay, "dense"))[0]
    four, stats = _ranks(_streaming, 2, (4, delay, "dense"))[0]
    assert [t for t, s, _ in one if s] == [8, 16, 24, 32]
    assert [(t, s) for t, s, _ in four if s] == [(t, [p]) for t in range(1, 33) for p in range(4)
                                                 if t >= 2 * p and (t - 2 * p) % 8 == 0]
    layer = 16 * 16 + 16
    # Bytes are counted as an exchange completes: after its start with no delay, `delay` steps later else.
    done = lambda log, t: [s for u, s, _ in log if s and u + delay == t]  # noqa: E731
    assert all(b == (_ring(4 * layer) if done(one, t) else 0) for t, _, b in one)
    assert all(b == (_ring(layer) if done(four, t) else 0) for t, _, b in four)
    peak1, peak4 = max(b for _, _, b in one), max(b for _, _, b in four)
    assert peak4 == _ring(layer) == 4 * layer and peak1 == 4 * peak4  # 2 ranks: half of it twice; P = 4: a quarter
    assert stats["outer_steps"] == sum(len(s) for t, s, _ in four if t + delay <= 32)


def test_streaming_peak_bytes_fall_by_p_with_e3m0():
    one, _ = _ranks(_streaming, 2, (1, 1, "e3m0", 64))[0]
    two, _ = _ranks(_streaming, 2, (2, 1, "e3m0", 64))[0]
    p1, p2 = max(b for _, _, b in one), max(b for _, _, b in two)
    sizes = [layers * (64 * 64 + 64) for layers in (4, 2)]  # P = 2: two layers each
    assert [p1, p2] == [commsgd_torch._C.diloco_round_traffic("e3m0", d, 2, 0, False)["bytes_sent"] for d in sizes]
    assert [p1, p2] == [40 + 4 * math.ceil(d / 256) + d // 2 for d in sizes]
    assert p1 / p2 > 1.95  # half, less the verdict and a block's scale


# --- checkpoints --------------------------------------------------------------------------------------------

def _resume(rank, world, compression, P, delay, save_at):
    def build():
        model = _layers()
        inner = torch.optim.Adam(model.parameters(), lr=1e-2)
        return model, inner, commsgd_torch.DiLoCo(model, inner, sync_every=4, fragments=P, delay=delay,
                                                  compression=compression, outer_lr=0.7, outer_momentum=0.9)

    def run(model, opt, steps):
        out = []
        for t in steps:
            g = torch.Generator().manual_seed(100 * t + rank)
            x = torch.randn(8, 16, generator=g)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            out.append(_flat(model.parameters()))
        return out

    torch.manual_seed(1)
    model, inner, opt = build()
    run(model, opt, range(1, save_at + 1))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "diloco": opt.state_dict()}, buf)
    if delay:
        assert any(opt._engine.in_flight(p) for p in range(P)), "the checkpoint should hold an exchange in flight"
    first = run(model, opt, range(save_at + 1, save_at + 21))
    final_stats = opt.stats()

    torch.manual_seed(99)  # another initialisation, overwritten by the checkpoint
    model2, inner2, opt2 = build()
    buf.seek(0)
    saved = torch.load(buf)
    model2.load_state_dict(saved["model"])  # after constructing: the constructor broadcasts rank 0's model
    opt2.load_state_dict(saved["diloco"])
    assert opt2.inner_steps == save_at
    second = run(model2, opt2, range(save_at + 1, save_at + 21))
    for t, (a, b) in enumerate(zip(first, second)):
        assert _same(a, b), (compression, t)
    assert opt2.stats() == final_stats
    for a, b in zip(opt.global_parameters(), opt2.global_parameters()):
        assert _same(a, b)
    return True


@pytest.mark.parametrize("compression,P,delay,save_at", [("dense", 1, 0, 6), ("topk-0.1", 2, 1, 14),
                                                         ("e3m0", 3, 2, 11), ("int8", 1, 3, 9)])
def test_state_dict_round_trip_reproduces_the_next_20_steps_bit_for_bit(compression, P, delay, save_at):
    run_ranks(_resume, 2, (compression, P, delay, save_at))


def test_load_state_dict_refuses_another_configuration():
    def one(rank, world):
        model = _layers()
        a = commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=4)
        b = commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=5)
        with pytest.raises(ValueError, match="'state_dict'.*sync_every"):
            b.load_state_dict(a.state_dict())
        return True
    run_ranks(one, 2)


# --- non-finite pseudo-gradients ------------------------------------------------------------------------------

def _outer_state(opt):
    mom = [opt.outer_velocity(p) for p in range(opt.num_fragments)]
    return ([g.clone() for g in opt.global_parameters()], [m.clone() for m in mom],
            [None if opt.residual(p) is None else opt.residual(p).clone() for p in range(opt.num_fragments)],
            opt.stats()["outer_steps"])


def _nonfinite(rank, world, compression, delay, value):
    model = Dot(SIZES)
    opt = commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=3, delay=delay,
                               compression=compression)
    for step in range(1, 9):  # two rounds and two steps: the second round's exchange is applied
        _dot_step(model, opt, step, rank)
    saved = _outer_state(opt)
    if rank == 1:
        with torch.no_grad():
            model.ps[3][17] = value
    # The third round's exchange starts after step 9 and is applied `delay` steps later.
    for step in range(9, 9 + delay):
        _dot_step(model, opt, step, rank)
    with pytest.raises(commsgd_torch.NonFinite) as info:
        _dot_step(model, opt, 9 + delay, rank)
    text = str(info.value)
    assert "fragment 0" in text, text
    assert ("parameter(s) ps.3" in text) == (rank == 1), text
    after = _outer_state(opt)
    assert after[3] == saved[3]
    for a, b in zip(saved[0] + saved[1] + saved[2], after[0] + after[1] + after[2]):
        assert (a is None and b is None) or _same(a, b)
    assert not any(opt._engine.in_flight(p) for p in range(opt.num_fragments))
    return True


@pytest.mark.parametrize("compression,delay,value", [("dense", 0, float("nan")), ("int8", 0, float("inf")),
                                                     ("e3m0", 2, float("nan")), ("topk-0.05", 1, float("-inf"))])
def test_non_finite_pseudo_gradient_is_refused_on_every_rank_and_changes_nothing(compression, delay, value):
    run_ranks(_nonfinite, 2, (compression, delay, value))


# --- training ---------------------------------------------------------------------------------------------------

def _train(rank, world, compression, P, delay):
    torch.manual_seed(0)
    x, y = fashion_mnist("train", 2000)
    mine = slice(rank * 1000, (rank + 1) * 1000)  # each rank its own half
    xs, ys = x[mine], y[mine]
    model = mlp()
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    opt = commsgd_torch.DiLoCo(model, inner, sync_every=10, fragments=P, delay=delay, compression=compression)
    g = torch.Generator().manual_seed(rank)
    with torch.no_grad():
        start = torch.nn.functional.cross_entropy(model(x), y).item()
    checks = 0
    for t in range(1, 201):
        i = torch.randint(0, 1000, (50,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xs[i]), ys[i]).backward()
        opt.step()
        if P == 1 and delay == 0 and t % 10 == 0:  # after each outer step both ranks hold the global model
            mine_flat = _flat(model.parameters())
            other = mine_flat.clone()
            dist.broadcast(other, src=0)
            assert _same(mine_flat, other) and _same(mine_flat, _flat(opt.global_parameters())), t
            checks += 1
    opt.finish()
    final = _flat(model.parameters())
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(x), y).item()
    return start, loss, final, checks, opt.stats()


# Top-k is left out: at 5 % with H = 10 it reached only 1.97 in these 200 steps (each round sends a twentieth of
# the pseudo-gradient and every rank restarts from the global model), a regime that needs many more rounds.
@pytest.mark.parametrize("compression,P,delay", [("dense", 1, 0), ("e3m0", 2, 2)])
def test_mlp_on_fashion_mnist_learns_and_ranks_agree(compression, P, delay):
    (s0, l0, f0, c0, st0), (s1, l1, f1, c1, st1) = _ranks(_train, 2, (compression, P, delay), timeout=400)
    print(f"{compression} P={P} delay={delay}: loss {s0:.3f} -> {l0:.3f}; bytes sent {st0['bytes_sent']}")
    assert s0 == s1 and l0 == l1 and _same(f0, f1)  # finish(): every rank holds the global model
    if P == 1 and delay == 0:
        assert c0 == c1 == 20
    assert l0 < 0.75, l0
    dense = 4 * sum(p.numel() for p in mlp().parameters())
    assert st0["bytes_sent"] <= 21 * (dense + 8)  # 20 exchanges and finish(); DDP would send 200 x dense


def _silent_peer(rank, world, group_s, set_s):
    """Rank world - 1 stops answering at the third exchange (it sleeps, its sockets open); the others return how
    long their exchange took to fail."""
    import time
    from datetime import timedelta
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=group_s))
    torch.manual_seed(0)
    model = Dot(SIZES)
    opt = commsgd_torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), process_group=group,
                               sync_every=1, compression="dense")
    if set_s is not None:
        opt.set_timeout(set_s)
    seen = opt.timeout()
    for s in range(1, 6):
        if rank == world - 1 and s == 3:
            time.sleep(7)
            return None, seen
        opt.zero_grad()
        model([torch.full((n,), float(rank + s)) for n in SIZES]).backward()
        t = time.monotonic()
        try:
            opt.step()
        except commsgd_torch.CommError:
            return time.monotonic() - t, seen
    return -1.0, seen


@pytest.mark.parametrize("group_s, set_s, deadline", [(3, None, 3.0), (120, 1.5, 1.5)])
def test_a_silent_peer_fails_the_exchange_within_its_deadline(group_s, set_s, deadline):
    # The engine's own group inherits the deadline of the group given (torch would give it 30 minutes), and
    # set_timeout() replaces it; the silent rank's sockets stay open, so only the deadline can end the wait.
    out = run_ranks(_silent_peer, 3, (group_s, set_s))
    for rank, (waited, seen) in enumerate(out):
        if torch.__version__ >= "2" or set_s is not None:  # torch 1.13 does not report a group's deadline
            assert seen == pytest.approx(deadline)
        if rank < 2:
            assert waited is not None and waited > 0, out
            assert deadline * 0.8 < waited < deadline + 3.0, out
