"""How much more fits: the largest batch torch trains at, and the largest ucudnn.torch trains
at, under one memory budget, and their samples per second there.

For each model (bench/pressure.py's MODELS) a blocker leaves `--budget` bytes free (per model:
MODEL:SIZE; default: that model's need at its own batch, --need, plus 64 MiB), then a fresh
process per probe builds the model at batch B and trains --iters steps (`torch`: its own layers;
`ucudnn`: `convert(model)` with its defaults). A probe passes where no step runs out of memory or
fails; the batch doubles from the model's own until a probe fails, then bisects (to within a
sixteenth) between the largest that passed and the smallest that failed.

    PYTHONPATH=. python3 bench/largest_batch.py --out OUT --models r3d_18,wav2vec2 --need r3d_18=BYTES,...
        [--iters 12] [--deadline 500]

Writes OUT/largest_batch.json (every probe) and OUT/largest_batch.md (the table).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ALLOC_CONF, MiB, block, child_env, first_line
from bench.pressure import MODELS, build, trainer
from ucudnn.plan.config import parse_size

VARIANTS = ("torch", "ucudnn")
STEADY = 4  # the last steps whose median is a probe's steady step
HEADROOM = 64 * MiB  # the default budget beyond the model's need at its own batch


def probe(args) -> dict:
    """One fresh process: the blocker, the model at args.batch, args.iters steps."""
    import torch

    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.empty(1, device=device)
    blocker = block(device, args.budget, 0, {})  # leaves the budget free: torch's benchmark mode meets it too
    model, x, amp = build(args.model, device, args.batch)
    if args.variant == "ucudnn":
        import ucudnn.torch as ut

        ut.convert(model, cache_path=args.cache)
    step = trainer(model, x, args.model, amp)
    ms = []
    for _ in range(args.iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    del blocker
    steady = statistics.median(ms[-STEADY:])
    return dict(steady_ms=steady, samples_per_s=args.batch / steady * 1e3, iteration_ms=ms)


def run_probe(args, model: str, variant: str, batch: int, budget: int) -> dict:
    out = Path(args.out) / f"largest-{model}-{variant}-{batch}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--child", variant, "--model", model, "--batch", str(batch), "--budget",
               str(budget), "--iters", str(args.iters), "--cache", args.cache, "--result", str(out)]
    env = dict(child_env(os.environ), UCUDNN_PROGRESS="0", PYTORCH_CUDA_ALLOC_CONF=ALLOC_CONF)
    began = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, timeout=args.probe_timeout, capture_output=True, text=True)
        row = json.loads(out.read_text()) if out.exists() else {}
        if done.returncode or not row:
            row.setdefault("error", " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:]) or "no result")
    except subprocess.TimeoutExpired:
        row = dict(error=f"timed out after {args.probe_timeout:.0f} s")
    return dict(row, model=model, variant=variant, batch=batch, budget_mib=budget / MiB,
                wall_s=time.perf_counter() - began)


def largest(try_batch, start: int, cap: int) -> tuple[int, int]:
    """(the largest batch that passed, 0 where none did; the smallest that failed, or cap + 1):
    doubling from `start` until a failure, then bisecting to within a sixteenth; try_batch(b) ->
    bool, None where time ran out (the search stops with what it knows)."""
    passed, failed, batch = 0, cap + 1, start
    while batch <= cap:
        ok = try_batch(batch)
        if ok is None:
            return passed, failed
        if ok:
            passed, batch = batch, batch * 2
        else:
            failed = batch
            break
    if passed == 0 and failed == start:  # even the model's own batch fails: bisect below it
        lo, hi = 0, start
    else:
        lo, hi = passed, failed
    while hi - lo > max(1, lo // 16):
        mid = (lo + hi) // 2
        ok = try_batch(mid)
        if ok is None:
            break
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo, hi


def table(rows: list[dict]) -> str:
    lines = ["| model | budget | torch: largest batch, samples/s | ucudnn: largest batch, samples/s | ucudnn / torch batch |",
             "|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        best = {}
        for variant in VARIANTS:
            passed = [r for r in rows if r["model"] == model and r["variant"] == variant and "error" not in r]
            best[variant] = max(passed, key=lambda r: r["batch"], default=None)
        budget = next(r["budget_mib"] for r in rows if r["model"] == model)
        cells = [f"{b['batch']}, {b['samples_per_s']:.0f}" if b else "none" for b in best.values()]
        ratio = (f"{best['ucudnn']['batch'] / best['torch']['batch']:.2f}x" if best["torch"] and best["ucudnn"]
                 else "-")
        lines.append(f"| {model} | {budget:.0f} MiB | {cells[0]} | {cells[1]} | {ratio} |")
    return "\n".join(lines)


def parent(args) -> None:
    out, rows = Path(args.out), []
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.deadline
    for entry in args.models.split(","):
        model, _, size = entry.partition(":")
        budget = parse_size(size) if size else args.need_of[model] + HEADROOM
        for variant in VARIANTS:
            def try_batch(batch: int) -> bool | None:
                longest = max((r["wall_s"] for r in rows), default=0)
                if time.perf_counter() + longest > deadline:
                    return None
                row = run_probe(args, model, variant, batch, budget)
                rows.append(row)
                print(f"{model} {variant} B={batch}: " + (row.get("error", "")[:100] or
                      f"{row['steady_ms']:.1f} ms, {row['samples_per_s']:.0f} samples/s"), flush=True)
                (out / "largest_batch.json").write_text(json.dumps(rows, indent=1))
                return "error" not in row
            largest(try_batch, MODELS[model][1], args.cap * MODELS[model][1])
        (out / "largest_batch.md").write_text(table(rows) + "\n")
    print(table(rows))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="out")
    p.add_argument("--models", default="r3d_18,wav2vec2,fcn_resnet50")
    p.add_argument("--need", dest="need_of", default="", help="MODEL=BYTES,...: the need at the model's own batch "
                   "(bench/pressure.py's `need`), for the default budget")
    p.add_argument("--iters", type=int, default=12, help="steps a probe trains (planning included)")
    p.add_argument("--cap", type=int, default=8, help="the largest batch tried, in multiples of the model's own")
    p.add_argument("--cache", default="/tmp/largest-cache.db")
    p.add_argument("--deadline", type=float, default=3000)
    p.add_argument("--probe-timeout", type=float, default=240)
    for hidden, kind in (("--child", str), ("--model", str), ("--batch", int), ("--budget", int), ("--result", str)):
        p.add_argument(hidden, type=kind, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.variant = args.child
        try:
            result = probe(args)
        except Exception as exc:  # out of memory and the like are results here
            result = dict(error=f"{type(exc).__name__}: {first_line(exc)}")
        Path(args.result).write_text(json.dumps(result))
        return
    args.need_of = {m: int(b) for m, _, b in (e.partition("=") for e in args.need_of.split(",") if e)}
    parent(args)


if __name__ == "__main__":
    main()
