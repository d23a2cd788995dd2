"""pays.py's profile of a model: forward, backward with each DDP bucket's ready time, the optimizer step and
every hook's own work per bucket, measured in one process of one thread (pays.py says how)."""
import math
import multiprocessing as mp
import os
import statistics
import tempfile
import time
import traceback

import bench
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commsgd_torch
from commsgd_torch.auto import candidate_compute
from pays_model import AUTO_CANDIDATES


def profile_worker(a, model_name, schemes, store, queue):
    try:
        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
        queue.put(("ok", profile_model(a, model_name, schemes)))
    except BaseException:
        queue.put(("error", traceback.format_exc()))


def profile_model(a, model_name, schemes, steps=60, measured=30):
    x, y = bench.fashion_mnist(a.data, "train", a.batch * steps)
    out = {}
    for scheme in ["none"] + schemes:
        torch.manual_seed(a.seed)
        model = bench.MODELS[model_name]()
        ddp = DDP(model)
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
        calls, rows = [], []
        clock = {"bwd": 0.0}
        original = ddp.register_comm_hook

        def timed_register(state, hook):
            def timed(st, bucket):
                t0 = time.perf_counter()
                fut = hook(st, bucket)
                t1 = time.perf_counter()
                rec = {"index": bucket.index(), "ready": t0 - clock["bwd"], "call": t1 - t0, "ret": t1,
                       "numel": bucket.buffer().numel(),
                       "shapes": [list(p.shape) for p in bucket.parameters()]}
                calls.append(rec)

                def done(f):
                    rec["done"] = time.perf_counter()
                    return f.value()
                return fut.then(done)
            original(state, timed)
        ddp.register_comm_hook = timed_register
        if scheme == "none":
            def passthrough(_, bucket):
                fut = torch.futures.Future()
                fut.set_result(bucket.buffer())
                return fut
            ddp.register_comm_hook(None, passthrough)
        else:
            s, *variants = scheme.split("+")
            bench.attach(ddp, model, opt, a, s, variants, 1, commsgd_torch.AllReduceMeter(install=False))
        for it in range(steps):
            xb, yb = x[it * a.batch:(it + 1) * a.batch], y[it * a.batch:(it + 1) * a.batch]
            calls.clear()
            opt.zero_grad()
            t0 = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
            t1 = time.perf_counter()
            clock["bwd"] = t1
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            if it >= steps - measured:
                chain, buckets = 0.0, []
                for c in sorted(calls, key=lambda r: r["ret"]):
                    start = max(c["ret"], chain)
                    buckets.append({"index": c["index"], "ready_s": c["ready"], "call_s": c["call"],
                                    "async_s": max(c["done"] - start, 0.0), "numel": c["numel"],
                                    "shapes": c["shapes"]})
                    chain = c["done"]
                rows.append({"forward_s": t1 - t0, "backward_s": t2 - t1, "optimizer_s": t3 - t2,
                             "buckets": buckets})
        nb = min(len(r["buckets"]) for r in rows)
        med = statistics.median
        out[scheme] = {
            "forward_s": med(r["forward_s"] for r in rows), "backward_s": med(r["backward_s"] for r in rows),
            "optimizer_s": med(r["optimizer_s"] for r in rows),
            "buckets": [{"ready_s": med(r["buckets"][i]["ready_s"] for r in rows),
                         "call_s": med(r["buckets"][i]["call_s"] for r in rows),
                         "async_s": med(r["buckets"][i]["async_s"] for r in rows),
                         "numel": rows[-1]["buckets"][i]["numel"], "shapes": rows[-1]["buckets"][i]["shapes"]}
                        for i in range(nb)]}
        ddp.register_comm_hook = original
    # The rate of a scatter-add of (index, value) pairs, what decoding n - 1 top-k messages costs per pair.
    dense = torch.zeros(1 << 18)
    idx = torch.randint(0, dense.numel(), (1 << 20,))
    val = torch.randn(1 << 20)
    t = min(timeit(lambda: dense.index_add_(0, idx, val)) for _ in range(5))
    out["pair_add_s"] = t / idx.numel()
    shapes = [(b["numel"], [(s[0], math.prod(s[1:])) for s in b["shapes"] if len(s) > 1])
              for b in out["none"]["buckets"]]
    out["auto_compute"] = {c: candidate_compute(c, shapes, 8, a.seed) for c in AUTO_CANDIDATES}
    return out


def timeit(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def profile(a, model_name, schemes):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        p = ctx.Process(target=profile_worker, args=(a, model_name, schemes, os.path.join(tmp, "store"), queue))
        p.start()
        status, out = queue.get(timeout=1800)
        p.join()
    if status != "ok":
        raise RuntimeError(out)
    return out
