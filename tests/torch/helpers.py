"""Shared by the commsgd_torch tests: run a function on N ranks of a process group (forked, or spawned where
CUDA is in use), the Dot model whose gradients are its inputs, load Fashion-MNIST."""
import faulthandler
import gzip
import os
import struct
import tempfile
import time
import traceback
import multiprocessing as mp

import torch
import torch.distributed as dist

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

# FSDP2 (torch 2), or None: torch 1.13 has no DeviceMesh, so its torch.distributed.fsdp (which fails to import
# under Python 3.11) is never tried.
try:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
except ImportError:
    init_device_mesh = FSDPModule = fully_shard = None


def needs_fsdp2():
    """The skip mark of a suite that needs FSDP2."""
    import pytest
    return pytest.mark.skipif(fully_shard is None, reason="FSDP2 needs torch 2 (fully_shard, DeviceMesh)")


def _worker(fn, rank, world, backend, cuda_device, store, queue, args):
    # A rank that hangs prints where, every minute, into the output the test shows when it fails.
    faulthandler.dump_traceback_later(60, repeat=True)
    try:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        torch.set_num_threads(1)
        if cuda_device is not None:
            torch.cuda.set_device(cuda_device)
        dist.init_process_group(backend, init_method="file://" + store, rank=rank, world_size=world,
                                timeout=__import__("datetime").timedelta(seconds=60))
        out = fn(rank, world, *args)
        # The result first, then the teardown, reported apart: a rank that hangs in it is named as such.
        queue.put((rank, "ok", out))
        dist.destroy_process_group()
        queue.put((rank, "closed", None))
    except BaseException:  # report everything, the parent decides
        queue.put((rank, "error", traceback.format_exc()))


def fresh_context():
    """A multiprocessing context whose children start clean, as spawned ones do (no threads or CUDA state of
    this process inherited), but forked from a server that has imported torch and commsgd_torch once: a
    spawned child pays those imports itself, seconds of a core each on a small machine. Its children see the
    environment the server started with (the first use in a session), not the caller's at the time."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "commsgd_torch"])
    return ctx


def run_ranks(fn, world=2, args=(), timeout=240, backend="gloo", spawn=False, cuda_device=None):
    """Runs fn(rank, world, *args) on `world` processes; returns their results by rank. Forked, unless
    `spawn` (a process that has touched CUDA cannot fork a child that uses it): then started clean
    (fresh_context); `cuda_device` is made each rank's current device before the group starts.

    A rank that raises, dies or outlives `timeout` fails the caller with that rank's traceback."""
    ctx = fresh_context() if spawn else mp.get_context("fork")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_worker, args=(fn, r, world, backend, cuda_device, store, queue, args))
                 for r in range(world)]
        for p in procs:
            p.start()
        results, closed, errors = {}, set(), []
        deadline = time.monotonic() + timeout
        try:
            while len(closed) < world:
                rank, status, out = queue.get(timeout=max(0.0, deadline - time.monotonic()))
                if status == "ok":
                    results[rank] = out
                    continue
                if status == "error":
                    errors.append(f"rank {rank}:\n{out}")
                closed.add(rank)
        except Exception as e:  # queue.Empty: some rank hung or died without reporting
            silent = sorted(set(range(world)) - set(results) - closed)
            if silent:
                errors.append(f"ranks {silent} did not report within {timeout} s: {e!r}")
            stuck = sorted(set(results) - closed)
            if stuck:
                errors.append(f"ranks {stuck} reported, then did not end dist.destroy_process_group() within "
                              f"{timeout} s")
        finally:
            reap(procs)
        if errors:
            raise AssertionError("\n".join(errors))
        return [results[r] for r in range(world)]


def reap(procs):
    """Waits a little for each process, then kills what is left: no test leaves a process behind."""
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()


def no_errors(errors, what="replica"):
    """Fails the test with every (who, traceback) in `errors`, naming each."""
    if errors:
        import pytest
        pytest.fail("\n".join(f"{what} {who}:\n{tb}" for who, tb in errors), pytrace=False)


class Dot(torch.nn.Module):
    """loss = sum_i <p_i, x_i>: the gradient of p_i is x_i exactly, so gradients are whatever we feed."""

    def __init__(self, sizes):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(n)) for n in sizes])

    def forward(self, xs):
        return sum((p * x).sum() for p, x in zip(self.ps, xs))


SIZES = [1000, 37, 1, 4096, 513]


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">i", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "i" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def fashion_mnist(split, count=None):
    """(images as float32 N x 784 in [0, 1], labels as int64) from the Debian dataset files."""
    prefix = "train" if split == "train" else "t10k"
    x = _idx(os.path.join(FASHION_MNIST, f"{prefix}-images-idx3-ubyte.gz"))
    y = _idx(os.path.join(FASHION_MNIST, f"{prefix}-labels-idx1-ubyte.gz"))
    if count is not None:
        x, y = x[:count], y[:count]
    return x.reshape(len(x), -1).float() / 255.0, y.long()


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


class FakeBucket:
    """What a DDP hook sees of a bucket, built by hand: parameters, their gradients flattened, is_last."""

    def __init__(self, params, grads, last=True):
        self._params = params
        self._buffer = torch.cat([g.reshape(-1) for g in grads]) if grads else torch.zeros(0)
        self._last = last

    def parameters(self):
        return self._params

    def buffer(self):
        return self._buffer

    def is_last(self):
        return self._last


class Bucket:
    """A DDP bucket as the hooks see it: a flat buffer, per-parameter views into it, an index; its parameters
    the views, or `params` where given."""

    def __init__(self, grads, index=0, last=True, params=None):
        self._buffer = torch.cat([g.reshape(-1) for g in grads]).contiguous()
        self._views, off = [], 0
        for g in grads:
            self._views.append(self._buffer[off:off + g.numel()].view(g.shape))
            off += g.numel()
        self._index, self._last, self._params = index, last, params

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._views

    def parameters(self):
        return self._views if self._params is None else self._params

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def is_first(self):
        return self._index == 0
