"""commsgd_torch.fsdp: FSDP2's gradient reduce-scatter in int8 and e3m0 blocks, fp16 and bf16, with error
feedback, on 4
processes (gloo, a 1-D mesh of all ranks):

- every call's output is, bit for bit, a reference written here: each rank's input plus its residual coded part
  by part (a scale per block counted from the part's start), decoded, summed in rank order from +0 in float32,
  divided by the group's size for AVG;
- sent + new residual == input + old residual exactly, on every rank and module, every step;
- the bytes each call put on the wire, as the communicator counted them, are (n - 1) (40 + a part's message),
  and what cost/ says;
- a checkpoint of the model and the codes resumes bit for bit, and a state of another code is refused;
- bad options and a model without FSDP2 modules are refused, naming the argument.
"""
import pytest
import torch
import torch.distributed as dist

from helpers import FSDPModule, fully_shard, init_device_mesh, needs_fsdp2, run_ranks

pytestmark = needs_fsdp2()

WORLD = 4
BLOCK = 16


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(9, 13)  # 130 values: FSDP2 pads each parameter to a multiple of the ranks
        self.b = torch.nn.Linear(13, 5)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _sharded(seed=0):
    torch.manual_seed(seed)
    model = _Net()
    mesh = init_device_mesh("cpu", (WORLD,))
    fully_shard(model.a, mesh=mesh)
    fully_shard(model.b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _step(model, opt, rank, t):
    g = torch.Generator().manual_seed(1000 * t + rank)
    x = torch.randn(8, 9, generator=g)
    x[0, :3] = 0.0  # exact zeros in the gradients too
    opt.zero_grad()
    loss = ((model(x) - x[:, :5]) ** 2).mean()
    loss.backward()
    opt.step()
    return loss.item()


def _recording(base):
    class Recording(base):
        """Keeps what each call saw: the input and residual before, the output and residual after."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.calls = []

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            started = self._state.started()
            zeros = torch.zeros_like(input_tensor)
            rec = {"input": input_tensor.clone(), "op": "avg" if op == dist.ReduceOp.AVG else "sum",
                   "e": self.residual().clone() if started else zeros, "r": self.residual_low().clone()
                   if started else zeros, "sent": self.traffic()["bytes_sent"]}
            super().__call__(output_tensor, input_tensor, group, op, async_op)
            rec.update(out=output_tensor.clone(), e_after=self.residual().clone(),
                       r_after=self.residual_low().clone(), sent=self.traffic()["bytes_sent"] - rec["sent"],
                       wire=self.wire_bytes())
            self.calls.append(rec)
    return Recording


def _recorded_run(rank, world, code):
    import commsgd_torch.fsdp as fsdp
    model = _sharded()
    codes = {}
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            codes[name] = _recording(fsdp.CompressedReduceScatter)(code, BLOCK)
            m.set_custom_reduce_scatter(codes[name])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = [_step(model, opt, rank, t) for t in range(4)]
    # numpy arrays travel to the parent by value (many tensors would each need a descriptor of their own)
    calls = {name: [{k: v.numpy().copy() if torch.is_tensor(v) else v for k, v in rec.items()} for rec in c.calls]
             for name, c in codes.items() if c.calls}
    return calls, losses


def _p(rec):
    """What the compressor codes: (input + e) + r, as its error feedback adds them."""
    s = rec["input"] + rec["e"]
    return torch.where(rec["r"] == 0, s, s + rec["r"])


def _decode_int8(p, s):
    q = torch.round(127.0 * p.double() / s.double())  # half to even, as the code's nearbyint
    return (q * s.double() / 127.0).float()


def _decode_e3m0(p, s):
    x = p.double().abs() / s.double()
    k = torch.ones_like(x)
    for i in range(-6, 0):
        k += (x > 1.5 * 2.0 ** i).double()
    mag = torch.where(x < 2.0 ** -7, torch.zeros_like(x), s.double() * torch.pow(2.0, k - 7)).float()
    return torch.where(torch.signbit(p), -mag, mag)


def _reference_decoded(p, world, code):
    """p cut into `world` parts, each coded in blocks of BLOCK from its start and decoded (fp16, bf16: each
    value rounded to the format, nearest and ties to even, as torch's casts round)."""
    if code in ("fp16", "bf16"):
        return p.to(torch.float16 if code == "fp16" else torch.bfloat16).float()
    out = torch.empty_like(p)
    part = p.numel() // world
    for j in range(world):
        for first in range(j * part, (j + 1) * part, BLOCK):
            v = p[first:min((j + 1) * part, first + BLOCK)]
            s = v.abs().max()
            if s == 0:
                d = torch.zeros_like(v) if code == "int8" else torch.where(torch.signbit(v), -0.0, 0.0)
            else:
                d = _decode_int8(v, s) if code == "int8" else _decode_e3m0(v, s)
            out[first:first + v.numel()] = d
    return out


def _part_bytes(part, bits):
    return 4 * -(-part // BLOCK) + -(-part * bits // 8)


@pytest.mark.parametrize("code", ["int8", "e3m0", "fp16", "bf16"])
def test_each_part_is_the_reference_sum_and_the_residual_keeps_the_rest(code):
    from commsgd_torch import _C
    results = run_ranks(_recorded_run, world=WORLD, args=(code,))
    ranks = [{name: [{k: torch.from_numpy(v) if hasattr(v, "dtype") else v for k, v in rec.items()} for rec in calls]
              for name, calls in r[0].items()} for r in results]
    assert set(ranks[0]) == {"a", "b"}, f"the calls came from modules {sorted(ranks[0])}"
    for name in ranks[0]:
        calls = [r[name] for r in ranks]
        assert all(len(c) == 4 for c in calls), [len(c) for c in calls]
        for t in range(4):
            recs = [c[t] for c in calls]
            decoded = [_reference_decoded(_p(rec), WORLD, code) for rec in recs]
            length = recs[0]["input"].numel()
            part = length // WORLD
            for j, rec in enumerate(recs):
                want = torch.zeros(part)
                for r in range(WORLD):  # rank order from +0
                    want = want + decoded[r][j * part:(j + 1) * part]
                if rec["op"] == "avg":
                    want = want / WORLD
                assert torch.equal(rec["out"].view(torch.int32), want.view(torch.int32)), \
                    f"module {name!r} step {t} rank {j}: the output differs from the reference"
                # Conservation, exactly: sent + new residual == p, in double (e' + r' is exact there).
                total = decoded[j].double() + (rec["e_after"].double() + rec["r_after"].double())
                assert torch.equal(total, _p(rec).double()), f"module {name!r} step {t} rank {j}: value lost"
                bits = {"int8": 8, "e3m0": 4}.get(code, 16)
                each = (WORLD - 1) * (40 + (2 * part if bits == 16 else _part_bytes(part, bits)))  # 16: no scales
                assert rec["sent"] == each == rec["wire"], (rec["sent"], each, rec["wire"])
                assert _C.reduce_scatter_wire_bytes(code, length, BLOCK, WORLD) == each
    losses = [r[1] for r in results]
    assert losses[0][-1] < losses[0][0], f"rank 0's loss did not fall: {losses[0]}"


def _checkpoint_run(rank, world):
    import commsgd_torch.fsdp as fsdp
    from commsgd_torch import InvalidArgument

    def fresh():
        model = _sharded()
        return model, fsdp.compress_reduce_scatter(model, code="e3m0", block_size=BLOCK), \
            torch.optim.SGD(model.parameters(), lr=0.1)

    model, codes, opt = fresh()
    for t in range(3):
        _step(model, opt, rank, t)
    saved_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
    saved_codes = codes.state_dict()
    for t in range(3, 6):
        _step(model, opt, rank, t)
    want = [p.to_local().detach().clone() for p in model.parameters()]

    model2, codes2, opt2 = fresh()
    model2.load_state_dict(saved_model)
    codes2.load_state_dict(saved_codes)
    for t in range(3, 6):
        _step(model2, opt2, rank, t)
    got = [p.to_local().detach().clone() for p in model2.parameters()]
    same = all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(want, got))

    # Without the codes' state the resumed run differs: the residual matters.
    model3, codes3, opt3 = fresh()
    model3.load_state_dict(saved_model)
    for t in range(3, 6):
        _step(model3, opt3, rank, t)
    differs = any(not torch.equal(a, p.to_local()) for a, p in zip(want, model3.parameters()))

    other = fsdp.compress_reduce_scatter(_sharded(), code="int8", block_size=BLOCK)
    try:
        other.load_state_dict(saved_codes)
        refused = None
    except InvalidArgument as e:
        refused = str(e)
    return same, differs, refused


def test_a_checkpoint_of_model_and_codes_resumes_bit_for_bit():
    for same, differs, refused in run_ranks(_checkpoint_run, world=WORLD):
        assert same, "the resumed run's parameters differ"
        assert differs, "a resume without the codes' residual gave the same bits: the test proves nothing"
        assert refused and "does not fit" in refused, refused


def test_bad_options_are_refused_naming_the_argument():
    import commsgd_torch.fsdp as fsdp
    from commsgd_torch import InvalidArgument
    with pytest.raises(InvalidArgument, match="argument 'code' = 'int4' is not one of int8, e3m0, fp16, bf16"):
        fsdp.CompressedReduceScatter("int4")
    with pytest.raises(InvalidArgument, match="'block_size' = 0 is outside the allowed range"):
        fsdp.CompressedReduceScatter("int8", block_size=0)
    with pytest.raises(InvalidArgument, match="holds no FSDP2 module"):
        fsdp.compress_reduce_scatter(torch.nn.Linear(2, 2))
