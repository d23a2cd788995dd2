"""examples/diloco_lm/sim_codes.py, the model of the top-k codes' rounds in one process (no ranks): each variant
of the code does what its option claims, against the dense average, a hand-made step or the plain code. A tool of
the sparse codes' studies, not of the package: its suite runs on the newest torch only (run_pytest.py)."""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "diloco_lm"))
import train  # noqa: E402


def test_the_code_model_is_the_dense_average_at_density_1_and_moves_at_most_n_k_a_chunk():
    import sim_codes
    common = ["--n", "2", "--steps", "3", "--H", "3", "--eval-every", "3"]
    start, dense = sim_codes.main(common)
    _, whole = sim_codes.main(common + ["--code", "topk", "--density", "1", "--two-bit", "0", "--decay", "1"])
    assert torch.equal(whole, dense)  # every value sent: the senders' mean is the plain mean, bit for bit
    _, sparse = sim_codes.main(common + ["--code", "topk", "--density", "0.01", "--chunk", "4096"])
    moved = (sparse != start).reshape(-1)
    for c0 in range(0, moved.numel(), 4096):
        k = math.ceil(0.01 * min(4096, moved.numel() - c0))
        assert 0 < int(moved[c0:c0 + 4096].sum()) <= 2 * k  # the union of 2 replicas' k values, no more


def test_the_code_models_residual_variants_touch_only_what_they_claim():
    import sim_codes
    common = ["--steps", "6", "--H", "3", "--eval-every", "6", "--code", "topk", "--density", "0.02"]
    one = ["--n", "1"] + common

    def final(argv):
        return sim_codes.main(argv)[1]
    # One replica: the common step on its indices is its own message, so holding the residual against it is
    # holding it against the message, 2-bit values and all.
    assert torch.equal(final(one + ["--residual", "common"]), final(one))
    # Float values: the message is the accumulator where it was sent, so the residual is already 0 there and
    # clearing it there changes nothing; clearing anywhere else would.
    assert torch.equal(final(one + ["--two-bit", "0", "--residual", "clear"]), final(one + ["--two-bit", "0"]))
    # 2-bit values leave a remainder where they were sent, which clearing drops.
    assert not torch.equal(final(one + ["--residual", "clear"]), final(one))
    two = ["--n", "2"] + common
    assert not torch.equal(final(two + ["--residual", "common"]), final(two))


def test_the_code_models_union_and_local_momentum_variants():
    import sim_codes
    common = ["--steps", "3", "--H", "3", "--eval-every", "3", "--code", "topk", "--density", "0.02"]
    # One replica: the union of the picks is its own picks, so the union variant is the plain code (float
    # values: 2-bit scales are means taken in another order there).
    one = ["--n", "1", "--two-bit", "0"] + common
    assert torch.equal(sim_codes.main(one + ["--union", "1"])[1], sim_codes.main(one)[1])
    # Two replicas, one round: both move the model where either replica picked a value, with other values
    # (every replica's value there against the senders' alone).
    two = ["--n", "2"] + common
    start, plain = sim_codes.main(two)
    _, union = sim_codes.main(two + ["--union", "1"])
    assert torch.equal(plain != start, union != start)
    assert not torch.equal(plain, union)
    # Dense: each replica's own Nesterov step, averaged, is the common model's Nesterov step on the mean
    # (a linear identity), over rounds in which the momentum carries.
    dense = ["--n", "2", "--steps", "9", "--H", "3", "--eval-every", "9", "--outer-lr", "0.7"]
    _, local = sim_codes.main(dense + ["--local-momentum", "0.9"])
    _, outer = sim_codes.main(dense + ["--outer-momentum", "0.9"])
    _, none = sim_codes.main(dense)
    assert torch.allclose(local, outer, rtol=0, atol=1e-5)
    assert not torch.allclose(local, none, rtol=0, atol=1e-3)


def test_the_code_models_per_tensor_chunks_partial_subtraction_and_starting_ahead():
    import sim_codes
    common = ["--n", "2", "--steps", "3", "--H", "3", "--eval-every", "3", "--code", "topk", "--density", "0.01"]
    start, tensors = sim_codes.main(common + ["--per-tensor", "1"])
    moved, at = (tensors != start).reshape(-1), 0
    model = train.make_model(argparse.Namespace(model="transformer", layers=2, width=64, heads=4, context=64,
                                                span=16))
    for q in model.parameters():  # every tensor its own k a chunk: each moves, none by more than 2 replicas' k
        for c0 in range(at, at + q.numel(), 4096):
            c1 = min(c0 + 4096, at + q.numel())
            assert 0 < int(moved[c0:c1].sum()) <= 2 * math.ceil(0.01 * (c1 - c0)), (c0, c1)
        at += q.numel()
    assert at == moved.numel()
    # Every value sent as a float: what stays of it in the residual reaches the model from the second round on,
    # as the decayed half of the first round's step.
    one = common + ["--two-bit", "0", "--density", "1"]  # argparse keeps the last
    _, whole = sim_codes.main(one)
    assert torch.equal(sim_codes.main(one + ["--subtract", "0.5"])[1], whole)
    two = one + ["--steps", "6", "--eval-every", "6"]
    _, kept = sim_codes.main(two + ["--subtract", "0.5"])
    assert torch.allclose(kept - sim_codes.main(two)[1], 0.95 * 0.5 * (whole - start), rtol=0, atol=1e-6)
    # Starting ahead of the common model changes nothing before there is a last step to start ahead by.
    assert torch.equal(sim_codes.main(one + ["--ahead", "0.5"])[1], whole)
    assert not torch.equal(sim_codes.main(two + ["--ahead", "0.5"])[1], sim_codes.main(two)[1])


def test_the_code_models_flush_outer_weight_decay_and_velocity():
    import sim_codes
    one_round = ["--n", "2", "--steps", "3", "--H", "3", "--eval-every", "3"]
    # A flush sends every accumulator whole, and in the first round an accumulator is the pseudo-gradient: the
    # dense mean, bit for bit; from the second round on the residuals it sends make it another model.
    _, dense = sim_codes.main(one_round)
    topk = one_round + ["--code", "topk", "--density", "0.01"]
    assert torch.equal(sim_codes.main(topk + ["--flush", "1"])[1], dense)
    two_rounds = topk + ["--steps", "6", "--eval-every", "6"]
    assert not torch.equal(sim_codes.main(two_rounds + ["--flush", "1"])[1], sim_codes.main(two_rounds)[1])
    # The common model's decay: the same inner steps (no weight decay inside either way), so doubling the power
    # of the round's shrink moves the model by the start times shrink^2 - shrink, the schedule's own lrs (up to
    # float32's rounding of values near 1, 60 times below the largest such move here).
    start, wd1 = sim_codes.main(one_round + ["--outer-wd", "1"])
    _, wd2 = sim_codes.main(one_round + ["--outer-wd", "2"])
    shrink = math.prod(1 - 2e-3 * (s + 1) / 50 * 0.1 for s in range(3))
    assert torch.allclose(wd2 - wd1, start * (shrink**2 - shrink), rtol=0, atol=4e-7)
    assert float((start * (shrink**2 - shrink)).abs().max()) > 2e-5
    # Over one round the decay taken out of the inner steps is nearly the one they would have applied, but not
    # in the same arithmetic.
    assert torch.allclose(wd1, dense, rtol=0, atol=1e-5) and not torch.equal(wd1, dense)
    # One round of velocity: the running mean holds (1 - decay) of the step, so the step is 1 + c (1 - decay)
    # times the plain one.
    _, fast = sim_codes.main(one_round + ["--velocity", "2", "--velocity-decay", "0.75"])
    assert torch.allclose(fast - start, 1.5 * (dense - start), rtol=0, atol=1e-7)


def test_the_code_models_runs_of_values_fill_top_k_bits():
    import sim_codes
    one = ["--n", "1", "--steps", "3", "--H", "3", "--eval-every", "3", "--code", "topk", "--density", "0.01"]
    start, single = sim_codes.main(one)
    _, runs = sim_codes.main(one + ["--block", "4"])
    moved, plain, spans = runs != start, single != start, sim_codes.chunk_spans([start.numel()], 4096)
    picked = 0
    for c0, c1 in spans:
        k = math.ceil(0.01 * (c1 - c0))
        runs_in = math.ceil((c1 - c0) / 4)
        fit = k * (math.ceil(math.log2(c1 - c0)) + 2) // (math.ceil(math.log2(runs_in)) + 8)
        touched = moved[c0:c1].nonzero().flatten() // 4
        assert len(set(touched.tolist())) <= fit, (c0, fit)  # no more runs than the bits pay for
        picked += len(set(touched.tolist()))
        assert int(plain[c0:c1].sum()) <= k
    # Nearly every run paid for moves the model (a value of a run can be exactly 0), and top-k's bits buy three
    # times the values as runs of 4 (18 bits a run against 14 a value).
    assert picked >= 0.9 * sum(math.ceil(0.01 * (c1 - c0)) * 14 // 18 for c0, c1 in spans)
    assert int(moved.sum()) > 2.5 * int(plain.sum())


def test_the_code_models_adam_scores_pick_k_values_a_chunk_but_other_ones():
    import sim_codes
    one = ["--n", "1", "--steps", "3", "--H", "3", "--eval-every", "3", "--code", "topk", "--density", "0.01",
           "--two-bit", "0"]
    start, plain = sim_codes.main(one)
    spans = sim_codes.chunk_spans([start.numel()], 4096)
    for score in ("adam", "adam-m"):
        _, scored = sim_codes.main(one + ["--score", score])
        moved = scored != start
        for c0, c1 in spans:  # k values a chunk, as top-k's bytes, each moved by its own accumulator (float values)
            assert int(moved[c0:c1].sum()) <= math.ceil(0.01 * (c1 - c0))
        assert int(moved.sum()) >= 0.9 * sum(math.ceil(0.01 * (c1 - c0)) for c0, c1 in spans)
        assert not torch.equal(moved, plain != start), score  # the gradient's scale changes the picks
        same = moved & (plain != start)  # where both sent, both sent the value itself
        assert torch.equal(scored[same], plain[same])


def test_the_code_models_masked_momentum_moves_only_where_replicas_sent():
    import sim_codes
    rounds = ["--n", "2", "--steps", "9", "--H", "3", "--eval-every", "9", "--outer-lr", "0.7",
              "--outer-momentum", "0.9"]
    # Dense: every value moves every round, so the masked momentum is the plain Nesterov step, bit for bit.
    _, masked = sim_codes.main(rounds + ["--masked", "1"])
    _, plain = sim_codes.main(rounds)
    assert torch.equal(masked, plain)
    # The step by hand: value 0 moves every round (plain Nesterov), value 1 in rounds 1 and 3 (its buffer decayed
    # twice by then), value 2 never (no step, no buffer).
    mu, lr = 0.5, 0.7
    momentum, age = torch.zeros(3), torch.ones(3)
    schedule = [([1.0, 2.0, 4.0], [True, True, False]), ([1.0, 0.0, 4.0], [True, False, False]),
                ([1.0, 2.0, 4.0], [True, True, False])]
    steps = []
    for mean, moved in schedule:
        step, momentum, age = sim_codes.masked_nesterov(torch.tensor(mean), torch.tensor(moved), momentum, age,
                                                        lr, mu)
        steps.append(step)
    assert torch.allclose(steps[0], torch.tensor([lr * 1.5, lr * 3.0, 0.0]))
    assert torch.allclose(steps[1], torch.tensor([lr * (1 + mu * 1.5), 0.0, 0.0]))
    assert torch.allclose(steps[2], torch.tensor([lr * (1 + mu * (1 + mu * 1.5)), lr * (2 + mu * (2 + mu**2 * 2)),
                                                  0.0]))
    assert torch.equal(age, torch.tensor([1.0, 1.0, 4.0]))


def test_the_code_models_move_report_counts_the_models_share_and_its_repeats(capsys):
    import sim_codes
    rounds = ["--n", "2", "--steps", "20", "--H", "1", "--eval-every", "20", "--moves", "1"]
    sim_codes.main(rounds)  # dense: every value moves every round
    dense = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"round"' in line]
    assert [r["round"] for r in dense] == [10, 20] and all(r["moved"] == r["again"] == 1.0 for r in dense)
    start, _ = sim_codes.main(rounds + ["--code", "topk", "--density", "0.01"])
    sparse = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"round"' in line]
    spans = sim_codes.chunk_spans([start.numel()], 4096)
    most = 2 * sum(math.ceil(0.01 * (c1 - c0)) for c0, c1 in spans) / start.numel()
    assert all(0 < r["moved"] <= most and 0 <= r["again"] < 1 for r in sparse)  # at most the 2 replicas' picks
