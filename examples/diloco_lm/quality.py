"""Quality at equal steps: the final validation loss of each arm over seeds, against the bytes it sends an
outer round, from the logs of `links.py run --rates none` (one --out folder a seed).

    python3 examples/diloco_lm/quality.py DIR_SEED1 DIR_SEED2 ... [--float32 ARM ...] [--md FILE] [--plot FILE]

For each arm: the validation loss at the run's last step (mean, min and max over the seeds that ran it to
the end), its distance from float32 DiLoCo at the same H and schedule over the same seeds, rank 0's bytes per
H inner steps (its whole run's bytes times H / steps; rank 0's replica's, its ranks summed, where the log has
them: replicas of several ranks) with float32 DiLoCo's bytes over these, and its bytes per inner step (arms of
different H compare there at equal bytes). float32 DiLoCo is diloco-h<H>, or diloco-h<H>-stream for a streamed
arm, with the arm's shape overrides; `--float32 ARM` names it instead for the arms of ARM's H and kind
(streamed or not), e.g. `diloco-h30+outer-lr=1+outer-momentum=0` for plain averaging. Arms that exchange every
step (ddp, fsdp) are listed first, with their losses only. The plot: final loss against bytes per outer round,
a panel per H, the named arms only. A run that did not reach its last step is listed as crashed, not used.
"""
import argparse
import json
import os
import re
import statistics
import sys


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def h_of(arm):
    """H, from the arm's name (diloco-h<H>...); None for an arm that exchanges every step (ddp, fsdp)."""
    m = re.search(r"-h(\d+)", arm)
    return int(m.group(1)) if m else None


def collect(dirs):
    """arm -> list of (final val loss, bytes per H steps, seed folder), and the runs that stopped early."""
    runs, crashed = {}, []
    for d in dirs:
        folder = os.path.join(d, "none")
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".jsonl"):
                continue
            arm = name[:-len(".jsonl")]
            recs = read(os.path.join(folder, name))
            if not recs or recs[-1]["step"] != recs[-1]["of"]:
                crashed.append(f"{d}/{arm}")
                continue
            h = h_of(arm)
            last = recs[-1]
            sent = last.get("replica_bytes_sent", last["bytes_sent"])
            per_round = sent * h / last["step"] if h is not None and sent is not None else None
            runs.setdefault(arm, []).append((last["val_loss"], per_round, d))
    return runs, crashed


# train.py options that make another model or run: an arm with one of these overrides ("+width=128") is held to
# float32 DiLoCo with the same overrides, not to the default model's.
SHAPE = ("width", "layers", "heads", "context", "batch", "steps", "replica-ranks", "model", "span", "corpus")


def kind(arm):
    """(H, streamed): the arms that one float32 reference serves."""
    return h_of(arm), "-stream" in arm.split("+")[0]


def reference(arm, chosen=()):
    """float32 DiLoCo's arm that `arm` is held to: one of `chosen` of the same kind if any, else the default."""
    for c in chosen:
        if kind(c) == kind(arm):
            return c
    h = re.search(r"diloco-h\d+", arm).group(0)
    ref = h + "-stream" if kind(arm)[1] else h
    return ref + "".join("+" + o for o in arm.split("+")[1:] if o.partition("=")[0] in SHAPE)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+")
    p.add_argument("--float32", action="append", default=[], metavar="ARM",
                   help="float32 DiLoCo's arm for the arms of its H and kind (streamed or not); repeatable")
    p.add_argument("--md")
    p.add_argument("--plot")
    args = p.parse_args(argv)
    kinds = [kind(c) for c in args.float32]
    if any(k[0] is None for k in kinds) or len(set(kinds)) != len(kinds):
        p.error(f"--float32: each ARM a DiLoCo arm (diloco-h<H>...), one for each H and kind; got {args.float32}")
    runs, crashed = collect(args.dirs)
    every_step = {a: r for a, r in runs.items() if h_of(a) is None}
    runs = {a: r for a, r in runs.items() if h_of(a) is not None}
    mean = {a: statistics.mean(v for v, _, _ in r) for a, r in runs.items()}
    per_round = {a: statistics.mean(b for _, b, _ in r) for a, r in runs.items()}

    def ref_mean(arm):
        """float32's mean loss over the seeds `arm` ran, or None."""
        ref = runs.get(reference(arm, args.float32))
        if ref is None:
            return None
        by_seed = {d: v for v, _, d in ref}
        seeds = [d for _, _, d in runs[arm]]
        return statistics.mean(by_seed[d] for d in seeds) if all(d in by_seed for d in seeds) else None
    lines = ["| arm | seeds | final val loss: mean (min, max) | vs float32 at its H, same seeds | "
             "bytes per outer round | float32's bytes / these | bytes per inner step |",
             "|---|---|---|---|---|---|---|"]
    for arm, r in sorted(every_step.items()):
        losses = [v for v, _, _ in r]
        lines.append(f"| {arm} (every step) | {len(losses)} | {statistics.mean(losses):.4f} ({min(losses):.4f}, "
                     f"{max(losses):.4f}) | - | - | - | - |")
    for arm in sorted(runs, key=lambda a: (reference(a, args.float32), per_round[a] * -1)):
        losses = [v for v, _, _ in runs[arm]]
        ref = reference(arm, args.float32)
        rm = ref_mean(arm)
        vs = f"{100 * (mean[arm] / rm - 1):+.2f} %" if rm else "-"
        ratio = f"{per_round[ref] / per_round[arm]:.1f}x" if ref in per_round else "-"
        lines.append(f"| {arm} | {len(losses)} | {mean[arm]:.4f} ({min(losses):.4f}, {max(losses):.4f}) | {vs} | "
                     f"{per_round[arm]:,.0f} | {ratio} | {per_round[arm] / h_of(arm):,.0f} |")
    if crashed:
        lines += ["", "Did not reach their last step (crashed, or still running; not used): " + ", ".join(crashed)]
    text = "\n".join(lines)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    if args.plot:
        plot(runs, mean, per_round, args.plot, args.float32)


def plot(runs, mean, per_round, path, chosen=()):
    """Final loss against bytes per outer round, one panel per H; the named arms only (an arm with "+option"
    overrides is a sweep's point, in the table)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    named = [a for a in runs if "+" not in a]
    hs = sorted({h_of(a) for a in named})
    fig, axes = plt.subplots(1, len(hs), figsize=(7 * len(hs), 5.5), squeeze=False)
    for ax, h in zip(axes[0], hs):
        for arm in sorted(a for a in named if h_of(a) == h):
            losses = [v for v, _, _ in runs[arm]]
            m = mean[arm]
            marker = "s" if "sparse" in arm else ("o" if arm == reference(arm, chosen) else "^")
            color = "tab:orange" if "-stream" in arm else "tab:blue"
            ax.errorbar(per_round[arm], m, yerr=[[m - min(losses)], [max(losses) - m]], fmt=marker, capsize=3,
                        color=color)
            ax.annotate(f"{arm.replace(f'diloco-h{h}', '') or 'float32'} ({len(losses)})", (per_round[arm], m),
                        fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_title(f"H = {h} (orange: streamed; in brackets: seeds)")
        ax.set_xlabel("bytes rank 0 sends per outer round")
        ax.set_ylabel("validation loss after the last step (nats/byte; mean, min-max over seeds)")
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1:])
