"""Every state survives the ways a training script ends, run as a real 2-rank script (two interpreters, not
forked workers, so the interpreter's own exit is what is tested): dist.destroy_process_group() with the state
alive, the state deleted before it, an exception in the training loop, and falling off the end without
destroying anything. Each rank's exit status must be 0, or 1 for the exception (Python's own status for an
uncaught one), and no rank may print a C++ abort.

AutoState is run under a forced exchange (so the choice does not depend on this machine's timing): on torch 1.13 a Python callback chained to a c10d future used to abort the interpreter at exit."""
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

rank, store, kind, ending = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
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
    choice = kind.split("-", 1)[1]
    hook = commsgd_torch.auto_hook
ddp.register_comm_hook(state, hook)
torch.manual_seed(1 + rank)
for step in range(10):
    if kind.startswith("auto") and step == 5 and choice != "dense":
        state.force(choice)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    if kind == "local_sgd":
        state.step()
    if ending == "exception" and step == 7:
        raise RuntimeError("boom in the training loop")
if kind.startswith("auto"):
    assert state.choice() == choice, (state.choice(), choice)
if ending == "destroy":
    dist.destroy_process_group()
elif ending == "delete":
    del state, hook, ddp
    gc.collect()
    dist.destroy_process_group()
print("trained", flush=True)
'''

# One setup per state class (sign: a compressor with the hook's momentum), and AutoState under dense (its own
# allreduce round, as its fp16 choice) and top-k (which takes the optimizer's momentum over): every machinery
# that holds a thread or a future at exit, each script a few seconds of interpreter start-up.
KINDS = ["topk", "powersgd", "sign", "local_sgd", "auto-dense", "auto-topk-0.1"]
ENDINGS = ["destroy", "delete", "exception", "exit"]


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("kind", KINDS)
def test_script_ends_cleanly(kind, ending):
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "train.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        store = os.path.join(tmp, "store")
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, script, str(r), store, kind, ending], env=env,
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
    for rank, (code, out, err) in enumerate(outs):
        assert code == want, f"rank {rank} exited {code}, expected {want}:\n{err[-3000:]}"
        assert "terminate called" not in err, f"rank {rank}:\n{err[-3000:]}"
        if ending == "exception":
            assert "boom in the training loop" in err, err[-3000:]
        else:
            assert "trained" in out, err[-3000:]
