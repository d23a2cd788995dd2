#!/usr/bin/python3
"""train.py's language model with DiLoCo that keeps training when replicas fail: commsgd_torch.FaultTolerantDiLoCo
(commsgd's engine, rounds over the replicas a torchft Manager finds alive) or, for comparison, torchft's own
DiLoCo with its own fault tolerance. One process per replica (RANK of WORLD_SIZE, as `netcluster run` or
tools/netcluster/faults.py start them); no default process group, so a replica can die and restart alone.

    --arm ft-diloco       commsgd_torch.FaultTolerantDiLoCo over AdamW (--sync-every, --outer-lr,
                          --outer-momentum, --compression; streamed: --fragments, --delay, --alpha,
                          --keep-delay-steps)
    --arm torchft-diloco  torchft.local_sgd.DiLoCo over AdamW, float32 pseudo-gradients (streamed: --fragments,
                          --delay, --alpha, the fragments train.py's torchft arm makes)
    --arm ckpt-diloco     the baseline, checkpoint-restart: commsgd_torch.DiLoCo over one gloo group, every rank
                          saving a checkpoint after each round (--ckpt-dir); a failure stops every rank's group,
                          and all start a new one (a generation counter in rank 0's store) once every rank is
                          back, resuming from the last checkpoint that all of them hold

Rank 0 starts torchft's lighthouse (so the failure schedule kills other ranks). A replica that restarts
(COMMSGD_RESTARTS > 0) or joins late is healed by a live peer at the next round boundary and goes on from the
others' step: its batches and learning rate follow the step it resumed at.

Log (--log PREFIX: PREFIX.rank<R>.jsonl, one per replica, every incarnation appending): a line per round with
its unix time, inner step, the replicas in it, whether this replica committed it, the hash of the common model
after it (commsgd's arm), the inner steps this incarnation computed (`taken`) and those of them that reached
the common model (`delivered`); rank 0 adds the validation loss of the common model every --eval-every steps
(evaluated alone, on every window). A round that fails is counted once either way: commsgd's arm keeps its
steps in the local model and the next exchange carries them (delivered when that one commits); torchft's
puts the model back to the common one, so they are dropped and taken again from the last committed step.

    python3 tools/netcluster/faults.py --name c --log ev.jsonl --kill 3 --every 60 --restart-after 10 \\
        --cable 2@95+30 -- python3 examples/diloco_lm/train_ft.py --arm ft-diloco --log run --steps 3000
"""
import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402

LIGHTHOUSE_PORT = 29510


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", choices=("ft-diloco", "torchft-diloco", "ckpt-diloco"), required=True)
    p.add_argument("--ckpt-dir", default=None, help="ckpt-diloco: where each rank saves its checkpoints")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-windows", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default=None, help="prefix of the per-replica JSON-lines logs")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--lr-warmup", type=int, default=50)
    p.add_argument("--sync-every", type=int, default=30)
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--compression", default="e3m0")
    p.add_argument("--fragments", type=int, default=1,
                   help="ft-diloco, torchft-diloco: streamed, P fragments (the transformer's units in P "
                        "contiguous groups, the same on both arms)")
    p.add_argument("--delay", type=int, default=0,
                   help="ft-diloco, torchft-diloco: tau, below the gap between two fragments' starts "
                        "(sync_every / P)")
    p.add_argument("--alpha", type=float, default=0.0,
                   help="ft-diloco, torchft-diloco: the local weight in the merge")
    p.add_argument("--keep-delay-steps", type=int, default=0, choices=(0, 1),
                   help="ft-diloco: 1 merges by keeping the --delay steps whole (--alpha 0)")
    p.add_argument("--min-replicas", type=int, default=2)
    p.add_argument("--deadline", type=float, default=5.0,
                   help="seconds a round's collective waits for a peer that went silent (gloo's timeout)")
    p.add_argument("--join-timeout", type=float, default=5.0,
                   help="seconds the lighthouse waits for a live replica late to a round before forming it "
                        "without it; more than a round lasts (docs/diloco.md, Deadlines)")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def lighthouse(min_replicas, join_timeout):
    exe = shutil.which("torchft_lighthouse") or os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    # Heartbeats every 100 ms (the Manager's default): a replica silent for 2 s leaves the quorum; a quorum
    # waits at most join_timeout for a live replica that has not asked for it yet.
    return subprocess.Popen([exe, "--min_replicas", str(min_replicas), "--quorum_tick_ms", "50",
                             "--join_timeout_ms", str(int(join_timeout * 1000)),
                             "--heartbeat_timeout_ms", "2000", "--bind", f"[::]:{LIGHTHOUSE_PORT}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=train._die_with_parent())  # whichever way this rank ends


def make_manager(args, rank, pg, state=None, load=None, init_sync=True):
    from torchft import Manager
    from torchft.checkpointing.http_transport import HTTPTransport
    own = os.environ.get("NETCLUSTER_ADDR", "127.0.0.1")
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    timeout = datetime.timedelta(seconds=60)
    store = torch.distributed.TCPStore(own, 29600 + rank, is_master=True, wait_for_workers=False, timeout=timeout)

    class Transport(HTTPTransport):  # the recovery checkpoint's address: this rank's, not the machine's name
        def address(self):
            return super().address().replace(socket.gethostname(), own, 1)
    manager = Manager(pg=pg, min_replica_size=args.min_replicas, load_state_dict=load, state_dict=state,
                      use_async_quorum=False, replica_id=f"rank{rank}", store_addr=own, store_port=29600 + rank,
                      rank=0, world_size=1, lighthouse_addr=f"http://{master}:{LIGHTHOUSE_PORT}",
                      port=29700 + rank, hostname=own, timeout=timeout, quorum_timeout=timeout,
                      connect_timeout=timeout, checkpoint_transport=Transport(timeout=timeout, num_chunks=0),
                      init_sync=init_sync)
    return manager, store


class TorchftSteps:
    """The torchft arm's count of steps, per fragment (one when not streamed). torchft's DiLoCo syncs one
    fragment each period of sync_every / P steps (the fragment is the Manager's step mod P): the fragment's
    pseudo-gradient leaves at the step its quorum forms (`delay` steps before the period ends; at its end when
    delay is 0) and is applied at the period's end, where the fragment's parameters are set from the common
    model whether the sync committed or not. So a fragment's steps reach the common model only in a sync that
    committed, and only those taken up to the quorum: the `delay` steps after it are merged away (torchft's
    alpha is 0 here). After a failed sync the Manager's step stays and the period's steps are taken again
    (their batches and learning rates too). A quorum that heals this replica (the Manager's step jumps) loads
    a peer's model: the steps of every fragment are replaced, not delivered."""

    def __init__(self, sync_every, fragments=1, delay=0):
        self.period = sync_every // fragments
        self.fragments = fragments
        self.delay = delay
        self.local = 0  # torchft's count of steps in the period (its DiLoCo's _local_step)
        self.since = [0] * fragments  # per fragment: steps since its parameters were set from the common model
        self.leaving = [0] * fragments  # per fragment: the steps its pseudo-gradient in flight carries
        self.delivered_by = [0] * fragments
        self.syncing = None  # the fragment whose pseudo-gradient is in flight (from a healed model: none of ours)
        self.failed = 0  # syncs this replica ran that did not commit

    @property
    def delivered(self):
        """Steps that reached the common model: the fewest any fragment delivered."""
        return min(self.delivered_by)

    def done(self, committed):
        """The step this replica's model is at: the committed syncs' periods and the steps taken since."""
        return committed * self.period + self.local

    def after_step(self, before, after, local):
        """One inner step taken; `before` and `after` are the Manager's step around it, `local` torchft's
        count of steps in the period after it (0: the step ended with a sync)."""
        self.local = local
        self.since = [n + 1 for n in self.since]
        synced = local == 0
        starts = local == self.period - self.delay if self.delay > 0 else synced
        if starts:
            healed = after - before > (1 if self.delay == 0 and synced else 0)
            if healed:
                self.since = [0] * self.fragments
            self.syncing = (after if self.delay > 0 or healed else before) % self.fragments
            self.leaving[self.syncing] = self.since[self.syncing]
        if synced and self.syncing is not None:
            if after == before + 1:
                self.delivered_by[self.syncing] += self.leaving[self.syncing]
            elif after == before:
                self.failed += 1
            self.since[self.syncing] = 0
            self.syncing = None


@torch.no_grad()
def evaluate(model, params, windows):
    for p, g in zip(model.parameters(), params):
        p.copy_(g)
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], 32):
        w = windows[i:i + 32]
        total += F.cross_entropy(model(w[:, :-1]).reshape(-1, 256), w[:, 1:].reshape(-1), reduction="sum").item()
        count += w[:, 1:].numel()
    return total / count


def checkpoint_restart(args, rank, world, restarts, model, inner, lr_at, write, evaluate_at, train_bytes):
    """Today's behaviour: one gloo group for everyone; any failure ends it on every rank (gloo's error, or
    --deadline when a peer went silent), and the job goes on only when every rank is back, from the last
    checkpoint all of them hold. Rank 0 keeps the store of the generations (it is not the one killed)."""
    import commsgd_torch
    dist = torch.distributed
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    store = dist.TCPStore(master, 29591, world_size=None, is_master=rank == 0 and restarts == 0,
                          wait_for_workers=False, timeout=datetime.timedelta(seconds=300))
    if rank == 0 and restarts == 0:
        store.set("gen", "0")
    saved = {}  # step -> path of this rank's checkpoint at that step
    path = lambda step: os.path.join(args.ckpt_dir, f"rank{rank}.step{step}.pt")  # noqa: E731
    for name in os.listdir(args.ckpt_dir):  # a restarted rank finds what its former self saved
        if name.startswith(f"rank{rank}.step") and name.endswith(".pt"):
            saved[int(name[len(f"rank{rank}.step"):-3])] = os.path.join(args.ckpt_dir, name)
    initial = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "inner": inner.state_dict()}
    steps = 0
    def arrive():
        """The generation every rank has reached (a barrier on rank 0's store, so that the group's own
        rendezvous never waits for a rank that is not back yet); it moves on to a newer one opened meanwhile.
        Each rank sets its own key, so a rank killed and restarted within one generation counts once; one that
        dies after arriving fails the group's rendezvous (--deadline), and everyone moves to the next."""
        while True:
            try:
                gen = int(store.get("gen"))
                prefix = dist.PrefixStore(f"gen{gen}", store)
                prefix.set(f"here{rank}", str(restarts))
                while not prefix.check([f"here{r}" for r in range(world)]):
                    if int(store.get("gen")) != gen:
                        break
                    time.sleep(0.05)
                else:
                    return gen, prefix
            except RuntimeError:  # rank 0's store out of reach (this rank's link is down): try again
                time.sleep(0.5)

    while steps < args.steps:
        gen, prefix = arrive()
        opt = None
        try:
            dist.init_process_group("gloo", store=prefix, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=args.deadline))
            opt = commsgd_torch.DiLoCo(model, inner, sync_every=args.sync_every, outer_lr=args.outer_lr,
                                       outer_momentum=args.outer_momentum, compression=args.compression)
            prefix.set(f"ckpt{rank}", str(max(saved, default=0)))
            # Every rank's last checkpoint, within the deadline: a rank that died since the rendezvous fails
            # this generation here rather than holding the others for the store's own timeout.
            prefix.wait([f"ckpt{r}" for r in range(world)], datetime.timedelta(seconds=args.deadline))
            common = min(int(prefix.get(f"ckpt{r}")) for r in range(world))
            state = torch.load(saved[common]) if common > 0 else {"model": initial["model"],
                                                                   "inner": initial["inner"], "diloco": None}
            model.load_state_dict(state["model"])
            inner.load_state_dict(state["inner"])
            if state["diloco"] is not None:
                opt.load_state_dict(state["diloco"])
            write({"event": "resume", "step": opt.inner_steps, "generation": gen})
            while opt.inner_steps < args.steps:
                step = opt.inner_steps + 1
                for g in inner.param_groups:
                    g["lr"] = args.lr * lr_at(step)
                x, y = train.batch_rows(train_bytes, step - 1, args.seed, args.batch, args.context, rank, world)
                opt.zero_grad()
                train.lm_loss(model, x, y).backward()
                opt.step()
                if opt.inner_steps % args.sync_every == 0:
                    # Written whole or not at all: a rank killed while saving leaves no checkpoint that fails
                    # to load (and so no generation that fails on it, over and over).
                    torch.save({"model": model.state_dict(), "inner": inner.state_dict(),
                                "diloco": opt.state_dict()}, path(opt.inner_steps) + ".part")
                    os.replace(path(opt.inner_steps) + ".part", path(opt.inner_steps))
                    saved[opt.inner_steps] = path(opt.inner_steps)
                    write({"event": "round", "step": opt.inner_steps, "committed": opt.stats()["outer_steps"],
                           "replicas": world, "delivered": 0, "generation": gen})
                evaluate_at(opt.inner_steps, opt.global_parameters)
            steps = opt.inner_steps
            write({"event": "end", "step": steps, "delivered": steps, "generation": gen})
        except (RuntimeError, commsgd_torch.CommError) as e:
            write({"event": "failure", "step": opt.inner_steps if opt else None, "generation": gen,
                   "error": str(e)[:200]})
            try:
                store.compare_set("gen", str(gen), str(gen + 1))  # the first rank to see it opens the next
            except RuntimeError:  # out of reach: the others open it
                pass
        finally:
            if opt is not None:
                try:
                    opt.close()
                except Exception:  # its group is gone
                    pass
            if dist.is_initialized():
                dist.destroy_process_group()
        while steps < args.steps:
            try:
                if int(store.get("gen")) != gen:
                    break
            except RuntimeError:
                pass
            time.sleep(0.1)


def main(argv=None):
    import commsgd_torch
    args = parse(argv)
    torch.set_num_threads(args.threads)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    restarts = int(os.environ.get("COMMSGD_RESTARTS", 0))
    house = lighthouse(args.min_replicas, args.join_timeout) if rank == 0 and restarts == 0 and args.arm != "ckpt-diloco" else None
    train_bytes, val = train.stdlib_split()
    windows = train.val_windows(val, args.eval_windows, args.context)
    torch.manual_seed(args.seed)
    model = train.ByteLM(args.layers, args.width, args.heads, args.context)
    eval_model = train.ByteLM(args.layers, args.width, args.heads, args.context)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))

    def lr_at(step):  # train.py's schedule, by the step counted from 1
        if step <= args.lr_warmup:
            return step / args.lr_warmup
        frac = (step - 1 - args.lr_warmup) / max(1, args.steps - args.lr_warmup)
        return 0.1 + 0.45 * (1 + __import__("math").cos(__import__("math").pi * min(1.0, frac)))

    log = open(f"{args.log}.rank{rank}.jsonl", "a") if args.log else None

    def write(rec):
        rec.update(rank=rank, incarnation=restarts, arm=args.arm, t=round(time.time(), 3))
        if log:
            log.write(json.dumps(rec) + "\n")
            log.flush()

    start = time.time()
    if args.arm == "ckpt-diloco":
        if not args.ckpt_dir:
            raise SystemExit("train_ft.py: --arm ckpt-diloco needs --ckpt-dir")
        os.makedirs(args.ckpt_dir, exist_ok=True)

        def evaluate_at(step, params):
            if rank == 0 and (step % args.eval_every == 0 or step >= args.steps):
                write({"event": "eval", "step": step, "wall_s": round(time.time() - start, 3),
                       "val_loss": round(evaluate(eval_model, params(), windows), 5)})
        write({"event": "start", "step": 0})
        checkpoint_restart(args, rank, world, restarts, model, inner, lr_at, write, evaluate_at, train_bytes)
        if log:
            log.close()
        if house is not None:
            house.terminate()
        return

    # The first start: every replica's Manager up (heartbeating) before any asks for a quorum, so that the
    # lighthouse's first quorum holds them all. A rank killed before it came counts when its restart comes
    # (each incarnation counts once), and after 120 s the others go on without it; a restart after the start
    # passes at once. Rank 0 holds the count (it is not the one killed). A restart that finds no count within
    # 10 s (rank 0 has finished, its store gone) goes on: nobody is waiting for it.
    def open_start_line():
        if rank == 0 and restarts:
            return None
        try:
            return torch.distributed.TCPStore(
                os.environ.get("MASTER_ADDR", "127.0.0.1"), 29590, world_size=None, is_master=rank == 0,
                wait_for_workers=False, timeout=datetime.timedelta(seconds=10 if restarts else 120))
        except RuntimeError:  # torch's DistStoreError
            if not restarts:
                raise
            return None

    start_line = open_start_line()

    def everyone_ready():
        if start_line is not None:
            start_line.add("managers", 1)
            until = time.monotonic() + 120
            while int(start_line.add("managers", 0)) < world and time.monotonic() < until:
                time.sleep(0.05)
            time.sleep(0.5)  # a heartbeat or five, so that the lighthouse knows every replica

    if args.arm == "ft-diloco":
        pg = commsgd_torch.ReplicaGroup(timeout=datetime.timedelta(seconds=args.deadline))
        manager, store = make_manager(args, rank, pg)
        everyone_ready()
        fragments = train.unit_fragments(model, args.fragments) if args.fragments > 1 else 1
        opt = commsgd_torch.FaultTolerantDiLoCo(model, inner, manager=manager, sync_every=args.sync_every,
                                                outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
                                                compression=args.compression, fragments=fragments,
                                                delay=args.delay, alpha=args.alpha,
                                                keep_delay_steps=bool(args.keep_delay_steps))
        steps_done = lambda: opt.inner_steps  # noqa: E731
        global_params = train.diloco_globals(opt, list(model.parameters()))

        def round_record():
            s = opt.stats()
            return {"committed": s["rounds_committed"], "failed": s["rounds_failed"], "heals": s["heals"],
                    "heals_at_start": s["heals_at_start"], "replicas": s["replicas"],
                    "delivered": s["steps_delivered"], "hash": opt.global_hash()}
    else:
        from torchft import ProcessGroupGloo
        from torchft.local_sgd import DiLoCo as TorchftDiLoCo
        pg = ProcessGroupGloo(timeout=datetime.timedelta(seconds=args.deadline))
        state = lambda: {"model": model.state_dict(), "inner": inner.state_dict()}  # noqa: E731
        load = lambda sd: (model.load_state_dict(sd["model"]), inner.load_state_dict(sd["inner"]))  # noqa: E731
        # Every replica builds the same model (one seed): torchft's own init_sync would load rank 0's model
        # and AdamW state into the others at their first sync, after sync_every steps.
        manager, store = make_manager(args, rank, pg, state, load, init_sync=False)
        everyone_ready()
        # Streamed as train.py's torchft arm is (one outer optimizer a fragment, as torchft's examples make them).
        frags = train.unit_fragments(model, args.fragments)
        outer = [torch.optim.SGD(f.parameters(), lr=args.outer_lr, momentum=args.outer_momentum,
                                 nesterov=args.outer_momentum > 0) for f in frags]
        diloco = TorchftDiLoCo(manager, frags, inner, outer, sync_every=args.sync_every,
                               fragment_sync_delay=args.delay, fragment_update_alpha=args.alpha)
        diloco.__enter__()
        opt = inner
        counts = TorchftSteps(args.sync_every, args.fragments, args.delay)
        steps_done = lambda: counts.done(manager.current_step())  # noqa: E731
        global_params = train.torchft_globals(frags, diloco, list(model.parameters()))

        def round_record():
            return {"committed": manager.current_step(), "failed": counts.failed,
                    "replicas": manager.num_participants(), "delivered": counts.delivered}
    start = time.time()
    write({"event": "start", "step": steps_done()})
    rounds_seen = None
    taken = 0  # inner steps this incarnation computed
    while steps_done() < args.steps:
        step = steps_done() + 1
        for g in inner.param_groups:
            g["lr"] = args.lr * lr_at(step)
        x, y = train.batch_rows(train_bytes, step - 1, args.seed, args.batch, args.context, rank, world)
        inner.zero_grad()
        loss = train.lm_loss(model, x, y)
        loss.backward()
        if args.arm == "ft-diloco":
            opt.step()
        else:
            before = manager.current_step()
            opt.step()  # torchft's DiLoCo hooks the inner step; every sync_every it runs the round
            counts.after_step(before, manager.current_step(), diloco._local_step)
        taken += 1
        rec = round_record()
        rec["taken"] = taken
        key = (rec["committed"], rec.get("failed"), rec.get("heals"))
        if key != rounds_seen:
            rounds_seen = key
            write({"event": "round", "step": steps_done(), "loss": round(loss.item(), 4), **rec})
        if rank == 0 and (steps_done() % args.eval_every == 0 or steps_done() >= args.steps):
            write({"event": "eval", "step": steps_done(), "wall_s": round(time.time() - start, 3),
                   "val_loss": round(evaluate(eval_model, global_params(), windows), 5)})
    write({"event": "end", "step": steps_done(), "taken": taken, **round_record()})
    if log:
        log.close()
    manager.shutdown(wait=False)
    del store
    if house is not None:
        house.terminate()


if __name__ == "__main__":
    main(sys.argv[1:])
