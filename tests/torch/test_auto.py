"""AutoState / auto_hook on 2 forked gloo ranks: the overlap model and the choice it feeds (dense on a free
network, compressed on a slow one), bit-identity with PyTorch's allreduce hook while dense, the log and
the checkpoint, the way back to dense, and bad settings raising on every rank."""
import math

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import commsgd_torch
from commsgd_torch import _C
from helpers import fashion_mnist, mlp, run_ranks

FREE = (0.0, math.inf)     # zero latency, infinite bandwidth
SLOW = (50e-6, 125e3)      # 1 Mbit/s


def _train(rank, world, steps, hook_of, seed=3, lr=0.05):
    """Trains the MLP for `steps` on this rank's shard with the hook hook_of(ddp, opt) registers; returns
    (ddp, opt, state, losses)."""
    x, y = fashion_mnist("train", 64 * world * steps)
    x, y = x[rank::world], y[rank::world]
    torch.manual_seed(seed)
    model = mlp()
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    state = hook_of(ddp, opt)
    losses = []
    for s in range(steps):
        xb, yb = x[32 * s:32 * (s + 1)], y[32 * s:32 * (s + 1)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return ddp, opt, state, losses


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _auto(network, **kw):
    def hook_of(ddp, opt):
        state = commsgd_torch.AutoState(model=ddp, optimizer=opt, network=network, profile_steps=4, **kw)
        ddp.register_comm_hook(state, commsgd_torch.auto_hook)
        return state
    return hook_of


# ---- the model the choice rests on, through the binding ---------------------------------------------------

def test_overlap_model_two_buckets():
    # Bucket 0 ready at 2 ms, its hook's call 0.5 ms, its exchange 3 ms after 1 ms of its own work; bucket 1
    # ready at 4 ms (4.5 with bucket 0's call), call 0.5, exchange 1 ms. Backward 5 ms (+1 ms of calls).
    # Chain: bucket 0 runs 2.5 -> 6.5; bucket 1 starts at max(4.5 + 0.5, 6.5) = 6.5 and ends at 7.5.
    # Step: forward 1 + max(6, 7.5) + optimizer 0.5 = 9 ms.
    ms = 1e-3
    r = _C.overlapped_step(1 * ms, 5 * ms, 0.5 * ms, [(2 * ms, 0.5 * ms, 1 * ms, 3 * ms),
                                                   (4 * ms, 0.5 * ms, 0.0, 1 * ms)], False)
    assert r["total_s"] == pytest.approx(9 * ms)
    assert r["backward_end_s"] == pytest.approx(6 * ms)
    assert r["exchange_end_s"] == pytest.approx(7.5 * ms)
    # Blocking: everything on the backward thread, no overlap: 5 + 0.5 + 1 + 3 + 0.5 + 1 = 11, + 1.5.
    b = _C.overlapped_step(1 * ms, 5 * ms, 0.5 * ms, [(2 * ms, 0.5 * ms, 1 * ms, 3 * ms),
                                                   (4 * ms, 0.5 * ms, 0.0, 1 * ms)], True)
    assert b["total_s"] == pytest.approx(12.5 * ms)


def test_choose_free_and_slow_networks():
    shapes = [(235146, [(256, 784), (128, 256), (10, 128)])]
    compute = {"dense": [(1e-5, 0.0)], "fp16": [(2e-4, 5e-5)], "topk-0.001": [(0.0, 8e-4)],
               "powersgd-r1": [(3e-4, 6e-4)]}
    cands = list(compute)
    args = (1e-3, 2e-3, 2e-4, [1.9e-3], shapes, compute, {c: False for c in cands}, 8)
    assert _C.choose(cands, *args, 0.0, math.inf, 0.05)["name"] == "dense"
    slow = _C.choose(cands, *args, 50e-6, 125e6, 0.05)
    assert slow["name"] != "dense"
    assert slow["predicted"][slow["name"]] < 0.95 * slow["predicted"]["dense"]
    assert slow["name"] in slow["reason"]
    # Charged the steps it needs over dense's, a compressed step that is not fast enough loses.
    factor = {slow["name"]: 1.01 * slow["predicted"]["dense"] / slow["predicted"][slow["name"]]}
    weighed = _C.choose(cands, *args, 50e-6, 125e6, 0.0, factor)
    assert weighed["name"] != slow["name"]


def test_fit_network_reads_timings_as_measure_network_does():
    # 4 ranks of 2^20 floats: 6 messages and 1.5 x 4 MiB each way on every rank; rank 2 has the slowest
    # latency, rank 3 the slowest link, and the model takes each.
    m = 1 << 20
    wire = 1.5 * 4 * m
    small = [60e-6, 60e-6, 90e-6, 60e-6]
    large = [60e-6 + wire / 1e9, 60e-6 + wire / 1e9, 90e-6 + wire / 1e9, 60e-6 + wire / 5e8]
    latency, bandwidth = _C.fit_network(small, large, m)
    assert latency == pytest.approx(15e-6) and bandwidth == pytest.approx(5e8)
    assert _C.fit_network(small, small, m)[1] == math.inf  # no slower with the bytes: they cost nothing
    assert _C.fit_network([1e-3], [2e-3], m) == (0.0, math.inf)
    with pytest.raises(commsgd_torch.SizeMismatch):
        _C.fit_network(small, large[:3], m)
    with pytest.raises(commsgd_torch.InvalidArgument, match="timing"):
        _C.fit_network([1e-3, -1.0], [1e-3, 1e-3], m)


# ---- on a process group ------------------------------------------------------------------------------------

def _free_and_slow(rank, world):
    out = {}
    for label, net in (("free", FREE), ("slow", SLOW)):
        ddp, _, state, losses = _train(rank, world, 8, _auto(net))
        assert all(math.isfinite(v) for v in losses)
        out[label] = (state.choice(), state.log()[-1]["reason"], _flat(ddp.module).tolist())
    return out


def test_dense_on_free_network_compressed_on_slow():
    r = run_ranks(_free_and_slow, world=2)
    assert r[0]["free"][0] == r[1]["free"][0] == "dense"
    assert r[0]["slow"][0] == r[1]["slow"][0] != "dense"
    assert r[0]["slow"][1] == r[1]["slow"][1]  # rank 0's verdict, the same words everywhere
    for label in ("free", "slow"):  # replicas stay identical
        assert r[0][label][2] == r[1][label][2]


def _measured(rank, world):
    _, _, state, _ = _train(rank, world, 1, _auto(None))
    return state._measure_network()


def test_measured_network_is_the_same_on_every_rank():
    r = run_ranks(_measured, world=2)
    assert r[0] == r[1]  # the slowest rank's figures, not each rank's own
    latency, bandwidth = r[0]
    assert 0 <= latency < math.inf and bandwidth > 0


def _dense_is_allreduce(rank, world):
    def plain(ddp, opt):
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    a, _, _, la = _train(rank, world, 10, plain)
    b, _, state, lb = _train(rank, world, 10, _auto(FREE))
    assert state.choice() == "dense"
    return la == lb and torch.equal(_flat(a.module), _flat(b.module))


def test_dense_choice_is_pytorch_allreduce_bit_for_bit():
    assert run_ranks(_dense_is_allreduce, world=2) == [True, True]


def _fp16_is_pytorch_fp16(rank, world):
    def plain(ddp, opt):
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)

    def forced(ddp, opt):
        state = _auto(SLOW, candidates=("dense", "fp16"))(ddp, opt)
        state.force("fp16")
        return state
    a, _, _, la = _train(rank, world, 6, plain)
    b, _, state, lb = _train(rank, world, 6, forced)
    assert state.choice() == "fp16"
    return la == lb and torch.equal(_flat(a.module), _flat(b.module))


def test_fp16_choice_is_pytorch_fp16_hook_bit_for_bit():
    assert run_ranks(_fp16_is_pytorch_fp16, world=2) == [True, True]


def _powersgd_is_powersgd_state(rank, world):
    def plain(ddp, opt):
        # DDP's allreduce for the profile's 4 iterations, then commsgd's PowerSGD with PyTorch's settings.
        state = commsgd_torch.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                            use_error_feedback=True, warm_start=True, random_seed=0)
        state.iter = 2
        done = [0]

        def hook(state, bucket):
            if done[0] < 4:
                done[0] += bucket.is_last()
                return default_hooks.allreduce_hook(None, bucket)
            return commsgd_torch.powersgd_hook(state, bucket)
        ddp.register_comm_hook(state, hook)
    a, _, _, la = _train(rank, world, 10, plain)
    b, _, state, lb = _train(rank, world, 10, _auto(SLOW, candidates=("dense", "powersgd-r2")))
    assert state.choice() == "powersgd-r2"
    return la == lb and torch.equal(_flat(a.module), _flat(b.module))


def test_powersgd_choice_is_powersgd_state_bit_for_bit():
    # Auto's PowerSGD run is commsgd's PowerSGDState (PyTorch's initial Q, error feedback, warm start)
    # started after the same dense iterations, nothing else.
    assert run_ranks(_powersgd_is_powersgd_state, world=2) == [True, True]


def _checkpoint(rank, world):
    ddp, opt, state, _ = _train(rank, world, 8, _auto(SLOW, candidates=("dense", "topk-0.01")))
    assert state.choice() == "topk-0.01"
    saved = state.state_dict()
    saved_opt = opt.state_dict()
    # A fresh model, optimizer and state take the checkpoint and go on exactly as the original does.
    torch.manual_seed(99)
    model2 = mlp()
    model2.load_state_dict(ddp.module.state_dict())
    ddp2 = DDP(model2)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9)
    opt2.load_state_dict(saved_opt)
    state2 = commsgd_torch.AutoState(model=ddp2, optimizer=opt2, network=SLOW, profile_steps=4, candidates=("dense", "topk-0.01"))
    state2.load_state_dict(saved)
    ddp2.register_comm_hook(state2, commsgd_torch.auto_hook)
    assert state2.choice() == "topk-0.01" and state2.log() == state.log()
    assert state2.iter == state.iter
    x, y = fashion_mnist("train", 64 * 4)
    x, y = x[rank::world], y[rank::world]
    for m, o in ((ddp, opt), (ddp2, opt2)):
        for s in range(3):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x[32 * s:32 * (s + 1)]), y[32 * s:32 * (s + 1)]).backward()
            o.step()
    return torch.equal(_flat(ddp.module), _flat(ddp2.module)), state.log()[-1]


def test_log_and_checkpoint_round_trip():
    r = run_ranks(_checkpoint, world=2)
    assert r[0][0] and r[1][0]
    assert r[0][1]["choice"] == "topk-0.01" and r[0][1]["iteration"] == 4
    assert set(r[0][1]["predicted_s"]) == {"dense", "topk-0.01"}


def _back_to_dense(rank, world, fall_back=True):
    def hook_of(ddp, opt):
        state = commsgd_torch.AutoState(model=ddp, optimizer=opt, network=SLOW, profile_steps=4, recheck_every=3,
                                        candidates=("dense", "topk-0.01"))
        ddp.register_comm_hook(state, commsgd_torch.auto_hook)
        return state
    x, y = fashion_mnist("train", 64 * 12)
    x, y = x[rank::world], y[rank::world]
    torch.manual_seed(3)
    model = mlp()
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = hook_of(ddp, opt)
    for s in range(12):
        if s == 6:  # pretend dense was far faster than top-k turns out to be, so the re-check falls back
            state._profile["dense_period_s"] = 1e-9
        if s == 6 and not fall_back:  # ranks that measured differently must still decide alike
            state._profile["dense_period_s"] = 1e-9 if rank == 0 else 1e9
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x[32 * s:32 * (s + 1)]), y[32 * s:32 * (s + 1)]).backward()
        opt.step()
    held = [opt.state[p].get("momentum_buffer") for p in model.parameters()]
    bufs = torch.cat([b.reshape(-1) for b in held]) if all(b is not None for b in held) else torch.zeros(0)
    return (state.choice(), [r["choice"] for r in state.log()], state.log()[-1]["reason"],
            opt.param_groups[0]["momentum"], _flat(model).tolist(), bufs.tolist())


def test_ranks_that_measured_differently_decide_alike():
    r = run_ranks(_back_to_dense, world=2, args=(False,))
    assert r[0][0] == r[1][0] == "topk-0.01"  # the slowest rank's dense step is 1e9 s: no fall-back anywhere
    assert r[0][4] == r[1][4]


def test_falls_back_to_dense_when_measured_slower():
    r = run_ranks(_back_to_dense, world=2)
    for choice, choices, reason, momentum, _, _ in r:
        assert choice == "dense" and choices == ["topk-0.01", "dense"]
        assert "back to dense" in reason and momentum == 0.9
    assert r[0][4] == r[1][4]  # replicas identical after the switch back
    assert r[0][5] == r[1][5]  # and the optimizer's momentum too (averaged over ranks)


def _bad(rank, world, kwargs):
    torch.manual_seed(0)
    ddp = DDP(mlp())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    try:
        commsgd_torch.AutoState(model=ddp, optimizer=opt, **kwargs)
    except commsgd_torch.InvalidArgument as e:
        return str(e)
    return None


@pytest.mark.parametrize("kwargs,word", [
    ({"network": (50e-6, -1.0)}, "bandwidth"),
    ({"network": (-1e-6, 1e9)}, "latency"),
    ({"candidates": ("dense", "topk-fast")}, "topk-fast"),
    ({"candidates": ("dense", "zip")}, "zip"),
    ({"margin": 1.5}, "margin"),
    ({"profile_steps": 1}, "profile_steps"),
    ({"steps_factor": {"topk-0.5": 1.0}}, "topk-0.5"),
    ({"steps_factor": {"fp16": 0.0}}, "steps_factor"),
])
def test_bad_settings_raise_on_every_rank(kwargs, word):
    msgs = run_ranks(_bad, world=2, args=(kwargs,))
    for m in msgs:
        assert m is not None and word in m
