"""DiLoCo's device round without a GPU: _device_round.DeviceEngine (the schedule and the exchanges over
torch.distributed that commsgd_torch.DiLoCo runs on CUDA parameters) over a stand-in fragment that works on CPU
tensors, on 2 forked gloo ranks, step by step beside the host engine (_C.DiLoCoEngine) on the same schedule: the
same steps exchange and apply, the same bytes are counted, the same fragments are in flight and touched next,
and a rank's non-finite pseudo-gradient is refused on every rank. The round's arithmetic is the device's
(cuda::diloco_fragment), held to the host engine's bits by tests/cuda/diloco_round_test.cu and, through this
class, by tests/torch/test_cuda.py on a GPU; the stand-in's is its own."""
import ctypes

import pytest
import torch
import torch.distributed as dist

import commsgd_torch
from commsgd_torch import _C, _device_round
from helpers import run_ranks

LAYERS = [30, 7, 50, 12]
CODES = ["dense", "int8", "e3m0", "topk-0.2-c16-2bit-b0.95-senders"]


def _floats(ptr, n):
    return torch.frombuffer((ctypes.c_float * n).from_address(ptr), dtype=torch.float32) if n else torch.zeros(0)


class _Fragment:
    """A stand-in for _cuda.DiLoCoFragment on CPU tensors: its message is the code's size (the engine's bytes),
    holding as many of the pseudo-gradient's floats as fit; the outer step is plain SGD on their mean."""

    def __init__(self, runs, code, lr, momentum, alpha):
        self.runs, self.lr, self.alpha = list(runs), lr, alpha
        self.length = sum(n for _, n in runs)
        self.total = max(o + n for o, n in runs)
        self.summed = code == "dense"
        self.message_bytes = _C.diloco_message_bytes(code, self.length)
        self.has_velocity = momentum != 0.0
        self.has_residual = code.startswith("topk")
        self.global_ = torch.zeros(self.length)
        self.counts = (0, 0, 0, 0, 0)

    def _take(self, x):
        return torch.cat([x[o:o + n] for o, n in self.runs])

    def _put(self, x, values):
        at = 0
        for o, n in self.runs:
            x[o:o + n] = values[at:at + n]
            at += n

    def start(self, params, stream):
        self.global_ = self._take(_floats(params, self.total)).clone()

    def encode(self, params, weight, out, stream):
        d = (self.global_ - self._take(_floats(params, self.total))) * weight
        bad = (~torch.isfinite(d)).nonzero().flatten()
        self.counts = (bad.numel(), int(bad[0]) if bad.numel() else 0, 0, 0, 0)
        fit = min(self.length, self.message_bytes // 4)
        _floats(out, fit).copy_(d[:fit])

    def apply(self, source, n, params, stream):
        fit = min(self.length, self.message_bytes // 4)
        if self.summed:
            total = _floats(source, self.length).clone()
        else:
            raw = torch.frombuffer((ctypes.c_ubyte * (n * self.message_bytes)).from_address(source),
                                   dtype=torch.uint8)
            total = torch.zeros(self.length)
            for r in range(n):
                total[:fit] += raw[r * self.message_bytes:r * self.message_bytes + 4 * fit].clone().view(torch.float32)
        bad = (~torch.isfinite(total)).nonzero().flatten()
        self.counts = self.counts[:2] + (bad.numel(), int(bad[0]) if bad.numel() else 0, 0)
        if bad.numel() or self.counts[0]:
            return
        self.global_ = self.global_ - self.lr * total / n
        x = _floats(params, self.total)
        self._put(x, self.global_ if self.alpha == 0 else self.alpha * self._take(x) + (1 - self.alpha) * self.global_)

    def verdict(self, stream):
        return self.counts

    def commit(self):
        pass

    def global_into(self, out, stream):
        _floats(out, self.length).copy_(self.global_)

    def velocity_into(self, out, stream):
        _floats(out, self.length).zero_()

    def residual_into(self, out, low, stream):
        _floats(out, self.length).zero_()
        _floats(low, self.length).zero_()

    def load(self, g, v, e, low, stream):
        self.global_ = _floats(g, self.length).clone()


def _engines(code, H, P, delay, alpha, x):
    group = dist.new_group(backend="gloo")
    host = _C.DiLoCoEngine(dist.new_group(backend="gloo"), LAYERS, H, P, delay, alpha, "strided", 0.7, 0.0, code)
    dev = _device_round.DeviceEngine(group, LAYERS, H, P, delay, alpha, "strided", 0.7, 0.0, code,
                                     torch.device("cpu"), make_fragment=_Fragment)
    xh, xd = x.clone(), x.clone()
    host.start(xh)
    dev.start(xd)
    return host, dev, xh, xd


def _schedule(rank, world, code, H, P, delay, alpha):
    torch.manual_seed(3)
    x = torch.randn(sum(LAYERS))
    host, dev, xh, xd = _engines(code, H, P, delay, alpha, x)
    mismatch = []
    if host.traffic()["bytes_sent"] != dev.traffic()["bytes_sent"]:
        mismatch.append(f"start: broadcast {host.traffic()['bytes_sent']} against {dev.traffic()['bytes_sent']}")
    g = torch.Generator().manual_seed(10 + rank)
    for s in range(1, 4 * H + 2):
        for want, got, what in ((host.touched_next(), dev.touched_next(), "touched_next"),
                                (host.applied_next(), dev.applied_next(), "applied_next")):
            if list(want) != list(got):
                mismatch.append(f"step {s}: {what} {want} against {got}")
        step = 0.01 * torch.randn(x.numel(), generator=g)
        xh += step
        xd += step
        a, b = host.advance(xh), dev.advance(xd)
        for want, got, what in ((tuple(a), tuple(b), "(exchanged, applied)"),
                                (host.bytes_sent(), dev.bytes_sent(), "bytes_sent"),
                                (host.exchanges_started(), dev.exchanges_started(), "exchanges_started"),
                                (host.exchanges_applied(), dev.exchanges_applied(), "exchanges_applied"),
                                ([host.in_flight(p) for p in range(P)], [dev.in_flight(p) for p in range(P)],
                                 "in_flight")):
            if want != got:
                mismatch.append(f"step {s}: {what} {want} against {got}")
    host.finish(xh)
    dev.finish(xd)
    if (host.bytes_sent(), host.exchanges_applied()) != (dev.bytes_sent(), dev.exchanges_applied()):
        mismatch.append(f"finish: {host.bytes_sent()}, {host.exchanges_applied()} against "
                        f"{dev.bytes_sent()}, {dev.exchanges_applied()}")
    counted = dev.traffic()["bytes_sent"] - _C.broadcast_traffic(4 * x.numel(), world, rank)["bytes_sent"]
    if counted != dev.bytes_sent():
        mismatch.append(f"traffic {counted} against bytes_sent {dev.bytes_sent()}")
    # The stand-in's models agree across ranks only if every rank applied the same gathered messages.
    models = [torch.zeros_like(xd) for _ in range(world)]
    dist.all_gather(models, xd)
    return mismatch, all(torch.equal(models[0], m) for m in models)


@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("H,P,delay,alpha", [(4, 1, 0, 0.0), (4, 2, 2, 0.5), (6, 3, 1, 0.0), (5, 4, 4, 0.0)])
def test_the_device_rounds_schedule_and_bytes_are_the_host_engines(code, H, P, delay, alpha):
    for mismatch, same in run_ranks(_schedule, 2, (code, H, P, delay, alpha)):
        assert not mismatch, "\n".join(mismatch[:10])
        assert same or alpha != 0.0


def _refusal(rank, world, code):
    torch.manual_seed(4)
    x = torch.randn(sum(LAYERS))
    _, dev, _, xd = _engines(code, 3, 1, 0, 0.0, x)
    for _ in range(3):
        dev.advance(xd)
    before = dev.global_model(0).clone()
    dev.advance(xd)
    dev.advance(xd)
    if rank == 1:  # past what the stand-in's message holds of a code: only the gathered verdicts see it
        xd[-1] = float("nan")
    try:
        dev.advance(xd)
        refused = None
    except commsgd_torch.NonFinite as e:
        refused = str(e)
    kept = torch.equal(before, dev.global_model(0))
    return refused, kept, dev.exchanges_applied(), dev.exchanges_started()


@pytest.mark.parametrize("code", CODES)
def test_a_nan_on_one_rank_is_refused_on_every_rank(code):
    for refused, kept, applied, started in run_ranks(_refusal, 2, (code,)):
        assert refused is not None and ("rank 1" in refused or "sum" in refused), refused
        assert kept and applied == 1 and started == 2


def _resume(rank, world, code):
    torch.manual_seed(5)
    _, dev, _, xd = _engines(code, 3, 2, 1, 0.0, torch.randn(sum(LAYERS)))
    for _ in range(3):
        dev.advance(xd)
    busy = any(dev.in_flight(p) for p in range(2))
    try:
        dev.save()
        refused = False
    except commsgd_torch.Unsupported:
        refused = True
    dev.finish(xd)
    blob = dev.save()
    again = _device_round.DeviceEngine(dist.new_group(backend="gloo"), LAYERS, 3, 2, 1, 0.0, "strided", 0.7, 0.0,
                                       code, torch.device("cpu"), make_fragment=_Fragment)
    again.load(blob)
    again.start(xd)  # after load: the loaded state stands, nothing is broadcast
    same = all(torch.equal(dev.global_model(p), again.global_model(p)) for p in range(2))
    counters = (again.steps(), again.bytes_sent(), again.exchanges_applied()) == \
        (dev.steps(), dev.bytes_sent(), dev.exchanges_applied())
    try:
        again.load(b"not a state")
        bad = False
    except commsgd_torch.InvalidArgument:
        bad = True
    return busy and refused, same and counters, bad


@pytest.mark.parametrize("code", ["int8", "topk-0.2-c16-2bit-b0.95-senders"])
def test_a_device_rounds_state_is_saved_between_exchanges_and_loads(code):
    for refused_in_flight, restored, bad_refused in run_ranks(_resume, 2, (code,)):
        assert refused_in_flight and restored and bad_refused


def test_codes_without_a_device_round_say_why():
    for code, length, phrase in (("fp16", 100, "16-bit"), ("bf16", 100, "16-bit"),
                                 ("topk-0.1-c64-b0.95-shared", 100, "flat-in-n"),
                                 ("topk-0.1-c64-b0.95-regions", 100, "flat-in-n"),
                                 ("topk-0.1", 5000, "4096")):
        why = _device_round.refusal(code, [length])
        assert why is not None and (phrase in why or "CUDA part" in why), (code, why)
    for code in CODES:
        why = _device_round.refusal(code, [4096])
        assert why is None or "CUDA part" in why, (code, why)
