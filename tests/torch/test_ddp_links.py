"""examples/torch_ddp: bench.train's stop at a target accuracy and its training clock, on 2 forked gloo ranks
and synthetic data (so the test needs no dataset), and links.py's reading of a run (compact, smoothed means,
the target from a full DDP run)."""
import argparse
import json
import os
import sys

import pytest
import torch

from helpers import run_ranks

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch_ddp")
sys.path.insert(0, EXAMPLES)
import bench  # noqa: E402
import links  # noqa: E402


def _synthetic(root, split, count):
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    y = torch.randint(0, 10, (count,), generator=g)
    x = torch.rand(count, 784, generator=g) * 0.2
    x[torch.arange(count), y * 78] += 1.0  # learnable: one bright pixel per class
    return x, y


def _train(rank, world, stop_at, scheme):
    bench.fashion_mnist = _synthetic
    a = argparse.Namespace(data="", train=512 * world, test=200, epochs=2, batch=32, lr=0.05, momentum=0.9,
                           evals_per_epoch=4, seed=1, auto_network="measure", stop_at=stop_at)
    return bench.train(rank, world, a, "mlp", scheme)


def test_runs_every_step_without_a_reachable_target():
    out = run_ranks(_train, 2, (2.0, "ddp"))
    for r in out:
        evals = [x for x in r["records"] if "acc" in x]
        assert r["records"][-1]["step"] == 32 and not r.get("stopped")
        assert [x["step"] for x in evals] == [4, 8, 12, 16, 20, 24, 28, 32]
        clock = [x["train_s"] for x in evals]
        assert all(b > a > 0 for a, b in zip(clock, clock[1:]))
    assert [x.get("acc") for x in out[0]["records"]] == [x.get("acc") for x in out[1]["records"]]


@pytest.mark.parametrize("scheme", ["ddp", "topk-laplace-1e-2"])
def test_every_rank_stops_at_the_first_evaluation_whose_mean_reaches_the_target(scheme):
    full = run_ranks(_train, 2, (2.0, scheme))[0]
    means = links.smoothed(full["records"])
    goal = means[3][1] - 1e-9  # reached at the 4th evaluation at the latest
    want = next(step for step, acc, _ in means if acc >= goal)
    out = run_ranks(_train, 2, (goal, scheme))
    for r in out:
        assert r["stopped"] and r["records"][-1]["step"] == want
        assert [x["acc"] for x in r["records"] if "acc" in x] == \
            [x["acc"] for x in full["records"] if "acc" in x and x["step"] <= want]


def test_compact_target_and_smoothed(tmp_path):
    recs = [{"step": s, "bytes_sent": 10 * s, "bytes_received": s} for s in range(1, 7)]
    for r, acc in zip(recs[1::2], (0.5, 0.8, 0.9)):
        r.update(acc=acc, train_s=r["step"] / 10)
    run = links.compact({"records": recs})
    assert run["steps"] == 6 and run["bytes_sent_total"] == 210 and run["bytes_received_total"] == 21
    assert [r["step"] for r in run["records"]] == [2, 4, 6]
    assert links.compact(run) == run
    assert links.smoothed(run["records"]) == [(2, 0.5, 0.2), (4, 0.65, 0.4), (6, pytest.approx(2.2 / 3), 0.6)]
    os.makedirs(tmp_path / "w4" / "none")
    with open(tmp_path / "w4" / "none" / "mlp-ddp.json", "w") as f:
        json.dump(run, f)
    goal, path = links.target(str(tmp_path), str(tmp_path / "kept"), "mlp", 4)
    assert goal == pytest.approx(2.2 / 3 - 0.01) and path.endswith("mlp-ddp.json")
    # A run that stopped at its target is no DDP final; nothing else: no target.
    with open(tmp_path / "w4" / "none" / "mlp-ddp.json", "w") as f:
        json.dump(dict(run, stopped=True), f)
    assert links.target(str(tmp_path), str(tmp_path / "kept"), "mlp", 4) == (None, None)
    with pytest.raises(ValueError, match="rate"):
        links.rate_bits("fast")
    assert links.rate_bits("100mbit") == 1e8 and links.rate_bits("none") == float("inf")
