"""Training iterations of torch and of ucudnn.torch interleaved in one process, memory free
or under memory pressure.

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

--free L puts every copy under pressure, in one process: a child process
first trains the same copies with no convolution workspace (every copy converted, WR at 0, no
delegation) and takes torch's peak allocated bytes over a rotation of turns (every copy's
parameters, gradients and optimizer state, one iteration's activations), then a blocker
allocation leaves that plus L free before the copies are converted and warmed up. torch's
benchmark mode then drops every plan whose workspace does not fit, and ucudnn plans under the same
pressure. Every copy takes its share of the pressure (the allocator's blocks move between them):
--no-control leaves the control out where torch's own model cannot train beside three.

Reported per network, precision and variant: the median ms per iteration over the rounds,
torch/variant round by round (median, min, max), the median of the rounds' first iterations apart
from the rest (a model that ran after another finds the caching allocator's blocks elsewhere:
ucudnn's CUDA graphs, kept per set of addresses, may be captured anew), torch's peak allocated
bytes during the variant's rounds (blocker excluded; every copy's persistent tensors included,
the same for all) and the caching allocator's retries per iteration (each a device sync: memory
pressure's cost to torch), and ucudnn's kernels (delegated, micro-batched) with its graph replays,
captures and direct runs in the timed rounds. Results go to OUT/train_ab.json and OUT/train_ab.md
after each network.

    PYTHONPATH=. python3 bench/train_ab.py --out OUT [--nets alexnet:256,resnet50:64]
        [--precisions fp32,amp] [--limits 64MiB,4GiB,wd:64MiB] [--free 64MiB] [--rounds 9]
        [--iters 10] [--cache DB]
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (ALLOC_CONF, MiB, allocator_counts, block, build, child_env, condensed, cuda_mark,
                          interleave, iteration_ms, outside_pool_bytes, program_counts, training_step)


class Watch:
    """Per variant, per round: torch's peak allocated bytes while it ran (less `blocked`, the
    blocker's) and the caching allocator's retries (each a device sync), read on the host right
    after the round was queued (the allocator counts on the host)."""

    def __init__(self, blocked: int = 0):
        self.blocked, self.rounds = blocked, {}

    def begin(self, name: str) -> None:
        import torch

        self.current = name
        torch.cuda.reset_peak_memory_stats()
        self._counts = allocator_counts()

    def end(self, name: str) -> None:
        import torch

        retries = allocator_counts()["num_alloc_retries"] - self._counts["num_alloc_retries"]
        self.rounds.setdefault(name, []).append(
            dict(peak_mib=(torch.cuda.max_memory_allocated() - self.blocked) / MiB, retries=retries))


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
    pressure = (f"Under pressure: free memory left at the copies' own peak + {meta['free']}"
                if meta.get("free") else "Memory free")
    lines = [f"# torch and ucudnn.torch interleaved in one process ({meta['gpu']}, torch {meta['torch']})\n",
             f"{pressure}; ms per iteration: median over {meta['rounds']} rotating rounds of {meta['iters']} "
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


def first_line(error: Exception) -> str:
    return str(error).splitlines()[0][:300]


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


def tensors_peak(net: str, batch: int, precision: str, args) -> int:
    """torch's peak allocated bytes over a rotation of turns of every copy with no convolution
    workspace (each converted, WR at 0, no delegation): what the copies' tensors take at most."""
    import torch

    models, steps, _ = settled_copies(net, batch, precision, args)
    for m in models.values():
        convert(m, dict(workspace_limit=0, delegate=False), precision == "amp", args.cache)
    for _ in range(args.warmup):
        for step in steps.values():
            step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    interleave(steps, len(steps), 2, lambda: None)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def footprint(net: str, batch: int, precision: str, args) -> int:
    """tensors_peak in a child process (this one's plan caches must not see a memory-free run)."""
    result = Path(args.out) / f"footprint-{net}-{precision}.json"
    command = [sys.executable, __file__, "--footprint-of-run", str(result), "--out", args.out,
               "--nets", f"{net}:{batch}", "--precisions", precision, "--limits", args.limits,
               "--warmup", str(args.warmup)] + (["--cache", args.cache] if args.cache else []) + (
               [] if args.control else ["--no-control"])
    subprocess.run(command, env=child_env(os.environ), check=True, timeout=300)
    return json.loads(result.read_text())["peak_bytes"]


def measure(net: str, batch: int, precision: str, args) -> dict:
    import torch

    device = torch.device("cuda")
    peak = footprint(net, batch, precision, args) if args.free else None
    models, steps, x = settled_copies(net, batch, precision, args)
    specs = args.limits.split(",")
    pressure: dict = {}
    blocker = block(device, peak, args.free_bytes, pressure) if args.free else None
    contexts = {f"ucudnn@{spec}": convert(models[f"ucudnn@{spec}"], convert_keywords(spec, x), precision == "amp",
                                          args.cache) for spec in specs}
    began = time.perf_counter()
    first_losses, failed = warm_up(steps, args.warmup)  # torch's model first
    if "torch" in failed:
        raise RuntimeError(f"torch's own model failed under this pressure: {failed['torch']}")
    for name in failed:
        del steps[name], models[name]
        contexts.pop(name, None)
    released()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - began

    before = {name: program_counts(c) for name, c in contexts.items()}
    watch = Watch(blocker.numel() if blocker is not None else 0)
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
                    dict(first_losses=first_losses, warmup_s=warm_s, ucudnn=summaries, pressure=pressure,
                         outside_pool_mib=outside_pool_bytes() / MiB, failed=failed), watch.rounds)
    del models, steps, contexts, blocker
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
    parser.add_argument("--free", default=None, help="memory pressure: free memory left beyond the copies' own peak")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="no A/A control copy (under tight pressure: one copy less to hold)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iters", type=int, default=10, help="iterations back to back per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cache", default=None, help="ucudnn's benchmark database")
    parser.add_argument("--deadline", type=float, default=540.0, help="seconds; no new network after it")
    parser.add_argument("--footprint-of-run", default=None, help=argparse.SUPPRESS)  # child: write tensors_peak
    args = parser.parse_args(argv)
    args.free_bytes = parse_size(args.free, "--free") if args.free else 0
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
    if args.free:  # before CUDA starts: torch's default segments fragment too much for any pressure (common.ALLOC_CONF)
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)
    import torch

    torch.backends.cudnn.benchmark = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.footprint_of_run:
        (net, batch, precision), = configs(args.nets, args.precisions)
        peak = tensors_peak(net, batch, precision, args)
        Path(args.footprint_of_run).write_text(json.dumps(dict(peak_bytes=peak)))
        return
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                limits=args.limits, rounds=args.rounds, iters=args.iters, free=args.free,
                alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    measure_all(configs(args.nets, args.precisions), lambda *config: measure(*config, args), meta, out,
                args.deadline)


if __name__ == "__main__":
    main()
