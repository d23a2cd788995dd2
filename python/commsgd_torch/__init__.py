"""commsgd for PyTorch DDP: communication hooks backed by the commsgd library.

One module per hook family, each a state class and its hook, as torch.distributed.algorithms.ddp_comm_hooks:

    topk         TopKState, topk_hook              top-k with error feedback, sparse exchange
    powersgd     PowerSGDState, powersgd_hook      PowerSGD (a drop-in for PyTorch's PowerSGDState)
    compressors  CompressorState, compressor_hook  fp16, bf16, EF-SignSGD, QSGD, random-k
    local_sgd    LocalSGDState, local_sgd_hook     local SGD with periodic or adaptive model averaging
    auto         AutoState, auto_hook              the fastest of the above that keeps accuracy, per run

and, without DDP, an optimizer wrapper:

    diloco       DiLoCo                            H local steps, then an outer Nesterov step on the averaged
                                                   (optionally streamed, compressed) pseudo-gradient

and, under FSDP2 (torch 2):

    fsdp         compress_reduce_scatter           the gradients' reduce-scatter in int8 or 4-bit blocks with
                                                   error feedback (CompressedReduceScatter per module)
    hsdp         register_replicate_hook           the replicas' gradient average (FSDP2 inside each replica)
                                                   through any hook family above, on the slow links

    state = commsgd_torch.TopKState(model=model, density=0.01, momentum=0.9)
    ddp.register_comm_hook(state, commsgd_torch.topk_hook)

Every state takes the process group first (None: a new gloo group of all ranks, so creating a state is
collective) and everything else by keyword; PowerSGDState keeps PyTorch's positional order. Iterations
averaged densely before compression starts are `start_iter` (PowerSGDState: PyTorch's
`start_powerSGD_iter`), the hook's own momentum is read with `momentum_buffer(key)`, and each state counts
the bytes this rank sent and received in its group: `traffic()`.

Every hook returns a future at once: the state's exchange runs on a thread of its own (one round in flight
per state, in bucket order), so DDP overlaps it with the rest of backward. An error in an exchange completes
the future with that error on every rank. Errors are commsgd_torch.Error (a RuntimeError) or a subclass:
InvalidArgument (naming the argument), SizeMismatch, NonFinite, CommError, CorruptData, Unsupported.
"""
from . import _torch_check  # noqa: F401  (first: refuses a torch other than the one _C was built against)
from . import fsdp, hsdp  # noqa: F401
from ._C import CommError, CorruptData, Error, InvalidArgument, NonFinite, SizeMismatch, Unsupported
from .auto import DEFAULT_CANDIDATES, AutoState, auto_hook
from .compressors import KINDS, CompressorState, compressor_hook
from .diloco import COMPRESSIONS, DiLoCo
from .fault_tolerant import FaultTolerantDiLoCo, ReplicaGroup
from .local_sgd import LocalSGDState, local_sgd_hook
from .meter import AllReduceMeter
from .powersgd import PowerSGDState, powersgd_hook
from .topk import SELECTORS, TopKState, topk_hook

__all__ = [
    "TopKState", "topk_hook", "SELECTORS",
    "PowerSGDState", "powersgd_hook",
    "CompressorState", "compressor_hook", "KINDS",
    "LocalSGDState", "local_sgd_hook",
    "AutoState", "auto_hook", "DEFAULT_CANDIDATES",
    "DiLoCo", "COMPRESSIONS", "FaultTolerantDiLoCo", "ReplicaGroup",
    "AllReduceMeter",
    "Error", "InvalidArgument", "SizeMismatch", "NonFinite", "CommError", "CorruptData", "Unsupported",
]
