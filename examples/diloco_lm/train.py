#!/usr/bin/python3
"""A byte-level causal transformer trained on the Python standard library's own sources, one process per rank,
to compare data-parallel exchanges where they matter: a language model, AdamW, few bytes of compute per
parameter.

Data (--corpus stdlib, the default): every .py file under sysconfig.get_paths()["stdlib"] except site-packages,
dist-packages, test folders and caches, in sorted order of relative path; a file goes to validation when the
CRC-32 of its relative path is 0 mod 20, else to training, so every rank and every run on this Python agrees.
(Another Python version ships other sources: compare arms on one machine's interpreter.) --corpus docs: English
prose instead, pydoc's topics (pydoc_data.topics), split by topic name the same way.

Models: --model transformer (ByteLM, the default) or mlp (ByteMLP: another family, each byte predicted from the
--span bytes before it through --layers hidden layers of --width; the sparse codes' second model).

Batches: step s draws `--batch` global windows of `--context` + 1 bytes at offsets from a generator seeded by
(seed, s); rank r of n trains on rows [r B / n, (r + 1) B / n). Every arm sees the same token stream.

Arms (all with AdamW, the same learning-rate schedule, the same global batch):
    ddp            DistributedDataParallel, dense all-reduce every step
    fsdp           FSDP2 (fully_shard, each block and the whole) over every rank: DDP's step, the model sharded
                   (--reduce-scatter int8, e3m0, fp16 or bf16: the gradients' reduce-scatter in
                   commsgd_torch.fsdp's codes)
    hsdp           replicas of --replica-ranks ranks, FSDP2 inside each, the gradients averaged across replicas
                   every step: --replicate float32 is FSDP2's own HSDP (a 2-D mesh, float32 all-reduce); fp16,
                   powersgd (--psgd-rank) or topk (--density) go through commsgd_torch.hsdp's replicate hook
                   with that commsgd DDP hook family (dense for --warmup steps); auto: AutoState among dense,
                   fp16 and powersgd, profiled for --warmup steps
    ddp-powersgd   DDP with PyTorch's PowerSGD hook (--psgd-rank, dense for --warmup steps)
    ddp-topk       DDP with commsgd_torch.TopKState / topk_hook (--density, dense for --warmup steps)
    postlocal      DDP with PyTorch's post-local-SGD hook and PostLocalSGDOptimizer + PeriodicModelAverager
                   (dense for --warmup steps, then model averaging every --sync-every steps)
    diloco         commsgd_torch.DiLoCo over AdamW (--sync-every, --outer-lr, --outer-momentum, --fragments,
                   --delay, --alpha, --compression: dense, fp16, bf16, int8, e3m0 or topk-<density>);
                   with --replica-ranks L > 1, replicas of L ranks with FSDP2 inside (a (replicate, shard)
                   mesh, each block and the whole sharded on the shard dimension), DiLoCo between them
    torchft-diloco torchft's DiLoCo (torchft.local_sgd.DiLoCo; pip install torchft) over AdamW, each rank a
                   replica group of one, a lighthouse started by rank 0 (--sync-every, --outer-lr,
                   --outer-momentum, --fragments as contiguous groups of blocks, --delay, --alpha; float32
                   only: torchft quantises through Triton on a GPU); bytes_sent counts the tensors torchft
                   hands its gloo group, each charged as a ring all-reduce

Log (--log, JSON lines, rank 0): per evaluation step, wall_s (since the start of training), train_s (time in
training steps, communication not hidden included, evaluation excluded), val_loss (nats per byte, of the
global model), bytes_sent (this rank's, by comm/traffic.hpp's count through commsgd_torch._C; see below), and
for diloco exchanges (fragment exchanges started: DiLoCo.stats()["exchanges_started"]); moved, the share of the
global model's values that changed since the previous evaluation (with --eval-every equal to --sync-every, one
round's coverage); max_rss_mb, the largest peak resident memory of any rank so far (MiB).

    torchrun --nproc_per_node 4 examples/diloco_lm/train.py --arm diloco --steps 2000 --log diloco.jsonl
    python3 examples/diloco_lm/train.py --arm ddp --steps 200      # WORLD_SIZE unset: one process
"""
import argparse
import copy
import json
import math
import os
import sys
import sysconfig
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ARMS = ("ddp", "fsdp", "hsdp", "ddp-powersgd", "ddp-topk", "postlocal", "diloco", "torchft-diloco")
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


# --- data ------------------------------------------------------------------------------------------------------

def stdlib_split(root=None, every=20):
    """(train bytes, validation bytes) as uint8 tensors: the stdlib's .py files, split by CRC-32 of the path."""
    root = root or sysconfig.get_paths()["stdlib"]
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        files += [os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith(".py")]
    parts = {"train": [], "val": []}
    for rel in sorted(files):
        with open(os.path.join(root, rel), "rb") as f:
            text = f.read()
        side = "val" if zlib.crc32(rel.encode()) % every == 0 else "train"
        parts[side].append(text + b"\0")  # a NUL between files: a byte no source contains
    return tuple(torch.frombuffer(bytearray(b"".join(parts[s])), dtype=torch.uint8) for s in ("train", "val"))


def docs_split(every=10):
    """(train bytes, validation bytes) of English prose: the reference text every Python ships for pydoc (about
    470 KB over 79 topics), a topic to validation when the CRC-32 of its name is 0 mod 10 (about 43 KB)."""
    from pydoc_data.topics import topics
    parts = {"train": [], "val": []}
    for name in sorted(topics):
        side = "val" if zlib.crc32(name.encode()) % every == 0 else "train"
        parts[side].append(topics[name].encode() + b"\0")
    return tuple(torch.frombuffer(bytearray(b"".join(parts[s])), dtype=torch.uint8) for s in ("train", "val"))


CORPORA = {"stdlib": stdlib_split, "docs": docs_split}


def batch_rows(data, step, seed, batch, context, rank, world):
    """This rank's rows of step `step`'s global batch: (inputs, targets), int64, [batch / world, context]."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=g)
    per = batch // world
    mine = starts[rank * per:(rank + 1) * per]
    win = torch.stack([data[s:s + context + 1] for s in mine.tolist()]).long()
    return win[:, :-1], win[:, 1:]


def val_windows(data, count, context):
    """`count` fixed windows spread evenly over the validation bytes."""
    span = data.numel() - context - 1
    starts = [i * span // count for i in range(count)]
    return torch.stack([data[s:s + context + 1] for s in starts]).long()


# --- model -----------------------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x, mask):
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(w, dim=2)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(w // self.heads)
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, w))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class ByteLM(nn.Module):
    """Pre-norm decoder: byte and position embeddings, `layers` blocks, output tied to the byte embedding."""

    def __init__(self, layers=4, width=128, heads=4, context=128):
        super().__init__()
        self.tok = nn.Embedding(256, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        # True above the diagonal: the future a position may not see. Not a buffer, so DDP has none to broadcast.
        self._mask = torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, idx):
        if self._mask.device != idx.device:  # a plain attribute: module.to() does not move it
            self._mask = self._mask.to(idx.device)
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x, self._mask)
        return self.ln(x) @ self.tok.weight.t()


class ByteMLP(nn.Module):
    """A model of another family: each byte predicted from the `span` bytes up to it alone (the bytes before
    a window read as NUL), each embedded in `embed` dimensions, concatenated, `layers` hidden layers of
    `width` with GELU, then 256 logits. No attention, no normalisation: an n-gram model that learns."""

    def __init__(self, layers=2, width=256, span=16, embed=32):
        super().__init__()
        self.span = span
        self.tok = nn.Embedding(256, embed)
        dims = [span * embed] + [width] * layers
        self.blocks = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.out = nn.Linear(dims[-1], 256)

    def forward(self, idx):
        b, t = idx.shape
        seen = F.pad(idx, (self.span - 1, 0)).unfold(1, self.span, 1)  # [b, t, span]: bytes t - span + 1 .. t
        x = self.tok(seen).reshape(b, t, -1)
        for layer in self.blocks:
            x = F.gelu(layer(x))
        return self.out(x)


def make_model(args):
    if args.model == "mlp":
        return ByteMLP(args.layers, args.width, args.span)
    return ByteLM(args.layers, args.width, args.heads, args.context)


def lm_loss(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))


# --- arms ------------------------------------------------------------------------------------------------------

def diloco_globals(opt, params):
    """A function returning a commsgd_torch.DiLoCo's global model in the order of `params`. The global model is
    the engine's copy (equal on every rank after each outer step; with fragments, each fragment's copy as of its
    last outer step); global_parameters() returns it fragment after fragment in fragment_parameters() order,
    mapped back here by position."""
    local = [p for f in range(opt.num_fragments) for p in opt.fragment_parameters(f)]
    where = {id(p): i for i, p in enumerate(local)}
    if len(where) != len(local) or set(where) != {id(p) for p in params}:
        raise SystemExit("diloco_lm: DiLoCo's fragments do not cover the model's parameters once each")
    order = [where[id(p)] for p in params]

    def global_params():
        copies = opt.global_parameters()
        return [copies[i] for i in order]
    return global_params


def make_arm(args, model, inner):
    """(the module to train, the optimizer to step, a function returning this rank's bytes sent or None, a
    function returning the global model's parameters in model.parameters() order)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    meter = None
    if args.arm in ("ddp", "ddp-powersgd", "postlocal") or (args.arm == "hsdp" and args.replicate == "float32"):
        import commsgd_torch
        meter = commsgd_torch.AllReduceMeter(on=False)  # counting during training steps only (main())
    params = list(model.parameters())
    if args.arm == "diloco":
        import commsgd_torch
        opt = commsgd_torch.DiLoCo(model, inner, sync_every=args.sync_every, outer_lr=args.outer_lr,
                                   outer_momentum=args.outer_momentum, fragments=args.fragments,
                                   delay=args.delay, alpha=args.alpha, compression=args.compression,
                                   keep_delay_steps=bool(args.keep_delay_steps))
        return model, opt, (lambda: opt.bytes_sent), diloco_globals(opt, params)
    if args.arm == "torchft-diloco":
        return torchft_arm(args, model, inner)
    if args.arm == "hsdp":  # sharded by shard(); the bytes are the cross-replica exchange's
        if args.replicate == "float32":
            return model, inner, (lambda: meter.bytes_sent), (lambda: params)
        state = model._replicate_state
        if args.replicate == "auto":  # its dense and fp16 rounds are PyTorch's collectives, not counted here
            return model, inner, (lambda: None), (lambda: params)
        return model, inner, (lambda: state.traffic()["bytes_sent"]), (lambda: params)
    if args.arm == "fsdp":  # sharded by shard(); its collectives are FSDP2's own (bytes not counted) unless
        # --reduce-scatter codes the gradients' reduce-scatter: then its bytes, as the communicator counted them
        codes = getattr(model, "_reduce_scatter_codes", None)
        return model, inner, (lambda: codes.traffic()["bytes_sent"] if codes else None), (lambda: params)
    ddp = DDP(model)  # the model has no buffers (the causal mask is a plain attribute): nothing else to sync
    opt = inner
    global_params = lambda: params  # every rank holds the same model after each step  # noqa: E731
    if args.arm == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)  # DDP's own, but through the meter
    elif args.arm == "ddp-powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.psgd_rank,
                                   start_powerSGD_iter=max(args.warmup, 2), random_seed=args.seed)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    elif args.arm == "ddp-topk":
        import commsgd_torch
        # No momentum in the hook: AdamW keeps its moments, as in every other arm; error feedback keeps the rest.
        state = commsgd_torch.TopKState(model=model, density=args.density, momentum=0.0, start_iter=args.warmup)
        ddp.register_comm_hook(state, commsgd_torch.topk_hook)
        return ddp, opt, (lambda: state.traffic()["bytes_sent"]), global_params
    elif args.arm == "postlocal":
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as plsgd
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer
        # After the warm-up the hook all-reduces in `subgroup` only: one group per rank, so nothing moves
        # between averagings (PyTorch's default subgroup is one per machine, of CUDA devices).
        # (new_subgroups refuses to without CUDA: make them with new_group, which every rank calls for every group.)
        own = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
        state = plsgd.PostLocalSGDState(process_group=None, subgroup=own, start_localSGD_iter=args.warmup)
        ddp.register_comm_hook(state, plsgd.post_localSGD_hook)
        opt = PostLocalSGDOptimizer(optim=inner, averager=PeriodicModelAverager(period=args.sync_every,
                                                                                warmup_steps=args.warmup))

        # The global model of local SGD: the mean of the ranks' models (what the next averaging would make),
        # computed for evaluation with an all-reduce the meter does not count.
        def global_params():
            out = [p.detach().clone() for p in params]
            for t in out:
                dist.all_reduce(t)
                t /= dist.get_world_size()
            return out
    return ddp, opt, (lambda: meter.bytes_sent), global_params


def _die_with_parent():
    """A preexec_fn for a helper such as the lighthouse: SIGTERM when this process dies (Linux's
    PR_SET_PDEATHSIG), however it ends, so that the helper never outlives the rank that started it; None where
    there is no prctl (atexit is all there is). prctl is looked up here, before the fork: a child forked from
    a process with threads must not wait on the loader's lock, which another thread may have held at the fork.
    """
    import ctypes
    import signal
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm():
        prctl(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the signal was set: it will never come
            os._exit(1)
    return arm


def unit_fragments(model, P):
    """Streamed DiLoCo's fragments by module: the transformer's units (embeddings, blocks, final norm) in P
    contiguous groups, or the whole model when P is 1 (torchft's arms, and train_ft.py's commsgd arm, so that
    both stream the same fragments)."""
    if P <= 1:
        return [model]
    units = [model.tok, model.pos, *model.blocks, model.ln]
    return [nn.ModuleList(units[len(units) * f // P:len(units) * (f + 1) // P]) for f in range(P)]


def torchft_globals(frags, diloco, params):
    """A function giving torchft's global model in the order of `params`: each fragment's copy as of its last
    outer step (torchft's backup of it; with FSDP2 this rank's shard of it, made a DTensor again)."""
    def global_params():
        by_id = {}
        for frag, f in zip(frags, diloco._fragments):
            for name, p in frag.named_parameters():
                t = f.original_parameters[name]
                if hasattr(p, "device_mesh"):
                    t = type(p).from_local(t, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
                by_id[id(p)] = t
        return [by_id[id(p)] for p in params]
    return global_params


def torchft_arm(args, model, inner):
    """torchft's DiLoCo as its users run it on CPUs: a Manager per rank of each replica group (one rank each, or
    --replica-ranks with FSDP2 inside: torchft's group of a rank then holds that rank of every replica, and its
    all-reduces carry the rank's shards) over torchft's reconfigurable gloo group, a quorum from a lighthouse
    (rank 0 starts it, at MASTER_ADDR), an outer Nesterov SGD. Every address is this rank's own (NETCLUSTER_ADDR
    on an emulated cluster); a replica's store is its first rank's."""
    import atexit
    import datetime
    import shutil
    import socket
    import subprocess
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.http_transport import HTTPTransport
    from torchft.local_sgd import DiLoCo as TorchftDiLoCo
    rank, world = dist.get_rank(), dist.get_world_size()
    L = args.replica_ranks
    replicas, first = world // L, rank // L * L
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    own = os.environ.get("NETCLUSTER_ADDR", "127.0.0.1")
    addresses = [None] * world
    dist.all_gather_object(addresses, own)
    lighthouse_port, store_port, manager_port = 29510, 29600 + first, 29700 + rank
    if rank == 0:
        exe = shutil.which("torchft_lighthouse") or os.path.join(os.path.dirname(sys.executable),
                                                                  "torchft_lighthouse")
        lighthouse = subprocess.Popen([exe, "--min_replicas", str(replicas), "--quorum_tick_ms", "100",
                                       "--join_timeout_ms", "10000", "--bind", f"[::]:{lighthouse_port}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      preexec_fn=_die_with_parent())
        atexit.register(lighthouse.terminate)  # a process that ends without atexit (a forked test rank,
        # a kill) takes it down through the parent-death signal instead
    dist.barrier()
    timeout = datetime.timedelta(seconds=120)
    # The replica group's own store, on its first rank (torchrun's, were each replica group started by a
    # torchrun of its own).
    store = dist.TCPStore(addresses[first], store_port, is_master=rank == first, wait_for_workers=False,
                          timeout=timeout)

    class CountingGloo(ProcessGroupGloo):
        """torchft's gloo group, keeping the size of every tensor its all-reduces are handed: the bytes come
        from what torchft gave the collective, not from what it is assumed to send."""
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.handed = []  # (values, bytes a value) of each tensor, in order

        def allreduce(self, tensors, opts):
            self.handed.extend((t.numel(), t.element_size()) for t in tensors)
            return super().allreduce(tensors, opts)

        def allreduce_coalesced(self, tensors, opts):
            self.handed.extend((t.numel(), t.element_size()) for t in tensors)
            return super().allreduce_coalesced(tensors, opts)
    pg = CountingGloo(timeout=timeout)

    class Transport(HTTPTransport):  # the recovery checkpoint's address: this rank's, not the machine's name
        def address(self):
            return super().address().replace(socket.gethostname(), own, 1)
    state = lambda: {"model": model.state_dict(), "inner": inner.state_dict()}  # noqa: E731
    load = lambda sd: (model.load_state_dict(sd["model"]), inner.load_state_dict(sd["inner"]))  # noqa: E731
    manager = Manager(pg=pg, min_replica_size=replicas, load_state_dict=load, state_dict=state,
                      use_async_quorum=False, replica_id=f"rank{first}", store_addr=addresses[first],
                      store_port=store_port, rank=rank - first, world_size=L,
                      lighthouse_addr=f"http://{master}:{lighthouse_port}", port=manager_port, hostname=own,
                      timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
                      checkpoint_transport=Transport(timeout=timeout, num_chunks=0),
                      # Every replica starts from the same model (the same seed), as DiLoCo's broadcast makes
                      # it; torchft's default (True) would have each replica load rank 0's model and AdamW
                      # state at the first sync, so that the first outer step used rank 0's progress alone.
                      init_sync=False)
    atexit.register(lambda: manager.shutdown(wait=False))
    model._torchft_keep = (store, manager)  # alive as long as the model
    frags = unit_fragments(model, args.fragments)
    # One outer optimizer per fragment, as torchft's streaming examples make them.
    outer = [torch.optim.SGD(f.parameters(), lr=args.outer_lr, momentum=args.outer_momentum,
                             nesterov=args.outer_momentum > 0)
             for f in frags]
    diloco = TorchftDiLoCo(manager, frags, inner, outer, sync_every=args.sync_every,
                           fragment_sync_delay=args.delay, fragment_update_alpha=args.alpha)
    diloco.__enter__()
    params = list(model.parameters())

    global_params = torchft_globals(frags, diloco, params)
    # What this rank sends for the tensors handed to the group: gloo's ring all-reduce of each, among the
    # replicas (comm/traffic.hpp's count of a ring, on the sizes torchft handed over).
    from commsgd_torch import _C
    ring = {}

    def sent():
        total = 0
        for values, size in pg.handed:
            if (values, size) not in ring:
                ring[values, size] = _C.ring_all_reduce_traffic(values, size, replicas, rank // L)["bytes_sent"]
            total += ring[values, size]
        return total
    return model, inner, sent, global_params


# --- training --------------------------------------------------------------------------------------------------

def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", choices=ARMS, required=True)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-windows", type=int, default=256, help="validation windows of --context bytes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default=None, help="JSON lines, written by rank 0")
    p.add_argument("--batch", type=int, default=64, help="global batch, in windows (divisible by WORLD_SIZE)")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--model", choices=("transformer", "mlp"), default="transformer",
                   help="transformer: ByteLM (--layers, --width, --heads); mlp: ByteMLP (--layers hidden layers "
                        "of --width over the last --span bytes)")
    p.add_argument("--span", type=int, default=16, help="mlp: the bytes each prediction sees")
    p.add_argument("--corpus", choices=sorted(CORPORA), default="stdlib",
                   help="stdlib: the standard library's .py sources; docs: pydoc's English reference text")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--lr-warmup", type=int, default=50, help="linear learning-rate warm-up, then cosine to 10 %%")
    p.add_argument("--warmup", type=int, default=20, help="dense steps before PowerSGD, top-k, local SGD")
    p.add_argument("--psgd-rank", type=int, default=4)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--sync-every", type=int, default=50, help="H for diloco, the period for postlocal")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--fragments", type=int, default=1)
    p.add_argument("--delay", type=int, default=0)
    p.add_argument("--alpha", type=float, default=0.0)
    p.add_argument("--keep-delay-steps", type=int, choices=(0, 1), default=0,
                   help="diloco: 1 merges by keeping the --delay steps whole (DiLoCo's keep_delay_steps), "
                        "--alpha 0")
    p.add_argument("--compression", default="dense",
                   help="diloco's code of the pseudo-gradients (commsgd_torch.DiLoCo's compression): dense "
                        "(float32, the default), fp16, bf16, int8, e3m0 (4-bit, blocks of 256) or "
                        "topk-<density> (top-k with error feedback, density in (0, 1], e.g. topk-0.01; "
                        "-shared: one set of indices for every rank, summed by a ring)")
    p.add_argument("--replica-ranks", type=int, default=1,
                   help="diloco: ranks a replica, FSDP2 inside it (1: each rank its own replica)")
    p.add_argument("--reduce-scatter", choices=("float32", "int8", "e3m0", "fp16", "bf16"), default="float32",
                   help="fsdp: the gradients' reduce-scatter, FSDP2's own (float32) or commsgd_torch.fsdp's codes")
    p.add_argument("--replicate", choices=("float32", "fp16", "powersgd", "topk", "auto"), default="float32",
                   help="hsdp: the cross-replica exchange, FSDP2's own (float32) or a commsgd hook family")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--stop-at", type=float, default=None,
                   help="stop after the first evaluation whose validation loss is at or below this (a time-to-"
                        "target run need not train on; the schedule still spans --steps)")
    args = p.parse_args(argv)
    if args.replica_ranks < 1 or (args.replica_ranks > 1 and args.arm not in ("diloco", "torchft-diloco", "hsdp")):
        p.error(f"--replica-ranks {args.replica_ranks}: 1, or more with --arm diloco, torchft-diloco or hsdp")
    if args.model == "mlp" and args.arm == "torchft-diloco":
        p.error("--model mlp: the torchft arm's fragments are the transformer's units; use --model transformer")
    if args.span < 1:
        p.error(f"--span {args.span}: at least 1")
    if args.arm == "diloco":  # refused here, before any rank starts, rather than by DiLoCo on every rank
        from commsgd_torch import InvalidArgument, _C
        try:
            _C.diloco_code_name(args.compression)
        except InvalidArgument as e:
            p.error(f"--compression: {e}")
    return args


def init_group():
    """The default gloo group: from the environment (torchrun, netcluster run), or one process alone."""
    if dist.is_initialized():
        return
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def whole(t):
    """A sharded parameter (an FSDP2 DTensor) gathered whole, on every rank of its mesh (collective); any other
    tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def flat(tensors):
    """The tensors' whole values (a DTensor's gathered), one flat vector."""
    return torch.cat([whole(t.detach()).reshape(-1) for t in tensors])


def shard(args, model):
    """FSDP2 on the model, in place, before its optimizer is made: over every rank (the fsdp arm), or inside
    each replica of --replica-ranks ranks (diloco, torchft-diloco)."""
    if args.arm not in ("fsdp", "hsdp") and args.replica_ranks == 1:
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    world, L = dist.get_world_size(), args.replica_ranks
    if world % L:
        raise SystemExit(f"--replica-ranks {L} does not divide the world size {world}")
    if args.arm == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
    else:
        mesh2 = init_device_mesh("cpu", (world // L, L), mesh_dim_names=("replicate", "shard"))
        # FSDP2's own HSDP shards over the 2-D mesh; every other exchange across replicas is a hook over the
        # replicate dimension, FSDP2 over the shard dimension alone.
        mesh = mesh2 if args.arm == "hsdp" and args.replicate == "float32" else mesh2["shard"]
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if args.arm == "hsdp" and args.replicate != "float32":
        import commsgd_torch
        group = mesh2["replicate"].get_group()
        warm = max(args.warmup, 2)
        if args.replicate == "fp16":
            state, hook = commsgd_torch.CompressorState(group, kind="fp16", start_iter=0), commsgd_torch.compressor_hook
        elif args.replicate == "powersgd":
            state = commsgd_torch.PowerSGDState(group, matrix_approximation_rank=args.psgd_rank,
                                                start_powerSGD_iter=warm, random_seed=args.seed)
            hook = commsgd_torch.powersgd_hook
        elif args.replicate == "auto":  # the network measured on the replicate group, dense profiled first
            state = commsgd_torch.AutoState(group, model=model, profile_steps=max(args.warmup, 3),
                                            candidates=("dense", "fp16", f"powersgd-r{args.psgd_rank}"))
            hook = commsgd_torch.auto_hook
        else:  # AdamW keeps its moments, as in ddp-topk; error feedback keeps the rest
            state = commsgd_torch.TopKState(group, model=model, density=args.density, momentum=0.0, start_iter=warm)
            hook = commsgd_torch.topk_hook
        commsgd_torch.hsdp.register_replicate_hook(model, state, hook)
        model._replicate_state = state
    if args.arm == "fsdp" and args.reduce_scatter != "float32":
        import commsgd_torch
        model._reduce_scatter_codes = commsgd_torch.fsdp.compress_reduce_scatter(model, code=args.reduce_scatter)


@torch.no_grad()
def evaluate(model, global_params, windows):
    """Validation loss (nats per byte) of the global model: `model` with the global parameters copied in,
    this rank's share of the windows, summed over ranks."""
    for p, g in zip(model.parameters(), global_params):
        p.copy_(whole(g))
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = windows[rank::world]
    total = torch.zeros(2, dtype=torch.float64)
    for i in range(0, mine.shape[0], 32):
        w = mine[i:i + 32]
        total[0] += F.cross_entropy(model(w[:, :-1]).reshape(-1, 256), w[:, 1:].reshape(-1),
                                    reduction="sum").item()
        total[1] += w[:, 1:].numel()
    dist.all_reduce(total)
    return (total[0] / total[1]).item()


def max_rss_mb():
    """The largest peak resident memory of any rank so far, in MiB (collective): what a rank of the arm needs."""
    import resource
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return round(peak.item(), 1)


def main(argv=None):
    args = parse(argv)
    torch.set_num_threads(args.threads)
    init_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} is not divisible by the world size {world}")
    train, val = CORPORA[args.corpus]()
    windows = val_windows(val, args.eval_windows, args.context)
    torch.manual_seed(args.seed)  # the same initial model on every rank (DDP and DiLoCo broadcast rank 0's)
    model = make_model(args)
    eval_model = copy.deepcopy(model)
    nparams = sum(p.numel() for p in model.parameters())
    shard(args, model)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                              betas=(0.9, 0.95))

    def lr_at(step):  # factor for step `step` (0-based): linear warm-up, then cosine down to 10 %
        if step < args.lr_warmup:
            return (step + 1) / args.lr_warmup
        frac = (step - args.lr_warmup) / max(1, args.steps - args.lr_warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac)))
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lr_at)

    net, opt, bytes_sent, global_params = make_arm(args, model, inner)
    # The arm's AllReduceMeter, if it made one: counting on during training steps only, not evaluation.
    counting = getattr(dist.all_reduce, "__self__", None)
    if rank == 0:
        print(f"diloco_lm: arm {args.arm}, {args.model} on {args.corpus}, {world} rank(s), {nparams} parameters, "
              f"train {train.numel()} bytes, val {val.numel()} bytes", flush=True)
    log = open(args.log, "w") if args.log and rank == 0 else None
    records = []
    before = flat(global_params())
    start = time.perf_counter()
    train_s = 0.0
    for step in range(1, args.steps + 1):
        x, y = batch_rows(train, step - 1, args.seed, args.batch, args.context, rank, world)
        if counting is not None:
            counting.on = True
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = lm_loss(net, x, y)
        loss.backward()
        opt.step()
        sched.step()
        train_s += time.perf_counter() - t0
        if counting is not None:
            counting.on = False
        if step % args.eval_every == 0 or step == args.steps:
            if args.arm == "diloco" and step == args.steps:
                t0 = time.perf_counter()
                # The exchanges in flight applied, and every fragment that moved since its last one exchanged
                # once more: the final model is the synchronised one.
                opt.finish()
                train_s += time.perf_counter() - t0
            sent = bytes_sent()
            now = global_params()
            # The share of the global model's values that moved since the last evaluation: with --eval-every H,
            # what one round's exchange touched (a sparse code's coverage, its senders' union).
            after = flat(now)
            moved = round(float((after != before).double().mean()), 6)
            before = after
            rec = {"arm": args.arm, "step": step, "of": args.steps,
                   "wall_s": round(time.perf_counter() - start, 3), "train_s": round(train_s, 3),
                   "train_loss": round(loss.item(), 4),
                   "val_loss": round(evaluate(eval_model, now, windows), 5),
                   "bytes_sent": int(sent) if sent is not None else None, "moved": moved,
                   "max_rss_mb": max_rss_mb()}
            if args.arm == "hsdp" and args.replicate == "auto":
                rec["auto_choice"] = model._replicate_state.choice()
            if args.arm == "diloco":
                stats = opt.stats()
                rec["exchanges"] = stats["exchanges_started"]
                # What this rank's engine keeps of the model, and what its replica sent: its ranks' sum.
                rec["engine_values"] = stats["engine_values"]
                sent_by = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
                dist.all_gather(sent_by, torch.tensor([stats["bytes_sent"]], dtype=torch.float64))
                first = rank // args.replica_ranks * args.replica_ranks
                rec["replica_bytes_sent"] = int(sum(float(t) for t in sent_by[first:first + args.replica_ranks]))
            records.append(rec)
            if rank == 0:
                print(json.dumps(rec), flush=True)
                if log:
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
            if args.stop_at is not None and rec["val_loss"] <= args.stop_at:
                # Every rank sees the same all-reduced loss: they stop together, DiLoCo's exchanges in flight
                # completed first (after the measurement) so that none outlives the process group.
                if args.arm == "diloco" and step != args.steps:
                    opt.finish()
                break
    if log:
        log.close()
    final = flat(model.parameters())
    global_final = flat(global_params())
    return records, final, nparams, global_final


if __name__ == "__main__":
    main(sys.argv[1:])
    dist.barrier()  # every rank past FSDP2's last gathers before any tears the group down
    dist.destroy_process_group()
