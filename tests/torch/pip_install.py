"""ctest torch.pip_install: the README's `pip install ./python` into a fresh venv that sees the environment's
torch (the dev preset's: Debian's 1.13, the oldest supported), then the installed package trains under every state.

    pip_install.py WORKDIR REPO_PYTHON_DIR

Run with the interpreter that has torch. WORKDIR is emptied and gets the venv (--system-site-packages, so the
environment's torch is the one the extension is built against); WORKDIR-build is kept as scikit-build-core's
build tree, so a rerun only compiles what changed. pip's isolated build fetches scikit-build-core and pybind11
from the package index: without one the test is skipped (exit 77). The CUDA part is left out (the dev preset
compiles it already); scripts/test_torch_pypi.sh builds it against the newest torch. The check runs from a
directory outside the source tree with a clean PYTHONPATH, so only the venv can provide commsgd_torch: 2 gloo
ranks train under every state (every_state.py). It runs only with COMMSGD_TEST_PIP_INSTALL=1 (skipped otherwise).
"""
import os
import shutil
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, **kw):
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def index_reachable():
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/") + "/scikit-build-core/"
    try:
        urllib.request.urlopen(url, timeout=15).close()
        return True
    except OSError as e:
        print(f"pip_install: the package index is not reachable ({url}: {e}); skipped", flush=True)
        return False


def main():
    work, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if os.environ.get("COMMSGD_TEST_PIP_INSTALL") != "1":
        # Two and a half minutes of compiling on two cores, for what the dev build's own extension already
        # tests on this torch; CI's install check is scripts/test_torch_pypi.sh on the newest torch.
        print("pip_install: opt-in, set COMMSGD_TEST_PIP_INSTALL=1 to run it; skipped", flush=True)
        return 77
    if not index_reachable():
        return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    venv = os.path.join(work, "venv")
    t0 = time.monotonic()
    run([sys.executable, "-m", "venv", "--system-site-packages", venv])
    python = os.path.join(venv, "bin", "python")
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PYTHONDONTWRITEBYTECODE="1",
               CMAKE_ARGS="-DCOMMSGD_ENABLE_CUDA=OFF")  # no __pycache__ written into the source tree
    env.pop("PYTHONPATH", None)
    t1 = time.monotonic()
    run([python, "-m", "pip", "install", "--no-deps", f"--config-settings=build-dir={work}-build", source], env=env, cwd=work)
    t2 = time.monotonic()
    outside = os.path.join(work, "elsewhere")
    os.makedirs(outside)
    run([python, os.path.join(HERE, "every_state.py"), "--expect-prefix", venv], env=env, cwd=outside)
    print(f"venv {t1 - t0:.1f} s, pip install {t2 - t1:.1f} s, check {time.monotonic() - t2:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
