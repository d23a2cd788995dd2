"""Trains a small MLP with DDP on 2 gloo ranks under every hook state of the installed commsgd_torch, as a user's
script would: each state in turn, 100 steps, on a separable synthetic problem. Checks, per state, that the
full-data loss fell below 0.8 of its start and that both ranks end with the same parameters (what DDP with an exact
or error-feedback exchange guarantees; local SGD after its final average).

    python every_state.py [--expect-prefix DIR]

--expect-prefix fails the run unless commsgd_torch is imported from under DIR (an installed copy, not the
source tree). Exit status 0 when every state trained; prints one line per state.
"""
import argparse
import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 100


def make_states(c):
    """Every state, by name: a function of (model, optimizer) that returns (state, hook)."""
    made = {
        "TopKState": lambda m, o: (c.TopKState(model=m, density=0.05, momentum=0.9), c.topk_hook),
        "PowerSGDState": lambda m, o: (c.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=5),
                                       c.powersgd_hook),
        "LocalSGDState": lambda m, o: (c.LocalSGDState(model=m, optimizer=o, period=4, start_iter=5),
                                       c.local_sgd_hook),
        "AutoState": lambda m, o: (c.AutoState(model=m, optimizer=o, profile_steps=10), c.auto_hook),
    }
    # random-k at its default density (1 %) needs far more than 100 steps; a quarter of the values trains here.
    options = {"fp16": {}, "sign": {}, "qsgd": {}, "random_k": {"density": 0.25}}
    for kind, extra in options.items():
        made[f"CompressorState({kind})"] = (lambda k, x: lambda m, o: (
            c.CompressorState(kind=k, momentum=0.9, **x), c.compressor_hook))(kind, extra)
    return made


# The hook keeps the momentum for these (the optimizer runs without); the others leave it to the optimizer.
MOMENTUM_IN_HOOK = ("TopKState", "CompressorState")


def rank_main(rank, store, expect_prefix, out):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    import commsgd_torch

    where = os.path.realpath(commsgd_torch.__file__)
    if expect_prefix and not where.startswith(os.path.realpath(expect_prefix) + os.sep):
        raise RuntimeError(f"commsgd_torch imported from {where}, not from under {expect_prefix}")
    g = torch.Generator().manual_seed(1)
    w_true = torch.randn(32, 4, generator=g)
    x_all = torch.randn(2048, 32, generator=g)
    y_all = (x_all @ w_true).argmax(1)
    lines = []
    for name, make in make_states(commsgd_torch).items():
        torch.manual_seed(0)  # the same initial model on both ranks
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0 if name.startswith(MOMENTUM_IN_HOOK) else 0.9)
        ddp = DDP(model, bucket_cap_mb=0.01)  # several buckets
        state, hook = make(model, opt)
        ddp.register_comm_hook(state, hook)
        first = last = None
        for step in range(STEPS):
            idx = torch.randint(0, 2048, (32,), generator=torch.Generator().manual_seed(1000 * step + rank))
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x_all[idx]), y_all[idx])
            loss.backward()
            opt.step()
            if hasattr(state, "step"):
                state.step(loss=loss.item())
            first = loss.item() if first is None else first
            last = loss.item()
        if hasattr(state, "finish"):
            state.finish()
        full = torch.nn.functional.cross_entropy(model(x_all), y_all).item()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        other = [torch.zeros_like(flat) for _ in range(2)]
        dist.all_gather(other, flat)
        same = torch.equal(other[0], other[1])
        lines.append((name, full, same, state.traffic()["bytes_sent"] if hasattr(state, "traffic") else -1))
        del ddp, state
    dist.destroy_process_group()
    if rank == 0:
        out.put((where, lines))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--expect-prefix", default="")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(1)
    w_true = torch.randn(32, 4, generator=g)
    x_all = torch.randn(2048, 32, generator=g)
    y_all = (x_all @ w_true).argmax(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    start = torch.nn.functional.cross_entropy(model(x_all), y_all).item()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=rank_main, args=(r, os.path.join(tmp, "store"), args.expect_prefix, out))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
        codes = [p.exitcode for p in procs]
    if codes != [0, 0]:
        print(f"every_state: rank exit codes {codes}", file=sys.stderr)
        return 1
    where, lines = out.get(timeout=10)
    print(f"commsgd_torch from {where}, torch {torch.__version__}; full-data loss at the start {start:.3f}")
    failed = 0
    for name, full, same, sent in lines:
        ok = full < 0.8 * start and same
        failed += not ok
        print(f"  {name:24s} loss {full:.3f} ({full / start:.2f} of the start), ranks equal: {same}, "
              f"bytes sent {sent}  {'ok' if ok else 'FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
