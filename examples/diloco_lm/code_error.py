#!/usr/bin/python3
"""How far two 4-bit E3M0 codes land from DiLoCo's real pseudo-gradients, at equal bytes.

Both codes send, per block of 256 values, a float32 scale s = max |x| of the block and 4 bits a value: a sign
bit and a 3-bit magnitude code, 0 meaning zero and the other seven the powers of two 2^-6 s .. s. They differ
only in which grid point a value goes to:

    log2    (commsgd_torch's former "fp4", python/commsgd_torch/diloco.py until it ran the C++ engine):
            e = round(-log2(|x| / s)), half to even, computed in float32; e in 0..6 is sent as 2^-e s
            (code e + 1), e >= 7 (|x| < 2^-6.5 s) as zero. The sign bit is x < 0 (-0.0 travels as +0).
    linear  (commsgd's compress::e3m0, include/commsgd/compress/block_quant.hpp; commsgd_torch's "e3m0"
            since): the power of two nearest |x| / s in linear terms, computed in double: between 2^(j-1)
            and 2^j the midpoint is 0.75 2^j and a tie goes to the smaller power; |x| / s < 2^-7 is zero
            (code k = 0), else code k = j + 7 in 1..7 means 2^(k-7) s. The sign bit is signbit(x) (-0.0
            travels as -0).
    A block of zeros (s = 0) decodes to zeros in both.

This script trains one process of examples/diloco_lm/train.py's model with its inner AdamW and schedule for
--rounds rounds of --sync-every (H) inner steps; at every round boundary it takes the pseudo-gradient
delta = theta_global - theta_local (flat float32, model.parameters() order), applies the outer Nesterov SGD to
the global copy with the float32 delta (so training follows the uncompressed trajectory) and resets the local
model to the global one. Each delta is coded both ways (and as int8 and fp16 for context), and the script
reports per round and over all rounds: relative L2 and L1 error, the fraction of values sent as zero and the
cosine to delta; and, with error feedback across rounds (e += delta; send Q(e); e -= Q(e)), the accumulated
error ||sum sent - sum delta|| / ||sum delta|| after the last round.

    python3 examples/diloco_lm/code_error.py --check
    python3 examples/diloco_lm/code_error.py --width 64 --layers 2 --context 64 --batch 32 --json out.json
"""
import argparse
import importlib.util
import json
import math
import os
import sys
import time
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train  # noqa: E402  (examples/diloco_lm/train.py: data, model, batches, defaults)

BLOCK = 256
CODES = ("log2", "linear", "int8", "fp16")


# --- codes: each returns the decoded float32 vector (what the receiver gets) ----------------------------------

def _blocks(x):
    """x (flat float32) as [nb, BLOCK], zero-padded; nb >= 1 (a zero-length vector: one block of zeros)."""
    n = x.numel()
    nb = max(1, (n + BLOCK - 1) // BLOCK)
    if nb * BLOCK != n:
        x = torch.cat([x, x.new_zeros(nb * BLOCK - n)])
    return x.view(nb, BLOCK)


def log2_codes(x):
    """(scale [nb] float32, magnitude code [nb, BLOCK] in 0..7, negative [nb, BLOCK] bool): the log2 rounding."""
    xb = _blocks(x.float())
    s = xb.abs().amax(dim=1)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    m = xb.abs() / safe[:, None]                       # float32, as the Python code computes it
    e = torch.round(-torch.log2(m))                    # half to even; m = 0 gives +inf
    code = torch.where(e <= 6, e + 1, torch.zeros_like(e)).to(torch.int64)
    return s, code, xb < 0


def log2_decode(s, code, neg, n):
    table = torch.tensor([0.0] + [2.0 ** -e for e in range(7)], dtype=torch.float32)
    mag = table[code] * s[:, None]                     # float32 product, as the Python decoder makes it
    return torch.where(neg, -mag, mag).reshape(-1)[:n]


def linear_codes(x):
    """(scale, code k in 0..7, sign bit): the linear rounding, computed in double as the C++ code does."""
    xb = _blocks(x.float())
    s = xb.abs().amax(dim=1)
    neg = torch.signbit(xb)
    safe = torch.where(s > 0, s, torch.ones_like(s)).double()
    r = xb.double().abs() / safe[:, None]              # |p| / s in double: exact ties stay exact
    mant, j = torch.frexp(r)                           # r = mant 2^j, mant in [0.5, 1) (r = 0: 0, 0)
    j = j.to(torch.int64) + (mant > 0.75).to(torch.int64) - 1   # 2^j the nearest power; a tie: the smaller
    j = j.clamp(-6, 0)
    k = torch.where(r < 2.0 ** -7, torch.zeros_like(j), j + 7)
    k = torch.where((s == 0)[:, None], torch.zeros_like(k), k)  # a block of zeros: the sign alone
    return s, k, neg


def linear_decode(s, k, neg, n):
    mag = s[:, None] * torch.pow(2.0, (k - 7).clamp(min=-6).float())  # s 2^(k-7) in float32 (= ldexp)
    mag = torch.where(k == 0, torch.zeros_like(mag), mag)
    return torch.where(neg, -mag, mag).reshape(-1)[:n]


def q_log2(x):
    return log2_decode(*log2_codes(x), x.numel())


def q_linear(x):
    return linear_decode(*linear_codes(x), x.numel())


def q_int8(x):
    xb = _blocks(x.float())
    s = xb.abs().amax(dim=1)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round(xb / safe[:, None] * 127.0).clamp_(-127, 127)
    return (q * (s / 127.0)[:, None]).reshape(-1)[:x.numel()]


def q_fp16(x):
    return x.half().float()


QUANT = {"log2": q_log2, "linear": q_linear, "int8": q_int8, "fp16": q_fp16}


def message_bytes(code, n):
    nb = (n + BLOCK - 1) // BLOCK
    return {"log2": 4 * nb + (n + 1) // 2, "linear": 4 * nb + (n + 1) // 2, "int8": 4 * nb + n,
            "fp16": 2 * n}[code]


def metrics(q, x):
    q64, x64 = q.double(), x.double()
    err = q64 - x64
    nx = x64.norm().item()
    return {"l2": err.norm().item() / nx, "l1": err.abs().sum().item() / x64.abs().sum().item(),
            "zeros": (q == 0).double().mean().item(),
            "cos": (q64 @ x64).item() / (q64.norm().item() * nx) if q64.norm().item() > 0 else 0.0,
            "norm": q64.norm().item() / nx,           # ||Q(x)|| / ||x||: the code's overall shrink or growth
            "input_zeros": (x == 0).double().mean().item()}


# --- the self-check --------------------------------------------------------------------------------------------

def _exact_decode(s, code, neg, n, log2):
    """Decoded values in float64 on the exact grid (no float32 rounding of s 2^-j)."""
    k = code if not log2 else torch.where(code == 0, code, 8 - code)  # log2's code c is 2^-(c-1): k = 8 - c
    mag = s.double()[:, None] * torch.pow(2.0, (k - 7).clamp(min=-6).double())
    mag = torch.where(k == 0, torch.zeros_like(mag), mag)
    return torch.where(neg, -mag, mag).reshape(-1)[:n]


def _cpp_scalar(p, s):
    """A line-by-line transliteration of e3m0_code::encode/decode (block_quant.hpp), Python floats = double."""
    if s == 0.0:
        return math.copysign(0.0, p)
    x = abs(p) / s
    sign = math.copysign(1.0, p)
    if x < 2.0 ** -7:
        return sign * 0.0
    m, j = math.frexp(x)
    if m > 0.75:
        j += 1
    j -= 1
    j = min(0, max(-6, j))
    return sign * float(torch.tensor(s, dtype=torch.float32) * torch.tensor(2.0 ** j, dtype=torch.float32))


def _load_python_fp4():
    """diloco.py's _fp4_encode / _fp4_decode, loaded from its source without the compiled _C (only its error
    types come from there). None when the source is not there or no longer has them (diloco.py runs the C++
    engine, whose "e3m0" is the linear rounding, since 2026-11-27)."""
    path = os.path.join(HERE, "..", "..", "python", "commsgd_torch", "diloco.py")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        if "def _fp4_encode" not in f.read():
            return None
    pkg = types.ModuleType("_cgd_stub")
    pkg.__path__ = []
    c = types.ModuleType("_cgd_stub._C")
    c.InvalidArgument = type("InvalidArgument", (Exception,), {})
    c.NonFinite = type("NonFinite", (Exception,), {})
    saved = {k: sys.modules.get(k) for k in ("_cgd_stub", "_cgd_stub._C")}
    sys.modules["_cgd_stub"], sys.modules["_cgd_stub._C"] = pkg, c
    try:
        spec = importlib.util.spec_from_file_location("_cgd_stub.diloco", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
    return mod


def _check_input(g, n):
    """A random float32 vector of n values with the awkward cases mixed in."""
    kind = torch.randint(0, 4, (1,), generator=g).item()
    if kind == 0:
        x = torch.randn(n, generator=g)
    elif kind == 1:      # heavy tails: a spread of magnitudes over many octaves
        x = torch.randn(n, generator=g) * torch.exp(3 * torch.randn(n, generator=g))
    elif kind == 2:      # tiny values: subnormal and near-subnormal scales
        x = torch.randn(n, generator=g) * 1e-39
    else:
        x = torch.rand(n, generator=g) * 2 - 1
    x = x.float()
    if n == 0:
        return x
    # Special values relative to a block's scale: make each block's max a known value, then plant ratios.
    ratios = [0.0, -0.0] + [2.0 ** -j for j in range(0, 9)] + [0.75 * 2.0 ** -j for j in range(0, 8)] \
        + [2.0 ** -6.5, 2.0 ** -7, 2.0 ** -7 * (1 - 2 ** -20), 2.0 ** -6.5 * (1 + 2 ** -20),
           2.0 ** -6.5 * (1 - 2 ** -20), 0.75 * (1 + 2 ** -20), 0.75 * (1 - 2 ** -20), 1e-30, 1e-45]
    for b in range(0, n, BLOCK):
        blk = x[b:b + BLOCK]
        if torch.rand(1, generator=g).item() < 0.1:
            blk.zero_()            # an all-zero block (with a -0.0 sometimes)
            if blk.numel() > 1 and torch.rand(1, generator=g).item() < 0.5:
                blk[1] = -0.0
            continue
        if torch.rand(1, generator=g).item() < 0.5:
            continue
        top = int(blk.abs().argmax())
        s = blk[top].abs().item()
        if s == 0:
            continue
        if torch.rand(1, generator=g).item() < 0.7:  # a power-of-two scale: planted ratios are exact values
            s = 2.0 ** math.ceil(math.log2(s))
            blk[top] = math.copysign(s, blk[top].item())
        for _ in range(min(blk.numel() - 1, 12)):
            i = torch.randint(0, blk.numel(), (1,), generator=g).item()
            if i == top:
                continue   # keep the block's scale
            r = ratios[torch.randint(0, len(ratios), (1,), generator=g).item()]
            negative = torch.rand(1, generator=g).item() < 0.5
            blk[i] = (-r if negative else r) * s if r != 0.0 else (-0.0 if negative else 0.0)
    return x


def self_check(seeds=200, verbose=True):
    sizes = (0, 1, 255, 256, 257, 10000)
    ref = _load_python_fp4()
    worse = ties = elements = cross = 0
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        for n in sizes:
            x = _check_input(g, n)
            out = {}
            for name, codes, dec in (("log2", log2_codes, log2_decode), ("linear", linear_codes, linear_decode)):
                s, code, neg = codes(x)
                y = dec(s, code, neg, n)
                assert y.dtype == torch.float32 and y.shape == x.shape
                # On the grid {0, +-2^-6 s .. +-s} of its block (float32 products), the sign of x when nonzero.
                grid = torch.cat([torch.zeros(s.numel(), 1),
                                  s[:, None] * torch.pow(2.0, -torch.arange(6, -1, -1).float())[None, :]], dim=1)
                yb = _blocks(y)
                on = (yb.abs()[:, :, None] == grid[:, None, :]).any(dim=2).reshape(-1)[:n]
                assert bool(on.all()), (name, seed, n, y[~on][:5], x[~on][:5])
                nz = y != 0
                assert bool(((y[nz] < 0) == (x[nz] < 0)).all()), (name, seed, n)
                # An all-zero block decodes to zeros; zeros decode to zeros.
                assert bool((y[x == 0] == 0).all()), (name, seed, n)
                # The float32 decode is the exact grid value rounded once to float32.
                exact = _exact_decode(s, code, neg, n, name == "log2")
                assert torch.equal(exact.float(), y), (name, seed, n)
                out[name] = exact
            # The linear rounding is the nearest grid point: never a larger error than the log2 rounding.
            x64 = x.double()
            el, eg = (out["linear"] - x64).abs(), (out["log2"] - x64).abs()
            bad = el > eg
            assert not bool(bad.any()), (seed, n, x[bad][:5], out["linear"][bad][:5], out["log2"][bad][:5])
            worse += int((el < eg).sum())
            ties += int(((el == eg) & (out["linear"] != out["log2"])).sum())
            elements += n
            # Against the sources: diloco.py's own fp4 code (bit for bit, -0 as +0) and the C++ transliteration.
            if ref is not None:
                msg = ref._fp4_encode(x)
                assert torch.equal(ref._fp4_decode(msg, n), q_log2(x) + 0.0), ("diloco.py", seed, n)
            if n <= 300 or seed % 20 == 0:
                xs = x.tolist()
                ql = q_linear(x).tolist()
                for b in range(0, n, BLOCK):
                    s = max((abs(v) for v in xs[b:b + BLOCK]), default=0.0)
                    for i in range(b, min(n, b + BLOCK)):
                        want = _cpp_scalar(xs[i], s)
                        assert want == ql[i] and math.copysign(1, want) == math.copysign(1, ql[i]), \
                            ("C++", seed, n, i, xs[i], s, want, ql[i])
                        cross += 1
    # The documented boundaries, one by one (s = 1).
    one = lambda f, v: f(torch.tensor([1.0, v], dtype=torch.float32))[1].item()  # noqa: E731
    for j in range(0, 7):
        assert one(q_linear, 2.0 ** -j) == 2.0 ** -j and one(q_log2, 2.0 ** -j) == 2.0 ** -j
    for j in range(0, 6):   # 0.75 2^-j: linear ties to the smaller power; log2 (above 2^-j-0.5) goes up
        assert one(q_linear, 0.75 * 2.0 ** -j) == 2.0 ** -(j + 1)
        assert one(q_log2, 0.75 * 2.0 ** -j) == 2.0 ** -j
        assert one(q_linear, 0.75 * 2.0 ** -j * (1 + 2 ** -20)) == 2.0 ** -j
    assert one(q_linear, 2.0 ** -7) == 2.0 ** -6 and one(q_linear, 2.0 ** -7 * (1 - 2 ** -20)) == 0.0
    assert one(q_log2, 2.0 ** -6.5 * (1 + 2 ** -20)) == 2.0 ** -6 and one(q_log2, 2.0 ** -7) == 0.0
    assert one(q_log2, 2.0 ** -6.5 * (1 - 2 ** -20)) == 0.0
    assert math.copysign(1, one(q_linear, -0.0)) < 0 and math.copysign(1, one(q_log2, -0.0)) > 0
    assert q_linear(torch.zeros(0)).numel() == 0 and q_log2(torch.zeros(0)).numel() == 0
    z = torch.tensor([0.0, -0.0, 0.0])
    assert bool((q_linear(z) == 0).all()) and bool((q_log2(z) == 0).all())
    if verbose:
        print(f"check: {seeds} seeds x sizes {sizes}: {elements} values; linear strictly nearer in {worse}, "
              f"an equal error at another grid point in {ties}, never farther; both on the grid; "
              f"log2 = diloco.py's fp4 {'bit for bit' if ref is not None else '(not in diloco.py: skipped)'}; "
              f"linear = the C++ e3m0 transliteration on {cross} values")


# --- the run ---------------------------------------------------------------------------------------------------

def parse(argv):
    d = train.parse(["--arm", "diloco"])   # train.py's defaults
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="run the self-check only")
    p.add_argument("--check-seeds", type=int, default=200)
    p.add_argument("--rounds", type=int, default=20, help="R: outer rounds")
    p.add_argument("--sync-every", type=int, default=30, help="H: inner steps a round")
    p.add_argument("--schedule-steps", type=int, default=None,
                   help="the steps the learning-rate schedule spans (default: rounds x H)")
    for name in ("seed", "batch", "context", "layers", "width", "heads", "lr", "weight_decay", "lr_warmup",
                 "outer_lr", "outer_momentum", "threads"):
        p.add_argument("--" + name.replace("_", "-"), type=type(getattr(d, name)), default=getattr(d, name))
    p.add_argument("--eval-windows", type=int, default=64, help="validation windows for the final loss")
    p.add_argument("--dump", default=None, help="save each round's delta as DIR/delta_rRRR_sSSSSS.pt")
    p.add_argument("--dump-accumulators", default=None,
                   help="write each round's top-k accumulator (residual + delta, top-k at --topk-density with "
                        "error feedback) as raw float32 with DIR/manifest.txt, for bench/select_bench --sequence")
    p.add_argument("--topk-density", type=float, default=0.01)
    p.add_argument("--topk-chunk", type=int, default=0,
                   help="with --dump-accumulators: top-k of each chunk of this many values (0: of the whole vector)")
    p.add_argument("--json", default=None, help="write the per-round and summary figures here")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def dump_accumulator(folder, r, step, delta, residual, density, files, chunk=0):
    """Round r's accumulator p = residual + delta of top-k with error feedback (what the engine's
    topk-<density>[-c<chunk>] code selects on), as select_bench --sequence reads it; the residual keeps p less
    its k largest magnitudes, of each chunk of `chunk` values when chunk > 0 (k = ceil(density x its length))."""
    os.makedirs(folder, exist_ok=True)
    p = residual + delta
    name = f"accumulator-{r:03d}.f32"
    p.numpy().astype("<f4").tofile(os.path.join(folder, name))
    residual.copy_(p)
    size = chunk if chunk > 0 else p.numel()
    k = 0
    for b in range(0, p.numel(), size):
        part = p[b:b + size]
        kj = max(1, math.ceil(density * part.numel()))
        residual[b + part.abs().topk(kj).indices] = 0.0
        k += kj
    files.append(f"file {name} {step} {k}")
    with open(os.path.join(folder, "manifest.txt"), "w") as m:
        m.write("# top-k accumulators p_r = e_(r-1) + delta_r of DiLoCo's pseudo-gradients (examples/diloco_lm/"
                f"code_error.py), one file per outer round\nn {p.numel()}\ndensity {density}\n"
                "# file step sent\n" + "\n".join(files) + "\n")


def summarize(rows):
    out = {}
    for key in ("l2", "l1", "zeros", "cos", "norm", "input_zeros"):
        v = [r[key] for r in rows]
        out[key] = {"mean": sum(v) / len(v), "min": min(v), "max": max(v)}
    return out


def main(argv=None):
    args = parse(argv)
    if args.check:
        self_check(args.check_seeds)
        return None
    torch.set_num_threads(args.threads)
    H, R = args.sync_every, args.rounds
    total = args.schedule_steps or R * H
    tr, va = train.stdlib_split()
    torch.manual_seed(args.seed)
    model = train.ByteLM(args.layers, args.width, args.heads, args.context)
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    inner = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))

    def lr_at(step):  # train.py's schedule: linear warm-up, then cosine down to 10 % over `total` steps
        if step < args.lr_warmup:
            return (step + 1) / args.lr_warmup
        frac = (step - args.lr_warmup) / max(1, total - args.lr_warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac)))
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lr_at)
    glob = [p.detach().float().clone() for p in params]
    outer = torch.optim.SGD(glob, lr=args.outer_lr, momentum=args.outer_momentum,
                            nesterov=args.outer_momentum > 0)
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    print(f"code_error: {n} parameters, R {R} rounds of H {H} steps, schedule {total} steps, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}", flush=True)
    print("bytes a round: " + ", ".join(f"{c} {message_bytes(c, n)}" for c in CODES) + f", float32 {4 * n}")

    topk_residual, files = torch.zeros(n, dtype=torch.float32), []
    rows = {c: [] for c in CODES}
    ef = {c: torch.zeros(n, dtype=torch.float32) for c in CODES}
    sent_ef = {c: torch.zeros(n, dtype=torch.float64) for c in CODES}
    sent_plain = {c: torch.zeros(n, dtype=torch.float64) for c in CODES}
    sum_delta = torch.zeros(n, dtype=torch.float64)
    losses, t_start, per_round = [], time.perf_counter(), []
    for step in range(1, R * H + 1):
        x, y = train.batch_rows(tr, step - 1, args.seed, args.batch, args.context, 0, 1)
        inner.zero_grad()
        loss = train.lm_loss(model, x, y)
        loss.backward()
        inner.step()
        sched.step()
        losses.append(loss.item())
        if step % H:
            continue
        r = step // H
        with torch.no_grad():
            delta = torch.cat([(g - p.detach().float()).reshape(-1) for g, p in zip(glob, params)])
            off = 0
            for g in glob:
                g.grad = delta[off:off + g.numel()].view_as(g).clone()
                off += g.numel()
            outer.step()
            for g, p in zip(glob, params):
                p.copy_(g)
        if args.dump:
            torch.save(delta.clone(), os.path.join(args.dump, f"delta_r{r:03d}_s{step:05d}.pt"))
        if args.dump_accumulators:
            dump_accumulator(args.dump_accumulators, r, step, delta, topk_residual, args.topk_density, files,
                                 args.topk_chunk)
        sum_delta += delta.double()
        line = [f"round {r:2d} step {step:4d} loss {sum(losses[-H:]) / H:.4f} |delta| {delta.norm():.4g}"]
        for c in CODES:
            q = QUANT[c](delta)
            m = metrics(q, delta)
            m["round"], m["step"] = r, step
            rows[c].append(m)
            sent_plain[c] += q.double()
            ef[c] += delta
            qe = QUANT[c](ef[c])
            ef[c] -= qe
            sent_ef[c] += qe.double()
            if c in ("log2", "linear"):
                line.append(f"{c} L2 {m['l2']:.4f} zeros {m['zeros']:.3f}")
        per_round.append(time.perf_counter() - t_start)
        if not args.quiet:
            print(" | ".join(line), flush=True)

    # The final global model's validation loss, for context.
    with torch.no_grad():
        w = train.val_windows(va, args.eval_windows, args.context)
        tot = cnt = 0.0
        for i in range(0, w.shape[0], 32):
            b = w[i:i + 32]
            tot += torch.nn.functional.cross_entropy(model(b[:, :-1]).reshape(-1, 256), b[:, 1:].reshape(-1),
                                                     reduction="sum").item()
            cnt += b[:, 1:].numel()
    val = tot / cnt
    nd = sum_delta.norm().item()
    summary = {}
    for c in CODES:
        summary[c] = summarize(rows[c])
        summary[c]["ef_accumulated"] = (sent_ef[c] - sum_delta).norm().item() / nd
        summary[c]["plain_accumulated"] = (sent_plain[c] - sum_delta).norm().item() / nd
        summary[c]["bytes_per_round"] = message_bytes(c, n)
    # Where the two 4-bit codes pick different grid points, over all rounds' deltas (for the report).
    print(f"\n{n} parameters, {R} rounds x {H} steps in {per_round[-1]:.0f} s; final val loss {val:.4f} nats/byte")
    print(f"{'code':7s} {'bytes':>8s} {'L2 mean [min, max]':>26s} {'L1 mean [min, max]':>26s} "
          f"{'zeros mean [min, max]':>26s} {'cos mean [min, max]':>26s} {'EF acc.':>8s} {'no-EF acc.':>10s} "
          f"{'norm ratio':>10s} {'sin':>7s}")
    for c in CODES:
        s = summary[c]
        f = lambda k, p=4: f"{s[k]['mean']:.{p}f} [{s[k]['min']:.{p}f}, {s[k]['max']:.{p}f}]"  # noqa: E731
        print(f"{c:7s} {s['bytes_per_round']:8d} {f('l2'):>26s} {f('l1'):>26s} {f('zeros'):>26s} "
              f"{f('cos', 5):>26s} {s['ef_accumulated']:8.4f} {s['plain_accumulated']:10.4f} "
              f"{s['norm']['mean']:10.4f} {math.sqrt(max(0.0, 1 - s['cos']['mean'] ** 2)):7.4f}")
    print(f"input zeros: {summary['log2']['input_zeros']['mean']:.4f} of the values (mean over rounds); sin: "
          "sqrt(1 - cos^2), the relative L2 error left after the best scalar rescale of Q(x)")
    a, b = summary["log2"], summary["linear"]
    print(f"linear vs log2: L2 {b['l2']['mean'] / a['l2']['mean'] - 1:+.1%}, L1 {b['l1']['mean'] / a['l1']['mean'] - 1:+.1%}, "
          f"EF accumulated {b['ef_accumulated'] / a['ef_accumulated'] - 1:+.1%}; linear lower L2 in "
          f"{sum(y['l2'] < x['l2'] for x, y in zip(rows['log2'], rows['linear']))}/{R} rounds")
    result = {"config": {k: v for k, v in vars(args).items()}, "parameters": n, "torch": torch.__version__,
              "final_val_loss": val, "seconds": per_round[-1], "summary": summary, "rounds": rows,
              "train_loss_per_round": [sum(losses[i * H:(i + 1) * H]) / H for i in range(R)]}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
