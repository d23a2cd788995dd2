"""examples/diloco_lm/train.py on 2 forked gloo ranks, a tiny model for 20 steps on each arm: the validation
loss of the global model is finite and falls, every rank ends holding the same global model bits, and where
every rank must hold the same local model too it does. (The validation losses are all-reduced: that ranks
log the same ones proves nothing, so the models themselves are compared.) A helper started as the torchft
lighthouse is ends with the process that started it, however that ends."""
import json
import math
import os
import signal
import subprocess
import sys
import time

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
    "diloco-mlp-docs": ["--model", "mlp", "--span", "8", "--corpus", "docs",
                        "--compression", "topk-0.05-c256-2bit-b0.95-senders", "--outer-lr", "1",
                        "--outer-momentum", "0"],
}


def _run(rank, world, argv):
    records, final, _, global_final = train.main(argv)
    return records, final.numpy().tobytes(), global_final.numpy().tobytes()


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
    assert out[0][2] == out[1][2], "the ranks' global models differ"
    if name != "postlocal":  # its ranks hold models of their own between averagings
        assert out[0][1] == out[1][1], "the ranks' models differ"


def test_mlp_predicts_each_byte_from_the_span_before_it_alone():
    torch.manual_seed(0)
    span = 5
    model = train.ByteMLP(layers=2, width=16, span=span, embed=4)
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        t = int(torch.randint(1, 24, (1,), generator=g))
        x = torch.randint(0, 256, (3, t), generator=g)
        at = int(torch.randint(0, t, (1,), generator=g))  # one byte changed: positions it may reach move only
        y = x.clone()
        y[:, at] = (y[:, at] + 1 + torch.randint(0, 255, (3,), generator=g)) % 256
        moved = (model(x) - model(y)).abs().amax(dim=(0, 2)) > 0
        assert moved.tolist() == [at <= p < at + span for p in range(t)], (seed, t, at)


def test_quality_holds_each_arm_to_the_float32_arm_named_for_its_kind(tmp_path, capsys):
    import quality
    losses = {"diloco-h30+outer-lr=1+outer-momentum=0": 2.0, "diloco-h30-sparse0.01-senders": 2.1,
              "diloco-h30-stream+alpha=0": 3.0, "diloco-h30-stream-sparse0.01-senders+alpha=0": 2.7,
              "diloco-h30": 1.0}
    (tmp_path / "none").mkdir()
    for arm, loss in losses.items():
        rec = {"step": 60, "of": 60, "val_loss": loss, "bytes_sent": 1000}
        (tmp_path / "none" / f"{arm}.jsonl").write_text(json.dumps(rec) + "\n")

    def vs(argv):
        quality.main([str(tmp_path)] + argv)
        rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| diloco")]
        return {r[0][2:]: r[3] for r in rows}
    default = vs([])
    assert default["diloco-h30-sparse0.01-senders"] == "+110.00 %"  # against diloco-h30
    assert default["diloco-h30-stream-sparse0.01-senders+alpha=0"] == "-"  # no diloco-h30-stream ran
    chosen = vs(["--float32", "diloco-h30+outer-lr=1+outer-momentum=0", "--float32", "diloco-h30-stream+alpha=0"])
    assert chosen["diloco-h30-sparse0.01-senders"] == "+5.00 %"
    assert chosen["diloco-h30-stream-sparse0.01-senders+alpha=0"] == "-10.00 %"
    assert chosen["diloco-h30"] == "-50.00 %"
    with pytest.raises(SystemExit):  # two references for one kind
        quality.main([str(tmp_path), "--float32", "diloco-h30", "--float32", "diloco-h30+outer-lr=1"])


def test_the_two_corpora_split_apart_and_differ():
    for split in (train.stdlib_split, train.docs_split):
        tr, va = split()
        assert tr.numel() > 4 * va.numel() > 0
        assert bytes(va[:200].tolist()) not in bytes(tr.tolist())
    assert bytes(train.docs_split()[0][:64].tolist()) not in bytes(train.stdlib_split()[0].tolist())


def test_stop_at_ends_both_ranks_at_the_first_evaluation_on_target():
    out = run_ranks(_run, 2, (TINY + ["--arm", "diloco", "--stop-at", str(math.log(256))],))
    assert [[r["step"] for r in rank[0]] for rank in out] == [[10], [10]]
    out = run_ranks(_run, 2, (TINY + ["--arm", "ddp", "--stop-at", "0"],))
    assert [r["step"] for r in out[0][0]] == [10, 20]  # never on target: the whole run


def _lighthouses(tag):
    """The pids of torchft lighthouses still running that carry `tag` in their environment (started under this
    test: another suite's lighthouse, on the same port, may be running at the same time)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(c.endswith(b"torchft_lighthouse") for c in cmd) and f"COMMSGD_TEST_TAG={tag}".encode() in env:
            found.append(int(pid))
    return found


def _run_leaving_nothing(args):
    """run_ranks(_run, 2, args), then: train.py's lighthouse ended with the rank that started it (the ranks
    were forked, so they end without atexit, as a killed rank does)."""
    tag = f"diloco_lm-{os.getpid()}-{time.monotonic_ns()}"
    os.environ["COMMSGD_TEST_TAG"] = tag
    try:
        out = run_ranks(_run, 2, args)
    finally:
        del os.environ["COMMSGD_TEST_TAG"]
    for _ in range(50):
        if not _lighthouses(tag):
            return out
        time.sleep(0.1)
    raise AssertionError(f"a torchft lighthouse outlived its run: pids {_lighthouses(tag)}")


def _running(pid):
    """Whether pid is a process that has not ended (a zombie nobody reaped has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("ending", ["exit without atexit", "killed"])
def test_a_helper_started_as_the_lighthouse_is_ends_with_its_parent(ending):
    """train.py starts the lighthouse with _die_with_parent: whichever way the rank that started it ends, as a
    forked rank does (os._exit, no atexit) or a killed one, the helper ends too, without anyone reaping it."""
    read, write = os.pipe()
    parent = os.fork()
    if parent == 0:  # the rank: starts the helper, reports its pid, ends
        try:
            os.close(read)
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                      preexec_fn=train._die_with_parent())
            os.write(write, f"{helper.pid}".encode())
        finally:
            if ending == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        reported = f.read()
    os.waitpid(parent, 0)
    assert reported, "the rank did not start its helper"
    helper = int(reported)
    for _ in range(100):
        if not _running(helper):
            return
        time.sleep(0.05)
    os.kill(helper, signal.SIGKILL)
    raise AssertionError(f"the helper outlived its parent ({ending}) by 5 s")


def test_torchft_diloco_arm():
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip(f"torchft needs torch 2 (this is torch {torch.__version__}): the newest-torch suite runs it")
    import torchft  # noqa: F401  (missing: the suite fails, as run_pytest.py fails any skip for want of it)
    out = _run_leaving_nothing((TINY + ["--arm", "torchft-diloco"],))
    records = out[0][0]
    assert [r["step"] for r in records] == [10, 20]
    losses = [r["val_loss"] for r in records]
    assert all(math.isfinite(v) for v in losses) and losses[1] < losses[0], losses
    assert out[0][2] == out[1][2], "the ranks' global models differ"
    # train.py counts the tensors torchft hands its gloo group. The cost of five outer steps of H = 4 in 20
    # steps, each a ring all-reduce of the float32 model among 2 replicas: 2 (n - 1) / n = 1 of it a step.
    # Fewer syncs, another precision or an extra collective of torchft's would move the measured bytes.
    nbytes = 4 * sum(p.numel() for p in train.ByteLM(1, 32, 2, 32).parameters())
    assert [r["bytes_sent"] for r in records] == [2 * nbytes, 5 * nbytes], (records, nbytes)


def _train_ft_failing(rank, world, argv, fail_at):
    """train_ft.py's replica `rank` (not the group run_ranks made: train_ft.py's replicas have none), with
    every all-reduce torchft's gloo group is handed during inner step `fail_at` raising, as a group whose peer
    died does: torchft reports it to the Manager and the sync does not commit. Returns the replica's log and
    the step of each batch it trained on."""
    import torchft
    import train_ft
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")
    batches = []
    rows = train.batch_rows

    def batch_rows(data, step, *rest):
        batches.append(step)
        return rows(data, step, *rest)

    class FailingGloo(torchft.ProcessGroupGloo):
        def allreduce(self, tensors, opts):
            if len(batches) == fail_at:
                raise RuntimeError(f"injected: the all-reduce of inner step {fail_at} failed")
            return super().allreduce(tensors, opts)
    train.batch_rows, torchft.ProcessGroupGloo = batch_rows, FailingGloo
    log = argv[argv.index("--log") + 1]
    train_ft.main(argv)
    with open(f"{log}.rank{rank}.jsonl") as f:
        return [json.loads(line) for line in f], batches


def test_train_ft_torchft_arm_counts_a_failed_syncs_steps_once(tmp_path):
    """train_ft.py's torchft arm, 2 replicas, 20 steps of H = 4, the third sync failing on both: torchft drops
    that round's steps (it puts the model back to the common one), so each replica takes steps 9-12 again on
    the same batches, computes 24 steps, delivers 20, commits 5 syncs and ends at step 20 (not earlier, as a
    count that kept the dropped steps would)."""
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip(f"torchft needs torch 2 (this is torch {torch.__version__}): the newest-torch suite runs it")
    import torchft  # noqa: F401  (missing: the suite fails)
    argv = ["--arm", "torchft-diloco", "--steps", "20", "--sync-every", "4", "--eval-every", "10",
            "--eval-windows", "4", "--batch", "4", "--context", "16", "--layers", "1", "--width", "16",
            "--heads", "2", "--lr-warmup", "2", "--log", str(tmp_path / "run")]
    out = run_ranks(_train_ft_failing, 2, (argv, 12))
    for rank, (records, batches) in enumerate(out):
        assert batches == list(range(12)) + list(range(8, 20)), (rank, batches)
        end = records[-1]
        assert end["event"] == "end", records[-1]
        counts = (end["step"], end["taken"], end["delivered"], end["committed"], end["failed"])
        assert counts == (20, 24, 20, 5, 1), end
        rounds = [(r["step"], r["committed"], r["failed"], r["delivered"]) for r in records if r["event"] == "round"]
        # A line when a count moves: the first step, then each sync, the failed one back at step 8.
        assert rounds == [(1, 0, 0, 0), (4, 1, 0, 4), (8, 2, 0, 8), (8, 2, 1, 8), (12, 3, 1, 12),
                          (16, 4, 1, 16), (20, 5, 1, 20)], (rank, rounds)


def test_torchft_steps_count_a_heal_as_no_delivery():
    """train_ft.TorchftSteps alone, on the Manager's steps a replica sees: commits of one, a failed sync (no
    move), and a heal inside a sync (a jump of more than one: its steps were replaced by a peer's model)."""
    import train_ft
    c = train_ft.TorchftSteps(3)
    seen = []
    script = [(0, 0, 1), (0, 0, 2), (0, 1, 0),  # a round committed
              (1, 1, 1), (1, 1, 2), (1, 1, 0),  # a round failed: back to step 3
              (1, 1, 1), (1, 1, 2), (1, 3, 0),  # healed to the others' step 3 of H
              (3, 3, 1)]
    for before, after, local in script:
        c.after_step(before, after, local)
        seen.append((c.done(after), c.delivered, c.failed))
    assert seen == [(1, 0, 0), (2, 0, 0), (3, 3, 0), (4, 3, 0), (5, 3, 0), (3, 3, 1), (4, 3, 1), (5, 3, 1),
                    (9, 3, 1), (10, 3, 1)], seen


def test_torchft_steps_streamed():
    """train_ft.TorchftSteps with 2 fragments, H = 8 (a period of 4) and a delay of 1: fragment f = the
    Manager's step mod 2 leaves at the period's third step carrying the steps since its parameters were last
    set (the delay step after it is merged away), is applied at the fourth; a failed sync delivers nothing
    and retakes the period; a heal at a quorum replaces every fragment's steps."""
    import train_ft
    c = train_ft.TorchftSteps(8, fragments=2, delay=1)
    script = [(0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 1, 0),  # fragment 0: leaves with 3 steps, commits
              (1, 1, 1), (1, 1, 2), (1, 1, 3), (1, 2, 0),  # fragment 1: 7 steps since the start, commits
              (2, 2, 1), (2, 2, 2), (2, 2, 3), (2, 2, 0),  # fragment 0: 4 + 3 steps, fails
              (2, 2, 1), (2, 2, 2), (2, 2, 3), (2, 3, 0),  # fragment 0 again: 3 steps, commits
              (3, 3, 1), (3, 3, 2), (3, 5, 3), (5, 6, 0)]  # healed at fragment 1's quorum to step 5
    seen = []
    for before, after, local in script:
        c.after_step(before, after, local)
        seen.append((c.done(after), tuple(c.delivered_by), c.failed))
    assert [s[0] for s in seen] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 8, 9, 10, 11, 12, 13, 14, 23, 24], seen
    assert seen[3][1:] == ((3, 0), 0) and seen[7][1:] == ((3, 7), 0)
    assert seen[11][1:] == ((3, 7), 1) and seen[15][1:] == ((6, 7), 1)
    assert seen[-1][1:] == ((6, 7), 1) and c.delivered == 6
    assert c.since == [1, 0], c.since  # the heal set both from the peer's model, the sync fragment 1 again


def test_torchft_and_commsgd_diloco_agree_without_compression():
    """torchft's DiLoCo (init_sync off: every replica starts from the same model, as ours broadcasts it) and
    commsgd's, float32 pseudo-gradients, one fragment, the same outer Nesterov SGD: the same global model at
    every evaluation, so a head-to-head between them compares the systems, not two algorithms."""
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip(f"torchft needs torch 2 (this is torch {torch.__version__}): the newest-torch suite runs it")
    opts = TINY + ["--outer-lr", "0.7", "--outer-momentum", "0.9"]
    ours = run_ranks(_run, 2, (opts + ["--arm", "diloco"],))
    theirs = run_ranks(_run, 2, (opts + ["--arm", "torchft-diloco"],))
    a = [r["val_loss"] for r in ours[0][0]]
    b = [r["val_loss"] for r in theirs[0][0]]
    assert len(a) == len(b) == 2
    assert all(abs(x - y) <= 1e-4 for x, y in zip(a, b)), (a, b)
    # And the global models themselves, to float rounding (the two sum and step in their own orders; here
    # 1.4e-5 at most after five outer steps, on weights of about 0.1).
    x = torch.frombuffer(bytearray(ours[0][2]), dtype=torch.float32)
    y = torch.frombuffer(bytearray(theirs[0][2]), dtype=torch.float32)
    assert x.shape == y.shape and torch.allclose(x, y, rtol=0, atol=1e-4), (x - y).abs().max().item()


def _fsdp2():
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip(f"FSDP2 needs torch 2 (this is torch {torch.__version__}): the newest-torch suite runs it")


def test_fsdp2_replicas_under_diloco_and_fsdp2_over_every_rank():
    """4 ranks: 2 replicas of 2 FSDP2 ranks under DiLoCo (int8, streamed), and FSDP2 over all 4 (DDP's step,
    sharded: its losses are DDP's to float rounding)."""
    _fsdp2()
    opts = TINY + ["--batch", "16"]
    out = run_ranks(_run, 4, (opts + ["--arm", "diloco", "--replica-ranks", "2", "--compression", "int8",
                                      "--fragments", "2", "--delay", "1"],))
    losses = [r["val_loss"] for r in out[0][0]]
    assert all(math.isfinite(v) for v in losses) and losses[1] < losses[0] < math.log(256), losses
    assert all(o[2] == out[0][2] for o in out), "the ranks' global models differ"
    assert out[0][0][-1]["bytes_sent"] > 0
    fsdp = run_ranks(_run, 4, (opts + ["--arm", "fsdp"],))
    ddp = run_ranks(_run, 4, (opts + ["--arm", "ddp"],))
    a, b = [r["val_loss"] for r in fsdp[0][0]], [r["val_loss"] for r in ddp[0][0]]
    assert all(abs(x - y) <= 1e-4 for x, y in zip(a, b)) and len(a) == 2, (a, b)
    assert all(o[1] == fsdp[0][1] for o in fsdp), "FSDP2's ranks hold different models"


_NATIVE_HSDP = {}  # FSDP2's own HSDP run, the same for every family: run once, by its options


@pytest.mark.parametrize("replicate", ["fp16", "powersgd", "topk", "auto"])
def test_hsdp_arm_through_a_hook_family(replicate):
    """4 ranks, 2 replicas of 2 FSDP2 ranks, the replicas' gradient average through commsgd_torch.hsdp: the loss
    falls, every rank ends with the same whole model, the hook's bytes are counted and fewer than FSDP2's own
    HSDP's float32 all-reduce (run beside it: fp16 half of them, to headers; auto's are not counted)."""
    _fsdp2()
    opts = TINY + ["--batch", "16", "--arm", "hsdp", "--replica-ranks", "2", "--psgd-rank", "2", "--density", "0.1"]
    out = run_ranks(_run, 4, (opts + ["--replicate", replicate],))
    if tuple(opts) not in _NATIVE_HSDP:
        _NATIVE_HSDP[tuple(opts)] = run_ranks(_run, 4, (opts + ["--replicate", "float32"],))
    native = _NATIVE_HSDP[tuple(opts)]
    losses = [r["val_loss"] for r in out[0][0]]
    assert all(math.isfinite(v) for v in losses) and losses[1] < losses[0] < math.log(256), losses
    assert all(o[1] == out[0][1] for o in out), "the replicas' models differ"
    ours, theirs = out[0][0][-1]["bytes_sent"], native[0][0][-1]["bytes_sent"]
    if replicate == "auto":  # AutoState's rounds are PyTorch's collectives: train.py does not count them
        assert ours is None and theirs > 0
        return
    assert 0 < ours < theirs, (ours, theirs)
    if replicate == "fp16":
        assert abs(ours / theirs - 0.5) < 0.01, (ours, theirs)
        a = [r["val_loss"] for r in native[0][0]]
        assert all(abs(x - y) <= 1e-3 for x, y in zip(a, losses)), (a, losses)


def test_torchft_and_commsgd_diloco_agree_on_fsdp2_replicas():
    """The same head-to-head on 2 replicas of 2 FSDP2 ranks: torchft's DiLoCo with a Manager per rank (its
    group of a rank: that rank of each replica) and commsgd's (each rank's shards with its counterparts) hold
    the same global model to float rounding, and each charges a replica half its model's ring per rank."""
    _fsdp2()
    import torchft  # noqa: F401
    opts = TINY + ["--batch", "16", "--outer-lr", "0.7", "--outer-momentum", "0.9", "--replica-ranks", "2"]
    ours = run_ranks(_run, 4, (opts + ["--arm", "diloco"],))
    theirs = run_ranks(_run, 4, (opts + ["--arm", "torchft-diloco"],))
    a = [r["val_loss"] for r in ours[0][0]]
    b = [r["val_loss"] for r in theirs[0][0]]
    assert len(a) == len(b) == 2 and all(abs(x - y) <= 1e-4 for x, y in zip(a, b)), (a, b)
    x = torch.frombuffer(bytearray(ours[0][2]), dtype=torch.float32)
    y = torch.frombuffer(bytearray(theirs[0][2]), dtype=torch.float32)
    assert x.shape == y.shape and torch.allclose(x, y, rtol=0, atol=1e-4), (x - y).abs().max().item()
    # Both count rank 0's float32 ring over 2 replicas of its shards: the same bytes.
    assert ours[0][0][-1]["bytes_sent"] == theirs[0][0][-1]["bytes_sent"] > 0


def test_ft_report_counts_every_tail_and_names_the_lost_replica(tmp_path):
    """Goodput over the whole run: a replica whose last incarnation never ended is named lost, and its last
    record, not the last end, closes the wall time; speed (steps taken) and goodput (steps delivered) apart."""
    import ft_report
    logs = {0: [{"event": "start", "t": 100.0, "step": 0}, {"event": "round", "t": 110.0, "step": 30, "replicas": 2,
                                                            "committed": 1, "hash": "a", "delivered": 30, "taken": 30},
                {"event": "end", "t": 150.0, "step": 60, "delivered": 60, "taken": 60}],
            1: [{"event": "start", "t": 101.0, "step": 0}, {"event": "round", "t": 110.5, "step": 30, "replicas": 2,
                                                            "committed": 1, "hash": "a", "delivered": 30, "taken": 30},
                {"event": "start", "t": 130.0, "step": 30, "incarnation": 1},
                {"event": "round", "t": 170.0, "step": 40, "replicas": 1, "committed": 2, "hash": "b",
                 "delivered": 5, "taken": 10, "incarnation": 1}]}
    for rank, recs in logs.items():
        with open(tmp_path / f"run.rank{rank}.jsonl", "w") as f:
            for r in recs:
                f.write(json.dumps(dict({"rank": rank, "incarnation": 0}, **r)) + "\n")
    s = ft_report.summarise(ft_report.load_run(str(tmp_path)), 2)
    assert s["wall"] == pytest.approx(70.0)  # to the lost replica's last record (170), not the last end (150)
    assert s["lost"] == [(1, 70.0, 40)]
    assert s["delivered"] == 60 + 30 + 5 and s["taken"] == 60 + 30 + 10
    assert s["goodput"] == pytest.approx(95 / (2 * 70.0)) and s["speed"] == pytest.approx(100 / (2 * 70.0))


def test_ft_report_counts_the_rounds_a_returned_replica_waited():
    """From faults.py's events: a restarted replica back at its first commit after the restart, a cut-off one
    at its first commit after the cable came back; the rounds another replica committed meanwhile."""
    import ft_report

    def rnd(rank, t, committed, inc=0):
        return {"rank": rank, "incarnation": inc, "event": "round", "t": t, "committed": committed}
    recs = [rnd(0, t, c) for c, t in enumerate([10, 20, 30, 40, 50, 60, 70], 1)]
    recs += [rnd(1, 10, 1), rnd(1, 14, 2), rnd(1, 34, 0, 1), rnd(1, 55, 1, 1)]  # restarted at 15: back at 55
    recs += [{"rank": 1, "incarnation": 1, "event": "start", "t": 33}]  # the new process up at 33
    recs += [rnd(2, 10, 1), rnd(2, 20, 2), rnd(2, 44, 2), rnd(2, 62, 3)]  # cable up at 41: back at 62
    restart = {"event": "restart", "rank": 1, "unix": 15.0, "restarts": 1}
    cable = {"event": "cable_up", "rank": 2, "unix": 41.0}
    assert ft_report.rounds_to_return(recs, [restart]) == 4  # rank 0's rounds at 20, 30, 40, 50
    assert ft_report.rounds_to_return(recs, [cable]) == 2  # at 50, 60
    assert ft_report.rounds_to_return(recs, [restart, cable]) == 4
    assert ft_report.rounds_to_return(recs, [restart], from_start=True) == 2  # at 40, 50: after it was up
    assert ft_report.rounds_to_return(recs, [cable], from_start=True) == 2  # a cable's return is its own
    unstarted = [r for r in recs if r["event"] != "start"]
    assert ft_report.rounds_to_return(unstarted, [restart], from_start=True) == float("inf")
    assert ft_report.rounds_to_return(recs, [{"event": "restart", "rank": 2, "unix": 65.0, "restarts": 1}]) == \
        float("inf")
    assert ft_report.rounds_to_return(recs, []) is None


def test_ft_report_counts_rounds_short_of_a_live_replica_outside_the_faults():
    """A round with a replica missing counts only outside every fault's window (a kill until the restarted
    replica's first commit, a cable until the cut-off one's first commit after it came back)."""
    import ft_report

    def rnd(rank, t, committed, replicas, inc=0):
        return {"rank": rank, "incarnation": inc, "event": "round", "t": t, "committed": committed,
                "replicas": replicas}
    recs = [rnd(0, 5, 0, 0)]  # before any quorum: not a short round
    recs += [rnd(0, t, c, 3 if t in (20, 30, 60, 80) else 4) for c, t in enumerate(range(10, 100, 10), 1)]
    recs += [rnd(1, 12, 1, 4), rnd(1, 31, 0, 3, 1), rnd(1, 35, 1, 3, 1)]  # killed at 15, back at 35
    recs += [rnd(2, 50, 4, 4), rnd(2, 85, 5, 4)]  # cable down at 75, up at 82, back at 85
    events = [{"event": "kill", "rank": 1, "unix": 15.0}, {"event": "restart", "rank": 1, "unix": 25.0,
                                                           "restarts": 1},
              {"event": "cable_down", "rank": 2, "unix": 75.0}, {"event": "cable_up", "rank": 2, "unix": 82.0}]
    assert ft_report.fault_windows(recs, events) == [(15.0, 35), (75.0, 85)]
    assert ft_report.rounds_short(recs, events, 4) == 1  # 20, 30 and 80 lie in a window, 60 does not
    assert ft_report.rounds_short(recs, [], 4) == 4  # fault-free: every short round counts
    assert ft_report.rounds_short([{"rank": 0, "event": "round", "t": 1}], [], 4) is None  # no counts logged
