#!/usr/bin/env python3
"""Markdown tables of the steady-state benchmarks.

  report_step.py step STEP.json OUT.md [--device NAME] [--date YYYY-MM-DD]
  report_step.py batched BATCHED.json TORCH_RESNET.json OUT.md [--device NAME] [--date YYYY-MM-DD]

step: step_gpu_bench's JSON, one table per (N, density). batched: batched_gpu_bench's JSON plus the
torch.topk loop of torch_topk.py --resnet-out (optional: a missing or broken file leaves that row out).
Times are the median and p90 over the timed steps; "x floor" is the median over the floor kernel's median
(read g, read e, write e) of the same run and gradient type.
"""
import argparse
import datetime
import json
import sys

STEP_KIND = {
    "floor_f32": ("floor", "read g + e, write e: 12 N bytes"),
    "floor_bf16": ("floor", "read bf16 g + e, write e: 10 N bytes"),
    "copy": ("floor", "device copy of N floats: 8 N bytes"),
    "top_k_laplace": ("warm", "cuda::top_k<laplace_bisect> (tol 1 %, warm start; host sync per step)"),
    "top_k_radix": ("cold", "cuda::top_k<radix> (exact; host sync per step)"),
    "batched_f32": ("warm", "batched_top_k<float>, 1 tensor (exact; no host sync)"),
    "batched_bf16": ("warm", "batched_top_k<__nv_bfloat16>, 1 tensor (exact; no host sync)"),
}

BATCHED_KIND = {
    "floor_f32": ("floor", "read g + e, write e over all 161 tensors"),
    "batched_f32": ("warm", "one batched_top_k<float> step over 161 tensors"),
    "graph_batched_f32": ("warm", "the same step captured in a CUDA graph, replayed"),
    "loop_batched_f32": ("warm", "161 one-tensor batched_top_k<float> steps"),
    "loop_top_k_radix": ("cold", "161 cuda::top_k<radix> steps (a host sync each)"),
    "loop_torch_topk": ("cold", "161 torch.topk(abs(x_t), k_t) (abs before timing; int64 indices)"),
}


def checks(r):
    parts = []
    parts.append("counts ok" if r.get("counts_ok", r.get("ok", True)) else "COUNTS WRONG")
    if "conservation_ok" in r:
        parts.append("sum ok" if r["conservation_ok"] else
                     f"SUM OFF ({r.get('conservation_diff', 0):.3g} > {r.get('conservation_bound', 0):.3g})")
    if "top_ok" in r:
        parts.append("top set ok" if r["top_ok"] else "TOP SET WRONG")
    if "same_residual" in r:
        parts.append("residual = batched's" if r["same_residual"] else "RESIDUAL DIFFERS")
    if r.get("note"):
        parts.append(r["note"])
    return ", ".join(parts)


def header(title, device, date, lines):
    return [f"# {title}", "", f"Device: {device}. Date: {date}.", ""] + lines + [""]


def step_report(a):
    data = json.load(open(a.json))
    device = a.device or data.get("device")
    lines = header("The top-k error-feedback step in steady state on raw gradients (GPU)", device, a.date, [
        "Command: `bash bench/gpu/run.sh` (program: `bench/gpu/step_gpu_bench.cu`). Every step gets a gradient "
        "drawn fresh on the device (relu_like noise on a fixed per-coordinate scale with a fixed sparse set of "
        "large coordinates, overall scale drifting slowly: consecutive steps correlated as in training); the "
        "drawing is outside the CUDA events. "
        f"{data.get('steps')} steps per row on a fresh object, the first {data.get('warmup')} untimed; median and "
        "p90 over the timed steps. 'x floor' = median / the floor kernel's median (f32 rows against floor_f32, "
        "bf16 rows against floor_bf16).",
        "",
        "Kinds: *warm* rows keep state from the previous step (laplace_bisect's threshold; batched's candidate "
        "floor), *cold* rows start every step from nothing. fast/full: batched steps served from the warm "
        "candidates / that read the tensor again, over the timed steps. Checks: message counts every step "
        "(top_k_laplace is approximate: k to 1.01 k); on one more untimed step, conservation (sent + new "
        "residual = old residual + gradient, summed) and the sent set being the largest |p|.",
    ])
    cases = {}
    for r in data["results"]:
        cases.setdefault((r["n"], r["density"]), []).append(r)
    bad = 0
    for (n, density), rows in cases.items():
        k = rows[0]["k"]
        lines += [f"## N = 2^{n.bit_length() - 1}, density {density:g} (k = {k})", "",
                  "| method | grad | kind | median ms | p90 ms | x floor | fast/full | checks | what |",
                  "| --- | --- | --- | ---: | ---: | ---: | --- | --- | --- |"]
        for r in rows:
            kind, what = STEP_KIND.get(r["method"], ("?", ""))
            fl = r.get("floor_ms") or 0
            xf = f"{r['median_ms'] / fl:.2f}" if fl > 0 else "-"
            ff = f"{r['fast_timed']}/{r['full_timed']}" if "fast_timed" in r else "-"
            bad += not r.get("ok", True)
            lines.append(f"| {r['method']} | {r['grad']} | {kind} | {r['median_ms']:.4f} | {r['p90_ms']:.4f} | {xf} | "
                         f"{ff} | {checks(r)} | {what} |")
        lines.append("")
    lines.append(f"Rows failing a check: {bad}.")
    write(a.out, lines)


def batched_report(a):
    data = json.load(open(a.json))
    try:
        torch_rows = json.load(open(a.torch))["results"]
    except (OSError, ValueError, KeyError, TypeError):
        torch_rows = []
    device = a.device or data.get("device")
    rows = data["results"] + torch_rows
    lines = header("Batched top-k over ResNet-50's parameter tensors (GPU)", device, a.date, [
        "Command: `bash bench/gpu/run.sh` (programs: `bench/gpu/batched_gpu_bench.cu`, "
        "`bench/gpu/torch_topk.py --resnet-out`). "
        f"{data.get('tensors')} tensors, {data.get('n')} values, density {data.get('density')} per tensor "
        f"(k_t = ceil(density n_t), total k = {data.get('total_k')}). Raw gradients drawn fresh every step "
        f"(untimed); {data.get('steps')} steps per row, the first {data.get('warmup')} untimed; median and p90 "
        "over the timed steps (a step = all 161 tensors). torch's gradients come from its own generator, same "
        "law. 'x floor' = median / floor_f32's median.",
        "",
        "All step rows are exact with ties to the lowest index and see the same gradients: their residuals after "
        "the run are compared bit for bit with batched_f32's. fast/full: tensor-steps served from the warm "
        "candidates / that read the tensor again, over the timed steps (and how many tensors had any full step).",
    ])
    lines += ["| method | kind | median ms | p90 ms | x floor | batched_f32 / this | fast/full (tensors) | checks | what |",
              "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    floor = next((r["median_ms"] for r in rows if r["method"] == "floor_f32"), 0)
    batched = next((r["median_ms"] for r in rows if r["method"] == "batched_f32"), 0)
    bad = 0
    for r in rows:
        kind, what = BATCHED_KIND.get(r["method"], ("?", ""))
        t = r["median_ms"]
        xf = f"{t / floor:.2f}" if floor and t else "-"
        vs = f"{batched / t:.2f}" if batched and t else "-"
        ff = (f"{r['fast_timed']}/{r['full_timed']} ({r.get('tensors_full_timed', 0)})"
              if "fast_timed" in r else "-")
        bad += not r.get("ok", True)
        lines.append(f"| {r['method']} | {kind} | {t:.4f} | {r['p90_ms']:.4f} | {xf} | {vs} | {ff} | {checks(r)} | "
                     f"{what} |")
    lines += ["", f"Rows failing a check: {bad}."]
    write(a.out, lines)


def write(path, lines):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("step")
    s.add_argument("json")
    s.add_argument("out")
    b = sub.add_parser("batched")
    b.add_argument("json")
    b.add_argument("torch")
    b.add_argument("out")
    for p in (s, b):
        p.add_argument("--device", default=None)
        p.add_argument("--date", default=datetime.date.today().isoformat())
    a = ap.parse_args()
    step_report(a) if a.cmd == "step" else batched_report(a)


if __name__ == "__main__":
    sys.exit(main())
