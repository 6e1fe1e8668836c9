"""Training iterations of torch and of ucudnn.torch interleaved in one process, memory free (issue 13).

`bench/train_step.py` runs each variant in a process of its own, and in AMP torch's own iteration
differs between processes by up to 20% (ResNet-50 B=64: 21.3-34.7 ms over four processes):
cudnn.benchmark picks among near-ties afresh in each process, and a GradScaler step synchronises
with the host every iteration, so the host's pace shows. That noise is larger than the bars
(>= 0.95x). Here one process builds the network once and deep-copies it twice: `ucudnn`, converted
(WR at --limit per kernel, delegation on, as users run it), and `control`, torch's model again
(an A/A test: what the harness reports between identical work). Each has its own SGD optimizer and
GradScaler. After --warmup iterations each (ucudnn plans and captures in its first ones), the
three take turns in --rounds rounds of --iters iterations back to back, who goes first rotating,
timed with CUDA events around each round. Delegated layers therefore run the very plans torch's
benchmark chose for torch's model.

Reported per network and precision: each variant's median ms per iteration over the rounds, the
per-round ratios torch/ucudnn and torch/control (median, min, max), and ucudnn's kernels
(delegated or micro-batched). Results go to OUT/train_ab.json and OUT/train_ab.md after each
network.

    PYTHONPATH=. python3 bench/train_ab.py --out OUT [--nets alexnet:256,resnet50:64]
        [--precisions fp32,amp] [--limit 64MiB] [--rounds 9] [--iters 10] [--cache DB]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_shapes import alternate_rounds  # noqa: E402
from train_step import build, condensed, training_step  # noqa: E402

VARIANTS = ("torch", "ucudnn", "control")


def ratios(times: dict[str, list[float]], of: str) -> dict[str, float]:
    """torch's time over `of`'s, round by round: median, min and max (above 1: `of` is faster)."""
    per_round = [t / o for t, o in zip(times["torch"], times[of])]
    return dict(median=statistics.median(per_round), min=min(per_round), max=max(per_round))


def summarise(net: str, batch: int, precision: str, times: dict[str, list[float]], extra: dict) -> dict:
    """One row of the report: medians per variant, the ratios, and what the run says of itself."""
    medians = {name: statistics.median(values) for name, values in times.items()}
    return dict(net=net, batch=batch, precision=precision, median_ms=medians, rounds_ms=times,
                speedup=ratios(times, "ucudnn"), control=ratios(times, "control"), **extra)


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# torch and ucudnn.torch interleaved in one process ({meta['gpu']}, torch {meta['torch']})\n",
             f"Limit {meta['limit']} per kernel, memory free; ms per iteration, median of {meta['rounds']} "
             f"rotating rounds of {meta['iters']} iterations; ratios are torch/variant per round.\n",
             "| net | precision | torch | ucudnn | control | torch/ucudnn median (min-max) | "
             "torch/control median (min-max) | ucudnn's kernels |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, s, c = r["median_ms"], r["speedup"], r["control"]
        lines.append(f"| {r['net']} B={r['batch']} | {r['precision']} | {m['torch']:.2f} | {m['ucudnn']:.2f} | "
                     f"{m['control']:.2f} | {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}) | "
                     f"{c['median']:.3f} ({c['min']:.3f}-{c['max']:.3f}) | {r['kernels']} |")
    return "\n".join(lines) + "\n"


def kernels_note(summary: dict) -> str:
    """How many of ucudnn's kernels run delegated to torch, and how many micro-batched."""
    return f"{summary['delegated']}/{summary['kernels']} delegated, {summary['micro_batched']} micro-batched"


def measure(net: str, batch: int, precision: str, args) -> dict:
    import torch

    import ucudnn.torch as ut

    amp = precision == "amp"
    torch.manual_seed(0)
    model, x, target = build(net, batch, amp, torch.device("cuda"))
    models = {"torch": model, "ucudnn": copy.deepcopy(model), "control": copy.deepcopy(model)}
    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        ut.convert(models["ucudnn"], workspace_limit=args.limit, cache_path=args.cache)
    steps = {name: training_step(m, x, target, amp) for name, m in models.items()}
    began = time.perf_counter()
    first_losses = {name: float(step()) for name, step in steps.items()}
    for _ in range(args.warmup - 1):
        for step in steps.values():
            step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - began

    def time_loop(loop) -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        loop()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end)

    times = alternate_rounds(steps, time_loop, args.rounds, args.iters)
    context = next(m.ucudnn_context for m in models["ucudnn"].modules() if isinstance(m, ut.Conv2d))
    summary = condensed(context.summary())
    row = summarise(net, batch, precision, times, dict(first_losses=first_losses, warmup_s=warm_s,
                                                       kernels=kernels_note(summary), ucudnn=summary))
    del models, steps, model
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return row


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--nets", default="alexnet:256,resnet50:64", help="NAME:BATCH,... (torchvision)")
    parser.add_argument("--precisions", default="fp32,amp")
    parser.add_argument("--limit", default="64MiB", help="ucudnn's workspace per kernel")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iters", type=int, default=10, help="iterations back to back per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cache", default=None, help="ucudnn's benchmark database")
    parser.add_argument("--deadline", type=float, default=540.0, help="seconds; no new network after it")
    return parser.parse_args(argv)


def measure_all(configs: list[tuple[str, int, str]], measure, meta: dict, out: Path, deadline_s: float) -> list[dict]:
    """measure(net, batch, precision) of each config until `deadline_s` has passed, writing the
    report after each one."""
    rows, started = [], time.perf_counter()
    for net, batch, precision in configs:
        if time.perf_counter() - started > deadline_s:
            print(f"deadline: {net} {precision} not measured", flush=True)
            continue
        rows.append(measure(net, batch, precision))
        (out / "train_ab.json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
        (out / "train_ab.md").write_text(markdown(meta, rows))
        print(markdown(meta, rows[-1:]).splitlines()[-1], flush=True)
    return rows


def configs(nets: str, precisions: str) -> list[tuple[str, int, str]]:
    """(net, batch, precision) of "alexnet:256,resnet50:64" and "fp32,amp", net by net."""
    return [(net, int(batch), precision) for net, batch in (spec.split(":") for spec in nets.split(","))
            for precision in precisions.split(",")]


def main(argv=None) -> None:
    import torch

    args = parse_args(argv)
    torch.backends.cudnn.benchmark = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                limit=args.limit, rounds=args.rounds, iters=args.iters)
    measure_all(configs(args.nets, args.precisions), lambda *config: measure(*config, args), meta, out,
                args.deadline)


if __name__ == "__main__":
    main()
