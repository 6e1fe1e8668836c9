"""Whole models where memory is short: torch against ucudnn.torch, each variant a fresh process.

For each model (torchvision, torchaudio and timm models nobody here wrote; training steps with
SGD and, for AMP, a gradient scaler):
1. `need`: a process converts the model with every convolution through ucudnn at zero workspace,
   plans it, then takes torch's peak allocated bytes over three steps, plus what the process
   came to hold outside torch's allocator (CUDA context growth, cuDNN and its kernels' code,
   CuPy, graphs): what the model needs.
2. Each variant in a fresh process: a blocker first, leaving `need` + L free (none for `free`),
   then the model, so that torch's benchmark mode meets the pressure too; --iters steps, each
   timed on the host after a device sync (the first steps' planning included), the steady time
   the median of the last 8 by CUDA events. Variants: `free` (torch, no blocker), `torch`,
   `control` (torch again: the A/A control), `ucudnn` (`convert(model)`, its defaults), `wd`
   (`convert(model, optimizer="wd", total_limit="auto")`) and `classes` (an experiment on flushes:
   ucudnn with its workspaces borrowed in a few sizes, borrow_in_classes; in the log, not the table).
3. ucudnn's variants then take one more step's gradients through ucudnn and through torch's own
   layers (the classes put back) on the same weights and batch, and compare them; `--explain`
   prints per kernel the room its moment left, ucudnn's limit and plan, and torch's kernel
   timed under that pressure and as it ran in the step (its layer's observed calls: the backward
   kernels together).

    PYTHONPATH=. python3 bench/pressure.py --out OUT [--models wav2vec2,fcn_resnet50,r3d_18:128MiB+512MiB,...]
        [--limits 64MiB,512MiB] [--iters 20] [--need MODEL=BYTES,...] [--profile] [--profile-planning N] [--profile-steady N] [--variants free,torch,control,ucudnn,wd] [--explain]

Writes OUT/pressure.json (every process's result) and OUT/pressure.md (the table) after each model.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ALLOC_CONF, MiB, child_env, outside_pool_bytes

STEADY = 8  # the last iterations whose median is the steady time
PHASE = ["start"]  # what a child process was doing, for its error
UCUDNN_VARIANTS = {"ucudnn": {}, "wd": dict(optimizer="wd", total_limit="auto"), "classes": {}}
TORCH_VARIANTS = ("free", "torch", "control")

# name -> (builder, batch, precision, input shape per sample, channels_last, loss)
MODELS = {
    "fcn_resnet50": ("torchvision.models.segmentation:fcn_resnet50", 8, "amp", (3, 512, 512), True),
    "wav2vec2": ("torchaudio.models:wav2vec2_base", 16, "fp32", (128000,), False),
    "r3d_18": ("torchvision.models.video:r3d_18", 8, "amp", (3, 16, 112, 112), False),
    "fpn_resnet50": ("torchvision.models.detection.backbone_utils:resnet_fpn_backbone", 4, "amp", (3, 640, 640), True),
    "efficientnet_b0": ("timm:efficientnet_b0", 64, "amp", (3, 224, 224), True),
    "densenet121": ("torchvision.models:densenet121", 32, "fp32", (3, 224, 224), False),
    "resnet50": ("timm:resnet50", 32, "amp", (3, 224, 224), True),
}


# --- one process ----------------------------------------------------------------------------------

def size_class(nbytes: int, divisions: int = 4) -> int:
    """`nbytes` rounded up to one of `divisions` steps per power of two (320 MiB for 303 or 311)."""
    if nbytes <= 2**21:
        return nbytes
    step = (1 << (nbytes - 1).bit_length()) // 2 // divisions
    return -(-nbytes // step) * step


def borrow_in_classes() -> None:
    """The `classes` variant, an experiment on flushes: ucudnn's workspaces borrowed in a few sizes
    (size_class), so that the block one leaves in torch's cache can hold the next kernel's instead
    of splitting the pool into holes of many sizes; the exact size where the class cannot be had."""
    from ucudnn.integrations.torch.kernels import TorchFramework

    exact = TorchFramework.borrow

    def borrow(self, nbytes, device):
        try:
            return exact(self, size_class(nbytes), device)[:nbytes]
        except MemoryError:
            return exact(self, nbytes, device)
    TorchFramework.borrow = borrow


def build(name: str, device):
    """The model (training mode, no pretrained weights) and a batch of its input."""
    import importlib

    import torch

    where, batch, precision, sample, channels_last = MODELS[name]
    module, builder = where.split(":")
    make = None if module == "timm" else getattr(importlib.import_module(module), builder)
    if name == "fcn_resnet50":
        model = make(weights=None, weights_backbone=None, aux_loss=False)
    elif name == "fpn_resnet50":
        model = make(backbone_name="resnet50", weights=None, trainable_layers=5)
    elif name == "wav2vec2":
        model = make().feature_extractor
    elif module == "timm":
        model = importlib.import_module("timm").create_model(builder, pretrained=False)
    else:
        model = make(weights=None)
    model = model.to(device).train()
    torch.manual_seed(0)
    x = torch.randn(batch, *sample, device=device)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    return model, x, precision == "amp"


def loss_of(out):
    """A scalar from whatever the model returns: the mean square of every floating output."""
    import torch

    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return sum(loss_of(o) for o in out if not torch.is_tensor(o) or o.is_floating_point())
    return out.float().pow(2).mean()


def forward(model, x, name: str):
    return model(x, None)[0] if name == "wav2vec2" else model(x)


def trainer(model, x, name: str, amp: bool):
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = loss_of(forward(model, x, name))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return step


def gradients(model, x, name: str, amp: bool):
    """One step's parameter gradients as one float64 vector (loss scaled by 1024 under AMP, as a
    gradient scaler would, so that fp16 gradients do not vanish), with the random generators
    seeded first, so that dropout draws the same masks each time."""
    import torch

    torch.manual_seed(1)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        loss = loss_of(forward(model, x, name)) * (1024.0 if amp else 1.0)
    loss.backward()
    grads = [p.grad.detach().double().flatten().cpu() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return torch.cat(grads)  # on the host: a second pass under the blocker has no room for it


def as_torch(model):
    """Put torch's own layer classes back on a converted model; the (layer, converted class) pairs."""
    from ucudnn.integrations.torch.layers import Converted

    swapped = [(m, type(m)) for m in model.modules() if isinstance(m, Converted)]
    for m, cls in swapped:
        m.__class__ = cls.torch_class
    return swapped


def blocker(device, leave: int):
    """A tensor holding all but `leave` bytes of what is free now."""
    import torch

    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info(device)[0]
    if free <= leave:
        raise ValueError(f"{free / MiB:.0f} MiB free, cannot leave {leave / MiB:.0f} MiB")
    return torch.empty((free - leave) // (2 * MiB) * 2 * MiB, dtype=torch.uint8, device=device)


def alloc_retries(device) -> int:
    """How often torch's allocator has given its whole cache back and retried an allocation so far
    (ucudnn's own reading of it, TorchFramework.flushes)."""
    from ucudnn.integrations.torch import TorchFramework

    return TorchFramework.flushes(device)


def run_need(args) -> dict:
    """The model's tensors' peak with every convolution at zero workspace, planned, and what the
    process holds outside torch's allocator beyond its start."""
    import torch

    import ucudnn.torch as ut

    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.empty(1, device=device)
    start_outside = outside_pool_bytes(device)
    model, x, amp = build(args.model, device)
    # undivided: at zero workspace micro-batching changes no tensor, and a sweep of one size is the
    # cheapest (every size of efficientnet_b0's 243 kernels took over 300 s)
    ut.convert(model, workspace_limit=0, delegate=False, policy="undivided", cache_path=args.cache)
    step = trainer(model, x, args.model, amp)
    step()
    ut.context_of(model).plan_pending()
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    peak, held = torch.cuda.max_memory_allocated(device), outside_pool_bytes(device) - start_outside
    return dict(peak_mib=peak / MiB, outside_mib=held / MiB, need=peak + held)


def run_variant(args) -> dict:
    import torch

    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.empty(1, device=device)
    wall = None if args.variant == "free" else blocker(device, args.need + args.limit)  # held to the end
    PHASE[0] = "build"
    model, x, amp = build(args.model, device)
    result = dict(blocker_mib=0 if wall is None else wall.numel() / MiB)
    if args.variant in UCUDNN_VARIANTS:
        import ucudnn.torch as ut

        ut.convert(model, cache_path=args.cache, **UCUDNN_VARIANTS[args.variant])
        if args.variant == "classes":
            borrow_in_classes()
    step = trainer(model, x, args.model, amp)
    host, events, outside_mib, retries = [], [], [], []  # per iteration: host s, CUDA events, outside MiB, retries so far
    if args.profile_planning and args.variant in UCUDNN_VARIANTS:  # its first iterations, where it plans
        PHASE[0] = "planning profile"
        result["planning_host_s"], result["planning_profile"] = host_profile(step, args.profile_planning)
    for i in range(args.iters):
        PHASE[0] = f"iteration {i + 1}"
        began = time.perf_counter()
        pair = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        pair[0].record()
        step()
        pair[1].record()
        torch.cuda.synchronize()
        host.append(time.perf_counter() - began)
        events.append(pair)
        outside_mib.append(outside_pool_bytes(device) / MiB)  # what planning loads beside torch's pool (kernels' code, handles)
        retries.append(alloc_retries(device))
    ms = [a.elapsed_time(b) for a, b in events]
    result.update(iteration_ms=ms, steady_ms=statistics.median(ms[-STEADY:]), first_s=sum(host),
                  peak_mib=torch.cuda.max_memory_allocated(device) / MiB, outside_mib=outside_pool_bytes(device) / MiB,
                  retries=alloc_retries(device), outside_by_iteration=outside_mib,
                  retries_by_iteration=retries,
                  convolutions=sum(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules()))
    result["reserved_mib"] = torch.cuda.memory_reserved(device) / MiB
    # what the steps could still have had: at most need + L where the blocker holds
    result["free_at_end_mib"] = (torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
                                 - torch.cuda.memory_allocated(device)) / MiB
    if args.variant in UCUDNN_VARIANTS:
        PHASE[0] = "retries by kernel"
        result["flushes"] = flushes_by_kernel(step, device)
    if args.profile_steady:  # after the timed steps: where a steady step's host time goes
        PHASE[0] = "steady profile"
        result["steady_host_s"], result["steady_profile"] = host_profile(step, args.profile_steady)
    if args.trace_flushes:
        PHASE[0] = "flush trace"
        result["flush_trace"] = flush_trace(step, device)
    if args.profile:
        PHASE[0] = "profile"
        try:
            result["profile"] = top_kernels(step)
        except torch.cuda.OutOfMemoryError as exc:  # the profiler's own device buffers come from the headroom
            result["profile_error"] = oom_message(exc)
    PHASE[0] = "gradient check"
    if args.variant in UCUDNN_VARIANTS or args.variant == "control":
        try:
            result.update(gradient_check(model, x, args, amp))
        except torch.cuda.OutOfMemoryError as exc:  # the check's extra pass, not the training step
            result["gradient_error"] = oom_message(exc)
    if args.variant in UCUDNN_VARIANTS:
        import ucudnn.torch as ut
        from ucudnn.integrations.torch.layers import Converted

        summary = ut.context_of(model).summary()
        result.update(kernels=summary["kernels"], shrinks=summary["shrinks"], runs=summary["runs"],
                      planning_s=summary["planning_s"], pending=summary["pending"],
                      flush_watch=summary.get("flush_watch"),
                      converted=sum(isinstance(m, Converted) for m in model.modules()))
    return result


def flush_trace(step, device, frames: int = 6) -> list[dict]:
    """One more step under torch's memory history: each flush (the allocator unmapping its free
    cached pages to serve an allocation), with the allocation that set it off (its bytes, the
    step's Python frames nearest to it) and the bytes it gave back."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    try:
        step()
        torch.cuda.synchronize()
        trace = torch.cuda.memory._snapshot()["device_traces"][device.index or 0]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    flushes, given_back = [], 0
    for entry in trace:
        if entry["action"] in ("segment_unmap", "segment_free"):
            given_back += entry["size"]
        elif entry["action"] == "alloc" and given_back:
            where = [f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in entry.get("frames", [])
                     if f["filename"].endswith(".py") and "/torch/" not in f["filename"]][:frames]
            flushes.append(dict(bytes=entry["size"], given_back=given_back, where=where))
            given_back = 0
    return flushes


def flushes_by_kernel(step, device) -> dict:
    """One more step with each of ucudnn's kernel runs watched (Planner.run: the workspace borrowed
    from torch's pool, a shrink where it cannot be had): per kernel (its description, as
    summary() names it), how many times running it made the allocator give its whole cache back
    and retry (alloc_retries), and the step's retries in all (those outside ucudnn's kernels
    included)."""
    import torch

    from ucudnn.plan.planner import Planner

    by_kernel: dict[str, int] = {}
    run = Planner.run

    def watched(planner, site, kind, x, w, y):
        before = alloc_retries(device)
        written = run(planner, site, kind, x, w, y)
        name = site.call.problem(kind).describe()
        by_kernel[name] = by_kernel.get(name, 0) + alloc_retries(device) - before
        return written

    before = alloc_retries(device)
    Planner.run = watched
    try:
        step()
        torch.cuda.synchronize()
    finally:
        Planner.run = run
    return dict(by_kernel=by_kernel, step=alloc_retries(device) - before)


def oom_message(exc: Exception) -> str:
    """An error's first line, whole: torch's out-of-memory message goes on to say what torch held
    and what it reserved unused."""
    return str(exc).splitlines()[0][:600]


def top_kernels(step, steps: int = 3, top: int = 15) -> dict:
    """Over `steps` steps under torch.profiler: the GPU kernels taking the most time (name, ms
    per step, launches per step), and the convolution ops by input shapes taking the most GPU
    time (which layer runs a slow kernel)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.key_averages() if e.device_type.name == "CUDA"),
                     key=lambda e: -e.self_device_time_total)
    ops = sorted((e for e in prof.key_averages(group_by_input_shape=True) if "convolution" in e.key),
                 key=lambda e: -e.device_time_total)
    return dict(kernels=[(e.key[:90], e.self_device_time_total / 1e3 / steps, e.count / steps) for e in kernels[:top]],
                convolutions=[(f"{e.key} {e.input_shapes}"[:160], e.device_time_total / 1e3 / steps, e.count / steps)
                              for e in ops[:top]])


def host_profile(step, iterations: int, top: int = 30) -> tuple[list, str]:
    """`iterations` steps under cProfile: the top functions by their own time and by cumulative
    time, as text, and the steps' host seconds."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    host = []
    for _ in range(iterations):
        began = time.perf_counter()
        profiler.runcall(step)
        host.append(time.perf_counter() - began)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return host, out.getvalue()[-16000:]


def gradient_check(model, x, args, amp: bool) -> dict:
    """The relative difference of one step's gradients through the model as it runs and through
    torch's own layers (same weights, same batch); for `control`, torch's against itself."""
    import torch

    mine = gradients(model, x, args.model, amp)
    swapped = as_torch(model)
    try:
        theirs = gradients(model, x, args.model, amp)
    finally:
        for m, cls in swapped:
            m.__class__ = cls
    return dict(gradient_rel=(torch.linalg.vector_norm(mine - theirs) / torch.linalg.vector_norm(theirs)).item())


# --- the parent ----------------------------------------------------------------------------------

def child(args, variant: str, limit: int = 0, need: int = 0, timeout: float = 300, cache: str = "") -> dict:
    """One fresh process; its result, or what went wrong (out of memory included)."""
    out = Path(args.out) / f"pressure-{args.model_now}-{variant}-{limit // MiB}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--child", variant, "--model", args.model_now, "--limit", str(limit),
               "--child-need", str(need), "--iters", str(args.iters), "--cache", cache or args.cache, "--result", str(out)
               ] + (["--profile"] if args.profile else []) + (["--trace-flushes"] if args.trace_flushes else []) \
               + ["--profile-planning", str(args.profile_planning), "--profile-steady", str(args.profile_steady)]
    env = dict(child_env(os.environ), UCUDNN_PROGRESS="0", PYTORCH_CUDA_ALLOC_CONF=args.alloc_conf)
    began = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return dict(variant=variant, limit_mib=limit / MiB, error=f"timed out after {timeout:.0f} s")
    row = json.loads(out.read_text()) if out.exists() else {}
    if done.returncode or not row:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        row["error"] = row.get("error") or " | ".join(tail) or f"exit {done.returncode}"
    return dict(row, variant=variant, limit_mib=limit / MiB, wall_s=time.perf_counter() - began)


def table(rows: list[dict]) -> str:
    """The Markdown table: per model and L, steady ms of each variant and ucudnn's ratios."""
    lines = ["| model | L | torch free | torch | control (A/A) | ucudnn | wd auto | torch / ucudnn | "
             "torch / free | first 20 s: torch, ucudnn | grad rel (ucudnn, A/A) |", "|" + "---|" * 11]
    by = {(r["model"], r["limit_mib"], r["variant"]): r for r in rows}

    def ms(r):
        return "-" if r is None else r.get("error", "")[:60] if "error" in r else f"{r['steady_ms']:.1f}"
    for model in dict.fromkeys(r["model"] for r in rows):
        free = by.get((model, 0.0, "free"))
        for limit in sorted({r["limit_mib"] for r in rows if r["model"] == model and r["limit_mib"]}):
            t, c, u, w = (by.get((model, limit, v)) for v in ("torch", "control", "ucudnn", "wd"))
            ok = lambda r: r is not None and "error" not in r  # noqa: E731
            ratio = f"{t['steady_ms'] / u['steady_ms']:.2f}x" if ok(t) and ok(u) else "-"
            loss = f"{t['steady_ms'] / free['steady_ms']:.2f}x" if ok(t) and ok(free) else "-"
            first = f"{t['first_s']:.1f}, {u['first_s']:.1f}" if ok(t) and ok(u) else "-"
            grads = (f"{u.get('gradient_rel', math.nan):.1e}, {c.get('gradient_rel', math.nan):.1e}"
                     if ok(u) and ok(c) else "-")
            lines.append(f"| {model} | {limit:.0f} MiB | {ms(free)} | {ms(t)} | {ms(c)} | {ms(u)} | {ms(w)} | "
                         f"{ratio} | {loss} | {first} | {grads} |")
    return "\n".join(lines)


def explain(row: dict) -> str:
    """Per kernel of a ucudnn variant: the room its moment left, ucudnn's limit and plan, torch's kernel."""
    lines = ["| kind | kernel | room MiB | limit MiB | ucudnn plan | workspace MiB | predicted ms | torch ms | "
             "torch in the step ms | cuDNN's favourite ms | torch workspace MiB | runs | flushes a step |",
             "|" + "---|" * 13]
    flushes = row.get("flushes", {}).get("by_kernel", {})
    for k in row.get("kernels", []):
        mib = lambda v: "-" if v is None else f"{v / MiB:.0f}"  # noqa: E731
        lines.append(f"| {k['kind']} | {k['kernel'][:60]} | {mib(k.get('room'))} | {mib(k.get('limit'))} | "
                     f"{k.get('configuration', k['via'])} | {mib(k.get('workspace'))} | "
                     f"{k.get('predicted_ms', float('nan')):.3f} | {k.get('own_ms', float('nan')):.3f} | "
                     f"{k.get('in_step_ms', float('nan')):.3f} | {k.get('favourite_ms', float('nan')):.3f} | "
                     f"{mib(k.get('own_workspace'))} | {'torch' if k['delegated'] else k['via']} | "
                     f"{flushes.get(k['kernel'], '-')} |")
    if "flushes" in row:
        lines.append(f"\nThe allocator's retries in one step: {row['flushes']['step']}, "
                     f"{sum(flushes.values())} of them borrowing ucudnn's workspaces.")
    if row.get("flush_watch"):
        watch = row["flush_watch"]
        lines.append(f"The flush watch: {watch['watched']} of {watch['steps']} steps watched; kept as planned "
                     f"although they flushed: {', '.join(k[:60] for k in watch['kept']) or 'none'}.")
    lines += [f"- shrunk: {s['kernel'][:60]}, {s['failed'] / MiB:.0f} -> {s['limit'] / MiB:.0f} MiB ({s.get('why', '?')})"
              for s in row.get("shrinks", [])]
    return "\n".join(lines)


def flush_lines(row: dict) -> str:
    """The flushes of --trace-flushes, one a line."""
    return "\n".join(f"- flush: {f['bytes'] / MiB:.1f} MiB asked, {f['given_back'] / MiB:.0f} MiB given back, "
                     f"at {' < '.join(f['where']) or '?'}" for f in row.get("flush_trace", []))


def plot(row: dict, path: str, title: str) -> None:
    """A ucudnn variant's kernels in planning order: the room each one's moment left, ucudnn's
    limit, the workspace of the plan that runs (ucudnn's, or torch's where the layer is
    delegated), and beneath, torch's time at that moment against ucudnn's predicted time."""
    from matplotlib.figure import Figure

    kernels = row["kernels"]
    x = range(len(kernels))
    figure = Figure(figsize=(max(8, len(kernels) * 0.35), 6.5))
    memory, times = figure.subplots(2, 1, sharex=True)
    mib = lambda key: [(k.get(key) or 0) / MiB for k in kernels]  # noqa: E731
    runs = [k.get("own_workspace", math.nan) / MiB if k["delegated"] or k["via"] != "ucudnn"  # torch's: where timed apart
            else (k.get("workspace") or 0) / MiB for k in kernels]
    memory.bar(x, mib("room"), color="#cfe2f3", label="room: free at its moment, beside its output")
    memory.plot(x, mib("limit"), "k_", markersize=10, label="ucudnn's limit (room less the margin)")
    memory.bar(x, runs, width=0.4, color=["#999999" if k["delegated"] else "#1f77b4" for k in kernels],
               label="workspace of the plan that runs (grey: torch's own, delegated)")
    memory.set_yscale("symlog", linthresh=1)
    memory.set_ylabel("MiB")
    memory.legend(fontsize=7, loc="upper right")
    memory.set_title(title, fontsize=9)
    times.plot(x, [k.get("own_ms", math.nan) for k in kernels], "o", color="#999999",
               label="torch's kernel at that moment, timed apart")
    times.plot(x, [k.get("in_step_ms", math.nan) for k in kernels], "^", color="#999999", fillstyle="none",
               label="torch's kernels in the step (F; BD and BF together)")
    times.plot(x, [k.get("predicted_ms", float("nan")) for k in kernels], "x", color="#1f77b4",
               label="ucudnn's plan (predicted)")
    times.set_yscale("log")
    times.set_ylabel("ms")
    times.legend(fontsize=7)
    times.set_xticks(list(x), [k["kind"] for k in kernels],
                     fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def parent(args) -> None:
    rows, out = [], Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.deadline
    variants = args.variants.split(",")
    for model, limits in args.models:
        args.model_now = model
        if time.perf_counter() > deadline:
            rows.append(dict(model=model, variant="need", limit_mib=0, error="deadline"))
            continue
        Path(args.cache).unlink(missing_ok=True)  # every model's ucudnn plans from a cold database
        need = dict(need=args.need_of[model], given=True, variant="need", limit_mib=0.0) if model in args.need_of else \
            child(args, "need", cache=args.cache + ".need")
        rows.append(dict(need, model=model))
        print(f"{model}: need {need}", flush=True)
        if "error" in need:
            continue
        plan = [("free", 0)] if "free" in variants else []
        for limit in limits:
            plan += [(v, limit) for v in variants if v != "free" and not (v in ("control", "wd") and limit != limits[0])]
        for variant, limit in plan:
            if time.perf_counter() > deadline:
                break
            row = dict(child(args, variant, limit, need["need"]), model=model)
            rows.append(row)
            brief = row.get("error") or f"{row['steady_ms']:.1f} ms, first {args.iters}: {row['first_s']:.1f} s, free at the end {row.get('free_at_end_mib', 0):.0f} MiB"
            print(f"{model} {variant} L={limit // MiB} MiB: {brief}", flush=True)
            if args.explain and variant in UCUDNN_VARIANTS and "error" not in row:
                print(explain(row), flush=True)
            if row.get("flush_trace"):
                print(flush_lines(row), flush=True)
            for name, ms, n in [*row.get("profile", {}).get("kernels", []), *row.get("profile", {}).get("convolutions", [])]:
                print(f"    {ms:8.2f} ms {n:5.0f}x  {name}", flush=True)
            for profile in ("planning_profile", "steady_profile"):
                if profile in row:
                    print(row[profile], flush=True)
        (out / "pressure.json").write_text(json.dumps(rows, indent=1))
        (out / "pressure.md").write_text(table([r for r in rows if r["variant"] != "need"]) + "\n")
    print(table([r for r in rows if r["variant"] != "need"]))


def main(argv=None) -> None:
    from ucudnn.plan.config import parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="out")
    p.add_argument("--models", default="wav2vec2,fcn_resnet50,r3d_18,fpn_resnet50,efficientnet_b0,densenet121")
    p.add_argument("--limits", default="64MiB,512MiB")
    p.add_argument("--variants", default="free,torch,control,ucudnn,wd")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--cache", default="/tmp/pressure-cache.db")
    p.add_argument("--deadline", type=float, default=3000)
    p.add_argument("--explain", action="store_true", help="print each ucudnn variant's kernels")
    p.add_argument("--need", dest="need_of", default="",
                   help="MODEL=BYTES,...: a need measured before (a `need` row), not measured again")
    p.add_argument("--profile", action="store_true", help="each variant's top GPU kernels and convolutions over 3 steps")
    p.add_argument("--trace-flushes", action="store_true",
                   help="one more step under torch's memory history: each flush and the allocation behind it")
    p.add_argument("--profile-planning", type=int, default=0, metavar="N",
                   help="ucudnn's variants: their first N iterations under cProfile (before the timed ones)")
    p.add_argument("--profile-steady", type=int, default=0, metavar="N",
                   help="every variant: N more iterations under cProfile after the timed ones")
    p.add_argument("--alloc-conf", default=ALLOC_CONF, help="PYTORCH_CUDA_ALLOC_CONF of every process")
    p.add_argument("--plot", nargs=2, metavar=("RESULT_JSON", "PNG"),
                   help="draw a ucudnn variant's result (a pressure-*.json) as a timeline, and stop")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--child-need", dest="need", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.variant = args.child
        try:
            result = run_need(args) if args.child == "need" else run_variant(args)
        except Exception as exc:  # out of memory and the like are results here, with where they happened
            import traceback

            frames = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_tb(exc.__traceback__)]
            result = dict(error=f"{type(exc).__name__}: {oom_message(exc)}", at=" < ".join(frames[::-1][:8]),
                          phase=PHASE[0])
        Path(args.result).write_text(json.dumps(result))
        return
    if args.plot:
        row = json.loads(Path(args.plot[0]).read_text())
        plot(row, args.plot[1], f"{Path(args.plot[0]).stem}: {row['steady_ms']:.1f} ms a step")
        return
    limits = [parse_size(v) for v in args.limits.split(",")]
    args.models = [(model, [parse_size(v) for v in own.split("+")] if own else limits)  # MODEL:L+L: its own limits
                   for model, _, own in (entry.partition(":") for entry in args.models.split(","))]
    args.need_of = {m: int(b) for m, _, b in (e.partition("=") for e in args.need_of.split(",") if e)}
    parent(args)


if __name__ == "__main__":
    main()
