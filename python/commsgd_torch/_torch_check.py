"""Refuses, at import, a torch other than the one the compiled part was built against.

The extension links torch's C++ libraries, whose symbols change between releases: under another torch its
import fails with an undefined symbol, or worse, loads and misbehaves. _build.py (written by the build) names
the torch it was built for; a different release raises ImportError saying what to do.
"""
import torch

from . import _build


def _release(version: str) -> str:
    return version.split("+", 1)[0]


if _release(torch.__version__) != _release(_build.TORCH_VERSION):
    raise ImportError(
        f"commsgd_torch {_build.VERSION} was built against torch {_build.TORCH_VERSION}, but torch "
        f"{torch.__version__} is installed; reinstall it against this torch (pip install ./python from a "
        f"commsgd checkout; supported torch: >={_build.TORCH_RANGE[0]},<{_build.TORCH_RANGE[1]})")
