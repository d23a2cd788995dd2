"""examples/diloco_lm/train.py on 2 forked gloo ranks, a tiny model for 20 steps on each arm: the validation
loss of the global model is finite and falls, and where every rank must hold the same model it does."""
import math
import os
import sys

import pytest
import torch

from helpers import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "diloco_lm"))
import train  # noqa: E402

TINY = ["--steps", "20", "--eval-every", "10", "--eval-windows", "16", "--batch", "8", "--context", "32",
        "--layers", "1", "--width", "32", "--heads", "2", "--lr", "3e-3", "--lr-warmup", "5", "--warmup", "4",
        "--sync-every", "4", "--seed", "3"]

ARMS = {
    "ddp": [],
    "ddp-powersgd": ["--psgd-rank", "2"],
    "ddp-topk": ["--density", "0.1"],
    "postlocal": [],
    "diloco": ["--outer-lr", "0.7", "--outer-momentum", "0.9", "--fragments", "2", "--delay", "1",
               "--compression", "int8"],
    "diloco-averaging": ["--sync-every", "1", "--outer-lr", "1", "--outer-momentum", "0"],
}


def _run(rank, world, argv):
    records, final, _ = train.main(argv)
    return records, final.numpy().tobytes()


@pytest.mark.parametrize("name", list(ARMS))
def test_arm(name):
    arm = "diloco" if name.startswith("diloco") else name
    out = run_ranks(_run, 2, (TINY + ["--arm", arm] + ARMS[name],))
    records = out[0][0]
    assert [r["step"] for r in records] == [10, 20]
    losses = [r["val_loss"] for r in records]
    assert all(math.isfinite(v) for v in losses), losses
    assert losses[0] < math.log(256) and losses[1] < losses[0], losses
    assert records[-1]["bytes_sent"] is not None and records[-1]["bytes_sent"] > 0
    assert [r["val_loss"] for r in out[1][0]] == losses  # both ranks evaluated the same global model
    if name in ("ddp", "diloco-averaging"):
        assert out[0][1] == out[1][1], "the ranks' models differ"


def test_stop_at_ends_both_ranks_at_the_first_evaluation_on_target():
    out = run_ranks(_run, 2, (TINY + ["--arm", "diloco", "--stop-at", str(math.log(256))],))
    assert [[r["step"] for r in rank[0]] for rank in out] == [[10], [10]]
    out = run_ranks(_run, 2, (TINY + ["--arm", "ddp", "--stop-at", "0"],))
    assert [r["step"] for r in out[0][0]] == [10, 20]  # never on target: the whole run


def test_torchft_diloco_arm():
    pytest.importorskip("torchft", reason="torchft is not installed (pip install torchft): its arm is not run")
    out = run_ranks(_run, 2, (TINY + ["--arm", "torchft-diloco"],))
    records = out[0][0]
    assert [r["step"] for r in records] == [10, 20]
    losses = [r["val_loss"] for r in records]
    assert all(math.isfinite(v) for v in losses) and losses[1] < losses[0], losses
    assert [r["val_loss"] for r in out[1][0]] == losses
    # Five outer steps of H = 4 in 20 steps, each a ring all-reduce of the float32 model: 2 (n - 1) / n of it.
    nbytes = 4 * sum(p.numel() for p in train.ByteLM(1, 32, 2, 32).parameters())
    assert records[-1]["bytes_sent"] == 5 * nbytes
