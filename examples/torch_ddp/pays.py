#!/usr/bin/python3
"""Where compression pays: time to accuracy of PyTorch's DDP hooks and commsgd's over networks, scales and
device speeds, with every hook's own work charged and DDP's overlap of exchange with backward modelled.

Three parts, each kept in OUT so a later call reuses it (pays_accuracy.py, pays_profile.py and pays_model.py;
pays_report.py writes the grid's tables and heat maps):
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
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# links.py reads the model's parts through this module.
from pays_accuracy import accuracy  # noqa: E402
from pays_model import (AUTO_RUN, BANDWIDTHS, COMMSGD, PYTORCH, SIZES, auto_choice, grid,  # noqa: E402,F401
                        step_seconds, time_to, warmup_of)
from pays_profile import profile  # noqa: E402
from pays_report import goals, heatmap, tables, write_csv  # noqa: E402


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
        # In place: the other parts read these same lists.
        models, worlds = ["mlp"], (4,)
        PYTORCH[:] = ["ddp", "fp16", "powersgd-r4"]
        COMMSGD[:] = ["topk-laplace-1e-3"]
        SIZES[:] = [4]
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
