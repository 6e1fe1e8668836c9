"""1-D, 3-D and transposed layers under memory pressure: torch alone against the layer through
ucudnn.torch, side by side in one process (bench/layer_pressure.py's `measured`, per layer and limit):
one training step (F with bias, BD, BF), torch's with memory free, torch's with only the limit
free beyond the step's own tensors (a blocker allocation), a second copy of torch's layer under
the same blocker (the A/A control), and ucudnn's twin of the layer (ucudnn.integrations.torch.
layers.TWINS, whether convert() swaps that kind yet or not) at the limit per kernel under it,
planned beforehand with memory free; outputs and gradients of both against float64.

Bars (the issue "Beyond 2-D"), checked by `verdicts`: where torch under pressure is over
LOSES x its memory-free time (it loses), ucudnn >= 2x faster than torch under pressure and within
1.3x of torch's memory-free time where the batch can be split; no row slower than torch under
pressure beyond the A/A control's spread; weight gradients within max(the dtype's bound, 3x
torch's own error) of float64.

    PYTHONPATH=. python3 bench/nd_layers.py --out OUT [--limits 64MiB,8MiB] [--layers c3d_conv1,...]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MiB = 2**20
LOSES = 1.5  # torch under pressure over torch free beyond which a row is one torch loses on
SPEEDUP_BAR, NEAR_FREE_BAR = 2.0, 1.3
DW_BOUND = {"fp32": 1e-4, "amp": 1e-2}  # relative error that the dtype's rounding alone reaches (tests/test_gpu_torch.py)

# name: (torch layer, keyword arguments, input shape, precision): the table
LAYERS = {
    "c3d_conv1": ("Conv3d", dict(in_channels=3, out_channels=64, kernel_size=3, padding=1), (16, 3, 16, 112, 112), "fp32"),
    "c3d_conv3": ("Conv3d", dict(in_channels=128, out_channels=256, kernel_size=3, padding=1), (16, 128, 8, 28, 28),
                  "fp32"),
    "unet3d": ("Conv3d", dict(in_channels=64, out_channels=64, kernel_size=3, padding=1), (2, 64, 64, 64, 64), "fp32"),
    "unet3d_fp16": ("Conv3d", dict(in_channels=64, out_channels=64, kernel_size=3, padding=1), (2, 64, 64, 64, 64),
                    "amp"),
    "conv3d_128": ("Conv3d", dict(in_channels=128, out_channels=128, kernel_size=3, padding=1), (4, 128, 32, 32, 32),
                   "fp32"),
    "dcgan_up": ("ConvTranspose2d", dict(in_channels=256, out_channels=128, kernel_size=4, stride=2, padding=1),
                 (128, 256, 16, 16), "fp32"),
    "unet_up": ("ConvTranspose2d", dict(in_channels=128, out_channels=64, kernel_size=2, stride=2), (32, 128, 128, 128),
                "fp32"),
    "audio_conv1d": ("Conv1d", dict(in_channels=256, out_channels=256, kernel_size=3, padding=1), (64, 256, 16000),
                     "fp32"),
    "diffusion_conv2d": ("Conv2d", dict(in_channels=320, out_channels=320, kernel_size=3, padding=1), (8, 320, 128, 128),
                         "amp"),
}


def verdicts(row: dict) -> dict:
    """Each bar of the docstring for one measured row (layer at one limit): met or not."""
    loses = row["torch_pressure_ms"] > LOSES * row["torch_free_ms"]
    speedup = row["torch_pressure_ms"] / row["ucudnn_ms"]
    floor = 1 - abs(row["control_pressure_ms"] / row["torch_pressure_ms"] - 1) - 0.02  # the A/A's spread, and 2%
    out = {"torch_loses": loses, "speedup": speedup, "over_free": row["ucudnn_ms"] / row["torch_free_ms"],
           "no_slower_ok": speedup >= floor,
           "grads_ok": row["ucudnn_errors"]["dw"] <= max(DW_BOUND[row["precision"]], 3 * row["torch_errors"]["dw"])}
    if row.get("plans"):  # what any split within L can reach: each kernel's best plan, summed
        out["kernels_ms"] = sum(planned_ms(p) for p in row["plans"])
        out["reachable_speedup"] = row["torch_pressure_ms"] / out["kernels_ms"]
    if "ucudnn_alike_ms" in row:  # torch's step took more workspace than L: ucudnn given as much
        out["alike_speedup"] = row["torch_pressure_ms"] / row["ucudnn_alike_ms"]
        out["alike_ok"] = out["alike_speedup"] >= floor
    if loses:
        out["speedup_ok"] = speedup >= SPEEDUP_BAR
        out["near_free_ok"] = out["over_free"] <= NEAR_FREE_BAR if row["input"][0] > 1 else None
    return out


def planned_ms(plan: dict) -> float:
    """A kernel's time as planned at L: the WR optimum over the full sweep (predicted), or torch's
    own where it runs because it was faster within L (timed): the least any split within L takes."""
    return plan["predicted_ms"] if plan["via"] == "ucudnn" else plan["own_ms"]


def markdown(rows: list[dict]) -> str:
    lines = ["| layer | input | precision | L | torch free | torch, L free | A/A control | ucudnn at L | "
             "speedup | ucudnn / torch free | torch's workspace: ucudnn given as much (speedup) | "
             "dW error ucudnn (torch) | bars |", "|" + "---|" * 13]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['layer']} | {tuple(r['input'])} | {r['precision']} | {r.get('free_mib', '-')} MiB | "
                         f"{r['error']} |" + " |" * 8)
            continue
        v = r["verdicts"]
        bars = ", ".join(k.removesuffix("_ok") + ("" if ok else " FAILED") for k, ok in v.items()
                         if k.endswith("_ok") and ok is not None)
        name = f"**{r['layer']}**" if v["torch_loses"] else r["layer"]
        lines.append(f"| {name} | {tuple(r['input'])} | {r['precision']} | {r['free_mib']:.0f} MiB | "
                     f"{r['torch_free_ms']:.2f} | {r['torch_pressure_ms']:.2f} | {r['control_pressure_ms']:.2f} | "
                     f"{r['ucudnn_ms']:.2f} | {v['speedup']:.2f}x | {v['over_free']:.2f} | {alike(r)} | "
                     f"{r['ucudnn_errors']['dw']:.1e} ({r['torch_errors']['dw']:.1e}) | {bars} |")
    return "\n".join(lines) + "\n"


def alike(row: dict) -> str:
    """The like-for-like cell: the most workspace a pass of torch's step took, and ucudnn's step given as much."""
    beyond = f"{row.get('torch_workspace_mib', float('nan')):.0f} MiB"
    if "ucudnn_alike_ms" not in row:
        return beyond
    return f"{beyond}: {row['ucudnn_alike_ms']:.2f} ({row['verdicts']['alike_speedup']:.2f}x)"


def run_layer(name: str, free: int, cache: str) -> dict:
    import torch
    from torch import nn

    from bench.layer_pressure import Case, measured

    kind, spec, shape, precision = LAYERS[name]
    row = {"layer": name, "kind": kind, "input": list(shape), "precision": precision}
    try:
        measured(Case(spec, shape, precision == "amp", layer=getattr(nn, kind)), free, cache, row)
    except torch.cuda.OutOfMemoryError as exc:  # failures are data: the row says what ran out
        row["error"] = f"out of memory: {str(exc).splitlines()[0]}"
    if "error" not in row:
        row["verdicts"] = verdicts(row)
    torch.cuda.empty_cache()
    return row


def in_child(name: str, limit: str, cache: str, seconds: float) -> dict:
    """run_layer in a process of its own: torch's benchmark mode keeps the plan it picked per
    shape for the life of a process, so a row measured after another of the same layer would
    time torch's memory-free step with the plan it chose under pressure."""
    command = [sys.executable, __file__, "--row", f"{name}:{limit}", "--cache", cache]
    failed = {"layer": name, "input": list(LAYERS[name][2]), "precision": LAYERS[name][3]}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=max(seconds, 1))
    except subprocess.TimeoutExpired:
        return failed | {"error": f"no result within {seconds:.0f} s"}
    lines = done.stdout.strip().splitlines()
    sys.stderr.write(done.stderr + "".join(line + "\n" for line in lines[:-1]))
    if done.returncode or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return failed | {"error": f"exit {done.returncode}: {last}"}
    return json.loads(lines[-1])


def main(argv=None) -> int:
    from ucudnn import parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out")
    parser.add_argument("--limits", default="64MiB,8MiB", help="memory left free beyond the step's tensors, "
                        "and ucudnn's limit per kernel")
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--cache", help="benchmark database (default OUT/nd_layers.db)")
    parser.add_argument("--deadline", type=float, default=560, help="seconds; rows not begun by then are left out")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # NAME:LIMIT, measured in this process (in_child)
    args = parser.parse_args(argv)
    if args.row:
        name, limit = args.row.split(":")
        print(json.dumps(run_layer(name, parse_size(limit), args.cache), default=str))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began, rows = time.time(), []
    for name in args.layers.split(","):
        for limit in args.limits.split(","):
            left = args.deadline - (time.time() - began)
            if left <= 0:
                break
            rows.append(in_child(name, limit, args.cache or str(out / "nd_layers.db"), left))
            (out / "nd_layers.json").write_text(json.dumps(rows, indent=1, default=str))
            (out / "nd_layers.md").write_text(markdown(rows))
            print(markdown(rows[-1:]), flush=True)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
