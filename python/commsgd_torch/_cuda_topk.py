"""TopKState's CUDA buckets: commsgd's batched top-k step on the device, exchanged over torch.distributed.

Per bucket (keyed, as on the CPU, by its parameters' model indices) one _cuda.TopK: per parameter when
layerwise, else over the whole bucket. A round enqueues the step on the current stream, writing the bucket's
total_k (index, value) pairs into a message of its own, all-gathers the messages over the state's process
group and returns DDP the future of the decoded average; nothing in it waits for the device, so DDP overlaps
it with the rest of backward as it does its own allreduce.

The average is built the same way on every rank: from zeros, rank by rank, each rank's pairs added at their
indices (one rank's indices are distinct, so the order within a rank changes nothing), then divided by the
world size, in float32, and cast to the bucket's dtype. Every rank therefore gets the same bits.

A step refused on the device (NaN/inf in the gradient) leaves its state as before and sends NaN values, so
every rank's average is non-finite and an AMP GradScaler skips the step. The refusing rank learns of it at
that bucket's next round (waiting for that step alone, long over by then): it still sends (a NaN message, so
that no peer waits) and its future raises NonFinite.
"""
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _C
from ._C import InvalidArgument, NonFinite, Error, Unsupported

try:
    from . import _cuda
except ImportError:  # built without nvcc
    _cuda = None

_DTYPES: Dict[torch.dtype, str] = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


class _Bucket:
    """One bucket's device step and its two messages (int32 indices, then float32 values, in one tensor, so
    one all-gather carries both; two, so a round never writes the message a peer may still be reading)."""

    # step: a _cuda.TopK (the extension ships no type stubs).
    def __init__(self, step: Any, params: List[int], sizes: List[int], device: torch.device,
                 dtype: torch.dtype) -> None:
        self.step, self.params, self.sizes, self.device, self.dtype = step, params, sizes, device, dtype
        self.offsets: List[int] = [0]
        for s in sizes[:-1]:
            self.offsets.append(self.offsets[-1] + s)
        self.length = sum(sizes)
        k = step.total_k
        # Zeros: a message always holds indices in range, even where a refused step left slots unwritten.
        self.messages = [torch.zeros(2 * k, dtype=torch.int32, device=device) for _ in range(2)]
        self.turn = 0
        self.last: Optional[torch.Tensor] = None
        self.stepped = False

    def split(self, msg: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        k = self.step.total_k
        return msg[:k], msg[k:].view(torch.float32)

    def residual(self) -> torch.Tensor:
        out = torch.empty(self.length, dtype=torch.float32, device=self.device)
        with torch.cuda.device(self.device):
            self.step.residual_into(out.data_ptr(), _stream(self.device))
        return out

    def momentum(self) -> Optional[torch.Tensor]:
        if not self.step.has_momentum:
            return None
        out = torch.empty(self.length, dtype=torch.float32, device=self.device)
        with torch.cuda.device(self.device):
            self.step.momentum_into(out.data_ptr(), _stream(self.device))
        return out


class CudaTopK:
    """The CUDA half of a TopKState (see TopKState and docs/pytorch.md, CUDA buckets)."""

    def __init__(self, group: dist.ProcessGroup, density: float, momentum: float, momentum_rule: str,
                 start_iter: int, dgc_warmup_steps_per_stage: int, warmup_momentum: bool,
                 layerwise: bool) -> None:
        self.group = group
        self.density, self.momentum_factor, self.momentum_rule = density, momentum, momentum_rule
        self.dense_warmup, self.dgc_warmup = start_iter, dgc_warmup_steps_per_stage
        self.warmup_momentum, self.layerwise = warmup_momentum, layerwise
        self.iteration = 0
        self.used = False
        self.buckets: Dict[str, _Bucket] = {}
        # parameter index -> key of the bucket holding its residual
        self.owner: Dict[int, str] = {}
        # parameter index -> momentum of the dense warm-up (float32, on the device)
        self.warm: Dict[int, torch.Tensor] = {}
        self.error: Optional[Error] = None  # the last round's, for exchange()
        self.counters: Dict[str, int] = dict(bytes_sent=0, bytes_received=0, messages_sent=0, messages_received=0,
                                             calls=0)

    # --- a round ----------------------------------------------------------------------------------------------

    def exchange(self, buf: torch.Tensor, params: Sequence[int], sizes: Sequence[int], last: bool) -> torch.Tensor:
        """The round, waited for; its own error raised as it is (a future may wrap what its callback raised)."""
        self.error = None
        fut = self.exchange_async(buf, params, sizes, last)
        try:
            return fut.wait()
        except Exception:
            if self.error is None:
                raise
        raise self.error

    def exchange_async(self, buf: torch.Tensor, params: Sequence[int], sizes: Sequence[int],
                       last: bool) -> "torch.futures.Future[torch.Tensor]":
        self._check(buf, sizes)
        self.used = True
        if self.iteration < self.dense_warmup:
            fut = self._dense(buf, params, sizes)
        else:
            fut = self._sparse(buf, params, sizes)
        if last:
            self.iteration += 1
        return fut

    def _check(self, buf: torch.Tensor, sizes: Sequence[int]) -> None:
        if _cuda is None:
            raise Unsupported("commsgd: TopKState got a CUDA bucket, but commsgd_torch was built without its CUDA "
                              "part (_cuda): rebuild it where nvcc (the CUDA toolkit) is found, or keep the "
                              "model on the CPU")
        if self.dgc_warmup > 0:
            raise Unsupported("commsgd: dgc_warmup_steps_per_stage > 0 is not supported for CUDA buckets (the "
                              "device step has one density); use dgc_warmup_steps_per_stage=0")
        if buf.dtype not in _DTYPES:
            raise InvalidArgument(f"commsgd: argument 'bucket' has dtype {buf.dtype}, the allowed dtypes on CUDA "
                                  "are float32, float16 and bfloat16")
        if sum(sizes) != buf.numel():
            raise InvalidArgument(f"commsgd: the bucket's parameters hold {sum(sizes)} elements, the bucket "
                                  f"{buf.numel()}")

    def _world(self) -> int:
        return dist.get_world_size(self.group)

    def _dense(self, buf: torch.Tensor, params: Sequence[int],
               sizes: Sequence[int]) -> "torch.futures.Future[torch.Tensor]":
        world = self._world()
        total = buf.to(torch.float32, copy=True)
        work = dist.all_reduce(total, group=self.group, async_op=True)
        self._add(_C.ring_all_reduce_traffic(total.numel(), 4, world, dist.get_rank(self.group)))
        momentum = self.momentum_factor if self.warmup_momentum else 0.0
        offsets = [sum(sizes[:j]) for j in range(len(sizes))]

        def average(fut: "torch.futures.Future[Any]") -> torch.Tensor:
            out = total.div_(world)
            if momentum > 0.0:
                # Momentum SGD's update v <- m v + mean(g), the same on every rank; top-k's momentum starts
                # from v (see _adopt).
                for p, off, n in zip(params, offsets, sizes):
                    v = self.warm.get(p)
                    if v is None or v.numel() != n or v.device != out.device:
                        v = self.warm[p] = torch.zeros(n, dtype=torch.float32, device=out.device)
                    v.mul_(momentum).add_(out[off:off + n])
                    out[off:off + n] = v
            return out if buf.dtype == torch.float32 else out.to(buf.dtype)

        return work.get_future().then(average)

    def _sparse(self, buf: torch.Tensor, params: Sequence[int],
                sizes: Sequence[int]) -> "torch.futures.Future[torch.Tensor]":
        b = self._find(buf, params, sizes)
        msg = b.messages[b.turn]
        b.turn ^= 1
        index, value = b.split(msg)
        error: Optional[Error] = None
        grad = buf.contiguous()
        try:
            with torch.cuda.device(buf.device):
                if b.stepped:
                    b.step.check_last_step()  # a refusal of this bucket's last step, reported a step late
                b.step.step(grad.data_ptr(), index.data_ptr(), value.data_ptr(), _stream(buf.device))
            b.stepped = True
        except Error as e:  # still sent, so that no peer waits for this rank; the future raises
            error = e
            value.fill_(math.nan)
        self.error = error
        b.last = msg
        world = self._world()
        outs = [torch.empty_like(msg) for _ in range(world)]
        work = dist.all_gather(outs, msg, group=self.group, async_op=True)
        self._add(_C.all_gather_traffic(8 * b.step.total_k, world))
        n, dtype = buf.numel(), buf.dtype

        def average(fut: "torch.futures.Future[Any]") -> torch.Tensor:
            if error is not None:
                raise error
            out = torch.zeros(n, dtype=torch.float32, device=msg.device)
            for o in outs:
                i, v = b.split(o)
                out.index_add_(0, i.long(), v)
            out.div_(world)
            return out if dtype == torch.float32 else out.to(dtype)

        return work.get_future().then(average)

    def _add(self, traffic: Dict[str, int]) -> None:
        """One collective's traffic, by comm/traffic.hpp's count (what the CPU states' meter charges)."""
        for key in ("bytes_sent", "bytes_received", "messages_sent", "messages_received"):
            self.counters[key] += traffic[key]
        self.counters["calls"] += 1

    # --- buckets ----------------------------------------------------------------------------------------------

    def _make(self, params: Sequence[int], sizes: Sequence[int], device: torch.device,
              dtype: torch.dtype) -> _Bucket:
        lengths = list(sizes) if self.layerwise else [sum(sizes)]
        with torch.cuda.device(device):
            step = _cuda.TopK(lengths, self.density, self.momentum_factor, self.momentum_rule, _DTYPES[dtype])
        return _Bucket(step, list(params), list(sizes), device, dtype)

    def _find(self, buf: torch.Tensor, params: Sequence[int], sizes: Sequence[int]) -> _Bucket:
        key = ",".join(str(p) for p in params)
        b = self.buckets.get(key)
        if b is not None and b.dtype == buf.dtype and b.device == buf.device and b.sizes == list(sizes):
            return b
        b = self._make(params, sizes, buf.device, buf.dtype)
        self._adopt(b)
        self.buckets[key] = b
        for p in params:
            self.owner[p] = key
        owned = set(self.owner.values())
        self.buckets = {k: v for k, v in self.buckets.items() if k in owned}
        return b

    def _adopt(self, b: _Bucket) -> None:
        """Each parameter's residual (and momentum) from the bucket that held it before (DDP rebuilds its
        buckets after the first iteration), and the dense warm-up's momentum for a parameter's first round."""
        residual = torch.zeros(b.length, dtype=torch.float32, device=b.device)
        velocity = torch.zeros_like(residual) if b.step.has_momentum else None
        states: Dict[str, Tuple[torch.Tensor, Optional[torch.Tensor]]] = {}
        moved = False
        for p, to, n in zip(b.params, b.offsets, b.sizes):
            key = self.owner.get(p)
            if key is None or key not in self.buckets:
                w = self.warm.get(p)
                if velocity is not None and w is not None and w.numel() == n:
                    velocity[to:to + n] = w.to(b.device)
                    moved = True
                continue
            old = self.buckets[key]
            if key not in states:
                states[key] = (old.residual(), old.momentum())
            r, u = states[key]
            at = old.offsets[old.params.index(p)]
            residual[to:to + n] = r[at:at + n].to(b.device)
            if velocity is not None and u is not None:
                velocity[to:to + n] = u[at:at + n].to(b.device)
            moved = True
        steps = max(self.iteration - self.dense_warmup, 0)
        if moved or steps > 0:
            with torch.cuda.device(b.device):
                b.step.assign(residual.data_ptr(), velocity.data_ptr() if velocity is not None else 0, steps,
                              _stream(b.device))

    # --- reading the state ------------------------------------------------------------------------------------

    def keys(self) -> List[str]:
        return sorted(self.buckets)

    def residual(self, key: str) -> Optional[torch.Tensor]:
        b = self.buckets.get(key)
        return None if b is None else b.residual()

    def momentum_buffer(self, key: str) -> Optional[torch.Tensor]:
        b = self.buckets.get(key)
        return None if b is None else b.momentum()

    def last_sent(self, key: str) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(indices as int64, values) of the bucket's last message, on its device."""
        b = self.buckets.get(key)
        if b is None or b.last is None:
            return None
        i, v = b.split(b.last)
        return i.long(), v.clone()

    def report(self, key: str) -> Optional[Dict[str, Any]]:
        b = self.buckets.get(key)
        if b is None:
            return None
        with torch.cuda.device(b.device):
            return b.step.report(_stream(b.device))

    def state_dict(self) -> Dict[str, Any]:
        buckets = {}
        for key, b in self.buckets.items():
            with torch.cuda.device(b.device):
                blob = b.step.save(_stream(b.device))
            buckets[key] = (b.params, b.sizes, str(b.dtype).replace("torch.", ""), b.device.index, blob)
        return {"iteration": self.iteration, "buckets": buckets, "warmup_velocity": dict(self.warm)}

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        if _cuda is None and d["buckets"]:
            raise Unsupported("commsgd: the saved state holds CUDA buckets, but commsgd_torch was built without "
                              "its CUDA part (_cuda): rebuild it where nvcc (the CUDA toolkit) is found")
        loaded: Dict[str, _Bucket] = {}
        owner: Dict[int, str] = {}
        for key, (params, sizes, dtype, index, blob) in d["buckets"].items():
            # The saved device where this process has it, else the current one.
            device = torch.device("cuda", index if index < torch.cuda.device_count() else torch.cuda.current_device())
            b = self._make(params, sizes, device, getattr(torch, dtype))
            with torch.cuda.device(device):
                b.step.load(blob, _stream(device))
            b.stepped = False
            loaded[key] = b
            for p in params:
                owner[p] = key
        self.buckets, self.owner = loaded, owner
        self.warm = dict(d.get("warmup_velocity", {}))
        self.iteration = int(d["iteration"])
        self.used = self.used or bool(loaded)
