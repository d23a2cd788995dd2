"""DiLoCo's device round: the engine's schedule over commsgd::cuda::diloco_fragment, for CUDA parameters.

commsgd_torch.DiLoCo takes this path when every parameter it syncs is a float32 CUDA tensor of one device, the
package has its CUDA part (``_cuda``) and the code has a device round (``dense``, ``int8``, ``e3m0`` and the
gathered top-k codes with chunks of at most 4096 values). The parameters become views of one flat device
tensor, and each fragment's common model, outer momentum and top-k residual live on the device; only the
messages move, over NCCL straight from device buffers, over gloo through page-locked host buffers of the
message's size.

The schedule is the host engine's (sync/diloco.hpp): fragment p starts an exchange after inner step s when
s >= p H / P and s - p H / P is a multiple of H, applied ``delay`` steps later (at once when 0) before the
fragments whose turn it is start; finish() applies what is in flight and exchanges once more every fragment
that has moved since. A round's arithmetic is the host engine's bit for bit (tests/cuda/diloco_round_test.cu,
passed on an H200), so the device is to give the bits the host path gives (tests/torch/test_cuda.py holds this
class to it on a GPU; tests/torch/test_device_round.py its schedule and bytes anywhere), and it counts the same
bytes: each gathered code's round
gathers a 40-byte verdict from every rank (length, this rank's non-finite count and the first of them, the
message's size, the code), as the host compressors' headers do, so that a non-finite pseudo-gradient or ranks
set up differently are refused on every rank before anything changes.
"""
import io
import zlib
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _C
from ._C import CorruptData, InvalidArgument, NonFinite, Unsupported

try:
    from . import _cuda
except ImportError:  # built without nvcc
    _cuda = None


def refusal(code: str, lengths: List[int]) -> Optional[str]:
    """Why fragments of these lengths have no device round for `code` (None when they have one)."""
    if _cuda is None or not hasattr(_cuda, "DiLoCoFragment"):
        return "the package was built without its CUDA part (no nvcc at build time)"
    for length in lengths:
        why = _cuda.diloco_device_refusal(code, length)
        if why:
            return why
    return None


class _Exchange:
    """One fragment's exchange from its start to its application."""

    def __init__(self, started: int, due: int) -> None:
        self.started, self.due = started, due
        self.works: List[Any] = []


class DeviceEngine:
    """The host engine's interface (``_C.DiLoCoEngine``'s methods that DiLoCo calls) over device fragments."""

    def __init__(self, group: dist.ProcessGroup, layer_sizes: List[int], sync_every: int, fragments: int,
                 delay: int, alpha: float, layout: str, outer_lr: float, outer_momentum: float, code: str,
                 device: torch.device, make_fragment: Any = None) -> None:
        """make_fragment(runs, code, outer_lr, outer_momentum, alpha): the fragments' round, ``_cuda``'s by default;
        the tests give a stand-in that runs on CPU tensors, to hold the schedule and the exchanges to the host
        engine's without a GPU."""
        self._group = group
        self._nccl = dist.get_backend(group) == "nccl"
        self._world = dist.get_world_size(group)
        self._rank = dist.get_rank(group)
        self._H, self._delay, self._alpha, self._code = sync_every, delay, alpha, code
        self._device = device
        self._runs = _C.diloco_fragment_runs(layer_sizes, fragments, layout)
        self._total = sum(layer_sizes)
        make = make_fragment or _cuda.DiLoCoFragment
        self._frags = [make(r, code, outer_lr, outer_momentum, alpha) for r in self._runs]
        n, pinned = self._world, not self._nccl and device.type == "cuda"
        self._send, self._in, self._host_send, self._host_in = [], [], [], []
        for f in self._frags:
            # The gathered messages lie back to back, message_bytes apart, as apply() reads them, with a few
            # bytes of slack after them (the bit readers never pass a field's last byte).
            b = f.message_bytes
            self._send.append(torch.zeros(b, dtype=torch.uint8, device=device))
            self._in.append(torch.zeros(b if f.summed else n * b + 8, dtype=torch.uint8, device=device))
            if not self._nccl:
                self._host_send.append(torch.zeros(b, dtype=torch.uint8, pin_memory=pinned))
                self._host_in.append(torch.zeros(b if f.summed else n * b, dtype=torch.uint8, pin_memory=pinned))
        # The verdict of every gathered round: 5 u64 a rank (cost::compress_header_fields).
        where = device if self._nccl else "cpu"
        self._header = [torch.zeros(5, dtype=torch.int64, device=where) for _ in self._frags]
        self._headers = [torch.zeros(n * 5, dtype=torch.int64, device=where) for _ in self._frags]
        self._fingerprint = zlib.crc32(code.encode()) & 0x7FFFFFFF
        self._pending: List[Optional[_Exchange]] = [None] * len(self._frags)
        self._applied_at = [-1] * len(self._frags)
        self._step = 0
        self._started = self._applied = 0
        self._bytes_sent = 0
        self._traffic = {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0, "messages_received": 0,
                         "calls": 0}
        self._weight = 1.0
        self._timeout = 0.0
        self._begun = False

    # --- the schedule ----------------------------------------------------------------------------------------

    def _stream(self) -> int:
        return torch.cuda.current_stream(self._device).cuda_stream if self._device.type == "cuda" else 0

    def _synchronize(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.current_stream(self._device).synchronize()

    def offset(self, p: int) -> int:
        return p * self._H // len(self._frags)

    def starts_after(self, p: int, s: int) -> bool:
        first = self.offset(p)
        return s >= 1 and s >= first and (s - first) % self._H == 0

    def start(self, flat: torch.Tensor, broadcast: bool = True) -> None:
        """Rank 0's parameters become every rank's and the common model (a broadcast)."""
        if self._begun:  # after load(): the loaded common model stands
            return
        self._check_flat(flat)
        if broadcast and self._world > 1:
            if self._nccl:
                dist.broadcast(flat, 0, group=self._group)
            else:
                host = flat.cpu()
                dist.broadcast(host, 0, group=self._group)
                flat.copy_(host)
            self._charge(_C.broadcast_traffic(4 * flat.numel(), self._world, self._rank, 0))
        for f in self._frags:
            f.start(flat.data_ptr(), self._stream())
        self._begun = True

    def advance(self, flat: torch.Tensor) -> Tuple[bool, bool]:
        self._require_started(flat)
        self._step += 1
        s = self._step
        exchanged = applied = False
        for p, ex in enumerate(self._pending):
            if ex is not None and ex.due <= s:
                exchanged = applied = True
                self._apply(p, flat)
        for p in range(len(self._frags)):
            if self.starts_after(p, s):
                exchanged = True
                self._launch(p, flat, s)
                if self._delay == 0:
                    applied = True
                    self._apply(p, flat)
        return exchanged, applied

    def finish(self, flat: torch.Tensor) -> None:
        self._require_started(flat)
        for p, ex in enumerate(self._pending):
            if ex is not None:
                self._apply(p, flat)
        for p in range(len(self._frags)):
            if self._alpha == 0.0 and self._applied_at[p] == self._step:
                continue
            self._launch(p, flat, self._step)
            self._apply(p, flat)

    def drain(self) -> None:
        for ex in self._pending:
            if ex is not None:
                self._wait(ex)

    # --- one exchange ----------------------------------------------------------------------------------------

    def _launch(self, p: int, flat: torch.Tensor, t: int) -> None:
        f, stream = self._frags[p], self._stream()
        ex = _Exchange(t, t + self._delay)
        f.encode(flat.data_ptr(), self._weight, self._send[p].data_ptr(), stream)
        g = self._group
        if f.summed:
            # The float pseudo-gradients, summed in place by an all-reduce (the host engine's c10d one).
            if self._nccl:
                ex.works.append(dist.all_reduce(self._floats(self._send[p], f.length), group=g, async_op=True))
            else:
                self._host_send[p].copy_(self._send[p])  # waits for the encode
                ex.works.append(dist.all_reduce(self._floats(self._host_send[p], f.length), group=g,
                                                async_op=True))
        else:
            own, first = f.verdict(stream)[:2]  # waits for the encode
            self._header[p].copy_(torch.tensor([f.length, own, first, f.message_bytes, self._fingerprint],
                                               dtype=torch.int64))
            ex.works.append(dist.all_gather(list(self._headers[p].view(self._world, 5).unbind(0)),
                                            self._header[p], group=g, async_op=True))
            b, mine = self._send[p].numel(), self._send[p]
            into = self._in[p]
            if not self._nccl:
                self._host_send[p].copy_(self._send[p])
                mine, into = self._host_send[p], self._host_in[p]
            ex.works.append(dist.all_gather(list(into[:self._world * b].view(self._world, b).unbind(0)), mine,
                                            group=g, async_op=True))
        self._pending[p] = ex
        self._started += 1

    def _apply(self, p: int, flat: torch.Tensor) -> None:
        ex, f, stream = self._pending[p], self._frags[p], self._stream()
        self._pending[p] = None
        self._wait(ex)
        # The device codes' rounds are alike from the first (only the 16-bit rings' first round differs).
        wire = _C.diloco_round_traffic(self._code, f.length, self._world, self._rank, False)
        self._bytes_sent += wire["bytes_sent"]
        self._charge(wire)
        n = self._world
        if f.summed:
            if not self._nccl:
                self._in[p].copy_(self._host_send[p], non_blocking=True)
                source = self._in[p]
            else:
                source = self._send[p]
            f.apply(source.data_ptr(), n, flat.data_ptr(), stream)
        else:
            self._check_headers(p, ex)
            if not self._nccl:
                self._in[p][:self._host_in[p].numel()].copy_(self._host_in[p], non_blocking=True)
            f.apply(self._in[p].data_ptr(), n, flat.data_ptr(), stream)
        own, _, bad, first_bad, corrupt = f.verdict(stream)
        if corrupt:
            raise CorruptData(f"DiLoCo's device round: fragment {p}'s gathered messages hold {corrupt} index(es) "
                              f"outside their chunk ({self._code}, started after step {ex.started})")
        if bad:
            mine = "this rank's own holds NaN or inf" if own else "this rank's own is finite"
            raise NonFinite(f"sync::diloco: the sum of the ranks' pseudo-gradients of fragment {p} (started after "
                            f"step {ex.started}; {mine}): {bad} value(s) not finite, the first at index {first_bad}")
        f.commit()
        self._applied_at[p] = self._step
        self._applied += 1

    def _check_headers(self, p: int, ex: _Exchange) -> None:
        h = self._headers[p].view(self._world, 5).cpu().tolist()
        mine = h[self._rank]
        for r, fields in enumerate(h):
            if fields[0] != mine[0] or fields[3] != mine[3] or fields[4] != mine[4]:
                raise InvalidArgument(
                    f"DiLoCo's device round: rank {r}'s fragment {p} is set up differently (length {fields[0]}, "
                    f"message of {fields[3]} bytes) from rank {self._rank}'s (length {mine[0]}, message of "
                    f"{mine[3]} bytes) or with another code; every rank must build DiLoCo alike")
        for r, fields in enumerate(h):
            if fields[1] != 0:
                raise NonFinite(f"sync::diloco: fragment {p}'s pseudo-gradients (theta_global - theta_local, "
                                f"started after step {ex.started}) compressed by {self._code} (rank {r}'s "
                                f"pseudo-gradient holds {fields[1]} value(s) not finite, the first at index "
                                f"{fields[2]})")

    def _wait(self, ex: _Exchange) -> None:
        works, ex.works = ex.works, []
        for w in works:
            if self._timeout > 0:
                w.wait(timeout=timedelta(seconds=self._timeout))
            else:
                w.wait()

    @staticmethod
    def _floats(buf: torch.Tensor, length: int) -> torch.Tensor:
        return buf.view(torch.float32)[:length]

    def _charge(self, t: Dict[str, int]) -> None:
        for k in ("bytes_sent", "bytes_received", "messages_sent", "messages_received"):
            self._traffic[k] += int(t[k])
        self._traffic["calls"] += 1

    def _check_flat(self, flat: torch.Tensor) -> None:
        total = self._total
        if flat.device != self._device or flat.dtype != torch.float32 or flat.numel() != total \
                or not flat.is_contiguous():
            raise InvalidArgument(f"DiLoCo's device round: argument 'flat' is a {flat.dtype} tensor of "
                                  f"{flat.numel()} values on {flat.device}; the allowed one is contiguous float32 "
                                  f"of {total} values on {self._device}")

    def _require_started(self, flat: torch.Tensor) -> None:
        self._check_flat(flat)
        if not self._begun:
            raise InvalidArgument("sync::diloco: step() or finish() before start(); call start(params) once, on "
                                  "every rank, before the first step")

    # --- readings --------------------------------------------------------------------------------------------

    def steps(self) -> int:
        return self._step

    def bytes_sent(self) -> int:
        return self._bytes_sent

    def exchanges_started(self) -> int:
        return self._started

    def exchanges_applied(self) -> int:
        return self._applied

    def num_fragments(self) -> int:
        return len(self._frags)

    def fragment_runs(self, p: int) -> List[Tuple[int, int]]:
        return list(self._runs[p])

    def in_flight(self, p: int) -> bool:
        return self._pending[p] is not None

    def code(self) -> str:
        return _C.diloco_code_name(self._code)

    def touched_next(self) -> List[int]:
        s = self._step + 1
        return [p for p in range(len(self._frags))
                if (self._pending[p] is not None and self._pending[p].due <= s) or self.starts_after(p, s)]

    def applied_next(self) -> List[int]:
        s = self._step + 1
        return [p for p in range(len(self._frags))
                if (self._pending[p] is not None and self._pending[p].due <= s)
                or (self._delay == 0 and self.starts_after(p, s))]

    def _copy(self, p: int, what: str) -> torch.Tensor:
        f = self._frags[p]
        out = torch.empty(f.length, dtype=torch.float32, device=self._device)
        if what == "global":
            f.global_into(out.data_ptr(), self._stream())
        else:
            f.velocity_into(out.data_ptr(), self._stream())
        return out

    def global_model(self, p: int) -> torch.Tensor:
        """A copy of fragment p's common model, on the device."""
        return self._copy(p, "global")

    def outer_velocity(self, p: int) -> torch.Tensor:
        """A copy of fragment p's outer momentum on the device (empty without momentum)."""
        if not self._frags[p].has_velocity:
            return torch.empty(0, dtype=torch.float32, device=self._device)
        return self._copy(p, "velocity")

    def residual(self, p: int) -> Optional[torch.Tensor]:
        """A copy of fragment p's top-k residual on the device (what has not been sent); None without top-k."""
        return self._residuals(p)[0] if self._frags[p].has_residual else None

    def _residuals(self, p: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Copies of fragment p's residual, e and its low word r (e + r exactly), on the device."""
        f = self._frags[p]
        e = torch.empty(f.length, dtype=torch.float32, device=self._device)
        low = torch.empty_like(e)
        f.residual_into(e.data_ptr(), low.data_ptr(), self._stream())
        return e, low

    def traffic(self) -> Dict[str, int]:
        return dict(self._traffic)

    def set_weight(self, w: float) -> None:
        if not (0.0 <= w <= self._world):
            raise InvalidArgument(f"argument 'weight' = {w} is outside the allowed range [0, the number of ranks "
                                  f"= {self._world}]")
        self._weight = float(w)

    def weight(self) -> float:
        return self._weight

    def set_timeout(self, seconds: float) -> None:
        if not seconds >= 0:
            raise InvalidArgument(f"argument 'seconds' = {seconds} is outside the allowed range [0, inf)")
        self._timeout = float(seconds)

    def timeout(self) -> float:
        return self._timeout

    def rebind(self, group: Any) -> None:
        raise Unsupported("DiLoCo's device round keeps its membership; build DiLoCo with device_round=False for "
                          "a membership engine that rebuilds its group")

    # --- checkpoints -----------------------------------------------------------------------------------------

    def save(self, part: str = "all") -> bytes:
        """The round's state (counters, and per fragment the common model, momentum and residual), as bytes.
        Between exchanges only: an exchange in flight is refused."""
        if part != "all":
            raise InvalidArgument(f"argument 'part' = '{part}' is not allowed on the device round; the allowed "
                                  "part is 'all'")
        busy = [p for p, ex in enumerate(self._pending) if ex is not None]
        if busy:
            raise Unsupported(f"DiLoCo's device round: fragment(s) {busy} have an exchange in flight; save between "
                              "exchanges (after finish(), or with delay=0 after any step)")
        frags = []
        for p, f in enumerate(self._frags):
            state = {"global": self._copy(p, "global").cpu()}
            if f.has_velocity:
                state["velocity"] = self._copy(p, "velocity").cpu()
            if f.has_residual:
                state["residual"], state["residual_low"] = (t.cpu() for t in self._residuals(p))
            frags.append(state)
        buf = io.BytesIO()
        torch.save({"kind": "commsgd.diloco.device", "code": self._code, "step": self._step,
                    "started": self._started, "applied": self._applied, "bytes_sent": self._bytes_sent,
                    "applied_at": list(self._applied_at), "fragments": frags}, buf)
        return buf.getvalue()

    def load(self, blob: bytes) -> None:
        try:
            state = torch.load(io.BytesIO(blob), weights_only=True)
        except Exception:  # noqa: BLE001 (any unreadable blob is the same refusal)
            state = None
        if not isinstance(state, dict) or state.get("kind") != "commsgd.diloco.device":
            raise InvalidArgument("DiLoCo's device round: argument 'state_dict' is not a device round's state (a "
                                  "host engine's checkpoint loads into DiLoCo(..., device_round=False))")
        if state["code"] != self._code or len(state["fragments"]) != len(self._frags):
            raise InvalidArgument(f"DiLoCo's device round: a state of code {state['code']} and "
                                  f"{len(state['fragments'])} fragments; the allowed one is of {self._code} and "
                                  f"{len(self._frags)}")
        stream = self._stream()
        keep = []
        for f, s in zip(self._frags, state["fragments"]):
            parts = [s.get(k) for k in ("global", "velocity", "residual", "residual_low")]
            on = [None if t is None else t.to(self._device, torch.float32).contiguous() for t in parts]
            if any(t is not None and t.numel() != f.length for t in on):
                raise InvalidArgument(f"DiLoCo's device round: a fragment's state holds a tensor not of its "
                                      f"{f.length} values")
            keep.append(on)
            f.load(*[0 if t is None else t.data_ptr() for t in on], stream)
        self._synchronize()  # `keep` outlives the copies
        self._step, self._started, self._applied = state["step"], state["started"], state["applied"]
        self._bytes_sent, self._applied_at = state["bytes_sent"], list(state["applied_at"])
        self._begun = True
