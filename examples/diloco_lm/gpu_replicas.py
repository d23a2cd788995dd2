"""n DiLoCo replicas of train.py's transformer on one GPU, their outer round on the device by commsgd's kernels.

Each replica takes its inner steps in turn (its own AdamW, its own rows of the global batch, as train.py's
ranks do). Every H steps each replica encodes its pseudo-gradient with commsgd_torch._cuda.DiLoCoFragment
(cuda::diloco_fragment: the engine's round, the host engine's bits), the messages are laid out in replica order
as an all-gather leaves them (dense: summed in replica order, as an all-reduce), and every replica decodes them
and takes the outer step. Nothing leaves the GPU, so a run of a model of tens of millions of parameters takes
minutes: the place to see whether a code keeps float32 DiLoCo's loss at a size the CPU runs never reach. The
replicas' models are checked to be bit for bit one after every round.

    python examples/diloco_lm/gpu_replicas.py --code dense --outer-lr 0.7 --outer-momentum 0.9
    python examples/diloco_lm/gpu_replicas.py --code topk-0.01-c4096-2bit-b0.95-senders --outer-lr 1 \\
        --outer-momentum 0

Prints one JSON line per evaluation and a last one with the run's figures (validation loss of the common model
in nats per byte, the bytes a replica sends a round by comm/traffic.hpp's rules, the inner step's and the
round's device times); --log writes them to a file too.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train as T  # noqa: E402


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4, help="replicas")
    p.add_argument("--steps", type=int, default=1020)
    p.add_argument("--H", type=int, default=30, help="inner steps a round")
    p.add_argument("--code", default="dense")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--batch", type=int, default=64, help="global batch in windows, split over the replicas")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", choices=sorted(T.CORPORA), default="stdlib")
    p.add_argument("--eval-every", type=int, default=255)
    p.add_argument("--eval-windows", type=int, default=256)
    p.add_argument("--log", default=None)
    return p.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    from commsgd_torch import _C, _cuda
    if not torch.cuda.is_available():
        raise SystemExit("gpu_replicas.py needs a CUDA device")
    if a.batch % a.n:
        raise SystemExit(f"--batch {a.batch} is not divisible by --n {a.n}")
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream(dev).cuda_stream
    train, val = T.CORPORA[a.corpus]()
    windows = T.val_windows(val, a.eval_windows, a.context).to(dev)
    margs = argparse.Namespace(model="transformer", layers=a.layers, width=a.width, heads=a.heads,
                               context=a.context, span=16)
    torch.manual_seed(a.seed)
    base = T.make_model(margs).to(dev)
    d = sum(p.numel() for p in base.parameters())
    models, flats, opts, scheds, frags = [], [], [], [], []
    for _ in range(a.n):
        m = T.make_model(margs).to(dev)
        m.load_state_dict(base.state_dict())
        flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
        at = 0
        for p in m.parameters():  # the parameters become views of one flat tensor, as DiLoCo's device round has
            p.data = flat[at:at + p.numel()].view_as(p)
            at += p.numel()
        models.append(m)
        flats.append(flat)
        opt = torch.optim.AdamW(m.parameters(), lr=a.lr, weight_decay=0.1, betas=(0.9, 0.95), fused=True)

        def lr_at(step):  # train.py's: linear warm-up, then cosine to 10 %
            if step < a.warmup:
                return (step + 1) / a.warmup
            return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))))
        opts.append(opt)
        scheds.append(torch.optim.lr_scheduler.LambdaLR(opt, lr_at))
        f = _cuda.DiLoCoFragment([(0, d)], a.code, a.outer_lr, a.outer_momentum, 0.0)
        f.start(flat.data_ptr(), stream)
        frags.append(f)
    # The messages back to back, message_bytes apart, as an all-gather leaves them (and apply reads them), with
    # a few bytes of slack after them.
    B = frags[0].message_bytes
    gathered = torch.zeros(a.n * B + 8, dtype=torch.uint8, device=dev)
    messages = [gathered[i * B:(i + 1) * B] for i in range(a.n)]
    wire = _C.diloco_round_traffic(a.code, d, a.n, 0, False)["bytes_sent"]
    dense_wire = _C.diloco_round_traffic("dense", d, a.n, 0, False)["bytes_sent"]

    def outer_round():
        for i, f in enumerate(frags):
            f.encode(flats[i].data_ptr(), 1.0, messages[i].data_ptr(), stream)
        if frags[0].summed:
            total = messages[0].view(torch.float32).clone()
            for i in range(1, a.n):
                total += messages[i].view(torch.float32)
            source = total
        else:
            source = gathered
        for i, f in enumerate(frags):
            f.apply(source.data_ptr(), a.n, flats[i].data_ptr(), stream)
        for i, f in enumerate(frags):
            own, _, bad, _, corrupt = f.verdict(stream)
            if own or bad or corrupt:
                raise SystemExit(f"round refused on replica {i}: {own} own, {bad} sum, {corrupt} corrupt")
            f.commit()
        for i in range(1, a.n):
            if not torch.equal(flats[0].view(torch.int32), flats[i].view(torch.int32)):
                raise SystemExit(f"replica {i}'s model differs from replica 0's after a round")

    @torch.no_grad()
    def evaluate():
        m = models[0]
        total, count = 0.0, 0
        for i in range(0, windows.shape[0], 32):
            w = windows[i:i + 32]
            total += F.cross_entropy(m(w[:, :-1]).reshape(-1, 256), w[:, 1:].reshape(-1), reduction="sum").item()
            count += w[:, 1:].numel()
        return total / count

    log = open(a.log, "w") if a.log else None

    def emit(rec):
        line = json.dumps(rec)
        print(line, flush=True)
        if log:
            log.write(line + "\n")
            log.flush()

    events = {"inner": [], "round": []}
    t0 = time.time()
    losses = []
    rounds = 0
    for step in range(1, a.steps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step_loss = torch.zeros((), device=dev)
        for i, m in enumerate(models):
            x, y = T.batch_rows(train, step - 1, a.seed, a.batch, a.context, i, a.n)
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            opts[i].zero_grad(set_to_none=True)
            loss = F.cross_entropy(m(x).reshape(-1, 256), y.reshape(-1))
            loss.backward()
            opts[i].step()
            scheds[i].step()
            step_loss += loss.detach()
        end.record()
        events["inner"].append((start, end))
        losses.append(step_loss)
        if step % a.H == 0 or step == a.steps:
            rs, re = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            rs.record()
            outer_round()
            re.record()
            events["round"].append((rs, re))
            rounds += 1
        if step % a.eval_every == 0 or step == a.steps:
            train_loss = torch.stack(losses).mean().item() / a.n
            losses = []
            emit({"step": step, "train_loss": round(train_loss, 5), "val_loss": round(evaluate(), 5),
                  "elapsed_s": round(time.time() - t0, 1)})
    torch.cuda.synchronize()
    inner = sorted(s.elapsed_time(e) for s, e in events["inner"][10:])
    rnd = sorted(s.elapsed_time(e) for s, e in events["round"][1:]) or [0.0]
    emit({"final": True, "code": a.code, "replicas": a.n, "steps": a.steps, "H": a.H, "params": d,
          "outer_lr": a.outer_lr, "outer_momentum": a.outer_momentum, "rounds": rounds,
          "val_loss": round(evaluate(), 5), "bytes_per_round": wire, "dense_bytes_per_round": dense_wire,
          "inner_step_ms_median": round(inner[len(inner) // 2], 3),
          "round_ms_median": round(rnd[len(rnd) // 2], 3),
          "device": torch.cuda.get_device_name(), "torch": torch.__version__,
          "elapsed_s": round(time.time() - t0, 1)})


if __name__ == "__main__":
    main()
