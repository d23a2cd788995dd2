"""Every state survives the ways a training script ends, run as a real 2-rank script (two interpreters, not
forked workers, so the interpreter's own exit is what is tested): dist.destroy_process_group() with the states
alive, the states deleted before it, an exception in the training loop, and falling off the end without
destroying anything. Each rank's exit status must be 0, or 1 for the exception (Python's own status for an
uncaught one), and no rank may print a C++ abort.

One script per ending trains every state side by side (one DDP model each), so the suite starts 8 interpreters
rather than 48; when a script fails, each state is rerun alone to name the one at fault.

AutoState is run under a forced exchange (so the choice does not depend on this machine's timing): on torch 1.13
a Python callback chained to a c10d future used to abort the interpreter at exit."""
import os
import subprocess
import sys
import tempfile

import pytest

SCRIPT = r'''
import gc, sys
import torch
import torch.distributed as dist
import commsgd_torch

rank, store, kinds, ending = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(","), sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)


def make(kind):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    if kind == "diloco":  # no DDP: the engine's thread holds an exchange in flight at every ending
        opt = commsgd_torch.DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-3), sync_every=4,
                                   fragments=2, delay=2, compression="e3m0")
        return {"kind": kind, "ddp": model, "opt": opt, "state": None, "hook": None}
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.005)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.0 if kind in ("topk", "sign") else 0.9)
    if kind == "topk":
        state, hook = commsgd_torch.TopKState(model=model, density=0.1, momentum=0.9), commsgd_torch.topk_hook
    elif kind == "powersgd":
        state = commsgd_torch.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=3)
        hook = commsgd_torch.powersgd_hook
    elif kind == "sign":
        state, hook = commsgd_torch.CompressorState(kind="sign", momentum=0.9), commsgd_torch.compressor_hook
    elif kind == "fp16":
        state, hook = commsgd_torch.CompressorState(kind="fp16", start_iter=0), commsgd_torch.compressor_hook
    elif kind == "local_sgd":
        state = commsgd_torch.LocalSGDState(model=model, period=2, start_iter=3, optimizer=opt)
        hook = commsgd_torch.local_sgd_hook
    else:  # auto-<choice>: profiled (dense) for 4 iterations, then the forced choice
        state = commsgd_torch.AutoState(model=ddp, optimizer=opt, network=(1e-4, 1e8), profile_steps=4,
                                        candidates=("dense", "fp16", "powersgd-r2", "topk-0.1"))
        hook = commsgd_torch.auto_hook
    ddp.register_comm_hook(state, hook)
    return {"kind": kind, "ddp": ddp, "opt": opt, "state": state, "hook": hook}


runs = [make(kind) for kind in kinds]
torch.manual_seed(1 + rank)
for step in range(10):
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    for run in runs:
        kind = run["kind"]
        if kind.startswith("auto") and step == 5 and kind != "auto-dense":
            run["state"].force(kind.split("-", 1)[1])
        run["opt"].zero_grad()
        torch.nn.functional.cross_entropy(run["ddp"](x), y).backward()
        run["opt"].step()
        if kind == "local_sgd":
            run["state"].step()
    if ending == "exception" and step == 7:
        raise RuntimeError("boom in the training loop")
for run in runs:
    if run["kind"].startswith("auto"):
        want = run["kind"].split("-", 1)[1]
        assert run["state"].choice() == want, (run["state"].choice(), want)
if ending == "destroy":
    dist.destroy_process_group()
elif ending == "delete":
    del runs, run
    gc.collect()
    dist.destroy_process_group()
print("trained", flush=True)
'''

# One setup per state class (sign: a compressor with the hook's momentum), AutoState under dense (its own
# allreduce round, as its fp16 choice) and top-k (which takes the optimizer's momentum over), and DiLoCo's
# engine with an exchange in flight after the last step: every machinery that holds a thread or a future at
# exit.
KINDS = ["topk", "powersgd", "sign", "fp16", "local_sgd", "auto-dense", "auto-topk-0.1", "diloco"]
ENDINGS = ["destroy", "delete", "exception", "exit"]


def run_script(kinds, ending):
    """Runs the script on 2 ranks; returns the problems found (empty when both ranks ended as they should)."""
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "train.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        store = os.path.join(tmp, "store")
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, script, str(r), store, ",".join(kinds), ending], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
        outs = []
        try:
            for p in procs:
                out, err = p.communicate(timeout=180)
                outs.append((p.returncode, out, err))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    want = 1 if ending == "exception" else 0
    problems = []
    for rank, (code, out, err) in enumerate(outs):
        if code != want:
            problems.append(f"rank {rank} exited {code}, expected {want}:\n{err[-3000:]}")
        elif "terminate called" in err:
            problems.append(f"rank {rank} printed a C++ abort:\n{err[-3000:]}")
        elif ending == "exception" and "boom in the training loop" not in err:
            problems.append(f"rank {rank} did not raise the loop's exception:\n{err[-3000:]}")
        elif ending != "exception" and "trained" not in out:
            problems.append(f"rank {rank} did not finish training:\n{err[-3000:]}")
    return problems


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_state_ends_cleanly(ending):
    problems = run_script(KINDS, ending)
    if problems:
        # Name the state at fault: each one alone, in a script of its own.
        alone = {kind: run_script([kind], ending) for kind in KINDS}
        at_fault = [kind for kind, found in alone.items() if found] or ["none alone: only all of them together"]
        pytest.fail(f"ending '{ending}' failed; at fault: {', '.join(at_fault)}\n" + "\n".join(problems))


CHAINED = r'''
import sys, time
import torch
import torch.distributed as dist
import commsgd_torch

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
model = torch.nn.Linear(8, 4)
ddp = torch.nn.parallel.DistributedDataParallel(model)
state = commsgd_torch.CompressorState(kind="fp16", start_iter=0)


def hook(state, bucket):
    fut = commsgd_torch.compressor_hook(state, bucket)
    # Runs on the exchange's thread once DDP's waiter is woken, and outlasts the script: the thread comes back
    # for the GIL after the main thread has reached the interpreter's exit.
    fut.then(lambda f: time.sleep(1.0))
    return fut


ddp.register_comm_hook(state, hook)
ddp(torch.randn(2, 8)).sum().backward()
print("trained", flush=True)
'''


def test_a_callback_that_outlasts_the_script_does_not_abort_the_exit():
    # torch 2's future lets go of the GIL while its callbacks run: without the wait at exit, the exchange
    # thread asked for the GIL back from a finalizing interpreter, which aborts the process.
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "chained.py")
        with open(script, "w") as f:
            f.write(CHAINED)
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        done = subprocess.run([sys.executable, script, os.path.join(tmp, "store")], env=env, capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 0 and "trained" in done.stdout, (done.returncode, done.stderr[-3000:])
    assert "terminate called" not in done.stderr, done.stderr[-3000:]
