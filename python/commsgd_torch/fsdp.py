"""FSDP2's gradient reduce-scatter in commsgd's codes: int8 or 4-bit (e3m0) blocks with a scale per block, or
fp16 / bf16 values, each value coded once and summed in float32 (through an all-to-all, not a ring that
would round every partial sum), the coding error kept per rank and per FSDP2 module as error feedback.

    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    codes = commsgd_torch.fsdp.compress_reduce_scatter(model, code="int8")   # every FSDP2 module of model
    ...train as before...
    torch.save({"model": model.state_dict(), "codes": codes.state_dict()}, path)
    codes.load_state_dict(saved["codes"])                                     # bit-identical resume

A rank sends (n - 1) (40 + part) bytes a backward per module where FSDP2's float32 reduce-scatter sends
(n - 1) 4 d / n, d the module's padded gradient: part = 4 ceil(d / n / block_size) + d / n for int8, half
that for e3m0, (n - 1) (40 + 2 d / n) for fp16 and bf16 (no scales; block_size does not apply)
(`commsgd_torch._C.reduce_scatter_wire_bytes`). CPU tensors of float32 (FSDP2's reduce dtype on a CPU); the
reduce-scatter ops FSDP2 uses for them, SUM and AVG. torch 2 (FSDP2) only.
"""
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from . import _C
from ._C import InvalidArgument, Unsupported

CODES = ("int8", "e3m0", "fp16", "bf16")

# FSDP2's extension point, on torch 2. Not even imported on torch 1.13, whose torch.distributed.fsdp fails to
# import on Python 3.11 (a dataclass with a mutable default).
_ReduceScatterBase = object
if int(torch.__version__.split(".")[0]) >= 2:
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
    except ImportError:  # a torch 2 without FSDP2's custom collectives: the class still works as a callable
        pass


class CompressedReduceScatter(_ReduceScatterBase):
    """An FSDP2 reduce-scatter (`module.set_custom_reduce_scatter(...)`) in commsgd's int8 or e3m0 blocks, or
    fp16 / bf16, with error feedback. One object per FSDP2 module: its residual is that module's gradient's."""

    def __init__(self, code: str = "int8", block_size: int = 256, error_feedback: bool = True):
        if code not in CODES:
            raise InvalidArgument(f"argument 'code' = {code!r} is not one of {', '.join(CODES)}")
        self.code, self.block_size, self.error_feedback = code, block_size, error_feedback
        self._state = _C.ReduceScatter(code, block_size, error_feedback)

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> None:
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise Unsupported(f"commsgd_torch.fsdp: reduce-scatter op {op} is not one of SUM, AVG (a gradient "
                              "divide factor other than the group's size asks for PREMUL_SUM)")
        for name, t in (("output_tensor", output_tensor), ("input_tensor", input_tensor)):
            if t.dtype != torch.float32 or t.device.type != "cpu":
                raise Unsupported(f"commsgd_torch.fsdp: argument '{name}' is {t.dtype} on {t.device}; the "
                                  "codes take float32 CPU tensors (FSDP2's reduce dtype on a CPU)")
        self._state(output_tensor, input_tensor, group)
        if op == dist.ReduceOp.AVG:
            output_tensor.div_(group.size())
        return None

    def residual(self) -> torch.Tensor:
        """This rank's residual over the whole input (every rank's part), high part; residual_low() the rest."""
        return self._state.residual()

    def residual_low(self) -> torch.Tensor:
        return self._state.residual_low()

    def steps(self) -> int:
        return self._state.steps()

    def wire_bytes(self) -> int:
        """What this rank sent in the last round (cost/compress.hpp's block_reduce_scatter_traffic)."""
        return self._state.wire_bytes()

    def traffic(self) -> Dict[str, int]:
        """What this rank sent and received in every round so far, as the communicator counted it."""
        return self._state.traffic()

    def state_dict(self) -> Dict[str, Any]:
        return {"code": self.code, "block_size": self.block_size, "error_feedback": self.error_feedback,
                "length": self._state.length(), "state": self._state.state()}

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        mine = (self.code, self.block_size, self.error_feedback)
        theirs = (d.get("code"), d.get("block_size"), d.get("error_feedback"))
        if mine != theirs:
            raise InvalidArgument(f"commsgd_torch.fsdp: a saved state of (code, block_size, error_feedback) = "
                                  f"{theirs} does not fit this object's {mine}")
        self._state.load_state(d["state"], d["length"])


class ReduceScatterCodes:
    """The compressed reduce-scatters of a model's FSDP2 modules, by module name ('' the root)."""

    def __init__(self, by_name: Dict[str, CompressedReduceScatter]):
        self.by_name = by_name

    def state_dict(self) -> Dict[str, Any]:
        return {name: c.state_dict() for name, c in self.by_name.items()}

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        if set(d) != set(self.by_name):
            raise InvalidArgument(f"commsgd_torch.fsdp: a saved state of modules {sorted(d)} does not fit this "
                                  f"model's FSDP2 modules {sorted(self.by_name)}")
        for name, c in self.by_name.items():
            c.load_state_dict(d[name])

    def traffic(self) -> Dict[str, int]:
        total: Dict[str, int] = {}
        for c in self.by_name.values():
            for k, v in c.traffic().items():
                total[k] = total.get(k, 0) + v
        return total


def compress_reduce_scatter(model: torch.nn.Module, code: str = "int8", block_size: int = 256,
                            error_feedback: bool = True, modules: Optional[Dict[str, torch.nn.Module]] = None
                            ) -> ReduceScatterCodes:
    """Gives every FSDP2 module of `model` (fully_shard applied) its own CompressedReduceScatter."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError as e:  # pragma: no cover - torch 1.13
        raise Unsupported(f"commsgd_torch.fsdp needs FSDP2 (torch 2): {e}") from None
    found = modules if modules is not None else {n: m for n, m in model.named_modules() if isinstance(m, FSDPModule)}
    if not found:
        raise InvalidArgument("commsgd_torch.fsdp: argument 'model' holds no FSDP2 module (apply fully_shard first)")
    by_name = {}
    for name, m in found.items():
        c = CompressedReduceScatter(code, block_size, error_feedback)
        m.set_custom_reduce_scatter(c)
        by_name[name] = c
    return ReduceScatterCodes(by_name)
