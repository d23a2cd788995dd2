"""ctest torch.pip_install: `pip install --no-build-isolation --no-deps <repo>/python` into a fresh venv, then
the installed package runs a hook.

    pip_install.py WORKDIR REPO_PYTHON_DIR

Run with the interpreter that has torch. WORKDIR is emptied and gets the venv (--system-site-packages, so the
environment's torch is the one the extension is built against). COMMSGD_BUILD_DIR, passed through from the
environment, names the build tree the backend reuses. The check runs from a directory outside the source
tree with a clean PYTHONPATH, so only the venv can provide commsgd_torch.
"""
import os
import shutil
import subprocess
import sys
import time

CHECK = r'''
import datetime, os, sys, tempfile
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import commsgd_torch

where = os.path.realpath(commsgd_torch.__file__)
venv = os.path.realpath(sys.argv[1])
assert where.startswith(venv + os.sep), f"commsgd_torch imported from {where}, not from the venv {venv}"
os.environ["GLOO_SOCKET_IFNAME"] = "lo"
torch.set_num_threads(1)
with tempfile.TemporaryDirectory() as tmp:
    dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "store"), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    ddp = DDP(model)
    state = commsgd_torch.TopKState(model, density=0.25)
    ddp.register_comm_hook(state, commsgd_torch.topk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(torch.rand(8, 16)), torch.randint(0, 4, (8,))).backward()
        opt.step()
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters())), "no parameter changed"
    traffic = state.traffic()
    assert isinstance(traffic, dict), f"traffic() returned {type(traffic)}"
    dist.destroy_process_group()
print(f"commsgd_torch from {where}: 3 DDP steps with topk_hook, traffic {traffic}")
'''


def run(cmd, **kw):
    print("$ " + " ".join("<the check>" if c == CHECK else c for c in cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def main():
    work, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    venv = os.path.join(work, "venv")
    t0 = time.monotonic()
    run([sys.executable, "-m", "venv", "--system-site-packages", venv])
    python = os.path.join(venv, "bin", "python")
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1", PIP_NO_INPUT="1",
               PYTHONDONTWRITEBYTECODE="1")  # nothing downloaded; no __pycache__ written into the source tree
    env.pop("PYTHONPATH", None)
    t1 = time.monotonic()
    run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-cache-dir", source],
        env=env, cwd=work)
    t2 = time.monotonic()
    outside = os.path.join(work, "elsewhere")
    os.makedirs(outside)
    env.pop("COMMSGD_BUILD_DIR", None)
    run([python, "-c", CHECK, venv], env=env, cwd=outside)
    print(f"venv {t1 - t0:.1f} s, pip install {t2 - t1:.1f} s, check {time.monotonic() - t2:.1f} s", flush=True)


if __name__ == "__main__":
    main()
