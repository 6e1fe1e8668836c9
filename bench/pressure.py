"""Whole models where memory is short: torch against ucudnn.torch, each variant a fresh process.

For each model (torchvision, torchaudio, timm and MONAI models nobody here wrote; training steps with
SGD and, for AMP, a gradient scaler):
1. `need`: the model's tensors' peak with every convolution at zero workspace (a process
   converts it so, plans it, then takes torch's peak allocated bytes over three steps), plus what
   torch's own process holds outside its allocator (the `free` process: free before the model,
   less free after its steps, less torch's reserved bytes: cuDNN's handle, its kernels' code).
   What ucudnn's process holds beside the pool (its handle, graphs, kernels' code) is not in it:
   that must fit in L like the workspaces (docs/results.md, "Training wherever the tensors fit").
2. Each variant in a fresh process: a blocker first, leaving `need` + L free (none for `free`),
   then the model, so that torch's benchmark mode meets the pressure too; --iters steps, each
   timed on the host after a device sync (the first steps' planning included), the steady time
   the median of the last 8 by CUDA events. Variants: `free` (torch, no blocker), `torch`,
   `control` (torch again: the A/A control), `ucudnn` (`convert(model)`, its defaults), `wd`
   (`convert(model, optimizer="wd", total_limit="auto")`), `imported`, `swapped` and its A/A
   `swapped_control` (SWAPS).
   With --rounds N each variant runs N processes at each limit, the variants taking turns; the
   table gives their median and range. Every process also times a tiny kernel's launch on its
   host before and after its steps (`launch_us`): how fast a host it met.
3. ucudnn's variants (and `control`) then take one step's gradients from the weights they were
   built with, through ucudnn and through torch's own layers (the classes put back), and, with the
   blocker given back, through torch's layers in float64: the table gives their difference and
   each one's error against float64; `--explain` prints ucudnn.reports.kernels' table of what
   each kernel's moment left and what ran there.

    PYTHONPATH=. python3 bench/pressure.py --out OUT [--models wav2vec2,r3d_18:128MiB+512MiB,...]
        [--limits 0,64MiB,512MiB] [--iters 40] [--rounds 1] [--need MODEL=BYTES,...] [--variants ...] [--explain]

Writes OUT/pressure.json (every process's result) and OUT/pressure.md (the table) after each model.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import (
    ALLOC_CONF,
    MiB,
    block,
    chance,
    child_env,
    first_line,
    host_profile,
    relative_error,
    training_step,
    turns,
)
from ucudnn.reports import kernels

STEADY = 8  # the last iterations whose median is the steady time
FIRST_20 = lambda row: sum(row["iteration_ms"][:20]) / 1e3  # noqa: E731 - planning's cost: the first 20 iterations' s
PHASE = ["start"]  # what a child process was doing, for its error
SO_FAR: dict = {}  # a child's per-iteration record so far, kept with its error
UCUDNN_VARIANTS = {"ucudnn": {}, "wd": dict(optimizer="wd", total_limit="auto")}
# converted as `ucudnn`; from this share of the steps on, the layers' classes cycle through the
# pattern (u: ucudnn's; t and T: torch's). `imported`: torch's from the first step, nothing planned
# (what ucudnn's process costs torch's layers); `swapped`: after half, planning done, both in turns,
# ABBA so that neither gains from going first (the layers' cost within one process, free of the
# spread between processes: docs/results.md); `swapped_control`: its A/A, torch's classes in both arms
SWAPS = {"imported": (0.0, "t"), "swapped": (0.5, "tuut"), "swapped_control": (0.5, "tTTt")}
TORCH_VARIANTS = ("free", "torch", "control")

# name -> (builder, batch, precision, input shape per sample, channels_last, the builder's keywords).
# unet3d: MONAI's 3-D segmentation UNet (strided Conv3d down, ConvTranspose3d up; its wheel travels
# in .whl/, docs/gpu.md) on 96^3 patches; convtasnet: torchaudio's speech separation (Conv1d,
# depthwise and dilated, a ConvTranspose1d decoder) on 4 s at 8 kHz.
TORCHVISION = dict(weights=None)
MODELS = {
    "fcn_resnet50": ("torchvision.models.segmentation:fcn_resnet50", 8, "amp", (3, 512, 512), True,
                     dict(weights=None, weights_backbone=None, aux_loss=False)),
    "wav2vec2": ("torchaudio.models:wav2vec2_base", 16, "fp32", (128000,), False, {}),
    "r3d_18": ("torchvision.models.video:r3d_18", 8, "amp", (3, 16, 112, 112), False, TORCHVISION),
    "fpn_resnet50": ("torchvision.models.detection.backbone_utils:resnet_fpn_backbone", 4, "amp", (3, 640, 640), True,
                     dict(backbone_name="resnet50", weights=None, trainable_layers=5)),
    "efficientnet_b0": ("timm:efficientnet_b0", 64, "amp", (3, 224, 224), True, {}),
    "densenet121": ("torchvision.models:densenet121", 32, "fp32", (3, 224, 224), False, TORCHVISION),
    "resnet50": ("timm:resnet50", 32, "amp", (3, 224, 224), True, {}),
    "unet3d": ("monai.networks.nets:UNet", 2, "amp", (1, 96, 96, 96), False,
               dict(spatial_dims=3, in_channels=1, out_channels=3, channels=(32, 64, 128, 256, 320),
                    strides=(2, 2, 2, 2), num_res_units=2)),
    "convtasnet": ("torchaudio.models:conv_tasnet_base", 4, "fp32", (1, 32000), False, dict(num_sources=2)),
}


# --- one process ----------------------------------------------------------------------------------

def build(name: str, device, batch: int | None = None):
    """The model (training mode, no pretrained weights) and a batch of its input (`batch`
    samples; default: the model's own, MODELS)."""
    import importlib

    import torch

    where, own_batch, precision, sample, channels_last, keywords = MODELS[name]
    batch = batch or own_batch
    module, builder = where.split(":")
    if module == "timm":
        model = importlib.import_module("timm").create_model(builder, pretrained=False)
    else:
        model = getattr(importlib.import_module(module), builder)(**keywords)
    if name == "wav2vec2":
        model = model.feature_extractor
    model = model.to(device).train()
    torch.manual_seed(0)
    x = torch.randn(batch, *sample, device=device)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    return model, x, precision == "amp"


def loss_of(out):
    """A scalar from whatever the model returns: the mean square of every floating output."""
    import torch

    out = list(out.values()) if isinstance(out, dict) else out
    if isinstance(out, (tuple, list)):
        return sum(loss_of(o) for o in out if not torch.is_tensor(o) or o.is_floating_point())
    return out.to(torch.promote_types(out.dtype, torch.float32)).pow(2).mean()  # float64 stays float64


def forward(model, x, name: str):
    return model(x, None)[0] if name == "wav2vec2" else model(x)


def trainer(model, x, name: str, amp: bool):
    """A training step (bench.common.training_step) on the mean square of the model's outputs."""
    return training_step(model, x, None, amp, loss=lambda model, x, _: loss_of(forward(model, x, name)), lr=1e-4)


def gradients(model, x, name: str, amp: bool, scale: float = 1.0):
    """One step's parameter gradients as one float64 vector (loss times `scale`, as a gradient
    scaler's, so that fp16 gradients do not vanish), with the random generators seeded first."""
    import torch

    torch.manual_seed(1)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        loss = loss_of(forward(model, x, name)) * scale
    loss.backward()
    grads = [p.grad.detach().double().flatten().cpu() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return torch.cat(grads)  # on the host: a second pass under the blocker has no room for it


def as_torch(model) -> None:
    """Put torch's own layer classes back on a converted model, for good."""
    from ucudnn.integrations.torch.layers import Converted

    for m in [m for m in model.modules() if isinstance(m, Converted)]:
        m.__class__ = type(m).torch_class


def arm(variant: str, i: int, iters: int) -> str:
    """Whose classes a SWAPS variant's iteration `i` (of `iters`) runs: "u" (ucudnn's) before
    its share of the steps, then its pattern's letters in turn."""
    share, pattern = SWAPS[variant]
    start = round(share * iters)
    return "u" if i < start else pattern[(i - start) % len(pattern)]


def in_one_process(row: dict) -> float:
    """A `swapped` process's torch / ucudnn (`swapped_control`'s torch / torch): the median of its
    ms ratios of an iteration of the turn's first arm to one of its second, paired within each turn
    (t u u t) so that both or neither of a pair follow a change of classes (a step right after one
    can run slower either way: docs/results.md): the first t with the second u, the second t with
    the first u; drift cancels, one pair's t going first, the other's u."""
    ms, arms, pattern = row["iteration_ms"], row["arms"], SWAPS[row["variant"]][1]
    assert pattern == pattern[0] + pattern[1] * 2 + pattern[0], f"{pattern}: the pairs below are those of a turn ABBA"
    start = arms.index(pattern[0])
    turns = range(start, len(arms) - 3, 4)
    return statistics.median([ms[i] / ms[i + 2] for i in turns] + [ms[i + 3] / ms[i + 1] for i in turns])


def machine_order(log: str = "/tmp/ucudnn-pressure-processes") -> int:
    """How many processes of this script ran on this machine before this one (a line each in
    `log`): a first iteration may pay for caches the machine's first GPU process fills (cuDNN's
    and the driver's), so a row says where it came."""
    with open(log, "a+") as f:
        f.seek(0)
        before = len(f.readlines())
        f.write(f"{os.getpid()}\n")
    return before


def launch_us(batches: int = 5, launches: int = 400) -> float:
    """µs the host takes to launch a tiny kernel (the median of `batches`, each of `launches`,
    fewer than the launch queue holds, synchronized between): how fast a host this process met."""
    import torch

    x = torch.zeros(1, device="cuda")
    each = []
    for _ in range(batches):
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(launches):
            x.add_(1)
        each.append((time.perf_counter() - began) / launches * 1e6)
    torch.cuda.synchronize()
    return statistics.median(each)


def run_need(args) -> dict:
    """The model's tensors' peak with every convolution at zero workspace, planned (`peak`), and,
    for the record, what this ucudnn process came to hold outside torch's allocator."""
    import torch

    import ucudnn.torch as ut
    from ucudnn.integrations.torch import TorchPool as Torch

    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.empty(1, device=device)
    start_outside = Torch.outside_bytes(device)
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
    peak, held = torch.cuda.max_memory_allocated(device), Torch.outside_bytes(device) - start_outside
    return dict(peak_mib=peak / MiB, ucudnn_outside_mib=held / MiB, peak=peak)


def run_variant(args) -> dict:
    import torch

    from ucudnn.integrations.torch import TorchPool as Torch

    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.empty(1, device=device)
    result: dict = {"blocker_mib": 0, "machine_order": machine_order()}
    free_before = torch.cuda.mem_get_info(device)[0]
    wall = None if args.variant == "free" else block(device, args.need, args.limit, result)  # held to the end
    PHASE[0] = "build"
    model, x, amp = build(args.model, device)
    checked = args.variant in UCUDNN_VARIANTS or args.variant == "control"  # its gradients checked at the end
    # every variant takes it, so that torch and its A/A control run the same process (the copy starts a CPU thread pool)
    initial = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if args.variant in UCUDNN_VARIANTS or args.variant in SWAPS:
        import ucudnn.torch as ut
        from ucudnn.integrations.torch.layers import Converted

        ut.convert(model, cache_path=args.cache, **UCUDNN_VARIANTS.get(args.variant, {}))
        layers = [m for m in model.modules() if isinstance(m, Converted)]
    arms = ""  # a SWAPS variant's classes by iteration (arm)
    step = trainer(model, x, args.model, amp)
    launch = [launch_us()]
    host, events, outside_mib, retries = [], [], [], []  # per iteration: host s, CUDA events, outside MiB, retries so far
    usage = [_usage()]  # after each iteration: where the host's time went (_usage)
    for i in range(args.iters):
        PHASE[0] = f"iteration {i + 1}"
        if args.variant in SWAPS:  # ucudnn's arm: the classes it left (a retired layer: torch's, Context.retire)
            if arms[-1:] in ("", "u"):
                left = [(m, type(m)) for m in layers]
            arms += arm(args.variant, i, args.iters)
            for m, cls in left:
                m.__class__ = cls if arms[-1] == "u" else getattr(cls, "torch_class", cls)
        began = time.perf_counter()
        pair = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        pair[0].record()
        step()
        pair[1].record()
        torch.cuda.synchronize()
        host.append(time.perf_counter() - began)
        events.append(pair)
        outside_mib.append(Torch.outside_bytes(device) / MiB)  # what planning loads beside torch's pool (kernels' code, handles)
        retries.append(Torch.flushes(device))
        SO_FAR.update(host_s=host, outside_by_iteration=outside_mib, retries_by_iteration=retries)
        usage.append(_usage())
    ms = [a.elapsed_time(b) for a, b in events]
    if args.variant == "free":  # what torch's own process holds outside its pool: part of the need
        result["torch_outside"] = free_before - torch.cuda.mem_get_info(device)[0] - torch.cuda.memory_reserved(device)
    launch.append(launch_us())
    result.update(launch_us=launch, arms=arms or None)
    result["steady_host"] = {k: (usage[-1][k] - usage[-1 - STEADY][k]) / STEADY for k in usage[0]}
    result["threads"] = [len(os.listdir("/proc/self/task")), threading.active_count()]  # the OS's, Python's
    result.update(iteration_ms=ms, steady_ms=statistics.median(ms[-STEADY:]), first_s=sum(host),
                  outside_by_iteration=outside_mib, retries_by_iteration=retries,
                  convolutions=sum(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules()),
                  # what the steps could still have had: at most need + L where the blocker holds
                  free_at_end_mib=(torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
                                   - torch.cuda.memory_allocated(device)) / MiB)
    if args.variant in UCUDNN_VARIANTS:
        PHASE[0] = "retries by kernel"
        result["flushes"] = flushes_by_kernel(step, device)
    if args.profile_steady:  # after the timed steps: where a steady step's host time goes
        PHASE[0] = "steady profile"
        result["steady_host_s"], result["steady_profile"] = host_profile(step, args.profile_steady)
    if args.profile:
        PHASE[0] = "profile"
        try:
            result["profile"] = top_kernels(step)
        except torch.cuda.OutOfMemoryError as exc:  # the profiler's own device buffers come from the headroom
            result["profile_error"] = first_line(exc)
    if args.variant in UCUDNN_VARIANTS:
        import ucudnn.torch as ut
        from ucudnn.execute.graphs import GRAPH_MEMORY
        from ucudnn.integrations.torch.layers import Converted

        context = ut.context_of(model)
        summary = context.summary()
        result.update(graph_mib=GRAPH_MEMORY.held / MiB, graph_budget=GRAPH_MEMORY.budget, pressed=context.planner.pressed)
        result.update(kernels=summary["kernels"], shrinks=summary["shrinks"], runs=summary["runs"],
                      planning_s=summary["planning_s"], pending=summary["pending"],
                      flush_watch=summary.get("flush_watch"),
                      retired=summary["retired"],  # converted, then torch's class again (Context.retire)
                      converted=sum(isinstance(m, Converted) for m in model.modules()) + summary["retired"])
    PHASE[0] = "gradient check"
    if checked:
        def release():
            nonlocal wall
            wall = None
            torch.cuda.empty_cache()
        try:
            model.load_state_dict(initial)  # trained weights may have diverged (fpn_resnet50's loss: nan)
            result.update(gradient_check(model, x, args, amp, release))
        except torch.cuda.OutOfMemoryError as exc:  # the check's extra passes, not the training step
            result["gradient_error"] = first_line(exc)
    return result


def _usage() -> dict:
    """The process's clocks, to tell a slow host from a busy one: wall, its CPU (every thread's) and
    its main thread's seconds, and its involuntary context switches (preempted)."""
    return dict(wall_s=time.perf_counter(), cpu_s=time.process_time(), main_s=time.thread_time(),
                preempted=resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw)


def flushes_by_kernel(step, device) -> dict:
    """One more step with each of ucudnn's kernel runs watched (Planner.run): per kernel (as
    summary() names it), the allocator's flushes running it made (TorchPool.flushes), and the
    step's in all (those outside ucudnn's kernels included)."""
    import torch

    from ucudnn.integrations.torch import TorchPool
    from ucudnn.plan.planner import Planner

    flushes = TorchPool.flushes
    by_kernel: dict[str, int] = {}
    run = Planner.run

    def watched(planner, site, kind, x, w, y):
        before = flushes(device)
        written = run(planner, site, kind, x, w, y)
        name = site.call.problem(kind).describe()
        by_kernel[name] = by_kernel.get(name, 0) + flushes(device) - before
        return written

    before = flushes(device)
    Planner.run = watched
    try:
        step()
        torch.cuda.synchronize()
    finally:
        Planner.run = run
    return dict(by_kernel=by_kernel, step=flushes(device) - before)


def top_kernels(step, steps: int = 3, top: int = 15) -> dict:
    """Over `steps` steps under torch.profiler: the GPU kernels taking the most time (name, ms and
    launches per step), and the convolution ops by input shapes (which layer runs a slow kernel)."""
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


def gradient_check(model, x, args, amp: bool, release) -> dict:
    """One step's gradients (from the initial weights, dropout off) through the model as it runs
    (`mine`) and through torch's own layers (`theirs`; for `control`, torch's against itself):
    their relative difference, and each one's relative error against the step in float64 through
    torch's layers after `release()` gave the blocker back, and under AMP torch's in float32's too
    (is the error AMP's or the model's?). That error decides: two fp16 runs that differ show only
    that. Under AMP the loss is scaled as a gradient scaler starts (2**16), an
    eighth of that until the fp16 gradients are finite."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.eval()
    scale = 2.0**16 if amp else 1.0
    mine = gradients(model, x, args.model, amp, scale)
    while not mine.isfinite().all() and scale > 2**-10:
        scale /= 8
        mine = gradients(model, x, args.model, amp, scale)
    as_torch(model)  # for good: this is the process's last use of the model
    theirs = gradients(model, x, args.model, amp, scale)
    result = dict(gradient_rel=relative_error(mine, theirs), gradient_scale=scale)
    release()
    exact = gradients(model.double(), x.double(), args.model, False, scale)
    result.update(gradient_fp64_rel=relative_error(mine, exact), torch_fp64_rel=relative_error(theirs, exact))
    if amp:  # AMP's error, or the model's at any precision: torch's layers in float32 against float64
        result["torch_fp32_fp64_rel"] = relative_error(gradients(model.float(), x.float(), args.model, False, scale), exact)
    return result


# --- the parent ----------------------------------------------------------------------------------

def child(args, variant: str, limit: int = 0, need: int = 0, timeout: float = 300, cache: str = "",
          round_index: int = 0) -> dict:
    """One fresh process; its result, or what went wrong (out of memory included)."""
    out = Path(args.out) / f"pressure-{args.model_now}-{variant}-{limit // MiB}{f'-r{round_index}' if round_index else ''}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--child", variant, "--model", args.model_now, "--limit", str(limit),
               "--child-need", str(need), "--iters", str(args.iters), "--cache", cache or args.cache, "--result", str(out)
               ] + (["--profile"] if args.profile else []) \
               + ["--profile-steady", str(args.profile_steady)]
    env = dict(child_env(os.environ), UCUDNN_PROGRESS="0", PYTORCH_CUDA_ALLOC_CONF=ALLOC_CONF)
    began = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return dict(variant=variant, limit_mib=limit / MiB, error=f"timed out after {timeout:.0f} s")
    row = json.loads(out.read_text()) if out.exists() else {}
    if done.returncode or not row:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        row["error"] = row.get("error") or " | ".join(tail) or f"exit {done.returncode}"
    return dict(row, variant=variant, limit_mib=limit / MiB, wall_s=time.perf_counter() - began, round=round_index)


def table(rows: list[dict]) -> str:
    """The Markdown table: per model and L, each variant's steady ms (the median over its rounds,
    their range beside it), ucudnn's ratios of those medians (torch / ucudnn also with the A/A's
    processes pooled with torch's, and the chance of so wide a gap between processes of one kind:
    common.chance), and the median seconds of the first 20 iterations (synchronized each, planning
    included)."""
    lines = ["| model | L | torch free | torch | control (A/A) | ucudnn | wd auto | torch / ucudnn | "
             "torch / free | first 20 s: torch, ucudnn | grad rel (ucudnn, A/A) | "
             "grad rel to float64 (ucudnn, torch) | imported | swapped: torch / ucudnn in one process | "
             "out of memory (torch, ucudnn) |", "|" + "---|" * 15]
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["model"], r["limit_mib"], r["variant"]), []).append(r)

    def ok(rs):
        return [r for r in rs or () if "error" not in r]

    def times(rs):
        return [r["steady_ms"] for r in ok(rs)]

    def steady(rs, value=lambda r: r["steady_ms"]):  # the median over the rounds
        return statistics.median(value(r) for r in ok(rs))

    def ms(rs):
        if not rs:
            return "-"
        if not ok(rs):
            return rs[0]["error"][:60]
        each, failed = sorted(times(rs)), [r["error"] for r in rs if "error" in r]
        spread = f" ({each[0]:.1f}-{each[-1]:.1f}, {len(each)} runs)" if len(each) > 1 else ""
        failures = f"; {len(failed)} failed: {failed[0][:40]}" if failed else ""  # never hidden by the median
        return f"{steady(rs):.1f}{spread}{failures}"

    def of(rs, key):
        return next((r[key] for r in ok(rs) if key in r), math.nan)

    def swapped(rs):  # each process's torch / ucudnn (in_one_process): their median and range
        each = sorted(in_one_process(r) for r in ok(rs))
        if not each:
            return ms(rs)
        spread = f" ({each[0]:.3f}-{each[-1]:.3f}, {len(each)} runs)" if len(each) > 1 else ""
        return f"{statistics.median(each):.3f}x{spread}"
    for model in dict.fromkeys(r["model"] for r in rows):
        free = by.get((model, 0.0, "free"))
        for limit in sorted({r["limit_mib"] for r in rows if r["model"] == model and r["variant"] not in ("free", "need")}):
            t, c, u, w, i, s, a = (by.get((model, limit, v)) for v in ("torch", "control", "ucudnn", "wd", *SWAPS))
            ratio = f"{steady(t) / steady(u):.2f}x" if ok(t) and ok(u) else "-"
            if ok(t) and ok(c) and ok(u):  # torch's processes with the A/A's, and how likely that by chance
                ratio += f"; with the A/A's {steady(t + c) / steady(u):.2f}x, p {chance(times(t + c), times(u)):.2f}"
            loss = f"{steady(t) / steady(free):.2f}x" if ok(t) and ok(free) else "-"
            first = f"{steady(t, FIRST_20):.1f}, {steady(u, FIRST_20):.1f}" if ok(t) and ok(u) else "-"
            grads = f"{of(u, 'gradient_rel'):.1e}, {of(c, 'gradient_rel'):.1e}" if ok(u) and ok(c) else "-"
            exact = f"{of(u, 'gradient_fp64_rel'):.1e}, {of(u, 'torch_fp64_rel'):.1e}" if ok(u) else "-"
            if ok(u) and not math.isnan(of(u, "torch_fp32_fp64_rel")):
                exact += f" (torch in fp32: {of(u, 'torch_fp32_fp64_rel'):.1e})"
            inside = swapped(s) + (f"; A/A {swapped(a)}" if a else "")
            lines.append(f"| {model} | {limit:.0f} MiB | {ms(free)} | {ms(t)} | {ms(c)} | {ms(u)} | {ms(w)} | "
                         f"{ratio} | {loss} | {first} | {grads} | {exact} | {ms(i)} | {inside} | "
                         f"{out_of_memory(t)}, {out_of_memory(u)} |")
    return "\n".join(lines)


def out_of_memory(rows: list[dict] | None) -> str:
    """How many of a variant's processes ran out of device memory, of how many: '1/3'."""
    if not rows:
        return "-"
    failed = sum("out of memory" in r.get("error", "").lower() or "OutOfMemory" in r.get("error", "") for r in rows)
    return f"{failed}/{len(rows)}"


def explain(row: dict) -> str:
    """Per kernel of a ucudnn variant: the room its moment left, ucudnn's limit and plan, torch's
    kernel (ucudnn.reports.kernels), and the allocator's retries in one step."""
    flushes = row.get("flushes", {})
    retries = (f"\nThe allocator's retries in one step: {flushes['step']}, {sum(flushes['by_kernel'].values())} of "
               "them borrowing ucudnn's workspaces.") if flushes else ""
    return kernels.table(row, flushes.get("by_kernel")) + retries


def runs(variants: list[str], limits: list[int], rounds: int) -> list[tuple[str, int, int]]:
    """(variant, limit, round) of each process, in order: `free` once; at each limit, the variants
    in `rounds` rounds taking turns (bench.common.turns: torch's step under a blocker is bistable,
    and a later process may meet a warmer machine), `control` and `wd` at the first limit only."""
    plan = [("free", 0, 0)] if "free" in variants else []
    for limit in limits:
        these = [v for v in variants if v != "free" and not (v in ("control", "wd") and limit != limits[0])]
        done = {v: 0 for v in these}
        for v in turns(these, rounds):
            plan.append((v, limit, done[v]))
            done[v] += 1
    return plan


def measured_need(args, model: str, rows: list[dict]) -> dict:
    """The model's need (`need`, bytes): the zero-workspace peak of a `need` process plus the
    bytes a `free` process of torch holds outside its pool (both rows go into `rows`), or the
    --need given."""
    if model in args.need_of:
        need = dict(need=args.need_of[model], given=True, variant="need", limit_mib=0.0, model=model)
        rows.append(need)
        return need
    need = dict(child(args, "need", cache=args.cache + ".need"), model=model)
    rows.append(need)
    if "error" in need:
        return need
    free = dict(child(args, "free"), model=model)
    rows.append(free)
    if "error" in free:
        return dict(need, error=f"torch's own process with memory free: {free['error']}")
    need.update(need=need["peak"] + max(0, free["torch_outside"]), torch_outside_mib=free["torch_outside"] / MiB,
                free=True)
    return need


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
        caches = [args.cache] + [f"{args.cache}.r{r}" for r in range(1, args.rounds)]  # a round each
        for cache in caches:
            Path(cache).unlink(missing_ok=True)  # every ucudnn process plans from a cold database
        need = measured_need(args, model, rows)
        print(f"{model}: need {need}", flush=True)
        if "error" in need:
            continue
        for variant, limit, round_index in runs(variants, limits, args.rounds):
            if variant == "free" and "free" in need:
                continue  # measure_need ran it
            if time.perf_counter() + max((r.get("wall_s", 0) for r in rows), default=0) > deadline:
                break  # a process is started only where the time left holds the longest so far
            row = dict(child(args, variant, limit, need["need"], cache=caches[round_index], round_index=round_index),
                       model=model)
            rows.append(row)
            brief = row.get("error") or (f"{row['steady_ms']:.1f} ms, first {args.iters}: {row['first_s']:.1f} s "
                                         f"(iteration 1: {row['iteration_ms'][0] / 1e3:.1f} s, process "
                                         f"{row.get('machine_order', 0) + 1} on its machine), free at the end "
                                         f"{row.get('free_at_end_mib', 0):.0f} MiB")
            if "steady_host" in row:  # where a steady step's host time went (_usage), and how fast a host (launch_us)
                brief += "; a steady step's host: " + ", ".join(f"{k} {v:.3g}" for k, v in row["steady_host"].items())
                brief += "; µs a launch before, after: " + ", ".join(f"{us:.2f}" for us in row["launch_us"])
            print(f"{model} {variant} L={limit // MiB} MiB: {brief}", flush=True)
            if args.explain and variant in UCUDNN_VARIANTS and "error" not in row:
                print(explain(row), flush=True)
            for name, ms, n in [*row.get("profile", {}).get("kernels", []), *row.get("profile", {}).get("convolutions", [])]:
                print(f"    {ms:8.2f} ms {n:5.0f}x  {name}", flush=True)
            if "steady_profile" in row:
                print(row["steady_profile"], flush=True)
        (out / "pressure.json").write_text(json.dumps(rows, indent=1))
        (out / "pressure.md").write_text(table([r for r in rows if r["variant"] != "need"]) + "\n")
    print(table([r for r in rows if r["variant"] != "need"]))


def main(argv=None) -> None:
    from ucudnn.plan.config import parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="out")
    p.add_argument("--models", default="wav2vec2,fcn_resnet50,r3d_18,fpn_resnet50,efficientnet_b0,densenet121,unet3d,convtasnet")
    p.add_argument("--limits", default="0,64MiB,512MiB")
    p.add_argument("--variants", default="free,torch,control,ucudnn,wd")
    p.add_argument("--iters", type=int, default=40,
                   help="steps a variant runs: wav2vec2 at 64 MiB settled after 30 (docs/results.md, \"Forty steps\")")
    p.add_argument("--rounds", type=int, default=1,
                   help="processes of each variant at each limit, taking turns; the table gives their median")
    p.add_argument("--cache", default="/tmp/pressure-cache.db")
    p.add_argument("--deadline", type=float, default=3000)
    p.add_argument("--explain", action="store_true", help="print each ucudnn variant's kernels")
    p.add_argument("--need", dest="need_of", default="",
                   help="MODEL=BYTES,...: a need measured before (a `need` row), not measured again")
    p.add_argument("--profile", action="store_true", help="each variant's top GPU kernels and convolutions over 3 steps")
    p.add_argument("--profile-steady", type=int, default=0, metavar="N",
                   help="every variant: N more iterations under cProfile after the timed ones")
    p.add_argument("--plot", nargs=2, metavar=("RESULT_JSON", "PNG"),
                   help="draw a ucudnn variant's result (a pressure-*.json) as a timeline, and stop")
    for hidden, kind, dest in (("--child", str, None), ("--model", str, None), ("--limit", int, None),
                               ("--child-need", int, "need"), ("--result", str, None)):  # what a child process is told
        p.add_argument(hidden, type=kind, dest=dest, default=0 if kind is int else None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.variant = args.child
        try:
            result = run_need(args) if args.child == "need" else run_variant(args)
        except Exception as exc:  # out of memory and the like are results here, with where they happened
            import traceback

            frames = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_tb(exc.__traceback__)]
            result = dict(SO_FAR, error=f"{type(exc).__name__}: {first_line(exc)}", at=" < ".join(frames[::-1][:8]),
                          phase=PHASE[0])
        Path(args.result).write_text(json.dumps(result))
        return
    if args.plot:
        row = json.loads(Path(args.plot[0]).read_text())
        kernels.plot_kernels(row, args.plot[1], f"{Path(args.plot[0]).stem}: {row['steady_ms']:.1f} ms a step")
        return
    limits = [parse_size(v) for v in args.limits.split(",")]
    args.models = [(model, [parse_size(v) for v in own.split("+")] if own else limits)  # MODEL:L+L: its own limits
                   for model, _, own in (entry.partition(":") for entry in args.models.split(","))]
    args.need_of = {m: int(b) for m, _, b in (e.partition("=") for e in args.need_of.split(",") if e)}
    parent(args)


if __name__ == "__main__":
    main()
