#!/usr/bin/python3
"""Where compression pays: time to accuracy of PyTorch's DDP hooks and commsgd's over networks, scales and
device speeds, with every hook's own work charged and DDP's overlap of exchange with backward modelled.

Three parts, each kept in OUT so a later call reuses it:
  accuracy  1,000-step runs of every scheme on 4 and 8 gloo ranks (examples/torch_ddp/bench.py, kept in
            OUT/w<n>/<model>/runs), evaluated every half epoch; each evaluation is averaged with the two
            before it (one seed's accuracy moves by a point between evaluations), the last such mean is the
            final accuracy, and a scheme reaches DDP allreduce's final minus 1 (and 2) points at the first
            evaluation whose mean is at or above it. Per-rank batch 32 at both sizes (16,000 and 32,000
            images).
  profile   one process, one thread, nothing else running (--profile pauses nothing: run it alone): the
            forward, the backward with the moment each DDP bucket becomes ready, the optimizer step, and
            every hook's own work per bucket on a world of one (the call, on the backward thread, and what
            runs after it returns until its future completes), medians over 30 steps (OUT/profile.json).
  grid      the step time of every scheme in every cell (bandwidth 1, 10, 25, 100 Gbit/s; n = 4 to 256;
            the measured CPU profile and the same profile scaled to a GPU-class step) from
            commsgd_torch._C.overlapped_step: bucket i's exchange starts when it is ready and the one before
            it is done, a hook's synchronous part delays the rest of backward, the optimizer waits for
            the last exchange; exchange seconds from cost/ at n (commsgd_torch._C.exchange_seconds) on the
            alpha-beta model of comm::simulated. Time to target = the sum of the modelled steps up to the
            first evaluation at or above the target (dense steps during a scheme's warm-up).

Scaling: the per-rank batch stays 32 (weak scaling, the global batch grows with n); the compute per rank is
the measured profile at every n; accuracy in steps is the 4-rank run's at n = 4 and the 8-rank run's at
n >= 8 (not measured beyond 8). Latency: 50 us at 1 and 10 Gbit/s (TCP), 5 us at 25 and 100 Gbit/s (RDMA).
GPU-class: every measured time (forward, backward, bucket ready times, optimizer, hooks' own work) scaled by
one factor so that forward + backward + optimizer take --gpu-step-ms (default 0.5 ms, a launch-bound step of
these small models on a current GPU); stated, not measured here.
n-dependent hook work beyond the world-of-one profile: top-k's decode adds (n - 1) k pairs at the measured
scatter-add rate; commsgd's 16-bit ring converts about 2 d values per step (twice the measured cast);
QSGD decodes n - 1 more messages (half its measured work each). `auto` is commsgd_torch.AutoState's choice
in that cell (commsgd_torch._C.choose on the profile, with candidate work timed by auto.candidate_compute)
and its accuracy is that of its own runs (schemes auto-<choice>) where they were made, else of the chosen
hook's run (marked in the CSV).

    PYTHONPATH=build/dev/python /usr/bin/python3 examples/torch_ddp/pays.py --out OUT            # all
    PYTHONPATH=build/dev/python /usr/bin/python3 examples/torch_ddp/pays.py --out OUT --slice    # < 10 min
"""
import argparse
import csv
import json
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import commsgd_torch  # noqa: E402
from commsgd_torch import _C  # noqa: E402
from commsgd_torch.auto import candidate_compute, default_steps_factor  # noqa: E402

PYTORCH = ["ddp", "fp16", "bf16", "powersgd-r1", "powersgd-r2", "powersgd-r4"]
COMMSGD = ["topk-laplace-1e-3", "topk-laplace-1e-2", "commsgd-fp16", "commsgd-qsgd4", "localsgd-h8"]
AUTO_CANDIDATES = ["dense", "fp16", "powersgd-r1", "powersgd-r2", "powersgd-r4", "topk-0.01", "topk-0.001"]
# The hook of each auto candidate, whose run stands for auto's accuracy where auto's own run is missing.
AUTO_RUN = {"dense": "ddp", "fp16": "fp16", "bf16": "bf16", "powersgd-r1": "powersgd-r1",
            "powersgd-r2": "powersgd-r2", "powersgd-r4": "powersgd-r4", "topk-0.01": "topk-laplace-1e-2",
            "topk-0.001": "topk-laplace-1e-3"}
BANDWIDTHS = [("1G", 125e6, 50e-6), ("10G", 1250e6, 50e-6), ("25G", 3125e6, 5e-6), ("100G", 12500e6, 5e-6)]
SIZES = [4, 8, 16, 32, 64, 128, 256]


def cost_name(scheme):
    """The exchange a scheme's hook runs, as cost/ names it."""
    if scheme in ("ddp",):
        return "dense"
    if scheme in ("fp16", "commsgd-fp16"):
        return "fp16"
    if scheme == "bf16":
        return "bf16"
    if scheme.startswith("powersgd"):
        return scheme
    if scheme.startswith("topk"):
        return "topk-" + repr(float(scheme.rsplit("-", 2)[-2] + "-" + scheme.rsplit("-", 1)[-1]))
    if scheme.startswith("commsgd-qsgd"):
        return "qsgd" + scheme[len("commsgd-qsgd"):]
    if scheme.startswith("localsgd"):
        return "localsgd-h" + scheme.split("-h")[1]
    raise ValueError(scheme)


def warmup_of(scheme):
    """Dense iterations before the scheme compresses (PyTorch's fp16 and commsgd's start at once)."""
    return 0 if scheme in ("ddp", "fp16", "bf16", "commsgd-fp16") else bench.WARMUP


# ---- profile ---------------------------------------------------------------------------------------------

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


# ---- accuracy --------------------------------------------------------------------------------------------

def accuracy(a, world, model_name, schemes):
    """Per scheme: the evaluations (step, accuracy) of its run on `world` ranks, trained here or reused."""
    out = os.path.join(a.out, f"w{world}", model_name)
    runs = {}
    for s in schemes:
        cache = os.path.join(out, "runs", f"{model_name}-{s}.json")
        if os.path.exists(cache):
            with open(cache) as f:
                res = json.load(f)
        elif a.no_train:
            continue
        else:
            b = argparse.Namespace(**vars(a))
            b.world, b.train, b.epochs, b.evals_per_epoch = world, 4000 * world, 8, 2
            t0 = time.time()
            res = bench.launch(b, model_name, s)
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            with open(cache, "w") as f:
                json.dump(res, f)
            print(f"{model_name} w{world} {s:22s} trained ({time.time() - t0:.0f} s)", flush=True)
        runs[s] = smoothed([(r["step"], r["acc"]) for r in res["records"] if "acc" in r])
    return runs


def smoothed(curve, width=3):
    """Each evaluation replaced by the mean of it and the width - 1 before it: one seed's test accuracy moves
    by a point between evaluations half an epoch apart, so a raw curve crosses a target by chance; the last
    entry (the mean of the last three, 1.5 epochs) is the final accuracy."""
    out = []
    for i, (step, _) in enumerate(curve):
        window = [a for _, a in curve[max(0, i - width + 1):i + 1]]
        out.append((step, sum(window) / len(window)))
    return out


# ---- the model -------------------------------------------------------------------------------------------

def scaled(prof, f):
    return {"forward_s": prof["forward_s"] * f, "backward_s": prof["backward_s"] * f,
            "optimizer_s": prof["optimizer_s"] * f,
            "buckets": [dict(b, ready_s=b["ready_s"] * f, call_s=b["call_s"] * f, async_s=b["async_s"] * f)
                        for b in prof["buckets"]]}


def shapes_of(bucket):
    return [(s[0], math.prod(s[1:])) for s in bucket["shapes"] if len(s) > 1]


def extra_async(scheme, bucket, cast_s, n, prof, f):
    """Hook work that grows with n beyond what a world of one showed (see the module's docstring)."""
    if scheme.startswith("topk"):
        density = float(cost_name(scheme).split("-", 1)[1])
        k = math.ceil(density * bucket["numel"])
        return (n - 1) * k * prof["pair_add_s"] * f
    if scheme == "commsgd-fp16":
        return 2 * cast_s
    if scheme.startswith("commsgd-qsgd"):
        return (n - 1) * 0.5 * bucket["async_s"]
    return 0.0


def step_seconds(scheme, profs, n, bw, latency, f):
    """Modelled seconds of one step of `scheme` in its compressed phase."""
    base = scaled(profs["none"], f)
    own = scaled(profs[scheme], f)
    name = cost_name(scheme)
    local_sgd = name.startswith("localsgd")
    buckets = []
    for i, (b0, b) in enumerate(zip(base["buckets"], own["buckets"])):
        # Local SGD averages the model after the optimizer every H steps (below), not overlapped.
        ex = 0.0 if local_sgd else _C.exchange_seconds(name, b0["numel"], shapes_of(b0), n, latency, bw)
        extra = extra_async(scheme, b, profs["fp16"]["buckets"][i]["call_s"] * f, n, profs, f)
        buckets.append((b0["ready_s"], b["call_s"], b["async_s"] + extra, ex))
    t = _C.overlapped_step(base["forward_s"], base["backward_s"], base["optimizer_s"], buckets, False)["total_s"]
    if local_sgd:
        h = int(name.split("-h")[1])
        t += sum(_C.exchange_seconds("dense", b["numel"], shapes_of(b), n, latency, bw) for b in base["buckets"]) / h
    return t


def time_to(curve, target, step_s, dense_s, warmup):
    for step, acc in curve:
        if acc >= target:
            return min(step, warmup) * dense_s + max(step - warmup, 0) * step_s, step
    return None, None


def auto_choice(profs, n, bw, latency, f):
    base = scaled(profs["none"], f)
    shapes = [(b["numel"], shapes_of(b)) for b in base["buckets"]]
    compute = {c: [(cs * f, asy * f) for cs, asy in v] for c, v in profs["auto_compute"].items()}
    v = _C.choose(AUTO_CANDIDATES, base["forward_s"], base["backward_s"], base["optimizer_s"],
                  [b["ready_s"] for b in base["buckets"]], shapes, compute, {c: False for c in AUTO_CANDIDATES},
                  n, latency, bw, 0.05, {c: default_steps_factor(c) for c in AUTO_CANDIDATES})
    return v["name"]


def grid(a, models, profiles, curves):
    rows = []
    for m in models:
        profs = profiles[m]
        cpu_step = profs["none"]["forward_s"] + profs["none"]["backward_s"] + profs["none"]["optimizer_s"]
        devices = [("cpu", 1.0), ("gpu", a.gpu_step_ms * 1e-3 / cpu_step)]
        for dev, f in devices:
            for label, bw, latency in BANDWIDTHS:
                for n in SIZES:
                    w = 4 if n == 4 else 8
                    cv = curves[m][w]
                    ddp_final = cv["ddp"][-1][1]
                    dense_s = step_seconds("ddp", profs, n, bw, latency, f)
                    row = {"model": m, "device": dev, "bandwidth": label, "n": n, "accuracy_ranks": w,
                           "ddp_final": ddp_final, "dense_step_ms": 1e3 * dense_s}
                    res = {}
                    for s in PYTORCH + COMMSGD:
                        if s not in cv or s not in profs:
                            continue
                        st = step_seconds(s, profs, n, bw, latency, f)
                        ws = dense_s if warmup_of(s) else st
                        t1, s1 = time_to(cv[s], ddp_final - 0.01, st, ws, warmup_of(s))
                        t2, s2 = time_to(cv[s], ddp_final - 0.02, st, ws, warmup_of(s))
                        res[s] = {"step_ms": 1e3 * st, "t1": t1, "t2": t2, "final": cv[s][-1][1]}
                    choice = auto_choice(profs, n, bw, latency, f)
                    run = "auto-" + choice if "auto-" + choice in cv else AUTO_RUN[choice]
                    if AUTO_RUN[choice] in profs and run in cv:
                        st = step_seconds(AUTO_RUN[choice], profs, n, bw, latency, f)
                        wa = bench.WARMUP if choice != "dense" else 0
                        t1, _ = time_to(cv[run], ddp_final - 0.01, st, dense_s, wa)
                        t2, _ = time_to(cv[run], ddp_final - 0.02, st, dense_s, wa)
                        res["auto"] = {"step_ms": 1e3 * st, "t1": t1, "t2": t2, "final": cv[run][-1][1]}
                    else:  # --slice profiles and trains only its own schemes
                        res["auto"] = {"step_ms": None, "t1": None, "t2": None, "final": None}
                    row["auto_choice"], row["auto_run"] = choice, run
                    for tgt in ("t1", "t2"):
                        def best(names):
                            got = [(res[s][tgt], s) for s in names if s in res and res[s][tgt] is not None]
                            return min(got) if got else (None, None)
                        tp, sp = best(PYTORCH)
                        tc, sc = best(COMMSGD)
                        row[f"{tgt}_best_pytorch"], row[f"{tgt}_best_pytorch_s"] = sp, tp
                        row[f"{tgt}_best_commsgd"], row[f"{tgt}_best_commsgd_s"] = sc, tc
                        row[f"{tgt}_ddp_s"] = res["ddp"][tgt]
                        row[f"{tgt}_auto_s"] = res["auto"][tgt]
                        row[f"{tgt}_pytorch_over_commsgd"] = (tp / tc) if tp and tc else None
                        row[f"{tgt}_ddp_over_commsgd"] = (res["ddp"][tgt] / tc) if res["ddp"][tgt] and tc else None
                        row[f"{tgt}_auto_over_pytorch"] = (res["auto"][tgt] / tp) if tp and res["auto"][tgt] else None
                        if sc:
                            row[f"{tgt}_best_commsgd_final"] = res[sc]["final"]
                    for s, r in res.items():
                        row[f"step_ms_{s}"] = r["step_ms"]
                        row[f"final_{s}"] = r["final"]
                    rows.append(row)
    return rows


# ---- outputs ---------------------------------------------------------------------------------------------

def write_csv(path, rows):
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def heatmap(out, rows, models, tgt="t1"):
    """One panel per model and device: log2 of (best PyTorch hook's time to target / best commsgd scheme's),
    bandwidth across, n down; > 0 where commsgd reaches the target sooner."""
    data = os.path.join(out, f"heatmap-{tgt}.dat")
    panels = [(m, d) for m in models for d in ("cpu", "gpu")]
    bws = [b[0] for b in BANDWIDTHS]
    with open(data, "w") as f:
        for pi, (m, d) in enumerate(panels):
            f.write(f"# {m} {d}\n")
            for r in rows:
                if r["model"] == m and r["device"] == d:
                    v = r[f"{tgt}_pytorch_over_commsgd"]
                    f.write(f"{bws.index(r['bandwidth'])} {SIZES.index(r['n'])} "
                            f"{math.log2(v) if v else 'NaN'} {v if v else 0:.2f}\n")
            f.write("\n\n")
    script = [f"set terminal pngcairo size 1300,{480 * len(models)} font ',10'",
              f"set output '{os.path.join(out, f'where-compression-pays-{tgt}.png')}'",
              f"set multiplot layout {len(models)},2",
              "set palette defined (-2 '#b2182b', 0 '#f7f7f7', 2 '#2166ac')", "set cbrange [-2:2]",
              "set cblabel 'log2(best PyTorch / best commsgd), time to target'",
              "set xtics (" + ", ".join(f"'{b}' {i}" for i, b in enumerate(bws)) + ")",
              "set ytics (" + ", ".join(f"'{n}' {i}" for i, n in enumerate(SIZES)) + ")",
              "set xlabel 'bandwidth (Gbit/s)'", "set ylabel 'ranks'", "set xrange [-0.5:3.5]",
              "set yrange [-0.5:6.5]"]
    for pi, (m, d) in enumerate(panels):
        dev = "CPU profile (measured)" if d == "cpu" else "GPU-class step (scaled)"
        script.append(f"set title '{m}, {dev}: best PyTorch hook / best commsgd scheme'")
        script.append(f"plot '{data}' index {pi} using 1:2:3 with image notitle, "
                      f"'' index {pi} using 1:2:(sprintf('%.2fx', $4)) with labels font ',9' notitle")
    script.append("unset multiplot")
    try:
        subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"pays: no heat map ({e})", file=sys.stderr)


def tables(rows, models, tgt="t1"):
    """Per model and device: best PyTorch / best commsgd (who), and auto / best PyTorch, bandwidth x n."""
    bws = [b[0] for b in BANDWIDTHS]
    out = []
    for m in models:
        for d in ("cpu", "gpu"):
            cells = {(r["bandwidth"], r["n"]): r for r in rows if r["model"] == m and r["device"] == d}
            if not cells:
                continue
            out.append(f"\n{m}, {'measured CPU profile' if d == 'cpu' else 'GPU-class step'}: best PyTorch hook's "
                       "time to target over the best commsgd scheme's (> 1: commsgd sooner; scheme), and auto's "
                       "over the best PyTorch hook's [auto's choice]\n")
            out.append("| n | " + " | ".join(f"{b}" for b in bws) + " |")
            out.append("|---|" + "---|" * len(bws))
            for n in SIZES:
                row = []
                for b in bws:
                    r = cells.get((b, n))
                    if r is None:
                        row.append("")
                        continue
                    v, a = r[f"{tgt}_pytorch_over_commsgd"], r[f"{tgt}_auto_over_pytorch"]
                    row.append(f"{v:.2f} {short(r[f'{tgt}_best_commsgd'])}; auto {a:.2f} [{r['auto_choice']}]"
                               if v and a else f"{v or 0:.2f} {short(r[f'{tgt}_best_commsgd'])}; auto - "
                               f"[{r['auto_choice']}]")
                out.append(f"| {n} | " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def short(s):
    return (s or "-").replace("topk-laplace-", "topk ").replace("commsgd-", "")


def goals(rows, models):
    lines = []
    for m in models:
        mr = [r for r in rows if r["model"] == m]
        for tgt, label in (("t1", "DDP-1pt"), ("t2", "DDP-2pt")):
            worst = max((r for r in mr if r[f"{tgt}_auto_over_pytorch"]), key=lambda r: r[f"{tgt}_auto_over_pytorch"],
                        default=None)
            missing = sum(1 for r in mr if r[f"{tgt}_auto_over_pytorch"] is None)
            over = sum(1 for r in mr if (r[f"{tgt}_auto_over_pytorch"] or 0) > 1.03)
            if worst:
                lines.append(f"- {m}, {label}: auto within 1.03x of the best PyTorch hook in "
                             f"{len(mr) - over - missing} of {len(mr)} cells (worst {worst[f'{tgt}_auto_over_pytorch']:.2f}x: "
                             f"{worst['device']} {worst['bandwidth']} n={worst['n']}, auto chose "
                             f"{worst['auto_choice']}, best PyTorch {worst[f'{tgt}_best_pytorch']}); "
                             f"{missing} cells where auto's run did not reach the target")
            cb = [r for r in mr if r["bandwidth"] == "1G" and r["n"] >= 16 and r["device"] == "gpu"]
            vs_pt = [r[f"{tgt}_pytorch_over_commsgd"] for r in cb if r[f"{tgt}_pytorch_over_commsgd"]]
            vs_ddp = [r[f"{tgt}_ddp_over_commsgd"] for r in cb if r[f"{tgt}_ddp_over_commsgd"]]
            gaps = [100 * (r["ddp_final"] - r[f"{tgt}_best_commsgd_final"]) for r in cb
                    if r.get(f"{tgt}_best_commsgd_final") is not None]
            if vs_pt:
                met = min(vs_pt) >= 1.5 and min(vs_ddp) >= 3.0 and max(gaps) <= 0.5
                lines.append(f"- {m}, {label}, communication-bound cells (1 Gbit/s, n >= 16, GPU-class): best "
                             f"commsgd {min(vs_pt):.2f}x to {max(vs_pt):.2f}x sooner than the best PyTorch hook, "
                             f"{min(vs_ddp):.2f}x to {max(vs_ddp):.2f}x sooner than DDP allreduce, final accuracy "
                             f"{max(gaps):+.2f} points below DDP's at worst (schemes: "
                             f"{', '.join(sorted({r[f'{tgt}_best_commsgd'] for r in cb}))}; PyTorch: "
                             f"{', '.join(sorted({r[f'{tgt}_best_pytorch'] for r in cb}))}): goal "
                             f"{'met' if met else 'not met'}")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--gpu-step-ms", type=float, default=0.5)
    p.add_argument("--auto-network", default="50e-6,125e6")
    p.add_argument("--no-train", action="store_true", help="use only the runs kept in OUT, train nothing")
    p.add_argument("--reprofile", action="store_true", help="measure the profile again")
    p.add_argument("--slice", action="store_true",
                   help="the MLP only, 4 ranks, DDP, fp16, PowerSGD r4 and top-k 1e-3 (under 10 minutes)")
    a = p.parse_args()
    models = a.models.split(",")
    worlds = (4, 8)
    if a.slice:
        global SIZES
        models, worlds = ["mlp"], (4,)
        PYTORCH[:] = ["ddp", "fp16", "powersgd-r4"]
        COMMSGD[:] = ["topk-laplace-1e-3"]
        SIZES = [4]
    os.makedirs(a.out, exist_ok=True)
    prof_path = os.path.join(a.out, "profile.json")
    profiles = {}
    if os.path.exists(prof_path) and not a.reprofile:
        with open(prof_path) as f:
            profiles = json.load(f)
    for m in models:
        if m not in profiles:
            t0 = time.time()
            profiles[m] = profile(a, m, PYTORCH + COMMSGD)
            print(f"{m}: profiled ({time.time() - t0:.0f} s)", flush=True)
            with open(prof_path, "w") as f:
                json.dump(profiles, f, indent=1)
    curves = {}
    for m in models:
        curves[m] = {}
        cpu_step = sum(profiles[m]["none"][k] for k in ("forward_s", "backward_s", "optimizer_s"))
        for w in worlds:
            # auto's own runs, for every exchange it picks in a cell whose accuracy comes from w ranks
            picks = set()
            if not a.slice:
                for _, bw, latency in BANDWIDTHS:
                    for n in SIZES:
                        if (4 if n == 4 else 8) == w:
                            for f in (1.0, a.gpu_step_ms * 1e-3 / cpu_step):
                                picks.add(auto_choice(profiles[m], n, bw, latency, f))
            # auto's dense is PyTorch's allreduce hook bit for bit (tests/torch/test_auto.py) and its PowerSGD
            # PyTorch's hook after the same 20 dense iterations, so their runs stand in; fp16 (dense first,
            # then 16-bit) and top-k (the optimizer's momentum handed to the hook) get runs of their own.
            picks = {c for c in picks if c.startswith(("fp16", "topk"))}
            curves[m][w] = accuracy(a, w, m, PYTORCH + COMMSGD + sorted("auto-" + c for c in picks))
        if a.slice:
            curves[m][8] = curves[m][4]
    rows = grid(a, models, profiles, curves)
    write_csv(os.path.join(a.out, "grid.csv"), rows)
    for tgt in ("t1", "t2"):
        heatmap(a.out, rows, models, tgt)
    text = goals(rows, models)
    with open(os.path.join(a.out, "goals.md"), "w") as f:
        f.write(text)
    for tgt in ("t1", "t2"):
        with open(os.path.join(a.out, f"tables-{tgt}.md"), "w") as f:
            f.write(tables(rows, models, tgt))
    print(text)


if __name__ == "__main__":
    main()
