"""AutoState's reading of its profile: the dense iterations it timed, reduced to the figures the step model
takes (commsgd_torch.auto)."""
import statistics
from typing import Any, Dict, List, NamedTuple, Sequence


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


class Profile(NamedTuple):
    buckets: int           # the buckets every profiled iteration saw
    forward: float         # seconds
    backward: float
    optimizer: float
    ready: List[float]     # when each bucket became ready, from the end of the forward pass
    period: float          # dense's whole step


def summarize(steps: Sequence[Dict[str, Any]], dense_periods: Sequence[float], blocking: bool) -> Profile:
    """The medians over the profiled iterations `steps` ({"forward_s", "ready_s", "done_s"} each) and the
    dense steps' periods; with a blocking hook, the ready times less the exchanges backward waited for."""
    nb = min(len(s["ready_s"]) for s in steps)
    forward = median([s["forward_s"] for s in steps])
    ready = [median([s["ready_s"][i] for s in steps]) for i in range(nb)]
    done = [median([s["done_s"][i] for s in steps if len(s["done_s"]) > i]) for i in range(nb)]
    period = median(dense_periods[2:]) or (forward + max(done))
    backward = ready[-1]
    optimizer = max(period - forward - max(backward, max(done)), 0.0)
    if blocking:  # the ready times measured include the exchanges waited for before: take them out
        lost, unhooked = 0.0, []
        for r, d in zip(ready, done):
            unhooked.append(r - lost)
            lost += max(d - r, 0.0)
        ready, backward = unhooked, unhooked[-1]
    return Profile(nb, forward, backward, optimizer, ready, period)
