"""What a 16-bit hook costs the CPU besides the network: PyTorch's fp16_compress_hook against commsgd's fp16
compressor hook, per bucket, on a one-rank gloo group (so the all-reduce moves nothing and what is timed is each
hook's own work: casts, checks, copies, its future), interleaved in one process.

    PY examples/torch_ddp/hook_cost.py [--sizes 235146,936330,6553600] [--calls 60] [--rounds 5]

Prints, per bucket size, the median microseconds of a call (hook + wait on its future) for each hook over
`rounds` interleaved rounds of `calls` calls, and their ratio. Gradient-like values: normal(0, 1e-3). Beside
them, the hook's memory floor timed in the same rounds: a copy of 6 bytes a value (12 bytes a value read and
written: the float bucket read and its 16-bit message written, the 16-bit sum read and the floats written
back), and each hook over it.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import commsgd_torch


class Bucket:
    """What both hooks read of a DDP bucket."""

    def __init__(self, n):
        self._buffer = torch.empty(n)
        self._param = torch.nn.Parameter(torch.empty(n))
        self._param.grad = self._buffer

    def refill(self, g):
        self._buffer.copy_(g)

    def buffer(self):
        return self._buffer

    def index(self):
        return 0

    def is_last(self):
        return True

    def parameters(self):
        return [self._param]

    def gradients(self):
        return [self._buffer]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="235146,936330,6553600")
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(1)
    store = tempfile.NamedTemporaryFile(delete=False).name
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    group = dist.new_group(backend="gloo")
    print(f"torch {torch.__version__}, commsgd_torch from {os.path.dirname(commsgd_torch.__file__)}")
    print("| bucket values | PyTorch fp16_compress_hook, us | commsgd fp16 hook, us | commsgd / PyTorch "
          "| floor, us | PyTorch / floor | commsgd / floor |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in [int(s) for s in a.sizes.split(",")]:
        g = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 1e-3
        bucket = Bucket(n)
        state = commsgd_torch.CompressorState(group, kind="fp16", start_iter=0)
        src, dst = torch.ones(6 * n, dtype=torch.uint8), torch.empty(6 * n, dtype=torch.uint8)

        class Done:
            def wait(self):
                return dst

        def floor(b):
            dst.copy_(src)
            return Done()

        hooks = {"pytorch": lambda b: default_hooks.fp16_compress_hook(group, b),
                 "commsgd": lambda b: commsgd_torch.compressor_hook(state, b),
                 "floor": floor}
        times = {k: [] for k in hooks}
        for r in range(a.rounds + 1):  # the first round warms up, untimed
            for name, hook in hooks.items():
                for _ in range(a.calls):
                    bucket.refill(g)
                    t0 = time.perf_counter()
                    out = hook(bucket).wait()
                    t1 = time.perf_counter()
                    if r > 0:
                        times[name].append(t1 - t0)
                # Both hooks average over one rank: the bucket comes back as its 16-bit rounding.
                want = g.to(torch.float16).to(torch.float32)
                if name != "floor" and not torch.equal(out, want):
                    sys.exit(f"{name}: the result is not the bucket's fp16 rounding")
        pt, cs, fl = (statistics.median(times[k]) * 1e6 for k in ("pytorch", "commsgd", "floor"))
        print(f"| {n:,} | {pt:.0f} | {cs:.0f} | {cs / pt:.2f}x | {fl:.0f} | {pt / fl:.2f}x | {cs / fl:.2f}x |")
    dist.destroy_process_group()
    os.unlink(store)


if __name__ == "__main__":
    main()
