"""A model of DiLoCo's top-k codes in one process, for trying a change to a code before building it.

n replicas of train.py's model take their inner steps in turn (each its own AdamW, its own rows of the global
batch, as train.py's ranks do); every H steps each forms its accumulator p = decay e + (theta_global -
theta_local), keeps each chunk's k largest |p_i| (torch.topk: ties in any order, where the engine takes the
lowest indices), 2-bit values against the chunk's mean |p| as compress::top_k_ef codes them, and the common
model takes the senders' mean with plain SGD (or the dense mean with Nesterov, as float32 DiLoCo). Float
arithmetic in torch's order, not the engine's: a model of the codes, checked against the engine's runs (the
same arms land within 0.5 % of their loss), never a substitute for them. Variants tried with it:

  --carry 1         the residual kept in each replica's local model (theta_local <- theta_global - decay e)
                    instead of added to the next accumulator
  --select rand     k random values a chunk (seeded per replica and round; --shared-mask 1: one mask for all)
  --residual clear  every replica's residual cleared where the common model moved (any sender's index)
  --residual common every replica's residual taken against what the common model moved there, not against
                    its own message (acc - outer lr x mean on the senders' union, acc elsewhere)
  --union 1         every replica sends its own value wherever any replica picked one, so the common model
                    moves there by the mean over all n (the picks' union), not over the senders
  --local-momentum  each replica codes its own Nesterov step (outer lr, this momentum) on its pseudo-gradient,
                    and the common model moves by the mean at lr 1: dense, the common Nesterov step exactly
  --per-tensor 1    chunks cut at every tensor's end, so each tensor (a layer norm's 64 too) has its own k
  --subtract s      only s of each sent value taken from the residual, so a sent value is sent again in part
  --ahead b         each round's replicas start b times the last common step ahead of the common model (a
                    look-ahead their inner steps correct; dense with plain averaging, a heavy-ball momentum)
  --lr              the inner AdamW's peak learning rate (train.py's --lr)
  --outer-wd c      no weight decay in the inner AdamW; the common model decays instead, each round by the
                    product of the round's steps' (1 - lr x 0.1) raised to c: no bytes, and no part of a code
  --block b         each chunk cut into runs of b values and the runs with the most energy (sum of squares) sent
                    whole, as many as fit the bits top-k at --density spends on the chunk (an index of the run
                    and 2 bits a value, against ceil(log2 chunk) + 2 bits a value): more values for the bytes
  --score adam      each chunk's k values picked by |p| times the replica's AdamW gradient scale (the square root
                    of its second moment): a first-order guess of what moving each value gains, where |p| alone,
                    a step AdamW has already scaled, does not say how steep the loss is there; --score
                    adam-m: times |the first moment| (the recent mean gradient) instead
  --flush 1         the last round sends every replica's whole accumulator (dense, the mean over all n)
  --velocity c      the common model also moves c times a running mean of its rounds' steps (decay
                    --velocity-decay): a momentum whose weight and memory are set apart
  --moves 1         every 10 rounds, the share of the model the round moved and the share of those values that
                    moved in the round before too (each and the mean so far): how steady a coordinate's moves are
  --masked 1        the outer Nesterov momentum only where the common model moves this round, its buffer there
                    decayed by the momentum once for every round since that value last moved: no move where no
                    replica sent (which the residuals still hold), and a value that moves every round gets the
                    dense step's gain

    python examples/diloco_lm/sim_codes.py --n 4 --steps 3000 --code topk --density 0.01 --tag base
"""
import argparse
import copy
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
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--H", type=int, default=30)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--code", choices=("dense", "topk"), default="dense")
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--per-tensor", type=int, choices=(0, 1), default=0,
                   help="chunks that never cross a tensor's end (each tensor its own k)")
    p.add_argument("--decay", type=float, default=0.95)
    p.add_argument("--two-bit", type=int, choices=(0, 1), default=1)
    p.add_argument("--subtract", type=float, default=1.0,
                   help="the share of what was sent taken from the residual (below 1: a sent value stays in part)")
    p.add_argument("--senders", type=int, choices=(0, 1), default=1, help="the mean over the senders")
    p.add_argument("--carry", type=int, choices=(0, 1), default=0)
    p.add_argument("--select", choices=("top", "rand"), default="top")
    p.add_argument("--residual", choices=("own", "clear", "common"), default="own")
    p.add_argument("--shared-mask", type=int, choices=(0, 1), default=0)
    p.add_argument("--union", type=int, choices=(0, 1), default=0,
                   help="every replica sends its values at the union of the picks: a mean over all n there")
    p.add_argument("--outer-lr", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-3, help="the inner AdamW's peak learning rate")
    p.add_argument("--local-momentum", type=float, default=0.0,
                   help="each replica's own Nesterov step on its pseudo-gradient, coded in place of it "
                        "(the common model then moves by the mean at lr 1)")
    p.add_argument("--ahead", type=float, default=0.0,
                   help="replicas start each round this share of the last common step ahead of the common model")
    p.add_argument("--outer-wd", type=float, default=0.0)
    p.add_argument("--block", type=int, default=1)
    p.add_argument("--score", choices=("abs", "adam", "adam-m"), default="abs")
    p.add_argument("--flush", type=int, choices=(0, 1), default=0)
    p.add_argument("--velocity", type=float, default=0.0)
    p.add_argument("--velocity-decay", type=float, default=0.9)
    p.add_argument("--outer-momentum", type=float, default=0.0, help="Nesterov when not 0")
    p.add_argument("--masked", type=int, choices=(0, 1), default=0,
                   help="the outer momentum only where the model moves, decayed by the rounds since it last did")
    p.add_argument("--moves", type=int, choices=(0, 1), default=0,
                   help="report what share of the model each round moves, and how much of it moved the round before")
    p.add_argument("--model", choices=("transformer", "mlp"), default="transformer")
    p.add_argument("--corpus", choices=sorted(T.CORPORA), default="stdlib")
    p.add_argument("--eval-every", type=int, default=300)
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


WEIGHT_DECAY = 0.1  # train.py's AdamW default; --outer-wd moves it onto the common model


def chunk_spans(sizes, chunk):
    """[start, end) of each chunk of at most `chunk` values, cut afresh at the start of every run of `sizes`"""
    spans, start = [], 0
    for size in sizes:
        spans += [(c0, min(c0 + chunk, start + size)) for c0 in range(start, start + size, chunk)]
        start += size
    return spans


def masked_nesterov(mean, moved, momentum, age, lr, mu):
    """(the common model's step, the new buffer, the new ages): Nesterov where `moved`, nothing elsewhere; a
    buffer decays by mu once for each round since its value last moved, so a value that moves every round takes
    the plain Nesterov step and one that moved long ago starts nearly afresh"""
    momentum = torch.where(moved, momentum * mu**age + mean, momentum)
    step = torch.where(moved, lr * (mean + mu * momentum), torch.zeros_like(mean))
    return step, momentum, torch.where(moved, torch.ones_like(age), age + 1)


def report_moves(moves, moved_now, moved_before, rnd, tag):
    """--moves: append this round's (share of the model moved, share of those moved the round before too) to
    `moves`, print it and the means so far every 10 rounds, and return what moved now for the next round"""
    if moved_before is not None:
        moves.append((moved_now.float().mean().item(),
                      (moved_now & moved_before).sum().item() / max(1, moved_now.sum().item())))
        if rnd % 10 == 0:
            print(json.dumps({"tag": tag, "round": rnd, "moved": round(moves[-1][0], 4),
                              "again": round(moves[-1][1], 4),
                              "mean_moved": round(sum(m for m, _ in moves) / len(moves), 4),
                              "mean_again": round(sum(r for _, r in moves) / len(moves), 4)}), flush=True)
    return moved_now


def main(argv):
    a = parse(argv)
    torch.set_num_threads(1)
    margs = argparse.Namespace(model=a.model, layers=2, width=64 if a.model == "transformer" else 256, heads=4,
                               context=64, span=16)
    train, val = T.CORPORA[a.corpus]()
    windows = T.val_windows(val, 64, 64)
    torch.manual_seed(a.seed)
    base = T.make_model(margs)
    models = [copy.deepcopy(base) for _ in range(a.n)]
    scratch = copy.deepcopy(base)

    def lr_at(step):  # train.py's schedule
        if step < 50:
            return (step + 1) / 50
        frac = (step - 50) / max(1, a.steps - 50)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac)))
    inner_wd = 0.0 if a.outer_wd else WEIGHT_DECAY
    opts = [torch.optim.AdamW(m.parameters(), lr=a.lr, weight_decay=inner_wd, betas=(0.9, 0.95)) for m in models]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lr_at) for o in opts]

    @torch.no_grad()
    def load(m, v):
        at = 0
        for q in m.parameters():
            q.copy_(v[at:at + q.numel()].view_as(q))
            at += q.numel()

    g = T.flat(base.parameters()).clone()
    start = g.clone()
    d = g.numel()
    res = [torch.zeros(d) for _ in range(a.n)]
    local_u = [torch.zeros(d) for _ in range(a.n)]
    momentum = torch.zeros(d)
    velocity = torch.zeros(d)
    age = torch.ones(d)  # rounds since each value of the common model last moved, for --masked
    moves, moved_before = [], None  # for --moves
    shrink = 1.0  # the round's product of the steps' (1 - lr x WEIGHT_DECAY), for --outer-wd
    spans = chunk_spans([q.numel() for q in base.parameters()] if a.per_tensor else [d], a.chunk)

    def code(acc, rank, rnd, at=None, weight=None):
        """(what the message decodes to, as a dense vector; which values it holds); at: the values to send"""
        sent, mask = torch.zeros(d), torch.zeros(d, dtype=torch.bool)
        gen = torch.Generator().manual_seed(1_000_003 * rnd + (0 if a.shared_mask else rank + 1))
        for c0, c1 in spans:
            c = acc[c0:c1]
            k = math.ceil(a.density * c.numel())
            if at is not None:
                idx = at[c0:c1].nonzero().flatten()
            elif a.block > 1:
                runs = math.ceil(c.numel() / a.block)
                bits = k * (math.ceil(math.log2(c.numel())) + 2)  # what top-k at the density spends
                kb = min(runs, max(1, bits // (max(1, math.ceil(math.log2(runs))) + 2 * a.block)))
                energy = F.pad(c * c, (0, runs * a.block - c.numel())).view(runs, a.block).sum(1)
                picked = torch.topk(energy, kb, sorted=False).indices
                idx = (picked[:, None] * a.block + torch.arange(a.block)).flatten()
                idx = idx[idx < c.numel()]
            elif a.select == "rand":
                idx = torch.randperm(c.numel(), generator=gen)[:k]
            else:
                score = c.abs() if weight is None else c.abs() * weight[c0:c1]
                idx = torch.topk(score, k, sorted=False).indices
            if idx.numel() == 0:
                continue
            v = c[idx]
            if a.two_bit:
                s = v.abs().mean()
                v = torch.sign(v) * torch.where(v.abs() >= s, 1.5 * s, 0.5 * s)
            sent[c0 + idx] = v
            mask[c0 + idx] = True
        return sent, mask

    @torch.no_grad()
    def evaluate(v):
        load(scratch, v)
        total, count = 0.0, 0
        for i in range(0, windows.shape[0], 32):
            w = windows[i:i + 32]
            total += F.cross_entropy(scratch(w[:, :-1]).reshape(-1, 256), w[:, 1:].reshape(-1),
                                     reduction="sum").item()
            count += w[:, 1:].numel()
        return total / count

    t0 = time.time()
    for step in range(1, a.steps + 1):
        for i, m in enumerate(models):
            x, y = T.batch_rows(train, step - 1, a.seed, 8 * a.n, 64, i, a.n)
            if i == 0:
                shrink *= 1 - opts[0].param_groups[0]["lr"] * WEIGHT_DECAY
            opts[i].zero_grad()
            T.lm_loss(m, x, y).backward()
            opts[i].step()
            scheds[i].step()
        if step % a.H == 0 or step == a.steps:
            total, senders = torch.zeros(d), torch.zeros(d)
            pgs = []
            for i, m in enumerate(models):
                pg = g - T.flat(m.parameters())
                if a.local_momentum:
                    local_u[i].mul_(a.local_momentum).add_(pg)
                    pg = a.outer_lr * (pg + a.local_momentum * local_u[i])
                pgs.append(pg)
            accs = [pg if a.carry else a.decay * r + pg for pg, r in zip(pgs, res)]
            union = None
            if a.code == "topk" and a.union:
                union = torch.zeros(d, dtype=torch.bool)
                for i in range(a.n):
                    union |= code(accs[i], i, step // a.H)[1]
            flush = a.flush and step == a.steps
            for i in range(a.n):
                if a.code == "dense" or flush:
                    total += accs[i] if flush else pgs[i]
                    senders += 1
                    continue
                weight = None
                if a.score != "abs":
                    moment = "exp_avg_sq" if a.score == "adam" else "exp_avg"
                    weight = torch.cat([opts[i].state[q][moment].reshape(-1) for q in models[i].parameters()])
                    weight = weight.sqrt() if a.score == "adam" else weight.abs()
                sent, mask = code(accs[i], i, step // a.H, union, weight)
                res[i] = accs[i] - a.subtract * sent
                total += sent
                senders += mask
            moved = senders > 0  # where the common model moves this round (everywhere when dense)
            if a.code == "dense" or flush or not a.senders:
                mean = total / a.n
            else:
                mean = torch.where(moved, total / senders.clamp(min=1), torch.zeros(d))
            if a.code == "topk" and a.residual != "own" and not flush:
                for i in range(a.n):
                    if a.residual == "clear":
                        res[i] = torch.where(moved, torch.zeros(d), res[i])
                    else:
                        res[i] = torch.where(moved, accs[i] - a.outer_lr * mean, res[i])
            if a.moves:
                moved_before = report_moves(moves, moved, moved_before, step // a.H, a.tag)
            before = g.clone()
            if a.outer_wd:
                g *= shrink ** a.outer_wd
            shrink = 1.0
            if a.local_momentum:
                g -= mean
            elif a.outer_momentum and a.masked:
                outer_step, momentum, age = masked_nesterov(mean, moved, momentum, age, a.outer_lr, a.outer_momentum)
                g -= outer_step
            elif a.outer_momentum:
                momentum.mul_(a.outer_momentum).add_(mean)
                g -= a.outer_lr * (mean + a.outer_momentum * momentum)
            else:
                g -= a.outer_lr * mean
            if a.velocity:
                velocity.mul_(a.velocity_decay).add_(mean, alpha=1 - a.velocity_decay)
                g -= a.velocity * velocity
            ahead = g + a.ahead * (g - before)
            for i, m in enumerate(models):
                load(m, ahead - a.decay * res[i] if a.carry else ahead)
        if step % a.eval_every == 0 or step == a.steps:
            print(json.dumps({"tag": a.tag, "step": step, "val_loss": round(evaluate(g), 5),
                              "wall_s": round(time.time() - t0, 1)}), flush=True)
    return start, g


if __name__ == "__main__":
    main(sys.argv[1:])
