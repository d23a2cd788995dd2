"""AutoState's measurement of the network: latency and bandwidth of its group, the same on every rank
(commsgd_torch.auto)."""
from typing import Tuple

import torch
import torch.distributed as dist

from . import _C
from ._auto_compute import timed


def measure_network(process_group: dist.ProcessGroup, world: int) -> Tuple[float, float]:
    """Latency and bandwidth of `process_group` (of `world` ranks) from a small and a large ring all-reduce.
    The timing is torch.distributed's, on this group; the model read from it is the library's (_C.fit_network,
    what sync::measure_network reads from its own timings): each number the slowest rank's, since a
    synchronous exchange waits for its slowest link, so every rank gets the same two."""
    if world == 1:
        return 0.0, float("inf")
    small, big = torch.zeros(1), torch.zeros(1 << 20)
    for _ in range(2):
        dist.all_reduce(small, group=process_group)
    t_small = timed(lambda: dist.all_reduce(small, group=process_group), 5)
    t_big = timed(lambda: dist.all_reduce(big, group=process_group), 3)
    mine = torch.tensor([t_small, t_big], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=process_group)
    latency, bandwidth = _C.fit_network([float(t[0]) for t in every], [float(t[1]) for t in every], big.numel())
    return latency, bandwidth
