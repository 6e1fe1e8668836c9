"""Where a converted training iteration spends its host time: one network through ucudnn.torch,
then per iteration the GPU time (CUDA events), the host time to issue it (perf_counter, no sync),
cProfile's top functions over a few iterations, and how each kernel's calls ran (CUDA-graph
replays, captures, direct runs), so that a converted path slower than torch's can be explained.

    PYTHONPATH=. python3 bench/train_profile.py --out OUT [--net resnet50] [--batch 64]
        [--precision amp] [--limit 64MiB] [--delegate] [--cache DB] [--iters 10] [--profile 5]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from collections import Counter
from pathlib import Path


def program_counts(context) -> Counter:
    """Calls of every planned kernel by how they ran (GraphedProgram's counters)."""
    counts = Counter()
    for kernel in context._kernels.values():
        program = getattr(kernel, "program", None)
        for name in ("replays", "captures", "direct_runs"):
            counts[name] += getattr(program, name, 0)
        counts["graphs"] += len(getattr(program, "graphs", ()))
    return counts


def main(argv=None) -> None:
    from train_step import add_run_arguments

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, "resnet50", 64, "amp")
    parser.add_argument("--delegate", action="store_true", help="let layers be delegated to torch (default: none)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--profile", type=int, default=5, help="iterations under cProfile")
    args = parser.parse_args(argv)

    import torch
    import torchvision
    from train_step import training_step

    import ucudnn.torch as ut

    torch.backends.cudnn.benchmark = True
    amp = args.precision == "amp"
    layout = torch.channels_last if amp else torch.contiguous_format
    model = torchvision.models.get_model(args.net, weights=None).to("cuda", memory_format=layout).train()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").contiguous(memory_format=layout)
    target = torch.randint(0, 1000, (args.batch,), device="cuda")
    ut.convert(model, workspace_limit=args.limit, cache_path=args.cache, delegate=args.delegate,
               planning="first_call")  # steady state: planned on the first (warm-up) call
    context = ut.context_of(model)
    step = training_step(model, x, target, amp)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    before = program_counts(context)
    gpu_ms, host_ms = [], []
    for _ in range(args.iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter()
        step()
        host_ms.append((time.perf_counter() - began) * 1e3)
        end.record()
        end.synchronize()
        gpu_ms.append(start.elapsed_time(end))
    after = program_counts(context)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.profile):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    result = dict(net=args.net, batch=args.batch, precision=args.precision, limit=args.limit,
                  delegate=args.delegate, iteration_ms=statistics.median(gpu_ms),
                  host_issue_ms=statistics.median(host_ms),
                  calls_per_iteration={k: (after[k] - before[k]) / args.iters for k in after},
                  graphs_held=after["graphs"], runs={f"{via}:{kind}": n for (via, kind), n in context.runs.items()})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"train_profile-{args.net}-{args.precision}.json").write_text(json.dumps(result, indent=1))
    (out / f"train_profile-{args.net}-{args.precision}.txt").write_text(text.getvalue())
    print(json.dumps(result, indent=1))
    print(text.getvalue()[:6000])


if __name__ == "__main__":
    main()
