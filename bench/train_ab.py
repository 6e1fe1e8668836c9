"""Training iterations of torch and of ucudnn.torch interleaved in one process, memory free
(whole models under memory pressure: bench/pressure.py, a fresh process per variant).

Run in processes of their own, torch's own AMP iteration differs between processes by up to 20%
(ResNet-50 B=64: 21.3-34.7 ms over four processes; docs/results.md):
cudnn.benchmark picks among near-ties afresh in each process, and a GradScaler step synchronises
with the host every iteration, so the host's pace shows. That noise is larger than the bars
(>= 0.95x). Here one process builds the network once and deep-copies it: `ucudnn@SPEC` for each
of --limits, converted (SPEC: a size, WR at that limit per kernel with delegation on, as users run
it; `wd:SIZE`, WD with that total learned from the batch; `wd:auto`, WD's memory-aware total), and
`control`, torch's model again (an A/A test: what the harness reports between identical work).
Each has its own SGD optimizer and GradScaler, and runs one untimed plain-torch iteration first
(optimizer state; cudnn.benchmark off and deterministic, so that torch's plan cache holds no choice
the timed iterations would use). After --warmup iterations each (torch's model first: its
benchmark mode picks its plans there; ucudnn plans and captures in its first ones), the variants
take turns in --rounds rounds of --iters iterations back to back, who goes first rotating, with a
CUDA event after each iteration. Delegated layers therefore run the very plans torch's benchmark
chose for torch's model.

Reported per network, precision and variant: the median ms per iteration over the rounds,
torch/variant round by round (median, min, max), the median of the rounds' first iterations apart
from the rest (a model that ran after another finds the caching allocator's blocks elsewhere:
ucudnn's CUDA graphs, kept per set of addresses, may be captured anew), torch's peak allocated
bytes during the variant's rounds (every copy's persistent tensors included, the same for all) and the caching allocator's retries per iteration (each a device sync: memory
pressure's cost to torch), and ucudnn's kernels (delegated, micro-batched) with its graph replays,
captures and direct runs in the timed rounds. Results go to OUT/train_ab.json and OUT/train_ab.md
after each network.

    PYTHONPATH=. python3 bench/train_ab.py --out OUT [--nets alexnet:256,resnet50:64]
        [--precisions fp32,amp] [--limits 64MiB,4GiB,wd:64MiB] [--rounds 9]
        [--iters 10] [--cache DB]
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    MiB,
    allocator_counts,
    build,
    condensed,
    cuda_mark,
    first_line,
    interleave,
    iteration_ms,
    program_counts,
    training_step,
)


class Watch:
    """Per variant, per round: torch's peak allocated bytes while it ran and the caching allocator's retries (each a device sync), read on the host right
    after the round was queued (the allocator counts on the host)."""

    def __init__(self):
        self.rounds = {}

    def begin(self, name: str) -> None:
        import torch

        self.current = name
        torch.cuda.reset_peak_memory_stats()
        self._counts = allocator_counts()

    def end(self, name: str) -> None:
        import torch

        retries = allocator_counts()["num_alloc_retries"] - self._counts["num_alloc_retries"]
        self.rounds.setdefault(name, []).append(
            dict(peak_mib=torch.cuda.max_memory_allocated() / MiB, retries=retries))


def ratios(torch_rounds: list[float], rounds: list[float]) -> dict[str, float]:
    """torch's time over a variant's, round by round: median, min and max (above 1: it is faster)."""
    per_round = [t / v for t, v in zip(torch_rounds, rounds)]
    return dict(median=statistics.median(per_round), min=min(per_round), max=max(per_round))


def memory_of(watched: list[dict], iters: int) -> dict:
    """A variant's rounds as Watch saw them: its highest peak, and retries per iteration."""
    return dict(peak_mib=max(r["peak_mib"] for r in watched),
                retries_per_iter=sum(r["retries"] for r in watched) / (iters * len(watched)))


def summarise(net: str, batch: int, precision: str, iterations: dict[str, list[list[float]]],
              notes: dict[str, str], extra: dict, watched: dict[str, list[dict]] | None = None) -> dict:
    """One network and precision: per variant the mean of each round, the medians of the rounds,
    of their first iterations and of the others, torch/variant per round, its memory (Watch) and
    its note."""
    rounds = {name: [statistics.fmean(r) for r in values] for name, values in iterations.items()}
    variants = {name: dict(median_ms=statistics.median(rounds[name]),
                           first_ms=statistics.median(r[0] for r in values),
                           rest_ms=statistics.median(t for r in values for t in r[1:]),
                           ratio=ratios(rounds["torch"], rounds[name]), rounds_ms=rounds[name],
                           iterations_ms=values, note=notes.get(name, ""),
                           **(memory_of(watched[name], len(values[0])) if watched else {}))
                for name, values in iterations.items()}
    return dict(net=net, batch=batch, precision=precision, variants=variants, **extra)


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# torch and ucudnn.torch interleaved in one process ({meta['gpu']}, torch {meta['torch']})\n",
             f"Memory free; ms per iteration: median over {meta['rounds']} rotating rounds of {meta['iters']} "
             "iterations (a round's mean); torch/variant per round; first / rest: median of the rounds' first "
             "iterations / of the others; peak: torch's allocated MiB during the variant's rounds (every copy's "
             "tensors); retries: the allocator's per iteration. `control` is torch's model again (A/A).\n",
             "| net | precision | variant | ms | torch/variant median (min-max) | first / rest | peak MiB | "
             "retries | notes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['net']} B={r['batch']} | {r['precision']} | failed | | | | | | {r['error'][:300]} |")
            continue
        for name, why in r.get("failed", {}).items():
            lines.append(f"| {r['net']} B={r['batch']} | {r['precision']} | {name} | failed | | | | | {why} |")
        for name, v in r["variants"].items():
            q = v["ratio"]
            memory = (f"{v['peak_mib']:.0f} | {v['retries_per_iter']:.1f}" if "peak_mib" in v else " | ")
            lines.append(f"| {r['net']} B={r['batch']} | {r['precision']} | {name} | {v['median_ms']:.2f} | "
                         f"{q['median']:.3f} ({q['min']:.3f}-{q['max']:.3f}) | {v['first_ms']:.2f} / "
                         f"{v['rest_ms']:.2f} | {memory} | {v['note']} |")
    return "\n".join(lines) + "\n"


def kernels_note(summary: dict, programs: dict) -> str:
    """ucudnn's kernels delegated to torch and micro-batched; its graph replays, captures and direct runs."""
    return (f"{summary['delegated']}/{summary['kernels']} delegated, {summary['micro_batched']} micro-batched; "
            f"{programs.get('replays', 0)} replays, {programs.get('captures', 0)} captures, "
            f"{programs.get('direct_runs', 0)} direct")


def convert_keywords(spec: str, x) -> dict:
    """ucudnn.torch.convert's keywords for a --limits entry: SIZE (WR at SIZE per kernel), wd:SIZE
    (WD, total SIZE, learned from the batch x) or wd:auto (WD's memory-aware total)."""
    optimizer, _, limit = spec.rpartition(":")
    if optimizer not in ("", "wd"):
        raise ValueError(f"--limits entry {spec!r}: write SIZE (WR), wd:SIZE or wd:auto")
    if not optimizer:
        return dict(workspace_limit=limit)
    return dict(optimizer="wd", total_limit=limit, **({} if limit == "auto" else dict(sample_input=x)))


def copies(model, specs: list[str], control: bool = True) -> dict:
    """torch's model, a copy per ucudnn spec (converted later) and the control copy (if asked for)."""
    return {"torch": model, **{f"ucudnn@{spec}": copy.deepcopy(model) for spec in specs},
            **({"control": copy.deepcopy(model)} if control else {})}


def convert(model, keywords: dict, amp: bool, cache: str | None):
    """Convert in place (the optimizer made before keeps its parameters), under the training
    autocast (WD learns from its sample input); the copy's Context."""
    import torch

    import ucudnn.torch as ut

    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        ut.convert(model, cache_path=cache, **{"planning": "first_call", **keywords})  # steady state: planned on the first (warm-up) call
    return ut.context_of(model)


def settle(steps: dict) -> None:
    """One untimed iteration of each copy: optimizer state, cuBLAS and torch's cuDNN handle. Not
    benchmarked and deterministic: torch caches the plans it runs keyed by the deterministic flag,
    so the timed iterations' plans stay unchosen."""
    import torch

    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        for step in steps.values():
            step()


def warm_up(steps: dict, iterations: int) -> tuple[dict[str, float], dict[str, str]]:
    """`iterations` of each copy in turn (torch's model first): its first loss, or, where it runs
    out of memory, why (that copy is left out from then on, the others go on)."""
    import torch

    losses, failed = {}, {}
    for i in range(iterations):
        for name, step in steps.items():
            if name in failed:
                continue
            try:
                loss = step()
            except torch.cuda.OutOfMemoryError as exc:
                failed[name] = f"warm-up iteration {i + 1}: {first_line(exc)}"
                continue
            losses.setdefault(name, float(loss))
    return losses, failed


def settled_copies(net: str, batch: int, precision: str, args) -> tuple[dict, dict, Any]:
    """The copies (copies()), each one's training step, settled (settle()), and the batch: built
    alike where the footprint is measured and where the copies are timed."""
    import torch

    amp = precision == "amp"
    torch.manual_seed(0)
    model, x, target = build(net, batch, amp, torch.device("cuda"))
    models = copies(model, args.limits.split(","), args.control)
    steps = {name: training_step(m, x, target, amp) for name, m in models.items()}
    settle(steps)
    return models, steps, x


def measure(net: str, batch: int, precision: str, args) -> dict:
    import torch

    from ucudnn.integrations.torch import TorchPool

    models, steps, x = settled_copies(net, batch, precision, args)
    specs = args.limits.split(",")
    contexts = {f"ucudnn@{spec}": convert(models[f"ucudnn@{spec}"], convert_keywords(spec, x), precision == "amp",
                                          args.cache) for spec in specs}
    began = time.perf_counter()
    first_losses, failed = warm_up(steps, args.warmup)  # torch's model first
    if "torch" in failed:
        raise RuntimeError(f"torch's own model failed: {failed['torch']}")
    for name in failed:
        del steps[name], models[name]
        contexts.pop(name, None)
    released()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - began

    before = {name: program_counts(c) for name, c in contexts.items()}
    watch = Watch()
    try:
        marks = interleave(steps, args.rounds, args.iters, cuda_mark, watch)
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as exc:
        raise RuntimeError(f"{watch.current} ran out of memory in the timed rounds: {first_line(exc)}") from None
    notes, summaries = {}, {}
    for name, context in contexts.items():
        after, summaries[name] = program_counts(context), condensed(context.summary())
        notes[name] = kernels_note(summaries[name], {k: after[k] - before[name][k] for k in after})
    row = summarise(net, batch, precision, iteration_ms(marks), notes,
                    dict(first_losses=first_losses, warmup_s=warm_s, ucudnn=summaries,
                         outside_pool_mib=TorchPool.outside_bytes() / MiB, failed=failed), watch.rounds)
    del models, steps, contexts
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return row


def parse_args(argv=None) -> argparse.Namespace:
    from ucudnn.plan.config import parse_size

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--nets", default="alexnet:256,resnet50:64", help="NAME:BATCH,... (torchvision)")
    parser.add_argument("--precisions", default="fp32,amp")
    parser.add_argument("--limits", default="64MiB",
                        help="a converted copy for each: SIZE (WR per kernel), wd:SIZE or wd:auto (WD's total)")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="no A/A control copy (under tight pressure: one copy less to hold)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iters", type=int, default=10, help="iterations back to back per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cache", default=None, help="ucudnn's benchmark database")
    parser.add_argument("--deadline", type=float, default=540.0, help="seconds; no new network after it")
    args = parser.parse_args(argv)
    for spec in args.limits.split(","):  # a bad entry fails here, before any GPU work
        keywords = convert_keywords(spec, None)
        limit = keywords.get("workspace_limit", keywords.get("total_limit"))
        if limit != "auto":
            parse_size(limit, "--limits")
    return args


def measure_all(configs: list[tuple[str, int, str]], measure, meta: dict, out: Path, deadline_s: float) -> list[dict]:
    """measure(net, batch, precision) of each config until `deadline_s` has passed, writing the
    report after each one. A config that fails (e.g. out of memory under pressure) is a row with
    its error, and the next one runs."""
    rows, started = [], time.perf_counter()
    for net, batch, precision in configs:
        if time.perf_counter() - started > deadline_s:
            print(f"deadline: {net} {precision} not measured", flush=True)
            continue
        try:
            rows.append(measure(net, batch, precision))
        except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
            rows.append(dict(net=net, batch=batch, precision=precision, error=f"{type(exc).__name__}: {exc}"[:600]))
        if "error" in rows[-1]:
            released()  # here, not in the except clause: its traceback still holds the config's tensors
        (out / "train_ab.json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
        (out / "train_ab.md").write_text(markdown(meta, rows))
        print(markdown(meta, rows[-1:]).splitlines()[-1], flush=True)
    return rows


def released() -> None:
    """A failed config's tensors back to the device before the next one."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def configs(nets: str, precisions: str) -> list[tuple[str, int, str]]:
    """(net, batch, precision) of "alexnet:256,resnet50:64" and "fp32,amp", net by net."""
    return [(net, int(batch), precision) for net, batch in (spec.split(":") for spec in nets.split(","))
            for precision in precisions.split(",")]


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    torch.backends.cudnn.benchmark = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                limits=args.limits, rounds=args.rounds, iters=args.iters,
                alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    measure_all(configs(args.nets, args.precisions), lambda *config: measure(*config, args), meta, out,
                args.deadline)


if __name__ == "__main__":
    main()
