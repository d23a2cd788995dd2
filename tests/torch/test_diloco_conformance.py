"""One DiLoCo across the binding: commsgd_torch.DiLoCo on 2 forked ranks over gloo, and the C++ engine
(sync::diloco) on 2 thread ranks over comm::local fed the same inner steps, hold the same global model bits and
the same byte counts after every step, for every code, one fragment and two with a delay. The torch run's
bytes are also those its comm::metered counted (point-to-point messages as sent, collectives charged by
comm/traffic.hpp's rules), and those the codes' sizes (sync/diloco_codes.hpp) predict. That the rules are the bytes
that travel is measured in C++, where comm::over_messages runs the collectives out of counted messages
(tests/unit/sync_diloco_code.cpp, tests/conformance/cases.hpp, over comm::process_group too)."""
import io

import pytest
import torch
import torch.distributed as dist

import commsgd_torch
from commsgd_torch import _C
from helpers import run_ranks

STEPS = 23
# Top-k as SparseLoCo runs it (chunks, 2-bit values, a decayed residual), and with the mean over the senders:
# the plain "topk-<density>" is the same compressor with one chunk and float values, held to the engine in C++
# (tests/unit/sync_diloco_code.cpp).
CODES = ["dense", "fp16", "bf16", "int8", "e3m0", "topk-0.2-c16-2bit-b0.95", "topk-0.2-c16-2bit-b0.95-senders",
         "topk-0.2-c16-b0.95-shared", "topk-0.2-c16-b0.95-regions"]


class _Net(torch.nn.Module):
    """Three layers of odd sizes (one fragment each when strided with P = 3, two or one otherwise)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(7, 5)
        self.b = torch.nn.Linear(5, 3, bias=False)
        self.c = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


class _Recording(torch.optim.AdamW):
    """AdamW that calls `after()` once its step is taken: the test snapshots the local model there, which is
    what the engine sees when DiLoCo.step() calls it."""

    after = None

    def step(self, closure=None):
        out = super().step(closure)
        if self.after is not None:
            self.after()
        return out


def _run(rank, world, code, fragments, delay, alpha, where="cpu", keep=False):
    """One rank of DiLoCo; `where`: "cpu" (parameters in place), "cpu-copy" (the host-copy path CUDA
    parameters take), "cuda" (the device round where the code has one) or "cuda-copy" (the host engine)."""
    if where == "cpu-copy":
        commsgd_torch.DiLoCo._IN_PLACE = False
    device = "cuda" if where.startswith("cuda") else "cpu"
    torch.manual_seed(100 + rank)  # different starts: construction must broadcast rank 0's
    model = _Net().to(device)
    inner = _Recording(model.parameters(), lr=0.05)
    opt = commsgd_torch.DiLoCo(model, inner, sync_every=4, fragments=fragments, delay=delay, alpha=alpha,
                               compression=code, keep_delay_steps=keep,
                               device_round=False if where == "cuda-copy" else None)
    flat = lambda: torch.cat([p.detach().reshape(-1) for p in opt._order]).cpu()  # noqa: E731 (engine's order)
    snaps = [flat().clone()]
    inner.after = lambda: snaps.append(flat().clone())
    globals_, sent = [], []
    g = torch.Generator().manual_seed(7 + rank)
    for _ in range(STEPS):
        x = torch.randn(16, 7, generator=g).to(device)
        opt.zero_grad()
        ((model(x) - x.sum(1, keepdim=True)) ** 2).mean().backward()
        opt.step()
        globals_.append(torch.cat([g_.reshape(-1).cpu() for g_ in opt.global_parameters()]))
        sent.append(opt.bytes_sent)
    layers = [sum(p.numel() for p in m.parameters(recurse=False)) for m in (model.a, model.b, model.c)]
    stats = opt.stats()
    opt.finish()  # every exchange completed: the engine has counted all it sent
    measured = (opt._engine.traffic()["bytes_sent"] - opt.stats()["broadcast_bytes"], opt.bytes_sent)
    device_round = opt.device_round
    code_taken = opt.compression
    inner.after = None  # the snapshot's closure holds opt: without it opt ends here, before the group does
    opt.close()
    del opt
    buf = io.BytesIO()
    torch.save({"snaps": torch.stack(snaps), "globals": torch.stack(globals_), "sent": torch.tensor(sent),
                "layers": layers, "measured": measured, "stats": stats, "device_round": device_round,
                "code": code_taken}, buf)
    return buf.getvalue()


def _expected_bytes(code, layers, fragments, exchanges_per_fragment, world=2):
    """What rank 0 sends, from the codes' sizes: each fragment's exchanges times one round's traffic."""
    lengths = [sum(layers[l] for l in range(len(layers)) if l % fragments == f) for f in range(fragments)]
    total = 0
    for length, count in zip(lengths, exchanges_per_fragment):
        for i in range(count):
            t = _C.diloco_round_traffic(code, length, world, 0, i == 0)
            total += t["bytes_sent"]
    return total


def check_agreement(runs, code, fragments, delay, alpha, keep=False):
    """The torch runs' global models and byte counts against the engine on threads fed their inner steps."""
    layers = runs[0]["layers"]
    want = _C.diloco_over_threads([r["snaps"] for r in runs], layers, 4, fragments, delay, alpha, "strided",
                                  0.7, 0.9, code, keep_delay_steps=keep)
    for rank, (run, (globals_, sent)) in enumerate(zip(runs, want)):
        assert run["globals"].shape == globals_.shape
        for step in range(STEPS):
            assert torch.equal(run["globals"][step].view(torch.int32), globals_[step].view(torch.int32)), \
                f"rank {rank}, after inner step {step + 1}"
            assert int(run["sent"][step]) == int(sent[step]), f"rank {rank}, after inner step {step + 1}"
        # The engine's count is what the communicator's meter counted.
        wire, counted = run["measured"]
        assert wire == counted and counted >= int(run["sent"][-1])
    # Every rank holds one global model.
    for run in runs[1:]:
        assert torch.equal(runs[0]["globals"].view(torch.int32), run["globals"].view(torch.int32))
    # And the bytes are those the codes' sizes predict: fragment p's exchanges start after steps t_p + k H.
    applied = [len([s for s in range(1, STEPS + 1) if s - delay >= max(1, f * 4 // fragments) and
                    (s - delay - f * 4 // fragments) % 4 == 0]) for f in range(fragments)]
    assert runs[0]["stats"]["outer_steps"] == sum(applied)
    assert int(runs[0]["sent"][-1]) == _expected_bytes(code, layers, fragments, applied, len(runs))


def _run_codes(rank, world, codes, fragments, delay, alpha, where, keep):
    """_run for each code in turn on the same two processes (starting them is most of a run's cost)."""
    return [_run(rank, world, code, fragments, delay, alpha, where, keep) for code in codes]


# (fragments, delay, alpha, keep_delay_steps): unstreamed; streamed with either merge.
@pytest.mark.parametrize("fragments,delay,alpha,keep", [(1, 0, 0.0, False), (2, 2, 0.5, False), (2, 2, 0.0, True)])
@pytest.mark.parametrize("where", ["cpu", "cpu-copy"])
def test_torch_class_and_cpp_engine_agree_bit_for_bit(fragments, delay, alpha, keep, where):
    by_rank = run_ranks(_run_codes, 2, (CODES, fragments, delay, alpha, where, keep))
    failed = []
    for i, code in enumerate(CODES):
        runs = [torch.load(io.BytesIO(r[i])) for r in by_rank]
        try:
            check_agreement(runs, code, fragments, delay, alpha, keep)
        except AssertionError as e:
            failed.append(f"{code}: {e}")
    assert not failed, "\n".join(failed)


def test_code_names_and_sizes_come_from_the_engine():
    assert commsgd_torch.COMPRESSIONS == ("dense", "fp16", "bf16", "int8", "e3m0",
                                          "topk-<density>[-c<chunk>][-2bit][-b<decay>][-senders]",
                                          "topk-<density>[-c<chunk>][-b<decay>]-shared",
                                          "topk-<density>[-c<chunk>][-b<decay>]-regions",
                                          "topk-<density>[-c<chunk>][-b<decay>]-fit<fit>")
    for d in (0, 1, 255, 256, 257, 10_000):
        blocks = (d + 255) // 256
        assert _C.diloco_message_bytes("dense", d) == 4 * d
        assert _C.diloco_message_bytes("fp16", d) == 2 * d
        assert _C.diloco_message_bytes("int8", d) == 4 * blocks + d
        assert _C.diloco_message_bytes("e3m0", d) == 4 * blocks + (d + 1) // 2
    # Seven floats and seven 7-bit indices; in chunks of 64 (k = 5 and 3), two scales, 2-bit values and
    # 6-bit indices.
    assert _C.diloco_message_bytes("topk-0.07", 100) == 4 * 7 + 7
    assert _C.diloco_message_bytes("topk-0.07-c64-2bit", 100) == 2 * 4 + 2 + 6
    assert _C.diloco_code_name("topk-0.25") == "topk-0.25"
    assert _C.diloco_code_name("topk-0.01-b0.95-2bit-c4096") == "topk-0.01-c4096-2bit-b0.95"
    # The shared code: 16-bit values and 6-bit indices of 5 + 3 values; its round a ring and the slots.
    assert _C.diloco_code_name("topk-0.07-shared-c64") == "topk-0.07-c64-shared"
    assert _C.diloco_message_bytes("topk-0.07-c64-shared", 100) == 2 * 8 + 6
    assert _C.diloco_message_bytes("topk-0.07-c64-regions", 100) == 2 * 8 + 6
    for bad in ("fp4", "int8_block", "topk:0.1", "topk-0", "none", "", "topk-0.1-b2", "topk-0.1-c0",
                "topk-0.1-2bit-shared", "topk-0.1-senders-shared", "topk-0.1-shared-regions", "topk-0.1-fit0.5",
                "topk-0.1-2bit-fit10", "topk-0.1-fit10-senders", "topk-0.1-fit10-regions", "topk-0.1-fitnan"):
        with pytest.raises(commsgd_torch.InvalidArgument, match="compression"):
            _C.diloco_code_name(bad)
    # DiLoCo's refusal of a name lists the engine's forms, each of them.
    with pytest.raises(ValueError) as refused:
        commsgd_torch.diloco._code_name("fp4")
    for form in commsgd_torch.COMPRESSIONS:
        assert f"'{form}'" in str(refused.value)
    assert "a density in (0, 1]" in str(refused.value)
    # The ring's traffic: 2 (n - 1) chunks each way.
    t = _C.ring_all_reduce_traffic(1000, 4, 4, 0)
    assert t["bytes_sent"] == 2 * 3 * 250 * 4 and t["messages_sent"] == 6
    assert _C.all_gather_traffic(10, 4)["bytes_sent"] == 30



def test_a_fit_code_runs_the_code_it_chose_bit_for_bit():
    """The model's 59 values: on 2 ranks a budget of 3x takes the gathered code (3.47x below the ring, the
    region sums 2.95x); on 4 ranks one of 1.9x the region sums (1.97x, the gathered code 1.74x)."""
    for world, fit, want in ((2, "topk-0.2-c16-b0.95-fit3", "topk-0.2-c16-2bit-b0.95-senders"),
                             (4, "topk-0.2-c16-b0.95-fit1.9", "topk-0.2-c16-b0.95-regions")):
        assert _C.diloco_code_chosen(fit, 59, world) == want
        by_rank = run_ranks(_run_codes, world, ([fit, want], 2, 2, 0.0, "cpu", True))
        runs = [[torch.load(io.BytesIO(r[i])) for r in by_rank] for i in range(2)]
        for a, b in zip(*runs):
            assert a["code"] == want and b["code"] == want
            assert torch.equal(a["globals"].view(torch.int32), b["globals"].view(torch.int32))
            assert torch.equal(a["sent"], b["sent"])
        check_agreement(runs[0], want, 2, 2, 0.0, True)
        # The engine on threads chooses alike.
        snaps, layers = [r["snaps"] for r in runs[0]], runs[0][0]["layers"]
        on_threads = [_C.diloco_over_threads(snaps, layers, 4, 2, 2, 0.0, "strided", 0.7, 0.9, code,
                                             keep_delay_steps=True) for code in (fit, want)]
        for (g_fit, s_fit), (g_want, s_want) in zip(*on_threads):
            assert torch.equal(g_fit.view(torch.int32), g_want.view(torch.int32)) and torch.equal(s_fit, s_want)
    # Past every budget either code meets, the choice is refused, naming what each reaches.
    with pytest.raises(commsgd_torch.InvalidArgument, match="the allowed fit here is at most 3.47"):
        _C.diloco_code_chosen("topk-0.2-c16-b0.95-fit50", 59, 2)
    with pytest.raises(commsgd_torch.InvalidArgument, match="ranks"):
        _C.diloco_code_chosen("topk-0.2-c16-fit3", 59, 0)
    with pytest.raises(commsgd_torch.InvalidArgument, match="take chosen"):
        _C.diloco_round_traffic("topk-0.2-c16-fit3", 59, 2, 0, False)
