"""What the benchmarks share: models and their training steps, variants timed in turns with CUDA
events, memory pressure (a blocker allocation), a converted model's summary in brief, and the
environment of their fresh child processes. torch is imported where it is used, so that the pure
parts load without it."""
from __future__ import annotations

import os
import random
import statistics
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20
# Children run torch's allocator with expandable segments unless PYTORCH_CUDA_ALLOC_CONF says
# otherwise: with its default segments, fragmentation leaves too little of a small headroom for
# even torch under pressure (docs/results.md, "Whole models where memory is short")
ALLOC_CONF = "expandable_segments:True"
SEGMENT = 2 * MiB  # torch's caching allocator rounds large blocks up to this: a blocker is rounded down
ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams", "num_ooms")
Step = Callable[[], object]


def child_env(environ) -> dict:
    """The environment of a fresh benchmark process: this checkout first on PYTHONPATH, output
    unbuffered, and ALLOC_CONF unless PYTORCH_CUDA_ALLOC_CONF is set."""
    env = dict(environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")])))
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)
    return env


# --- models and their steps -------------------------------------------------------------------------

def build(net: str, batch: int, amp: bool, device):
    """torchvision's `net` (no weights, training mode), a 224x224 batch and class targets; AMP runs
    channels_last, the layout fp16 tensor-core kernels want."""
    import torch
    import torchvision

    layout = torch.channels_last if amp else torch.contiguous_format
    model = torchvision.models.get_model(net, weights=None).to(device, memory_format=layout).train()
    x = torch.randn(batch, 3, 224, 224, device=device).contiguous(memory_format=layout)
    target = torch.randint(0, 1000, (batch,), device=device)
    return model, x, target


def training_step(model, x, target, amp: bool, loss: Callable | None = None, lr: float = 1e-3) -> Step:
    """One SGD training iteration of `model` on (x, target) as a function (AMP: fp16 autocast and
    a gradient scaler), returning the loss: `loss(model, x, target)`, cross-entropy unless given.
    Its optimizer lives as long as the function."""
    import torch
    import torch.nn.functional as F

    loss = loss or (lambda model, x, target: F.cross_entropy(model(x), target))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            value = loss(model, x, target)
        scaler.scale(value).backward()
        scaler.step(optimizer)
        scaler.update()
        return value.detach()
    return step


def relative_error(got, want) -> float:
    """||got - want|| / ||want|| in float64; inf where either is not finite."""
    got, want = got.double(), want.double()
    if not (got.isfinite().all() and want.isfinite().all()):
        return float("inf")
    return float((got - want).norm()) / max(float(want.norm()), 1e-30)


# --- a converted model in brief -----------------------------------------------------------------------

def condensed(summary: dict) -> dict:
    """ucudnn.torch's summary() in brief: kernels, delegated, micro-batched, workspaces, runs."""
    kernels = summary["kernels"]
    ours = [k for k in kernels if k["via"] == "ucudnn"]
    return dict(
        kernels=len(kernels), delegated=sum(k["delegated"] for k in kernels),
        via_torch=sum(k["via"] == "torch" and not k["delegated"] for k in kernels),
        micro_batched=sum(1 for k in ours if k["parts"] > 1),
        max_workspace_mib=max((k["workspace"] for k in ours), default=0) / MiB,
        sum_workspace_mib=sum(k["workspace"] for k in ours) / MiB,
        runs=summary["runs"], fallbacks=summary["fallbacks"], wd=summary.get("wd"), shrinks=summary["shrinks"],
        cudnn_handles=summary.get("cudnn_handles"),
        configurations=[(k["kind"], k["kernel"], k.get("configuration")) for k in kernels],
    )


def program_counts(context) -> Counter:
    """Calls of every planned kernel by how they ran (GraphedProgram's counters)."""
    counts = Counter()
    for kernel in context.planner.kernels.planned.values():
        program = getattr(kernel, "program", None)
        for name in ("replays", "captures", "direct_runs"):
            counts[name] += getattr(program, name, 0)
        counts["graphs"] += len(getattr(program, "graphs", ()))
    return counts


# --- memory pressure -----------------------------------------------------------------------------------

def blocker_bytes(free: int, held: int, footprint: int, headroom: int) -> int:
    """Bytes to allocate so that only the run's own peak (`footprint`, of which `held` is held
    already) plus `headroom` stay free out of `free`."""
    need = max(footprint - held, 0)
    blocker = free - need - headroom
    if blocker < 0:
        raise ValueError(f"the GPU cannot hold the run plus the headroom: {free / MiB:.0f} MiB free, the run "
                         f"needs {need / MiB:.0f} MiB more (footprint {footprint / MiB:.0f} MiB, "
                         f"{held / MiB:.0f} MiB held), headroom {headroom / MiB:.0f} MiB")
    return blocker


def block(device, footprint: int, headroom: int, result: dict):
    """The pressure: a tensor that leaves free only the run's own peak (torch's allocated bytes at
    it) plus `headroom`; what it took goes into `result`."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    held = torch.cuda.memory_allocated(device)
    free = torch.cuda.mem_get_info(device)[0]
    blocker = torch.empty(blocker_bytes(free, held, footprint, headroom) // SEGMENT * SEGMENT,
                          dtype=torch.uint8, device=device)
    left = torch.cuda.mem_get_info(device)[0] - max(footprint - held, 0)
    result.update(blocker_mib=blocker.numel() / MiB, footprint_mib=footprint / MiB, free_headroom_mib=left / MiB)
    return blocker


def allocator_counts() -> dict[str, int]:
    """torch's caching-allocator event counters: retries after freeing cached blocks (each a
    device sync), cudaMalloc/cudaFree (or page maps) and full syncs, the churn of memory pressure."""
    import torch

    stats = torch.cuda.memory_stats()
    return {key: stats.get(key, 0) for key in ALLOCATOR_COUNTERS}


# --- timing: variants in turns -------------------------------------------------------------------------

def turns(names: list[str], rounds: int) -> Iterator[str]:
    """The names in `rounds` rounds, each name once a round, who goes first rotating: no variant
    always meets the state (clocks, caches, allocator) its predecessor left."""
    for round_index in range(rounds):
        shift = round_index % len(names)
        yield from names[shift:] + names[:shift]


def chance(a: list[float], b: list[float], draws: int = 20000) -> float:
    """How often the medians of `a` and `b`, their values dealt out afresh at random (seeded), lie
    at least as far apart as they do: a two-sided permutation test. Near 1, the difference is what
    processes of one kind show anyway."""
    deal, pool, far = random.Random(1), [*a, *b], abs(statistics.median(a) - statistics.median(b))
    hits = 0
    for _ in range(draws):
        deal.shuffle(pool)
        hits += abs(statistics.median(pool[:len(a)]) - statistics.median(pool[len(a):])) >= far - 1e-12
    return hits / draws


def alternate_rounds(variants: dict[str, Step], time_loop: Callable[[Callable[[], None]], float],
                     rounds: int, steps: int) -> dict[str, list[float]]:
    """Milliseconds per step of each variant in each round: `time_loop` times `steps` steps back
    to back; the variants take turns."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name in turns(list(variants), rounds):
        step = variants[name]

        def loop(step=step) -> None:
            for _ in range(steps):
                step()
        times[name].append(time_loop(loop) / steps)
    return times


def interleave(steps: dict[str, Step], rounds: int, iters: int, mark: Callable[[], Any], watch=None) -> dict:
    """Per variant, per round, the marks around its iterations: `mark()` (a recorded CUDA event)
    before the round and after each iteration. The variants take turns; `watch` (begin(name),
    end(name)) sees each round begin and end."""
    marks: dict[str, list[list[Any]]] = {name: [] for name in steps}
    for name in turns(list(steps), rounds):
        if watch:
            watch.begin(name)
        step, held = steps[name], [mark()]
        for _ in range(iters):
            step()
            held.append(mark())
        marks[name].append(held)
        if watch:
            watch.end(name)
    return marks


def cuda_mark() -> Any:
    """A CUDA event recorded now on the current stream: interleave's mark."""
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def iteration_ms(marks: dict) -> dict[str, list[list[float]]]:
    """Milliseconds of every iteration, from the marks of interleave() (once they completed)."""
    return {name: [[a.elapsed_time(b) for a, b in zip(held, held[1:])] for held in rounds]
            for name, rounds in marks.items()}


def median_iteration_ms(steps: dict[str, Step], rounds: int, iters: int) -> dict[str, float]:
    """Median milliseconds per iteration of each step, the steps taking turns (interleave)."""
    import torch

    marks = interleave(steps, rounds, iters, cuda_mark)
    torch.cuda.synchronize()
    return {n: statistics.median(t for r in per_round for t in r) for n, per_round in iteration_ms(marks).items()}


def median_ms(run: Callable[[], None], warmup: int = 3, repeats: int = 10) -> float:
    """Median CUDA-event milliseconds of run() on torch's current stream, after `warmup` calls."""
    import torch

    from ucudnn.execute import gpu

    stream = torch.cuda.current_stream().cuda_stream
    gpu.time_calls(run, warmup, stream)
    return statistics.median(gpu.time_calls(run, repeats, stream))


def host_profile(step: Callable[[], None], iterations: int, top: int = 30,
                 orders: tuple[str, ...] = ("tottime", "cumulative")) -> tuple[list[float], str]:
    """`iterations` calls of `step` under cProfile: each call's host seconds, and the top functions
    by each of `orders` (own time, cumulative time) as text."""
    import cProfile
    import io
    import pstats
    import time

    profiler, host = cProfile.Profile(), []
    for _ in range(iterations):
        began = time.perf_counter()
        profiler.runcall(step)
        host.append(time.perf_counter() - began)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    for order in orders:
        stats.sort_stats(order).print_stats(top)
    return host, out.getvalue()


def first_line(error: Exception) -> str:
    """An error's first line, whole: torch's out-of-memory message goes on to say what torch held
    and what it reserved unused."""
    return str(error).splitlines()[0][:600]
