"""pays.py's accuracy curves: each scheme's 1,000-step run on n gloo ranks (bench.py), trained once and kept
in OUT, its evaluations smoothed (pays.py says how)."""
import argparse
import json
import os
import time

import bench


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
