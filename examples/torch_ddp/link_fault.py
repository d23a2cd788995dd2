"""A measured link fault for DDP's communication hooks on an emulated cluster (tools/netcluster): one rank's
switch port is taken down mid-run. Every rank must then fail with a clear error within its gloo timeout (no
hang), and once the port is back the run resumes from its last checkpoint and must end with exactly the
parameters (bit for bit) of a run that was never interrupted.

    sudo PY examples/torch_ddp/link_fault.py drive --out DIR [--hooks topk,fp16,ddp] [--steps 300]
        [--timeout-s 10] [--ranks 4] [--rate 100mbit] [--fault-rank 2] [--fault-after-step 100]

    PY examples/torch_ddp/link_fault.py rank --hook topk --checkpoint-dir D --out rank_{rank}.json [--resume]

PY is an interpreter with torch and commsgd_torch; `drive` starts the ranks with the same one
(sys.executable). `rank` is what `netcluster run` starts once per rank (RANK, WORLD_SIZE, MASTER_ADDR, ... in
its environment).

`drive`, per hook, on a fresh cluster (`netcluster up`, and `down` however the hook's runs end):
  1. reference: --steps uninterrupted steps; its final parameters' SHA-256 is the target;
  2. faulted: the same run from scratch; once every rank has checkpointed step --fault-after-step (or
     --fault-after-s into the run) and --fault-delay-s more, `netcluster port K down`; every rank must exit
     within --timeout-s + --slack-s of that (a run still alive --timeout-s * 3 + 30 s after it is a hang: its
     ranks' stacks are dumped, Python's into their logs and gdb's into rank_K.gdb.txt, then it is killed);
     then `port K up`;
  3. resumed: the same command with --resume, on the faulted run's checkpoints; its hash must equal 1's.
It writes DIR/report.md and DIR/results.json, and DIR/HOOK/{reference,faulted,resumed}/ holds each rank's log
(rank_K.log), its own report (rank_K.json) and its exit status with the wall time it exited (rank_K.exit).

The hooks: `topk` is commsgd's TopKState + topk_hook at density 0.01 with the hook's momentum 0.9 (the
optimizer then runs without momentum, docs/pytorch.md), `fp16` commsgd's CompressorState(kind="fp16") +
compressor_hook, `ddp` DDP's own all-reduce; the latter two with momentum 0.9 in the optimizer. The hooks get
a gloo group of their own whose timeout is --timeout-s (a state's default group would wait torch's 30 min).
"""
import argparse
import datetime
import faulthandler
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.abspath(__file__)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "netcluster"))
from launch import NETCLUSTER, netcluster  # noqa: E402
HOOKS = ("topk", "fp16", "ddp")
EXIT_FAILED = 3
SIZES = (784, 512, 256, 10)  # 535k parameters: 2.1 MB of float32 gradients a step, 0.27 s of ring all-reduce
BATCH = 64                   # on 4 ranks at 100 Mbit/s; fp16 half that, top-k at 1 % about 10 ms
LR, MOMENTUM, DENSITY = 0.05, 0.9, 0.01
CHECKPOINT_NAME = re.compile(r"^rank(\d+)-step(\d+)\.pt$")


# ---- one rank (run by netcluster inside its namespace) -----------------------------------------------------

def checkpoint_path(folder, rank, step):
    return os.path.join(folder, f"rank{rank}-step{step:06d}.pt")


def checkpoints(folder):
    """{rank: sorted steps} of the complete checkpoint files in `folder` (a .tmp is one being written)."""
    found = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        m = CHECKPOINT_NAME.match(name)
        if m:
            found.setdefault(int(m.group(1)), []).append(int(m.group(2)))
    return {rank: sorted(steps) for rank, steps in found.items()}


def write_atomically(path, write):
    """A reader (a resuming rank, `drive` polling) sees the old file or the whole new one, never a part."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path, record):
    write_atomically(path, lambda f: f.write((json.dumps(record, indent=1) + "\n").encode()))


def batch_for(torch, teacher, seed, rank, step):
    """The batch of (seed, rank, step) alone, so a resumed run sees exactly what the uninterrupted one saw."""
    g = torch.Generator().manual_seed((seed << 40) + (rank << 24) + step)
    x = torch.randn(BATCH, SIZES[0], generator=g)
    return x, (x @ teacher).argmax(dim=1)  # labels of a fixed random linear teacher: a task that can be learnt


def parameters_sha256(torch, model):
    """SHA-256 of the parameters' float32 bytes in the model's order: equal only where every bit is."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def make_hook_state(args, model, group):
    import commsgd_torch
    if args.hook == "topk":
        return (commsgd_torch.TopKState(group, model=model, density=DENSITY, momentum=MOMENTUM),
                commsgd_torch.topk_hook)
    if args.hook == "fp16":
        return commsgd_torch.CompressorState(group, kind="fp16"), commsgd_torch.compressor_hook
    return None, None


def agreed_checkpoint_step(args, rank):
    """The newest step every rank has a checkpoint of (0: none). A rank can be at most one checkpoint ahead of
    another (writing step s + K needs every rank through step s + K's collectives, so past writing s), and
    each keeps its last two, so the minimum of the ranks' newest steps exists on every rank."""
    import torch
    import torch.distributed as dist
    newest = torch.tensor([(checkpoints(args.checkpoint_dir).get(rank) or [0])[-1]], dtype=torch.int64)
    dist.all_reduce(newest, op=dist.ReduceOp.MIN)
    step = int(newest.item())
    if step > 0 and not os.path.exists(checkpoint_path(args.checkpoint_dir, rank, step)):
        raise RuntimeError(f"the ranks agreed on step {step}, but {checkpoint_path(args.checkpoint_dir, rank, step)} "
                           "is missing")
    return step


def load_checkpoint(torch, path):
    if int(torch.__version__.split(".")[0]) >= 2:
        return torch.load(path, map_location="cpu", weights_only=True)
    # torch 1.x's weights-only unpickler cannot read a float (the optimizer's lr); these files are this
    # experiment's own.
    return torch.load(path, map_location="cpu")


def train(args, rank, world, report, progress):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)  # four ranks share this machine's cores; more threads would time compute, not links
    timeout = datetime.timedelta(seconds=args.timeout_s)
    progress["phase"] = "init_process_group"
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world, timeout=timeout)

    start = 0
    if args.resume:
        progress["phase"] = "agreeing on the checkpoint"
        start = agreed_checkpoint_step(args, rank)
    report["resumed_from"] = start
    progress["steps_done"] = start

    progress["phase"] = "setup"
    torch.manual_seed(args.seed)  # the same start on every rank (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(SIZES[0], SIZES[1]), torch.nn.ReLU(),
                                torch.nn.Linear(SIZES[1], SIZES[2]), torch.nn.ReLU(),
                                torch.nn.Linear(SIZES[2], SIZES[3]))
    teacher = torch.randn(SIZES[0], SIZES[3], generator=torch.Generator().manual_seed(args.seed))
    ckpt = load_checkpoint(torch, checkpoint_path(args.checkpoint_dir, rank, start)) if start else None
    if ckpt is not None:
        if (ckpt["hook"], ckpt["world_size"], ckpt["seed"]) != (args.hook, world, args.seed):
            raise RuntimeError(f"checkpoint of step {start} is of hook {ckpt['hook']}, {ckpt['world_size']} ranks, "
                               f"seed {ckpt['seed']}; this run is {args.hook}, {world}, {args.seed}")
        model.load_state_dict(ckpt["model"])
    ddp = DistributedDataParallel(model)
    # The top-k hook keeps the momentum itself, so its optimizer runs without (docs/pytorch.md, Momentum).
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.0 if args.hook == "topk" else MOMENTUM)
    group = dist.new_group(backend="gloo", timeout=timeout) if args.hook != "ddp" else None
    state, hook = make_hook_state(args, model, group)
    if ckpt is not None:
        opt.load_state_dict(ckpt["opt"])
        if state is not None:
            state.load_state_dict(ckpt["hook_state"])
        if not args.skip_bucket_warmup:
            # DDP's first iteration runs one bucket in parameter order, and from the second on buckets in the
            # order the gradients became ready. The uninterrupted run is past that rebuild; a fresh DDP is
            # not, so its first resumed step would reduce another layout (other sums in gloo's ring, another
            # bucket for the hook's state). One backward of zeros before the hook is registered moves the
            # rebuild here: nothing is stepped, and the hook and its state see the layout they saw before.
            x, _ = batch_for(torch, teacher, args.seed, rank, start)
            ddp(x).sum().mul(0.0).backward()
            opt.zero_grad(set_to_none=True)
    if hook is not None:
        ddp.register_comm_hook(state, hook)

    watchdog_s = 2 * args.timeout_s + 15
    loss = None
    train_start = progress["last_step_end"] = time.monotonic()
    for step in range(start, args.steps):
        # A step that runs far past the gloo timeout would be a hang: leave every thread's stack in the log.
        faulthandler.dump_traceback_later(watchdog_s, exit=False)
        progress["phase"] = f"step {step}"
        x, y = batch_for(torch, teacher, args.seed, rank, step)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        progress["steps_done"] = step + 1
        progress["last_step_end"] = time.monotonic()
        if (step + 1) % args.checkpoint_every == 0:
            progress["phase"] = f"checkpoint {step + 1}"
            save_checkpoint(args, rank, world, step + 1, model, opt, state)
    faulthandler.cancel_dump_traceback_later()
    report.update(steps=args.steps, steps_run=args.steps - start, train_s=round(time.monotonic() - train_start, 3),
                  final_loss=None if loss is None else loss.item(), sha256=parameters_sha256(torch, model))
    progress["phase"] = "destroy_process_group"
    dist.destroy_process_group()


def save_checkpoint(args, rank, world, step, model, opt, state):
    import torch
    payload = {"step": step, "hook": args.hook, "world_size": world, "seed": args.seed,
               "model": model.state_dict(), "opt": opt.state_dict(),
               "hook_state": None if state is None else state.state_dict()}
    write_atomically(checkpoint_path(args.checkpoint_dir, rank, step), lambda f: torch.save(payload, f))
    for old in (checkpoints(args.checkpoint_dir).get(rank) or [])[:-2]:
        os.remove(checkpoint_path(args.checkpoint_dir, rank, old))


def rank_main(args):
    started, started_wall = time.monotonic(), time.time()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = args.out.format(rank=rank)
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    # `drive` sends SIGUSR1 to a rank it finds hung, and netcluster SIGTERM to one it stops: either leaves
    # every thread's Python stack in the rank's log first.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    report = {"rank": rank, "world_size": world, "hook": args.hook, "pid": os.getpid(), "timeout_s": args.timeout_s,
              "started_wall": started_wall}
    progress = {"phase": "import", "steps_done": 0, "last_step_end": started}
    try:
        train(args, rank, world, report, progress)
    except BaseException as e:  # noqa: B036 -- every way a step can end, so each is reported
        now, now_wall = time.monotonic(), time.time()
        message = str(e).strip()
        first_line = message.splitlines()[0] if message else ""
        report.update(ok=False, phase=progress["phase"], steps_done=progress["steps_done"],
                      error_type=f"{type(e).__module__}.{type(e).__qualname__}", error=message,
                      error_first_line=first_line,
                      seconds_since_last_step=round(now - progress["last_step_end"], 3),
                      seconds_since_start=round(now - started, 3), error_wall=now_wall)
        traceback.print_exc()
        write_json(out, report)
        print(f"rank {rank}: FAILED in {progress['phase']} after {progress['steps_done']} steps, "
              f"{now - progress['last_step_end']:.2f} s after the last one: {report['error_type']}: {first_line}",
              flush=True)
        # A normal exit would first wind down the gloo groups and the hook state's exchange thread, whose
        # peers are gone (2 to 5 s more here, measured); the rank has reported, so it ends now, as it failed.
        sys.stderr.flush()
        os._exit(EXIT_FAILED)
    report.update(ok=True, seconds_since_start=round(time.monotonic() - started, 3))
    write_json(out, report)
    print(f"rank {rank}: {report['steps_run']} steps ({report['resumed_from']} to {args.steps}) in "
          f"{report['train_s']:.1f} s, final loss {cell(report['final_loss'], 4)}, "
          f"parameters sha256 {report['sha256']}", flush=True)
    return 0


# ---- the experiment (root: it builds the clusters) ----------------------------------------------------------

def rank_command(args, hook, phase_dir, checkpoint_dir, resume):
    command = [sys.executable, SCRIPT, "rank", "--hook", hook, "--steps", args.steps, "--timeout-s", args.timeout_s,
               "--checkpoint-dir", checkpoint_dir, "--checkpoint-every", args.checkpoint_every, "--seed", args.seed,
               "--out", os.path.join(phase_dir, "rank_{rank}.json")]
    if resume:
        command.append("--resume")
    if args.skip_bucket_warmup:
        command.append("--skip-bucket-warmup")
    # netcluster run gives only the first failure's status; each rank's own, and when it exited, come from
    # this shell around it.
    wrapper = 'dir=$1; shift; "$@"; rc=$?; echo "$rc $(date +%s.%N)" > "$dir/rank_$RANK.exit"; exit $rc'
    return ["sh", "-c", wrapper, "sh", phase_dir, *map(str, command)]


def start_run(args, cluster, hook, phase_dir, checkpoint_dir, resume, master_port):
    os.makedirs(phase_dir, exist_ok=True)
    log = open(os.path.join(phase_dir, "netcluster.log"), "w")
    # A session of its own, so a hung run can be stopped as a whole without touching anything else.
    proc = subprocess.Popen([NETCLUSTER, "run", "--name", cluster, "--logs", phase_dir, "--keep-going",
                             "--master-port", str(master_port), "--",
                             *rank_command(args, hook, phase_dir, checkpoint_dir, resume)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return proc


def rank_processes(cluster, rank):
    """The Python processes of a rank still running in its namespace."""
    listed = subprocess.run(["ip", "netns", "pids", f"netcluster-{cluster}-r{rank}"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True).stdout.split()
    found = []
    for pid in listed:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if SCRIPT.encode() in argv and b"rank" in argv and not argv[0].endswith(b"sh"):
            found.append(int(pid))
    return found


def dump_hung(args, cluster, phase_dir):
    """Stacks of every rank process still alive: Python's (SIGUSR1, into the rank's log) and, where gdb is
    installed, the native threads' (rank_K.gdb.txt), which say which collective waits. Returns the ranks."""
    hung = {k: rank_processes(cluster, k) for k in range(args.ranks)}
    hung = {k: pids for k, pids in hung.items() if pids}
    for pids in hung.values():
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    time.sleep(1)  # the faulthandler dumps reach the logs before gdb stops the processes
    gdb = shutil.which("gdb")
    if gdb:
        # In parallel and bounded: gdb reads libtorch's symbols for tens of seconds a process here.
        running = []
        for k, pids in hung.items():
            for pid in pids:
                out = open(os.path.join(phase_dir, f"rank_{k}.gdb.txt"), "a")
                running.append((subprocess.Popen([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                                                 stdout=out, stderr=subprocess.STDOUT), out))
        deadline = time.time() + args.gdb_limit_s
        for proc, out in running:
            try:
                proc.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                out.write(f"\n(gdb stopped after {args.gdb_limit_s} s)\n")
            out.close()
    return sorted(hung)


def stop_run(proc):
    """netcluster run's own trap stops its ranks (SIGTERM, SIGKILL 5 s later); SIGKILL to the lot after 15 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_run(args, cluster, proc, phase_dir, limit_s):
    """netcluster run's exit status, or None (a hang) when it outlives limit_s: stacks dumped, run stopped."""
    try:
        return proc.wait(timeout=max(0.0, limit_s)), []
    except subprocess.TimeoutExpired:
        hung = dump_hung(args, cluster, phase_dir)
        stop_run(proc)
        return None, hung


def rank_results(args, phase_dir, fault_wall=None):
    ranks = []
    for k in range(args.ranks):
        r = {"rank": k}
        path = os.path.join(phase_dir, f"rank_{k}.json")
        if os.path.exists(path):
            with open(path) as f:
                r.update(json.load(f))
        exit_path = os.path.join(phase_dir, f"rank_{k}.exit")
        if os.path.exists(exit_path):
            with open(exit_path) as f:
                rc, wall = f.read().split()
            r.update(exit_code=int(rc), exit_wall=float(wall))
        if fault_wall is not None:
            if "exit_wall" in r:
                r["exit_after_fault_s"] = round(r["exit_wall"] - fault_wall, 3)
            if "error_wall" in r:
                r["error_after_fault_s"] = round(r["error_wall"] - fault_wall, 3)
        ranks.append(r)
    return ranks


def clean_run(args, cluster, hook, phase_dir, checkpoint_dir, resume, master_port):
    """A run that should end by itself: its ranks, the hash they agree on (None where they do not)."""
    start = time.time()
    load = os.getloadavg()[0]
    proc = start_run(args, cluster, hook, phase_dir, checkpoint_dir, resume, master_port)
    try:
        status, hung = wait_run(args, cluster, proc, phase_dir, args.run_limit_s)
    finally:
        stop_run(proc)
    ranks = rank_results(args, phase_dir)
    hashes = {r.get("sha256") for r in ranks}
    return {"status": status, "hung_ranks": hung, "wall_s": round(time.time() - start, 2), "load_before": load,
            "ranks": ranks, "sha256": hashes.pop() if len(hashes) == 1 else None,
            "ok": status == 0 and all(r.get("ok") for r in ranks) and len({r.get("sha256") for r in ranks}) == 1,
            "resumed_from": sorted({r.get("resumed_from") for r in ranks}, key=str)}


def faulted_run(args, cluster, hook, phase_dir, checkpoint_dir, master_port):
    start = time.time()
    proc = start_run(args, cluster, hook, phase_dir, checkpoint_dir, False, master_port)
    fault_wall = None
    try:
        # The fault comes once every rank has checkpointed --fault-after-step (or --fault-after-s into the
        # run), and --fault-delay-s later so it lands between two checkpoints: the steps after the last one
        # are lost and run again.
        while proc.poll() is None and time.time() - start < args.fault_after_s:
            steps = checkpoints(checkpoint_dir)
            if len(steps) == args.ranks and min(s[-1] for s in steps.values()) >= args.fault_after_step:
                break
            time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (status {proc.returncode}) before the fault; see {phase_dir}")
        time.sleep(args.fault_delay_s)
        before = time.time()
        netcluster("port", "--name", cluster, args.fault_rank, "down")
        fault_wall = time.time()
        # Every rank is due to fail within its timeout; three timeouts and 30 s more is past any excuse.
        status, hung = wait_run(args, cluster, proc, phase_dir, args.timeout_s * 3 + 30 - (time.time() - fault_wall))
    finally:
        stop_run(proc)
        netcluster("port", "--name", cluster, args.fault_rank, "up", check=False)
    ranks = rank_results(args, phase_dir, fault_wall)
    limit = args.timeout_s + args.slack_s
    for r in ranks:
        r["within_limit"] = r.get("exit_after_fault_s") is not None and r["exit_after_fault_s"] <= limit
    return {"status": status, "hang": status is None, "hung_ranks": hung, "fault_wall": fault_wall,
            "port_down_command_s": round(fault_wall - before, 3), "fault_after_start_s": round(fault_wall - start, 2),
            "limit_s": limit, "ranks": ranks,
            "all_failed_within_limit": status is not None and all(r["within_limit"] and r.get("exit_code", 0) != 0
                                                                   for r in ranks)}


def run_hook(args, index, hook):
    cluster = f"{args.cluster_prefix}{index + 1}"
    hook_dir = os.path.join(args.out, hook)
    shutil.rmtree(hook_dir, ignore_errors=True)
    checkpoint_dir = os.path.join(hook_dir, "checkpoints")
    result = {"hook": hook, "cluster": cluster}
    print(f"== {hook}: cluster {cluster}, {args.ranks} ranks at {args.rate}", flush=True)
    netcluster("up", "-n", args.ranks, "--name", cluster, "--rate", args.rate)
    try:
        ref = clean_run(args, cluster, hook, os.path.join(hook_dir, "reference"),
                        os.path.join(hook_dir, "reference", "checkpoints"), False, args.master_port)
        result["reference"] = ref
        print(f"   reference: {'ok' if ref['ok'] else 'FAILED'} in {ref['wall_s']} s, sha256 {ref['sha256']}",
              flush=True)
        fault = faulted_run(args, cluster, hook, os.path.join(hook_dir, "faulted"), checkpoint_dir,
                            args.master_port + 1)
        result["faulted"] = fault
        print(f"   faulted: port {args.fault_rank} down at {fault['fault_after_start_s']} s; "
              + ("HANG: " + ", ".join(map(str, fault["hung_ranks"])) + " still running" if fault["hang"] else
                 ", ".join(f"rank {r['rank']} exit {r.get('exit_code')} after {r.get('exit_after_fault_s')} s"
                           for r in fault["ranks"])), flush=True)
        resumed = clean_run(args, cluster, hook, os.path.join(hook_dir, "resumed"), checkpoint_dir, True,
                            args.master_port + 2)
        result["resumed"] = resumed
        result["bit_identical"] = bool(ref["ok"] and resumed["ok"] and resumed["sha256"] == ref["sha256"])
        print(f"   resumed from step {resumed['resumed_from']}: {'ok' if resumed['ok'] else 'FAILED'} in "
              f"{resumed['wall_s']} s, sha256 {resumed['sha256']}, "
              f"{'bit-identical' if result['bit_identical'] else 'NOT bit-identical'} to the reference", flush=True)
    except Exception as e:  # one hook's failure is a result; the next hook still runs
        result["error"] = f"{type(e).__name__}: {e}"
        print(f"   {hook} failed: {result['error']}", flush=True)
    finally:
        netcluster("down", "--name", cluster, check=False)
        if not args.keep_checkpoints:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
            shutil.rmtree(os.path.join(hook_dir, "reference", "checkpoints"), ignore_errors=True)
    result["passed"] = bool(result.get("bit_identical") and result.get("faulted", {}).get("all_failed_within_limit"))
    return result


def cell(value, digits=2):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value).replace("|", "\\|")


def report_markdown(args, results):
    lines = [f"# Link fault: rank {args.fault_rank}'s port down mid-run, {args.ranks} ranks at {args.rate}",
             "",
             f"gloo timeout {args.timeout_s} s (init_process_group and the hook's own group), limit for a rank to "
             f"exit: timeout + {args.slack_s} s; a run alive {args.timeout_s * 3 + 30} s after the fault is a hang. "
             f"{args.steps} steps, checkpoints every {args.checkpoint_every}, the fault {args.fault_delay_s} s after "
             f"every rank checkpointed step {args.fault_after_step}. Python {sys.version.split()[0]}, "
             f"torch {torch_version()}.",
             "",
             "| hook | reference s | faulted: all exited within limit | hang | resumed from step | resumed s | "
             "final hash equal | reference sha256 |",
             "|---|---|---|---|---|---|---|---|"]
    for res in results:
        ref, fault, resumed = res.get("reference", {}), res.get("faulted", {}), res.get("resumed", {})
        lines.append(f"| {res['hook']} | {cell(ref.get('wall_s'))} | "
                     f"{'yes' if fault.get('all_failed_within_limit') else 'NO'} | "
                     f"{'YES: ranks ' + ', '.join(map(str, fault['hung_ranks'])) if fault.get('hang') else 'no'} | "
                     f"{cell(','.join(map(str, resumed.get('resumed_from', []))) or None)} | "
                     f"{cell(resumed.get('wall_s'))} | {'yes' if res.get('bit_identical') else 'NO'} | "
                     f"{cell((ref.get('sha256') or '')[:16] or None)} |")
    lines += ["", "Per rank, in the faulted run (seconds from the port going down; `exception` is when the rank "
              "caught it, `exit` when its process ended; `stalled` is exception minus the end of its last step):",
              "",
              "| hook | rank | exit code | steps done | exception s | exit s | stalled s | within limit | error | "
              "first line of the message |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for r in res.get("faulted", {}).get("ranks", []):
            lines.append(f"| {res['hook']} | {r['rank']} | {cell(r.get('exit_code'))} | {cell(r.get('steps_done'))} | "
                         f"{cell(r.get('error_after_fault_s'))} | {cell(r.get('exit_after_fault_s'))} | "
                         f"{cell(r.get('seconds_since_last_step'))} | {'yes' if r.get('within_limit') else 'NO'} | "
                         f"{cell(r.get('error_type'))} | {cell(r.get('error_first_line'))} |")
    errors = [f"- {res['hook']}: {res['error']}" for res in results if res.get("error")]
    if errors:
        lines += ["", "Errors of the experiment itself:", ""] + errors
    lines += ["", "Reproduce:", "", "```sh", "sudo " + " ".join([sys.executable, *sys.argv]), "```", ""]
    return "\n".join(lines)


def torch_version():
    try:
        import torch
        return torch.__version__
    except ImportError:
        return "?"


def drive_main(args):
    if os.geteuid() != 0:
        print("link_fault.py drive: needs root (netcluster makes network namespaces); run it with sudo",
              file=sys.stderr)
        return 77
    if not args.cluster_prefix or not re.match(r"^[A-Za-z0-9_]{1,20}$", args.cluster_prefix):
        print(f"--cluster-prefix {args.cluster_prefix}: expected letters, digits or _", file=sys.stderr)
        return 2
    if not 0 <= args.fault_rank < args.ranks:
        print(f"--fault-rank {args.fault_rank}: expected a rank from 0 to {args.ranks - 1}", file=sys.stderr)
        return 2
    if not args.checkpoint_every <= args.fault_after_step < args.steps - args.checkpoint_every:
        print(f"--fault-after-step {args.fault_after_step}: expected a step from --checkpoint-every to "
              "--steps minus a checkpoint interval", file=sys.stderr)
        return 2
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    # SIGTERM or SIGHUP to `drive` unwinds like Ctrl-C, so every cluster it made is taken down.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    results = []
    for index, hook in enumerate(args.hooks.split(",")):
        results.append(run_hook(args, index, hook))
        # Written after each hook, so a stopped experiment keeps what it measured.
        write_json(os.path.join(args.out, "results.json"), {"settings": vars(args), "hooks": results})
        with open(os.path.join(args.out, "report.md"), "w") as f:
            f.write(report_markdown(args, results))
    print(f"report: {os.path.join(args.out, 'report.md')}", flush=True)
    return 0 if all(res["passed"] for res in results) else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--steps", type=int, default=300)
    common.add_argument("--timeout-s", type=float, default=10.0, help="gloo's timeout, every group")
    common.add_argument("--checkpoint-every", type=int, default=20)
    common.add_argument("--seed", type=int, default=1)
    common.add_argument("--skip-bucket-warmup", action="store_true",
                        help="resume without the zero backward that rebuilds DDP's buckets first (to show why "
                             "it is there)")

    r = sub.add_parser("rank", parents=[common], help="one rank (netcluster run starts it in the rank's namespace)")
    r.add_argument("--hook", choices=HOOKS, required=True)
    r.add_argument("--checkpoint-dir", required=True)
    r.add_argument("--resume", action="store_true",
                   help="start from the newest step every rank has a checkpoint of (from 0 where there is none)")
    r.add_argument("--out", required=True, help="the rank's JSON report; {rank} is replaced by the rank")

    d = sub.add_parser("drive", parents=[common], help="the whole experiment (root)")
    d.add_argument("--out", required=True, help="folder for report.md, results.json and the runs' logs")
    d.add_argument("--hooks", default=",".join(HOOKS))
    d.add_argument("--ranks", type=int, default=4)
    d.add_argument("--rate", default="100mbit")
    d.add_argument("--fault-rank", type=int, default=2)
    d.add_argument("--fault-after-step", type=int, default=100)
    d.add_argument("--fault-after-s", type=float, default=120.0, help="or this long into the run, if sooner")
    d.add_argument("--fault-delay-s", type=float, default=1.0)
    d.add_argument("--slack-s", type=float, default=5.0, help="how far past the timeout a rank may exit")
    d.add_argument("--run-limit-s", type=float, default=600.0, help="a run that should end by itself, at most")
    d.add_argument("--master-port", type=int, default=29500, help="reference's; faulted +1, resumed +2")
    d.add_argument("--cluster-prefix", default="tf", help="clusters PREFIX1, PREFIX2, ... one per hook")
    d.add_argument("--keep-checkpoints", action="store_true")
    d.add_argument("--gdb-limit-s", type=float, default=120.0,
                   help="at most this long for gdb's native stacks of the ranks of a hung run")
    args = parser.parse_args(argv)
    if args.command == "rank":
        return rank_main(args)
    unknown = set(args.hooks.split(",")) - set(HOOKS)
    if unknown:
        parser.error(f"--hooks: {', '.join(sorted(unknown))} not among {', '.join(HOOKS)}")
    return drive_main(args)


if __name__ == "__main__":
    sys.exit(main())
