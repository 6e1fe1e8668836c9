"""Training-iteration time and memory under real memory pressure: torch's own convolutions
against ucudnn.torch (issue 18).

For each network (torchvision AlexNet B=256, ResNet-50 B=64), precision (fp32 NCHW; AMP fp16 with
channels_last) and variant (VARIANTS). Pressure is a blocker allocation that leaves free only the
run's own peak with no convolution workspace (measured first by the `footprint` variant: the peak
its tensors hold, or with --footprint-of reserved the peak torch's allocator holds, its slack
included) plus --free (64 MiB): torch's benchmark mode then drops every plan whose workspace does
not fit, the baseline a user short of memory sees. (CUDNN_CONV_WSCAP_DBG, which an earlier version set, is
ignored by torch's cuDNN graph-API path, ../shared/design/engines.md section 2, so it compared
ucudnn with an uncapped torch.)

Every variant runs in a fresh subprocess: one untimed plain-torch iteration (it allocates the
optimizer state; cudnn.benchmark off and deterministic, so that torch's plan cache holds no
memory-free choice the timed iterations would use), the blocker (pressure variants), the
conversion (ucudnn variants), the first iteration (benchmarking; timed apart, with the cache's
state before it), --warmup - 1 more, --iters timed with CUDA events (median), and one more untimed
while a thread samples the device's free memory. Memory, blocker excluded: peak_mib
(torch.cuda.max_memory_allocated over the timed iterations), peak_first_mib (setup and first
iteration), device_peak_mib (total - least free memory seen: CuPy's pool, cuDNN and the CUDA
context too). The children run torch's allocator with expandable segments (ALLOC_CONF) unless
PYTORCH_CUDA_ALLOC_CONF is set. Results go to OUT/train_step.json and .md after every variant, with
the issue's bars as findings.

    PYTHONPATH=. python3 bench/train_step.py --out OUT [--nets alexnet:256,resnet50:64]
        [--precisions fp32,amp] [--variants footprint,torch,wr,...] [--limit 64MiB] [--free 64MiB]
        [--wd-total SIZE] [--cache DB] [--deadline 540]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20
# The children's allocator, unless PYTORCH_CUDA_ALLOC_CONF says otherwise: with torch's default
# segments, fragmentation (reserved - allocated ~0.5 GiB on AlexNet) leaves too little of --free for
# even torch under pressure (it ran out of memory at 64 MiB, on an H100)
ALLOC_CONF = "expandable_segments:True"
SEGMENT = 2 * MiB  # torch's caching allocator rounds large blocks up to this: the blocker is rounded down


class Arg(NamedTuple):
    """A convert keyword's value taken from the run: an attribute of the child's arguments, or
    "sample_input" (the batch)."""
    name: str


@dataclass(frozen=True)
class Variant:
    description: str
    ucudnn: bool = False
    pressure: bool = False
    convert: dict = field(default_factory=dict)  # ucudnn.torch.convert keywords (cache_path added)
    own_cache: str = ""  # a cache file of its own, OUT/<own_cache>-<net>-<precision>.db (else --cache)
    seeded: bool = False  # that file starts as a copy of --cache (else empty), removed after the run


WR = dict(optimizer="wr", workspace_limit=Arg("limit"))
WD = dict(optimizer="wd", workspace_limit=Arg("limit"))
VARIANTS = {
    "footprint": Variant("ucudnn WR, no workspace, no layer delegated, memory free: the run's own peak",
                         True, convert=dict(optimizer="wr", workspace_limit=0, delegate=False),
                         own_cache="footprint", seeded=True),
    "torch": Variant("torch, cudnn.benchmark, memory free"),
    "torch-pressure": Variant("torch, cudnn.benchmark, under pressure", pressure=True),
    "wr": Variant("ucudnn WR, --limit per kernel, memory free", True, convert=WR),
    "wr-cold": Variant("ucudnn WR, --limit per kernel, memory free, from an empty cache", True, convert=WR,
                       own_cache="cold"),
    "wr-pressure": Variant("ucudnn WR, --limit per kernel, under pressure", True, True, WR),
    "wd-pressure": Variant("ucudnn WD, total --wd-total, learned from the batch, under pressure", True, True,
                           dict(WD, total_limit=Arg("wd_total"), sample_input=Arg("sample_input"))),
    "auto-pressure": Variant("ucudnn WD, total 'auto' (a share of the memory free after the first iteration), "
                             "under pressure", True, True, dict(WD, total_limit="auto")),
    "wr-all": Variant("ucudnn WR, --limit per kernel, no layer delegated to torch, memory free", True,
                      convert=dict(WR, delegate=False)),
    "wr-all-pressure": Variant("ucudnn WR, --limit per kernel, no layer delegated to torch, under pressure",
                               True, True, dict(WR, delegate=False)),
}
DEFAULT_VARIANTS = "footprint,torch,wr,torch-pressure,wr-pressure,wd-pressure,auto-pressure"
# The bars: (net, precision, variants, needed speedup over the variant's torch reference)
PRESSURE_BARS = [("alexnet", "fp32", ("wr-pressure",), 1.5)] + [
    (net, precision, ("wr-pressure", "wd-pressure", "auto-pressure"), 1.0)
    for net, precision in (("alexnet", "amp"), ("resnet50", "fp32"), ("resnet50", "amp"))]
FREE_BAR = 0.97  # memory free: WR at least this fraction of torch's speed
# The footprint's peak, by --footprint-of. On AlexNet fp32 (H100) the allocator's slack was 110-250
# MiB: with "reserved" torch under pressure kept memory-free speed (14.8 ms), with "allocated" it
# fell to 34.9 ms, the pressure users meet
FOOTPRINT_KEYS = {"allocated": "peak_bytes", "reserved": "peak_reserved_bytes"}


def log(message: str) -> None:
    print(message, flush=True)


def reference(variant: str) -> str:
    """The torch variant a row's speedup is taken against."""
    return "torch-pressure" if VARIANTS[variant].pressure else "torch"


def convert_keywords(variant: Variant, values: dict) -> dict:
    return {key: values[value.name] if isinstance(value, Arg) else value for key, value in variant.convert.items()}


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


def cache_state(path: Path) -> str:
    """'warm' where the benchmark database holds measurements, else 'empty'."""
    if not path.is_file():
        return "empty"
    try:
        with contextlib.closing(sqlite3.connect(path)) as connection:
            (found,) = connection.execute("SELECT EXISTS (SELECT 1 FROM measurements)").fetchone()
    except sqlite3.DatabaseError:  # no measurements table (yet)
        return "empty"
    return "warm" if found else "empty"


# --- child: one variant in this process --------------------------------------------------------

def child(args) -> dict:
    import torch

    variant = VARIANTS[args.variant]
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    device = torch.device("cuda")
    amp = args.precision == "amp"
    model, x, target = build(args.net, args.batch, amp, device)
    result = dict(net=args.net, batch=args.batch, precision=args.precision, variant=args.variant,
                  torch=torch.__version__, cudnn=torch.backends.cudnn.version(), gpu=torch.cuda.get_device_name(),
                  alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    step = training_step(model, x, target, amp)
    # untimed: optimizer state, cuBLAS and cuDNN loaded. Without benchmarking, and deterministic: torch
    # caches the plans it runs with or without benchmark mode, keyed by the deterministic flag too, so
    # the plans the timed iterations look up stay unchosen (no memory-free choice among them)
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        step()
    blocker = block(args, device, result) if variant.pressure else None
    blocked = blocker.numel() if blocker is not None else 0
    if variant.ucudnn:
        result["cache"] = cache_state(Path(args.cache))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    context = convert(model, x, variant, args, amp) if variant.ucudnn else None
    torch.cuda.synchronize()
    result["setup_s"] = time.perf_counter() - start
    result.update(timed(step, args, blocked))
    result.update(device_peak_mib=(device_peak_bytes(step, device) - blocked) / MiB, cupy_pool_mib=cupy_pool_mib())
    result["memory_end"] = memory_now()
    result["outside_mib"] = outside_pool_bytes() / MiB
    if context is not None:
        result["ucudnn"] = condensed(context.summary())
    return result


def build(net: str, batch: int, amp: bool, device):
    import torch
    import torchvision

    # AMP runs channels_last, the layout fp16 tensor-core kernels want (as AMP users are advised)
    layout = torch.channels_last if amp else torch.contiguous_format
    model = torchvision.models.get_model(net, weights=None).to(device, memory_format=layout).train()
    x = torch.randn(batch, 3, 224, 224, device=device).contiguous(memory_format=layout)
    target = torch.randint(0, 1000, (batch,), device=device)
    return model, x, target


def block(args, device, result: dict):
    """The pressure: a tensor that leaves free only the run's own peak plus --free."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    held = (torch.cuda.memory_reserved if args.footprint_of == "reserved" else torch.cuda.memory_allocated)(device)
    free = torch.cuda.mem_get_info(device)[0]
    blocker = torch.empty(blocker_bytes(free, held, args.footprint, args.free_bytes) // SEGMENT * SEGMENT,
                          dtype=torch.uint8, device=device)
    left = torch.cuda.mem_get_info(device)[0] - max(args.footprint - held, 0)
    result.update(blocker_mib=blocker.numel() / MiB, footprint_mib=args.footprint / MiB, free_headroom_mib=left / MiB)
    return blocker


def timed(step, args, blocked: int) -> dict:
    """The first iteration (wall clock), warm-up, then the timed iterations (CUDA events) and the
    peaks of torch's allocator over the first and over the timed ones, less `blocked` bytes."""
    import torch

    start = time.perf_counter()
    losses = [step()]
    torch.cuda.synchronize()
    out = dict(first_iter_s=time.perf_counter() - start,
               peak_first_mib=(torch.cuda.max_memory_allocated() - blocked) / MiB)
    log(f"    first iteration {out['first_iter_s']:.1f} s")
    losses += [step() for _ in range(args.warmup - 1)]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the timed iterations' reserved peak is then what they need, slack included
    torch.cuda.reset_peak_memory_stats()
    counted = allocator_counts()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.iters)]
    for begin, end in events:
        begin.record()
        losses.append(step())
        end.record()
    torch.cuda.synchronize()
    times = [begin.elapsed_time(end) for begin, end in events]
    peak, reserved = (torch.cuda.max_memory_allocated() - blocked, torch.cuda.max_memory_reserved() - blocked)
    churn = {key: (value - counted[key]) / args.iters for key, value in allocator_counts().items()}
    return dict(out, allocator_per_iter=churn, times_ms=times, median_ms=statistics.median(times), min_ms=min(times),
                peak_bytes=peak, peak_mib=peak / MiB, peak_reserved_bytes=reserved, peak_reserved_mib=reserved / MiB,
                losses=[float(v) for v in losses])


ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams", "num_ooms")


def allocator_counts() -> dict[str, int]:
    """torch's caching-allocator event counters: retries after freeing cached blocks (each a
    device sync), cudaMalloc/cudaFree (or page maps) and full syncs, the churn of memory pressure."""
    import torch

    stats = torch.cuda.memory_stats()
    return {key: stats.get(key, 0) for key in ALLOCATOR_COUNTERS}


def device_peak_bytes(step, device) -> int:
    """Device memory in use at its highest over one more iteration (total - the least free memory
    a thread saw, sampling every ~1 ms): kept out of the timed iterations, it takes the GIL."""
    import torch

    index = torch.cuda.current_device() if device.index is None else device.index  # the thread's own is 0
    free, total = torch.cuda.mem_get_info(index)
    seen, done = [free], threading.Event()

    def sample():
        while not done.wait(0.001):
            seen.append(torch.cuda.mem_get_info(index)[0])
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        step()
        torch.cuda.synchronize()
    finally:
        done.set()
        sampler.join()
    return total - min(seen)


def training_step(model, x, target, amp: bool):
    """One SGD training iteration of `model` on (x, target) as a function (AMP: fp16 autocast and
    a gradient scaler), returning the loss. Its optimizer lives as long as the function."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = F.cross_entropy(model(x), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()
    return step


def convert(model, x, variant: Variant, args, amp: bool):
    """Convert in place (layers keep their parameters: the optimizer made before still works); WD
    learns the network from x under the training autocast and grad mode."""
    import torch

    import ucudnn.torch as ut

    keywords = convert_keywords(variant, dict(vars(args), sample_input=x))
    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        ut.convert(model, cache_path=args.cache, **{"planning": "first_call", **keywords})  # steady state: planned on the first (warm-up) call
    return ut.context_of(model)


def condensed(summary: dict) -> dict:
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


def outside_pool_bytes() -> int:
    """Device memory in use outside torch's caching allocator (CUDA context, cuDNN handles and
    code, CuPy, CUDA graphs): total - free - torch's reserved bytes (a blocker is torch's)."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def memory_now() -> str:
    """Where device memory stands, in words: torch's allocated and reserved bytes, and what the
    device has in use outside torch's pool (CUDA context, cuDNN, CuPy, CUDA graphs; a blocker is
    torch's)."""
    import torch

    free = torch.cuda.mem_get_info()[0]
    return (f"torch allocated {torch.cuda.memory_allocated() / MiB:.0f} MiB, reserved "
            f"{torch.cuda.memory_reserved() / MiB:.0f} MiB; device free {free / MiB:.0f} MiB, in use outside "
            f"torch {outside_pool_bytes() / MiB:.0f} MiB")


def cupy_pool_mib() -> float | None:
    cupy = sys.modules.get("cupy")
    return cupy.get_default_memory_pool().total_bytes() / MiB if cupy else None


# --- parent: every variant in a fresh subprocess ----------------------------------------------------

def ordered(variants: list[str]) -> list[str]:
    """footprint first where asked for or where a pressure variant needs its peak, then the rest in
    the order given, once each."""
    first = ["footprint"] if "footprint" in variants or any(VARIANTS[v].pressure for v in variants) else []
    return first + [v for v in dict.fromkeys(variants) if v != "footprint"]


def plan(nets: str, precisions: str, variants: str) -> list[tuple[str, int, str, str]]:
    return [(net, int(batch), precision, variant)
            for net, batch in (item.split(":") for item in nets.split(","))
            for precision in precisions.split(",") for variant in ordered(variants.split(","))]


def skipped(variant: str, footprint: dict | None, left: float) -> str | None:
    """Why a planned variant does not run (None: it runs); `footprint`: its (net, precision)'s row."""
    if left < 30:
        return "skipped: deadline"
    if VARIANTS[variant].pressure and "peak_bytes" not in (footprint or {}):
        return f"skipped: footprint failed ({(footprint or {}).get('error', 'not run')})"
    return None


def remove_database(path: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def variant_cache(args, net: str, precision: str, variant: str) -> str:
    """The variant's cache file: --cache, or one of its own made afresh (seeded: a copy of --cache)."""
    v = VARIANTS[variant]
    if not v.own_cache:
        return args.cache
    path = str(Path(args.out) / f"{v.own_cache}-{net}-{precision}.db")
    remove_database(path)
    for suffix in ("", "-wal") if v.seeded else ():
        if Path(f"{args.cache}{suffix}").is_file():
            shutil.copyfile(f"{args.cache}{suffix}", f"{path}{suffix}")
    return path


def child_command(args, row: dict, cache: str, result_path: Path, footprint: int | None) -> list[str]:
    command = [sys.executable, __file__, "--child", "--out", args.out, "--net", row["net"],
               "--batch", str(row["batch"]), "--precision", row["precision"], "--variant", row["variant"],
               "--limit", args.limit, "--free", args.free, "--wd-total", args.wd_total, "--cache", cache,
               "--footprint-of", args.footprint_of,
               "--warmup", str(args.warmup), "--iters", str(args.iters), "--result", str(result_path)]
    return command + (["--footprint", str(footprint)] if footprint is not None else [])


def child_env(environ) -> dict:
    env = dict(environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")])))
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)
    return env


def run_variant(args, row: dict, timeout: float, footprint: int | None) -> dict:
    net, precision, variant = row["net"], row["precision"], row["variant"]
    result_path = Path(args.out) / f"train_step-{net}-{precision}-{variant}.json"
    result_path.unlink(missing_ok=True)
    cache = variant_cache(args, net, precision, variant)
    start = time.perf_counter()
    try:
        command = child_command(args, row, cache, result_path, footprint)
        code = subprocess.run(command, env=child_env(os.environ), timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return dict(row, error=f"timed out after {timeout:.0f} s")
    finally:
        if VARIANTS[variant].seeded:  # a copy of --cache, too large to keep under OUT
            remove_database(cache)
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if code or "error" in result or not result:
        return dict(row, error=result.get("error") or f"exit code {code}")
    return dict(result, wall_s=time.perf_counter() - start)


def keyed(rows: list[dict]) -> dict:
    return {(r["net"], r["precision"], r["variant"]): r for r in rows}


def speedup(ok: dict, row: dict) -> float | None:
    """reference_ms / row_ms (>1: faster than torch), where both ran."""
    ref = ok.get((row["net"], row["precision"], reference(row["variant"])), {})
    return ref["median_ms"] / row["median_ms"] if "median_ms" in ref and "median_ms" in row else None


def why_missing(row: dict | None) -> str:
    return "not run" if row is None else first_line(row.get("error", "no result"))


def bar(rows: list[dict], net: str, precision: str, variant: str, needs: float) -> str:
    """One bar in words: the variant's speedup over its torch reference, PASS/FAIL/not evaluated."""
    ok, ref = keyed(rows), reference(variant)
    label = f"{net} {precision} {variant} vs {ref}"
    missing = [f"{v}: {why_missing(ok.get((net, precision, v)))}"
               for v in (variant, ref) if "median_ms" not in ok.get((net, precision, v), {})]
    if missing:
        return f"{label}: not evaluated ({'; '.join(missing)})"
    ratio = speedup(ok, ok[(net, precision, variant)])
    return f"{label}: {ratio:.2f}x ({'PASS' if ratio >= needs else 'FAIL'}, needs >= {needs}x)"


def findings(rows: list[dict]) -> list[str]:
    """The issue's bars: under pressure against torch-pressure, with memory free WR against torch."""
    notes = [f"Bar (pressure): {bar(rows, net, precision, variant, needs)}"
             for net, precision, variants, needs in PRESSURE_BARS for variant in variants]
    pairs = dict.fromkeys((r["net"], r["precision"]) for r in rows)
    return notes + [f"Bar (memory free): {bar(rows, net, precision, 'wr', FREE_BAR)}" for net, precision in pairs]


TABLE_HEAD = ("| net | precision | variant | ms/iter (median) | speedup vs torch (pressure: vs torch-pressure) | "
              "peak MiB | device peak MiB | first iter s (cache) | notes |\n|---|---|---|---|---|---|---|---|---|")


def first_line(text: str) -> str:
    return (str(text).strip().splitlines() or [""])[0][:200].replace("|", "/")


def table_row(ok: dict, r: dict) -> str:
    head = f"| {r['net']} | {r['precision']} | {r['variant']} |"
    if "median_ms" not in r:
        return f"{head} - | - | - | - | - | {first_line(r.get('error', ''))} |"
    ratio = speedup(ok, r)
    first = f"{r['first_iter_s']:.1f}" + (f" ({r['cache']})" if "cache" in r else "")
    return (f"{head} {r['median_ms']:.1f} | {f'{ratio:.2f}x' if ratio else '-'} | {r['peak_mib']:.0f} | "
            f"{r['device_peak_mib']:.0f} | {first} | {notes_of(r)} |")


def table(rows: list[dict]) -> str:
    ok = keyed(rows)
    return "\n".join([TABLE_HEAD] + [table_row(ok, r) for r in rows])


def mib(value) -> str:
    return f"{value / MiB:.0f}" if isinstance(value, (int, float)) else str(value)


def notes_of(r: dict) -> str:
    u, parts = r.get("ucudnn"), []
    if "blocker_mib" in r:
        parts.append(f"blocker {r['blocker_mib']:.0f} MiB (footprint {r['footprint_mib']:.0f}, "
                     f"{r['free_headroom_mib']:.0f} MiB free beyond it)")
    if u:
        parts.append(f"{u['micro_batched']}/{u['kernels']} kernels micro-batched, max ws "
                     f"{u['max_workspace_mib']:.0f} MiB")
        if u["delegated"]:
            parts.append(f"{u['delegated']}/{u['kernels']} kernels in layers delegated to torch")
        if u["via_torch"] or u["fallbacks"]:
            parts.append(f"FALLBACKS: {u['via_torch']} kernels via torch, {u['fallbacks']}")
        for solve in u.get("wd") or []:
            parts.append(f"WD total {mib(solve['total_workspace'])} of {mib(solve['total_limit'])} MiB "
                         f"(persistent), solve {solve['solve_seconds'] * 1e3:.0f} ms")
    if r.get("setup_s", 0) >= 0.1:
        parts.append(f"setup {r['setup_s']:.1f} s")
    if r.get("cupy_pool_mib"):
        parts.append(f"CuPy pool {r['cupy_pool_mib']:.0f} MiB")
    churn = r.get("allocator_per_iter") or {}
    if churn.get("num_alloc_retries") or churn.get("num_device_alloc"):
        parts.append(f"allocator per iteration: {churn['num_alloc_retries']:.1f} retries, "
                     f"{churn['num_device_alloc']:.1f} device allocations")
    if r.get("outside_mib") is not None:
        parts.append(f"{r['outside_mib']:.0f} MiB outside torch's pool")
    return "; ".join(parts)


def write(args, rows: list[dict], started: float) -> None:
    out = Path(args.out)
    meta = dict(limit=args.limit, free=args.free, wd_total=args.wd_total, warmup=args.warmup, iters=args.iters,
                elapsed_s=time.perf_counter() - started, variants={k: v.description for k, v in VARIANTS.items()})
    notes = findings(rows)
    (out / "train_step.json").write_text(json.dumps(dict(meta=meta, findings=notes, rows=rows), indent=1))
    header = (f"# Training iteration: torch vs ucudnn.torch (WR {args.limit} per kernel; pressure leaves "
              f"{args.free} free beyond the run's own peak; WD total {args.wd_total}; {args.iters} timed "
              f"iterations after {args.warmup} warm-up)\n\n")
    (out / "train_step.md").write_text(header + table(rows) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")


def parent(args) -> None:
    started = time.perf_counter()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    todo, rows, footprints = plan(args.nets, args.precisions, args.variants), [], {}
    for i, (net, batch, precision, variant) in enumerate(todo, 1):
        row = dict(net=net, batch=batch, precision=precision, variant=variant)
        left = args.deadline - (time.perf_counter() - started)
        footprint = footprints.get((net, precision))
        reason = skipped(variant, footprint, left)
        if reason is None:
            log(f"[{i}/{len(todo)}] {net} B={batch} {precision} {variant} ({left:.0f} s left)")
            row = run_variant(args, row, min(args.variant_timeout, left - 10),
                              footprint[FOOTPRINT_KEYS[args.footprint_of]] if VARIANTS[variant].pressure else None)
            log(f"    error: {row['error']}" if "error" in row else
                f"    {row['median_ms']:.1f} ms/iter, peak {row['peak_mib']:.0f} MiB, first iteration "
                f"{row['first_iter_s']:.1f} s")
        rows.append(row if reason is None else dict(row, error=reason))
        if variant == "footprint":
            footprints[(net, precision)] = rows[-1]
        write(args, rows, started)
    write(args, rows, started)
    log((Path(args.out) / "train_step.md").read_text())


def add_run_arguments(parser, net: str, batch: int, precision: str) -> None:
    """--out, --net, --batch, --precision, --limit and --cache, as the scripts that run one
    network through ucudnn.torch (memory_overhead.py, train_profile.py) take them."""
    parser.add_argument("--out", required=True)
    parser.add_argument("--net", default=net)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--precision", choices=("fp32", "amp"), default=precision)
    parser.add_argument("--limit", default="64MiB")
    parser.add_argument("--cache", default=None)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--nets", default="alexnet:256,resnet50:64")
    parser.add_argument("--precisions", default="fp32,amp")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of: {', '.join(VARIANTS)}")
    parser.add_argument("--limit", default="64MiB", help="WR's limit per kernel (WD's per-kernel setting)")
    parser.add_argument("--free", default="64MiB", help="memory pressure leaves free beyond the run's own peak")
    parser.add_argument("--wd-total", default=None, help="WD's total limit (default: --free)")
    parser.add_argument("--footprint-of", choices=sorted(FOOTPRINT_KEYS), default="allocated",
                        help="the run's own peak as tensors hold it (allocated, the default) or as the "
                             "allocator holds it (reserved: its slack too)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--cache", default=None, help="ucudnn benchmark database (default OUT/ucudnn-bench.db)")
    parser.add_argument("--deadline", type=float, default=540, help="seconds for the whole run")
    parser.add_argument("--variant-timeout", type=float, default=240)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--net", "--precision", "--variant", "--result"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--footprint", type=int, help=argparse.SUPPRESS)  # bytes: the footprint variant's peak
    args = parser.parse_args(argv)
    from ucudnn.plan.config import parse_size

    args.wd_total = args.wd_total or args.free
    args.free_bytes = parse_size(args.free, "--free")
    for value, name in ((args.limit, "--limit"), (args.wd_total, "--wd-total")):
        parse_size(value, name)  # checked here; the children pass them on as given
    args.cache = args.cache or str(Path(args.out) / "ucudnn-bench.db")
    variants = set(args.variants.split(",")) | ({args.variant} if args.child else set())
    unknown = variants - set(VARIANTS) | set(args.precisions.split(",")) - {"fp32", "amp"}
    if unknown:
        parser.error(f"unknown variant(s) or precision(s): {sorted(unknown)}")
    if args.child and VARIANTS[args.variant].pressure and args.footprint is None:
        parser.error(f"--variant {args.variant} needs --footprint")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if not args.child:
        return parent(args)
    try:
        result = child(args)
    except Exception as error:  # the reason, and where memory stood, for the parent's table
        Path(args.result).write_text(json.dumps(dict(error=f"{type(error).__name__}: {error} [{memory_now()}]")))
        raise
    Path(args.result).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
