"""What a training run holds on the device outside torch's caching allocator, phase by phase:
torch alone (cudnn.benchmark) against ucudnn.torch (WR), so that memory pressure can be budgeted.

Outside = device memory in use (total - free) - torch's reserved bytes. Each variant runs in a
fresh process (one CUDA context each); phases are cumulative and their growth is reported:

    PYTHONPATH=. python3 bench/memory_overhead.py --out OUT [--net alexnet] [--batch 256]
        [--precision fp32] [--limit 64MiB] [--cache DB] [--variants torch,wr,wr-direct,...]

Variants: torch; wr (CUDA graphs, backend all); wr-direct (UCUDNN_EXECUTION=direct);
wr-legacy / wr-engines (one backend). The ucudnn phases: `import` (ucudnn.torch and CuPy),
`first iteration` (convert, plan, run: on torch's cuDNN handle where it can be borrowed, which
the result's cudnn_handles says), `warm iterations` (graph captures), `graphs dropped` (every
captured graph destroyed: what they held). (Until 2026-11-24 two phases also made a cuDNN handle
and a frontend handle, to measure them: 10 and 8 MiB on the H100.)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

MiB = 2**20
VARIANTS = {  # name: (ucudnn, environment)
    "torch": (False, {}),
    "wr": (True, {}),
    "wr-direct": (True, {"UCUDNN_EXECUTION": "direct"}),
    "wr-legacy": (True, {"UCUDNN_BACKEND": "legacy"}),
    "wr-engines": (True, {"UCUDNN_BACKEND": "engines"}),
}


def child(args) -> dict:
    import torch

    from train_step import build, outside_pool_bytes, training_step

    ucudnn, _ = VARIANTS[args.variant]
    torch.backends.cudnn.benchmark = True
    model, x, target = build(args.net, args.batch, args.precision == "amp", torch.device("cuda"))
    step = training_step(model, x, target, args.precision == "amp")
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        step()
    phases = []

    def phase(name: str) -> None:
        torch.cuda.synchronize()
        gc.collect()
        phases.append(dict(phase=name, outside_mib=outside_pool_bytes() / MiB,
                           reserved_mib=torch.cuda.memory_reserved() / MiB))

    phase("torch step (no benchmark)")
    if ucudnn:
        import ucudnn.torch as ut
        from ucudnn.execute import gpu

        gpu.cupy().cuda.runtime.getDevice()
        phase("import")
        with torch.autocast("cuda", dtype=torch.float16, enabled=args.precision == "amp"):
            ut.convert(model, cache_path=args.cache, workspace_limit=args.limit, optimizer="wr",
                       planning="first_call")  # steady state: planned on the first (warm-up) call
    step()
    phase("first iteration")
    for _ in range(args.iters):
        step()
    phase("warm iterations")
    if ucudnn:
        context = ut.context_of(model)
        graphs = 0
        for kernel in context._kernels.values():
            held = getattr(getattr(kernel, "program", None), "graphs", None)
            if held is not None:
                graphs += len(held)
                held.clear()
        phase(f"graphs dropped ({graphs})")
        cupy_pool = gpu.cupy().get_default_memory_pool()
        phases.append(dict(phase="cupy pool", outside_mib=cupy_pool.total_bytes() / MiB, reserved_mib=None))
        handles = context.summary()["cudnn_handles"]
    return dict(variant=args.variant, net=args.net, batch=args.batch, precision=args.precision,
                module_loading=os.environ.get("CUDA_MODULE_LOADING", "(default: lazy)"), phases=phases,
                cudnn_handles=handles if ucudnn else None)


def table(rows: list[dict]) -> str:
    lines = ["| variant | phase | outside torch's pool MiB | growth MiB | torch reserved MiB |", "|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['variant']} | error | {row['error'][:200]} | | |")
            continue
        before = None
        for p in row["phases"]:
            growth = "" if before is None or p["reserved_mib"] is None else f"{p['outside_mib'] - before:+.1f}"
            reserved = "" if p["reserved_mib"] is None else f"{p['reserved_mib']:.0f}"
            lines.append(f"| {row['variant']} | {p['phase']} | {p['outside_mib']:.1f} | {growth} | {reserved} |")
            if p["reserved_mib"] is not None:
                before = p["outside_mib"]
        for device, whose in (row.get("cudnn_handles") or {}).items():
            lines.append(f"| {row['variant']} | cuDNN handle on {device}: {whose} | | | |")
    return "\n".join(lines)


def parent(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for variant in args.variants.split(","):
        result = out / f"memory-{variant}.json"
        env = dict(os.environ, **VARIANTS[variant][1])
        command = [sys.executable, __file__, "--child", "--variant", variant, "--result", str(result)] + [
            f"--{k}={getattr(args, k)}" for k in ("out", "net", "batch", "precision", "limit", "iters")]
        if args.cache:
            command.append(f"--cache={args.cache}")
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
        rows.append(json.loads(result.read_text()) if run.returncode == 0 and result.is_file()
                    else dict(variant=variant, error=run.stderr.strip().splitlines()[-1:] and run.stderr[-600:]))
        print(table(rows[-1:]), flush=True)
    (out / "memory_overhead.json").write_text(json.dumps(rows, indent=1))
    (out / "memory_overhead.md").write_text(f"# Outside torch's pool: {args.net} B={args.batch} {args.precision}, "
                                            f"WR {args.limit}\n\n" + table(rows) + "\n")


def main(argv=None) -> None:
    from train_step import add_run_arguments

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, "alexnet", 256, "fp32")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        Path(args.result).write_text(json.dumps(child(args), indent=1))
    else:
        parent(args)


if __name__ == "__main__":
    main()
