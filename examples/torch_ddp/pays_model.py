"""pays.py's model: the schemes compared, the modelled step of each in every cell of the grid (a network's
bandwidth and latency, n ranks, a device speed) and the time to a target accuracy it gives (pays.py says how)."""
import math

import bench

from commsgd_torch import _C
from commsgd_torch.auto import default_steps_factor

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


