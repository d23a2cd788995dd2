"""HSDP's cross-replica exchange through commsgd's DDP hook families: FSDP2 shards the model inside each
replica over the fast links, and the replicas average their gradient shards over the slow ones with top-k,
PowerSGD, fp16/bf16 or any other commsgd DDP hook instead of a float32 all-reduce.

    mesh = init_device_mesh("cpu", (replicas, ranks_per_replica), mesh_dim_names=("replicate", "shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh["shard"])        # FSDP2 inside the replica only: no native HSDP
    fully_shard(model, mesh=mesh["shard"])
    state = commsgd_torch.PowerSGDState(mesh["replicate"].get_group(), matrix_approximation_rank=2)
    hooks = commsgd_torch.hsdp.register_replicate_hook(model, state, commsgd_torch.powersgd_hook)
    ...train as before...
    torch.save({"model": model.state_dict(), "hook": state.state_dict()}, path)

FSDP2 calls the hook (`set_all_reduce_hook`) with each module's reduce-scatter output, the rank's shard of
that module's gradient averaged over its replica; the hook hands it to the state as a bucket, waits for the
state's round over the replicate group and writes the average over replicas back in place. Rank r of every
replica holds the same shard, so the replicate group's ranks exchange like-for-like buckets, and every
replica ends the step with the same bits (the families' rounds are bit-identical across ranks).

A bucket is one FSDP2 module's shard; its index is the module's position among the model's FSDP2 modules,
its gradients the parameters' padded shards in FSDP2's order (PowerSGD's matrices are those shards: rows of a
dim-0 shard), its parameters the model's (sharded) parameters. The mesh must not be FSDP2's own 2-D HSDP
mesh: FSDP2 would all-reduce in float32 first and call the hook after. Every parameter of a hooked module
needs a gradient each backward (FSDP2 leaves one without out of the reduce-scatter, which would change the
bucket's layout). CPU tensors; torch 2 (FSDP2) only. AutoState chooses among dense, fp16 and PowerSGD here
(its model of the step takes each exchange as blocking backward, as FSDP2's hook does); its top-k
candidates are refused for now.
"""
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from ._C import InvalidArgument, Unsupported

__all__ = ["register_replicate_hook", "ReplicateHooks", "ShardBucket"]


class ShardBucket:
    """One FSDP2 module's gradient shard, as a DDP hook sees a GradBucket (buffer, index, is_last, gradients,
    parameters)."""

    def __init__(self, buffer: torch.Tensor, index: int, last: bool, shapes: List[torch.Size],
                 params: List[torch.nn.Parameter]) -> None:
        self._buffer, self._index, self._last, self._shapes, self._params = buffer, index, last, shapes, params

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def gradients(self) -> List[torch.Tensor]:
        out, at = [], 0
        for shape in self._shapes:
            n = shape.numel()
            out.append(self._buffer[at:at + n].view(shape))
            at += n
        return out

    def parameters(self) -> List[torch.nn.Parameter]:
        return list(self._params)

    def shard_sizes(self) -> List[int]:
        """Each parameter's padded shard size in the buffer (a DTensor's numel() is the whole parameter's)."""
        return [s.numel() for s in self._shapes]


class ReplicateHooks:
    """The hooked FSDP2 modules, by name ('' the root), in bucket-index order; counts the buckets of the
    backward in progress, so that the state sees its iteration's last bucket."""

    def __init__(self, state: Any, hook: Callable[[Any, Any], Any], modules: Dict[str, torch.nn.Module]) -> None:
        self.state, self.hook = state, hook
        self.names = list(modules)
        self._layouts = [_layout(m) for m in modules.values()]
        self._seen: List[int] = []
        self.calls = 0

    def check_backward_ended(self, *_: Any) -> None:
        """A forward pre-hook of the model: the backward before, if it reduced any module, reduced all of them
        (a module none of whose parameters got a gradient is skipped by FSDP2, and its iteration would never
        reach its last bucket)."""
        if self._seen:
            missing = [repr(self.names[i]) for i in range(len(self.names)) if i not in self._seen]
            self._seen = []
            raise Unsupported(f"commsgd_torch.hsdp: the last backward reduced no gradient of module(s) "
                              f"{', '.join(missing)}: every parameter of a hooked module needs a gradient each "
                              "backward")

    def _call(self, index: int, reduce_output: torch.Tensor) -> None:
        shapes, params = self._layouts[index]
        need = sum(s.numel() for s in shapes)
        if reduce_output.numel() != need:
            raise Unsupported(f"commsgd_torch.hsdp: module '{self.names[index]}' reduced {reduce_output.numel()} "
                              f"gradient values, its parameters' shards hold {need}: every parameter of a hooked "
                              "module needs a gradient each backward")
        if reduce_output.device.type != "cpu":
            raise Unsupported(f"commsgd_torch.hsdp: module '{self.names[index]}' reduced on {reduce_output.device}"
                              "; the replicate hook takes CPU tensors for now")
        self._seen.append(index)
        last = len(self._seen) == len(self._layouts)
        if last:
            self._seen = []
        bucket = ShardBucket(reduce_output, index, last, shapes, params)
        result = self.hook(self.state, bucket).wait()
        if result.data_ptr() != reduce_output.data_ptr():
            reduce_output.copy_(result)
        self.calls += 1


def _layout(module: torch.nn.Module):
    """(each parameter's padded shard shape, the parameters) of an FSDP2 module, in its reduce-scatter's
    order."""
    state = module._get_fsdp_state()
    groups = state._fsdp_param_groups
    if len(groups) != 1:
        raise Unsupported(f"commsgd_torch.hsdp: a module with {len(groups)} FSDP2 parameter groups (one hook "
                          "per module; FSDP2 refuses it too)")
    group = groups[0]
    if group._is_hsdp:
        raise InvalidArgument("commsgd_torch.hsdp: argument 'model' was sharded over FSDP2's own 2-D HSDP mesh, "
                              "which all-reduces in float32 before the hook; shard it over the mesh's 'shard' "
                              "dimension alone (fully_shard(..., mesh=mesh['shard']))")
    fsdp_params = group.fsdp_params
    return [fp.padded_sharded_param_size for fp in fsdp_params], [fp.sharded_param for fp in fsdp_params]


def register_replicate_hook(model: torch.nn.Module, state: Any, hook: Callable[[Any, Any], Any],
                            modules: Optional[Dict[str, torch.nn.Module]] = None) -> ReplicateHooks:
    """Sets `hook(state, bucket)` (a commsgd DDP hook and its state, the state built over the replicate
    group) as the cross-replica all-reduce of every FSDP2 module of `model` with parameters."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError as e:  # pragma: no cover - torch 1.13
        raise Unsupported(f"commsgd_torch.hsdp needs FSDP2 (torch 2): {e}") from None
    from .auto import AutoState
    if isinstance(state, AutoState):
        topk = [c for c in state.candidates if c.startswith("topk")]
        if topk:
            raise Unsupported(f"commsgd_torch.hsdp: argument 'state' is an AutoState with top-k candidates "
                              f"{topk}, not supported here yet: moving the optimizer's momentum into top-k's "
                              "hook (and back) works on whole parameters, HSDP hands the hook shards; pass "
                              "candidates without them (dense, fp16, powersgd-r<k>)")
        state.blocking = True  # FSDP2 waits for each module's hook before backward goes on
    group = getattr(state, "process_group", None)
    if not isinstance(group, dist.ProcessGroup):
        raise InvalidArgument(f"commsgd_torch.hsdp: argument 'state' is a {type(state).__name__} without a "
                              "process group; pass a commsgd hook state built over the replicate group")
    found = modules if modules is not None else {n: m for n, m in model.named_modules() if isinstance(m, FSDPModule)}
    found = {n: m for n, m in found.items() if m._get_fsdp_state()._fsdp_param_groups}
    if not found:
        raise InvalidArgument("commsgd_torch.hsdp: argument 'model' holds no FSDP2 module with parameters "
                              "(apply fully_shard first)")
    hooks = ReplicateHooks(state, hook, found)
    for i, m in enumerate(found.values()):
        m.set_all_reduce_hook(lambda out, i=i: hooks._call(i, out))
    model.register_forward_pre_hook(hooks.check_backward_ended)
    return hooks
