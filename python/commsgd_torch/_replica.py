"""Replicas of many ranks: which values of the model each rank's DiLoCo engine holds, and how they move.

A DiLoCo replica is one rank (the engine holds the whole model, diloco.py's own path) or L ranks, in one of two
shapes:

- **sharded** (FSDP2 inside): the parameters are DTensors and each rank holds its local shards. Its engine holds
  those shards, fragment by fragment, and exchanges them with its counterparts: the ranks that hold the same
  shards in the other replicas (the replicate dimension of the mesh the shard mesh was sliced from).
- **split** (DDP inside, or a plain model every rank of the replica holds whole): rank i of the replica's L
  ranks holds the i-th of L parts of each fragment, cut at the code's unit (sync::diloco_code::unit) so that
  each part is coded as it is in the whole fragment, exchanges it with its counterparts, and after each outer
  step the replica all-gathers the new parts over its own ranks.

Either way a replica sends one pseudo-gradient's bytes over the slow links whatever L, and each rank keeps 1/L
of the outer state (common model, outer momentum, residuals).
"""
import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _C

# (position of the parameter in the class's order, first value in its flat local tensor, values, place in the
# engine's flat tensor)
Piece = Tuple[int, int, int, int]


@functools.lru_cache(maxsize=None)
def dtensor_type() -> Optional[type]:
    """torch's DTensor class, or None where this torch has none (1.13)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor  # type: ignore[no-redef]
        except ImportError:
            return None
    return DTensor


def is_sharded(p: torch.Tensor) -> bool:
    t = dtensor_type()
    return t is not None and isinstance(p, t)


def local(p: torch.Tensor) -> torch.Tensor:
    """The values of `p` this rank holds: a DTensor's local shard (a view FSDP2 all-gathers from), or `p`."""
    return p.to_local() if is_sharded(p) else p


def check_contiguous(params: Sequence[torch.Tensor], bad: Any) -> None:
    """The engine reads and writes each parameter's local values as one flat run."""
    for i, p in enumerate(params):
        if not local(p).is_contiguous():
            raise bad("model", f"a parameter (the {i}-th of the fragments) whose local tensor is not contiguous",
                      "parameters whose local tensors are contiguous (FSDP2's shards are)")


class Plan:
    """Which values of each fragment this rank's engine holds, where they sit in its flat tensor, and the
    groups they travel over."""

    def __init__(self, kind: str, pieces: List[List[Piece]], lengths: List[int], counterparts: Any,
                 replica: Optional[Any], replica_size: int, replica_rank: int, config: Dict[str, Any]) -> None:
        self.kind = kind  # "sharded" or "split"
        self.pieces = pieces  # per fragment
        self.lengths = lengths  # per fragment: the engine's layer (and fragment) sizes
        self.counterparts = counterparts  # the process group the engine averages over
        self.replica = replica  # split: a gloo group of the replica's ranks, for the all-gathers
        self.replica_size = replica_size
        self.replica_rank = replica_rank
        self.config = config  # what a checkpoint must match
        self.whole: List[List[Piece]] = []  # split: per fragment, pieces of all its values
        self.parts: List[List[int]] = []  # split: per fragment, every replica rank's part length


def _pieces_of(sizes: Sequence[int], positions: Sequence[int], first: int, last: int, at: int) -> List[Piece]:
    """Pieces covering values [first, last) of the concatenation of parameters of `sizes`, placed from `at`."""
    out, begin = [], 0
    for size, pos in zip(sizes, positions):
        a, b = max(first, begin), min(last, begin + size)
        if a < b:
            out.append((pos, a - begin, b - a, at))
            at += b - a
        begin += size
    return out


def sharded_plan(params: List[torch.Tensor], fragment_params: List[List[torch.Tensor]], order: Dict[int, int],
                 process_group: Optional[Any], bad: Any, find_counterparts: bool = True) -> Plan:
    """FSDP2: the engine holds each parameter's local shard; `process_group` (or the mesh's replicate
    dimension) holds this rank's counterparts, checked. Without `find_counterparts` they are left to the
    caller (a membership engine's group, rebuilt each time the replicas change)."""
    meshes = {(m.device_type, tuple(m.mesh.shape), tuple(m.mesh.flatten().tolist()))
              for m in (p.device_mesh for p in params)}
    if len(meshes) != 1:
        raise bad("model", f"DTensor parameters on {len(meshes)} device meshes", "every parameter on one mesh")
    check_contiguous(params, bad)
    mesh = params[0].device_mesh
    if mesh.ndim != 1:
        # HSDP all-reduces every gradient across the replicas, each step: what DiLoCo's outer round replaces.
        raise bad("model", f"FSDP2 parameters on a {mesh.ndim}-D mesh (HSDP)",
                  "parameters sharded on a 1-D mesh inside each replica: fully_shard(model, mesh=mesh['shard']) "
                  "on a (replicate, shard) mesh, whose replicate dimension DiLoCo then exchanges over")
    shard_ranks = dist.get_process_group_ranks(mesh.get_group(0))
    if find_counterparts:
        if process_group is None:
            process_group = _replicate_group(mesh)
        if process_group is None:
            raise bad("process_group", None, "with FSDP2 on a mesh of its own, the group of this rank's "
                      "counterparts: the ranks that hold the same shards in the other replicas (one per replica)")
        _check_counterparts(process_group, shard_ranks, bad)
    pieces, lengths = [], []
    for group in fragment_params:
        out, at = [], 0
        for p in group:
            n = local(p).numel()
            if n:
                out.append((order[id(p)], 0, n, at))
            at += n
        pieces.append(out)
        lengths.append(at)
    coordinate = shard_ranks.index(dist.get_rank())
    signature = {"shard": coordinate, "of": len(shard_ranks), "lengths": lengths}
    if find_counterparts:
        _check_alike(process_group, signature, "process_group", bad)
    plan = Plan("sharded", pieces, lengths, process_group, None, len(shard_ranks), coordinate, signature)
    return plan


def _replicate_group(mesh: Any) -> Optional[Any]:
    """The other dimension's group of the 2-D mesh that `mesh` was sliced from (``mesh["shard"]`` of a
    (replicate, shard) mesh: the replicate group), or None when it was not sliced from one."""
    try:
        root = mesh._get_root_mesh()
    except AttributeError:  # a torch without sliced meshes' roots
        return None
    if root is mesh or root.ndim != 2 or not mesh.mesh_dim_names or not root.mesh_dim_names:
        return None
    shard_dim = root.mesh_dim_names.index(mesh.mesh_dim_names[0])
    return root.get_group(1 - shard_dim)


def split_plan(fragment_params: List[List[torch.Tensor]], order: Dict[int, int], code: str,
               process_group: Optional[Any], replica_group: Any, bad: Any) -> Plan:
    """DDP or plain replicas of L ranks: rank i holds the i-th of L parts of each fragment, cut at the code's
    unit."""
    size, rank = dist.get_world_size(replica_group), dist.get_rank(replica_group)
    unit = _C.diloco_code_unit(code)
    if unit == 0:
        raise bad("compression", code, "with a replica of several ranks, a code the ranks can split: dense, "
                  "fp16, bf16, int8, e3m0 or top-k with a chunk (-c<chunk>), whose chunks the ranks share out")
    if process_group is None:
        raise bad("process_group", None, "with replica_group, the group of this rank's counterparts: the ranks "
                  "of the same replica rank in every replica (one per replica)")
    members = group_ranks(replica_group)
    _check_counterparts(process_group, members, bad)
    check_contiguous([p for group in fragment_params for p in group], bad)
    pieces, whole, lengths, parts = [], [], [], []
    for group in fragment_params:
        sizes = [p.numel() for p in group]
        positions = [order[id(p)] for p in group]
        n = sum(sizes)
        units = (n + unit - 1) // unit
        cuts = [min(n, i * units // size * unit) for i in range(size + 1)]
        pieces.append(_pieces_of(sizes, positions, cuts[rank], cuts[rank + 1], 0))
        whole.append(_pieces_of(sizes, positions, 0, n, 0))
        lengths.append(cuts[rank + 1] - cuts[rank])
        parts.append([cuts[i + 1] - cuts[i] for i in range(size)])
    signature = {"replica_rank": rank, "of": size, "lengths": lengths}
    _check_alike(process_group, signature, "process_group", bad)
    plan = Plan("split", pieces, lengths, process_group, replica_group, size, rank, signature)
    plan.whole, plan.parts = whole, parts
    return plan


def group_ranks(group: Optional[Any]) -> List[int]:
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def _check_counterparts(process_group: Any, replica: List[int], bad: Any) -> None:
    counterparts = group_ranks(process_group)
    if set(counterparts) & set(replica) != {dist.get_rank()}:
        raise bad("process_group", f"ranks {counterparts}",
                  f"one rank of each replica, no other from this rank's replica (ranks {replica})")


def _check_alike(group: Any, signature: Dict[str, Any], name: str, bad: Any) -> None:
    """Every rank of `group` holds the same part of the model, or every rank raises naming `name`."""
    seen: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(seen, signature, group=group)
    if any(s != signature for s in seen):
        raise bad(name, f"a group whose ranks hold different parts of the model {seen}",
                  "ranks that hold the same shard or part in every replica")


def move(plan: Plan, order: List[torch.Tensor], flat: torch.Tensor, fragments: Sequence[int], offsets: List[int],
         into_engine: bool) -> None:
    """The fragments' values this rank holds, from the parameters into the engine's flat tensor
    (`into_engine`) or back."""
    with torch.no_grad():
        for f in fragments:
            base = offsets[f]
            for pos, first, n, at in plan.pieces[f]:
                param = local(order[pos]).detach().view(-1)[first:first + n]
                engine = flat[base + at:base + at + n]
                if into_engine:
                    engine.copy_(param)
                else:
                    param.copy_(engine)


def gather_fragment(plan: Plan, f: int, part: torch.Tensor) -> torch.Tensor:
    """Split: fragment f whole (float32), from each rank's part of it: one all-gather over the replica's
    ranks, every part padded to the longest."""
    lengths = plan.parts[f]
    longest = max(lengths)
    padded = torch.zeros(longest, dtype=torch.float32)
    padded[:part.numel()].copy_(part)
    got = [torch.empty(longest, dtype=torch.float32) for _ in lengths]
    dist.all_gather(got, padded, group=plan.replica)
    return torch.cat([g[:n] for g, n in zip(got, lengths)])


def write_whole(plan: Plan, order: List[torch.Tensor], f: int, values: torch.Tensor) -> None:
    """Split: fragment f's values, in fragment order, into the parameters."""
    with torch.no_grad():
        for pos, first, n, at in plan.whole[f]:
            order[pos].detach().view(-1)[first:first + n].copy_(values[at:at + n])
