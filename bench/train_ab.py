"""Training iterations of torch and of ucudnn.torch interleaved in one process, memory free (issue 13).

`bench/train_step.py` runs each variant in a process of its own, and in AMP torch's own iteration
differs between processes by up to 20% (ResNet-50 B=64: 21.3-34.7 ms over four processes):
cudnn.benchmark picks among near-ties afresh in each process, and a GradScaler step synchronises
with the host every iteration, so the host's pace shows. That noise is larger than the bars
(>= 0.95x). Here one process builds the network once and deep-copies it: `ucudnn@LIMIT` for each
of --limits, converted (WR at LIMIT per kernel, delegation on, as users run it), and `control`,
torch's model again (an A/A test: what the harness reports between identical work). Each has its
own SGD optimizer and GradScaler. After --warmup iterations each (ucudnn plans and captures in
its first ones), the variants take turns in --rounds rounds of --iters iterations back to back,
who goes first rotating, with a CUDA event after each iteration. Delegated layers therefore run
the very plans torch's benchmark chose for torch's model.

Reported per network, precision and variant: the median ms per iteration over the rounds,
torch/variant round by round (median, min, max), the median of the rounds' first iterations apart
from the rest (a model that ran after another finds the caching allocator's blocks elsewhere:
ucudnn's CUDA graphs, kept per set of addresses, may be captured anew), and ucudnn's kernels
(delegated, micro-batched) with its graph replays, captures and direct runs in the timed rounds.
Results go to OUT/train_ab.json and OUT/train_ab.md after each network.

    PYTHONPATH=. python3 bench/train_ab.py --out OUT [--nets alexnet:256,resnet50:64]
        [--precisions fp32,amp] [--limits 64MiB,4GiB] [--rounds 9] [--iters 10] [--cache DB]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_shapes import turns  # noqa: E402
from train_profile import program_counts  # noqa: E402
from train_step import build, condensed, training_step  # noqa: E402

def interleave(steps: dict[str, Callable[[], object]], rounds: int, iters: int, mark: Callable[[], Any]) -> dict:
    """Per variant, per round, the marks around its iterations: `mark()` (a recorded CUDA event)
    before the round and after each iteration. The variants take turns (torch_shapes.turns)."""
    marks: dict[str, list[list[Any]]] = {name: [] for name in steps}
    for name in turns(list(steps), rounds):
        step, held = steps[name], [mark()]
        for _ in range(iters):
            step()
            held.append(mark())
        marks[name].append(held)
    return marks


def iteration_ms(marks: dict) -> dict[str, list[list[float]]]:
    """Milliseconds of every iteration, from the marks of interleave() (once they completed)."""
    return {name: [[a.elapsed_time(b) for a, b in zip(held, held[1:])] for held in rounds]
            for name, rounds in marks.items()}


def ratios(torch_rounds: list[float], rounds: list[float]) -> dict[str, float]:
    """torch's time over a variant's, round by round: median, min and max (above 1: it is faster)."""
    per_round = [t / v for t, v in zip(torch_rounds, rounds)]
    return dict(median=statistics.median(per_round), min=min(per_round), max=max(per_round))


def summarise(net: str, batch: int, precision: str, iterations: dict[str, list[list[float]]],
              notes: dict[str, str], extra: dict) -> dict:
    """One network and precision: per variant the mean of each round, the medians of the rounds,
    of their first iterations and of the others, torch/variant per round, and its note."""
    rounds = {name: [statistics.fmean(r) for r in values] for name, values in iterations.items()}
    variants = {name: dict(median_ms=statistics.median(rounds[name]),
                           first_ms=statistics.median(r[0] for r in values),
                           rest_ms=statistics.median(t for r in values for t in r[1:]),
                           ratio=ratios(rounds["torch"], rounds[name]), rounds_ms=rounds[name],
                           iterations_ms=values, note=notes.get(name, ""))
                for name, values in iterations.items()}
    return dict(net=net, batch=batch, precision=precision, variants=variants, **extra)


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# torch and ucudnn.torch interleaved in one process ({meta['gpu']}, torch {meta['torch']})\n",
             f"Memory free; ms per iteration: median over {meta['rounds']} rotating rounds of {meta['iters']} "
             "iterations (a round's mean); torch/variant per round; first / rest: median of the rounds' first "
             "iterations / of the others. `control` is torch's model again (A/A).\n",
             "| net | precision | variant | ms | torch/variant median (min-max) | first / rest | notes |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        for name, v in r["variants"].items():
            q = v["ratio"]
            lines.append(f"| {r['net']} B={r['batch']} | {r['precision']} | {name} | {v['median_ms']:.2f} | "
                         f"{q['median']:.3f} ({q['min']:.3f}-{q['max']:.3f}) | {v['first_ms']:.2f} / "
                         f"{v['rest_ms']:.2f} | {v['note']} |")
    return "\n".join(lines) + "\n"


def kernels_note(summary: dict, programs: dict) -> str:
    """ucudnn's kernels delegated to torch and micro-batched; its graph replays, captures and direct runs."""
    return (f"{summary['delegated']}/{summary['kernels']} delegated, {summary['micro_batched']} micro-batched; "
            f"{programs.get('replays', 0)} replays, {programs.get('captures', 0)} captures, "
            f"{programs.get('direct_runs', 0)} direct")


def context_of(model):
    import ucudnn.torch as ut

    return next(m.ucudnn_context for m in model.modules() if isinstance(m, ut.Conv2d))


def measure(net: str, batch: int, precision: str, args) -> dict:
    import torch

    import ucudnn.torch as ut

    amp = precision == "amp"
    torch.manual_seed(0)
    model, x, target = build(net, batch, amp, torch.device("cuda"))
    models = {"torch": model}
    for limit in args.limits.split(","):
        models[f"ucudnn@{limit}"] = converted = copy.deepcopy(model)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            ut.convert(converted, workspace_limit=limit, cache_path=args.cache)
    models["control"] = copy.deepcopy(model)
    contexts = {name: context_of(m) for name, m in models.items() if name.startswith("ucudnn")}
    steps = {name: training_step(m, x, target, amp) for name, m in models.items()}
    began = time.perf_counter()
    first_losses = {name: float(step()) for name, step in steps.items()}
    for _ in range(args.warmup - 1):
        for step in steps.values():
            step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - began

    def mark():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    before = {name: program_counts(c) for name, c in contexts.items()}
    marks = interleave(steps, args.rounds, args.iters, mark)
    torch.cuda.synchronize()
    notes, summaries = {}, {}
    for name, context in contexts.items():
        after, summaries[name] = program_counts(context), condensed(context.summary())
        notes[name] = kernels_note(summaries[name], {k: after[k] - before[name][k] for k in after})
    row = summarise(net, batch, precision, iteration_ms(marks), notes,
                    dict(first_losses=first_losses, warmup_s=warm_s, ucudnn=summaries))
    del models, steps, model, contexts
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return row


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--nets", default="alexnet:256,resnet50:64", help="NAME:BATCH,... (torchvision)")
    parser.add_argument("--precisions", default="fp32,amp")
    parser.add_argument("--limits", default="64MiB", help="ucudnn's workspace per kernel: a converted copy for each")
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
                limits=args.limits, rounds=args.rounds, iters=args.iters)
    measure_all(configs(args.nets, args.precisions), lambda *config: measure(*config, args), meta, out,
                args.deadline)


if __name__ == "__main__":
    main()
