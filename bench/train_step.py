"""Training-iteration time and peak memory: torch's own convolutions against ucudnn.torch.

For each network (torchvision AlexNet B=256, ResNet-50 B=64), precision (fp32 NCHW; AMP fp16 with
channels_last) and variant:
  native  - torch, cudnn.benchmark=True, workspace uncapped
  capped  - torch, cudnn.benchmark=True, CUDNN_CONV_WSCAP_DBG=<limit in MiB> (read by torch at startup)
  wr      - ucudnn.torch.convert(optimizer="wr"), <limit> per kernel; benchmarks in the first iteration;
            layers ucudnn would not speed up are delegated to torch's own convolution (the default)
  wr-all  - the same with delegate=False: every layer through ucudnn (what a converted call costs)
  wd      - ucudnn.torch.convert(optimizer="wd", sample_input=x), total = <limit> x kernels (the
            paper's "same total" as WR); learns and solves before the first iteration (setup)
every variant runs in a fresh subprocess (the environment variable needs one; the others get one for
uniformity). Each times `--iters` iterations (CUDA events, median) after `--warmup` untimed ones; the
first iteration (ucudnn's or torch's benchmarking) is reported apart. Peak memory is
torch.cuda.max_memory_allocated over the timed iterations (and over warm-up, apart); ucudnn's
benchmarking scratch lives in CuPy's pool, outside that counter, and is reported as cupy_pool_mib.
Results go to OUT/train_step.json and OUT/train_step.md after every variant.

    PYTHONPATH=. python3 bench/train_step.py --out OUT [--nets alexnet:256,resnet50:64]
        [--precisions fp32,amp] [--variants capped,wr,native,wd] [--limit 64MiB] [--deadline 540]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {
    "capped": "torch, cudnn.benchmark, workspace capped by CUDNN_CONV_WSCAP_DBG",
    "wr": "ucudnn WR, limit per kernel",
    "wr-all": "ucudnn WR, limit per kernel, no layer delegated to torch",
    "native": "torch, cudnn.benchmark, uncapped",
    "wd": "ucudnn WD, total = limit x kernels",
}
BAR = 1.5  # AlexNet fp32: ucudnn WR must be this much faster per iteration than torch capped


def log(message: str) -> None:
    print(message, flush=True)


# --- child: one variant in this process --------------------------------------------------------

def child(args) -> dict:
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    device = torch.device("cuda")
    amp = args.precision == "amp"
    # AMP runs channels_last, the layout fp16 tensor-core kernels want (as AMP users are advised)
    layout = torch.channels_last if amp else torch.contiguous_format
    model = torchvision.models.get_model(args.net, weights=None).to(device, memory_format=layout).train()
    x = torch.randn(args.batch, 3, 224, 224, device=device).contiguous(memory_format=layout)
    target = torch.randint(0, 1000, (args.batch,), device=device)
    result = dict(net=args.net, batch=args.batch, precision=args.precision, variant=args.variant,
                  torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                  gpu=torch.cuda.get_device_name(), wscap_env=os.environ.get("CUDNN_CONV_WSCAP_DBG"))
    start = time.perf_counter()
    context = convert(model, x, args, amp) if args.variant in ("wr", "wr-all", "wd") else None
    torch.cuda.synchronize()
    result["setup_s"] = time.perf_counter() - start
    step = training_step(model, x, target, amp)

    start = time.perf_counter()
    losses = [step()]
    torch.cuda.synchronize()
    result["first_iter_s"] = time.perf_counter() - start
    log(f"    first iteration {result['first_iter_s']:.1f} s")
    losses += [step() for _ in range(args.warmup - 1)]
    torch.cuda.synchronize()
    result["peak_warmup_mib"] = torch.cuda.max_memory_allocated() / 2**20
    torch.cuda.reset_peak_memory_stats()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(args.iters)]
    for begin, end in events:
        begin.record()
        losses.append(step())
        end.record()
    torch.cuda.synchronize()
    times = [begin.elapsed_time(end) for begin, end in events]
    free, total = torch.cuda.mem_get_info()
    result.update(
        times_ms=times, median_ms=statistics.median(times), min_ms=min(times),
        peak_mib=torch.cuda.max_memory_allocated() / 2**20,
        peak_reserved_mib=torch.cuda.max_memory_reserved() / 2**20,
        device_used_mib=(total - free) / 2**20, cupy_pool_mib=cupy_pool_mib(),
        losses=[float(v) for v in losses],
    )
    if context is not None:
        result["ucudnn"] = condensed(context.summary())
    return result


def training_step(model, x, target, amp: bool):
    """One SGD training iteration of `model` on (x, target) as a function (AMP: fp16 autocast and
    a gradient scaler), returning the loss."""
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


def convert(model, x, args, amp: bool):
    """Convert in place; WD learns the network from x under the training autocast and grad mode."""
    import torch

    import ucudnn.torch as ut

    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        ut.convert(model, workspace_limit=args.limit, optimizer="wd" if args.variant == "wd" else "wr",
                   cache_path=args.cache, total_limit=args.wd_total if args.variant == "wd" else None,
                   sample_input=x if args.variant == "wd" else None, delegate=args.variant != "wr-all")
    return next(m.ucudnn_context for m in model.modules() if isinstance(m, ut.Conv2d))


def condensed(summary: dict) -> dict:
    kernels = summary["kernels"]
    ours = [k for k in kernels if k["via"] == "ucudnn"]
    return dict(
        kernels=len(kernels), delegated=sum(k["delegated"] for k in kernels),
        via_torch=sum(k["via"] == "torch" and not k["delegated"] for k in kernels),
        micro_batched=sum(1 for k in ours if k["parts"] > 1),
        max_workspace_mib=max((k["workspace"] for k in ours), default=0) / 2**20,
        sum_workspace_mib=sum(k["workspace"] for k in ours) / 2**20,
        runs=summary["runs"], fallbacks=summary["fallbacks"], wd=summary.get("wd"),
        configurations=[(k["kind"], k["kernel"], k.get("configuration")) for k in kernels],
    )


def cupy_pool_mib() -> float | None:
    cupy = sys.modules.get("cupy")
    return cupy.get_default_memory_pool().total_bytes() / 2**20 if cupy else None


# --- parent: every variant in a fresh subprocess ----------------------------------------------------

def run_variant(args, net: str, batch: int, precision: str, variant: str, timeout: float) -> dict:
    result_path = Path(args.out) / f"train_step-{net}-{precision}-{variant}.json"
    result_path.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("CUDNN_CONV_WSCAP_DBG", None)
    if variant == "capped":
        env["CUDNN_CONV_WSCAP_DBG"] = str(max(1, args.limit_bytes // 2**20))
    command = [sys.executable, __file__, "--child", "--out", args.out, "--net", net, "--batch", str(batch),
               "--precision", precision, "--variant", variant, "--limit", args.limit, "--cache", args.cache,
               "--warmup", str(args.warmup), "--iters", str(args.iters), "--result", str(result_path)]
    if args.wd_total:
        command += ["--wd-total", args.wd_total]
    row = dict(net=net, batch=batch, precision=precision, variant=variant)
    start = time.perf_counter()
    try:
        code = subprocess.run(command, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return dict(row, error=f"timed out after {timeout:.0f} s")
    if code or not result_path.exists():
        return dict(row, error=f"exit code {code}")
    return dict(json.loads(result_path.read_text()), wall_s=time.perf_counter() - start)


def by_key(rows: list[dict]) -> dict:
    return {(r["net"], r["precision"], r["variant"]): r for r in rows if "median_ms" in r}


def findings(rows: list[dict]) -> list[str]:
    """The bar, and whether torch seems to honour the cap, in words."""
    ok, notes = by_key(rows), []
    wr, capped = ok.get(("alexnet", "fp32", "wr")), ok.get(("alexnet", "fp32", "capped"))
    if wr and capped:
        speedup = capped["median_ms"] / wr["median_ms"]
        notes.append(f"Bar: AlexNet fp32, ucudnn WR vs torch capped: {speedup:.2f}x "
                     f"({'PASS' if speedup >= BAR else 'FAIL'}, needs >= {BAR}x)")
    else:
        notes.append("Bar: AlexNet fp32 WR or capped did not finish: not evaluated")
    for (net, precision, variant), row in ok.items():
        native = ok.get((net, precision, "native"))
        if variant == "capped" and native:
            same_time = abs(row["median_ms"] / native["median_ms"] - 1) < 0.03
            same_memory = abs(row["peak_mib"] - native["peak_mib"]) < 1
            if same_time and same_memory:
                notes.append(f"{net} {precision}: torch capped ~ uncapped (time within 3%, peak within 1 MiB): "
                             "CUDNN_CONV_WSCAP_DBG may not be honoured by this torch, or no chosen "
                             "algorithm needed more than the cap")
    return notes


def table(rows: list[dict]) -> str:
    ok = by_key(rows)
    lines = ["| net | precision | variant | ms/iter (median) | speedup vs torch capped | time vs torch "
             "uncapped | peak MiB | peak - uncapped MiB | first iter s | setup s | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "median_ms" not in r:
            lines.append(f"| {r['net']} | {r['precision']} | {r['variant']} | - | - | - | - | - | - | - | "
                         f"{r.get('error', '')} |")
            continue
        capped, native = ok.get((r["net"], r["precision"], "capped")), ok.get((r["net"], r["precision"], "native"))
        speedup = f"{capped['median_ms'] / r['median_ms']:.2f}x" if capped else "-"
        ratio = f"{r['median_ms'] / native['median_ms']:.2f}" if native else "-"
        delta = f"{r['peak_mib'] - native['peak_mib']:+.0f}" if native else "-"
        lines.append(f"| {r['net']} | {r['precision']} | {r['variant']} | {r['median_ms']:.1f} | {speedup} | "
                     f"{ratio} | {r['peak_mib']:.0f} | {delta} | {r['first_iter_s']:.1f} | {r['setup_s']:.1f} | "
                     f"{notes_of(r)} |")
    return "\n".join(lines)


def notes_of(r: dict) -> str:
    u = r.get("ucudnn")
    parts = []
    if u:
        parts.append(f"{u['micro_batched']}/{u['kernels']} kernels micro-batched, max ws "
                     f"{u['max_workspace_mib']:.0f} MiB")
        if u["delegated"]:
            parts.append(f"{u['delegated']}/{u['kernels']} kernels in layers delegated to torch")
        if u["via_torch"] or u["fallbacks"]:
            parts.append(f"FALLBACKS: {u['via_torch']} kernels via torch, {u['fallbacks']}")
        for solve in u.get("wd") or []:
            parts.append(f"WD total {solve['total_workspace'] / 2**20:.0f} of {solve['total_limit'] / 2**20:.0f} "
                         f"MiB (persistent), solve {solve['solve_seconds'] * 1e3:.0f} ms")
    if r.get("cupy_pool_mib"):
        parts.append(f"CuPy pool {r['cupy_pool_mib']:.0f} MiB")
    parts.append(f"device used {r['device_used_mib']:.0f} MiB")
    return "; ".join(parts)


def write(args, rows: list[dict], started: float) -> None:
    out = Path(args.out)
    meta = dict(limit=args.limit, wd_total=args.wd_total or "limit x kernels", warmup=args.warmup, iters=args.iters, elapsed_s=time.perf_counter() - started,
                variants=VARIANTS)
    notes = findings(rows)
    (out / "train_step.json").write_text(json.dumps(dict(meta=meta, findings=notes, rows=rows), indent=1))
    header = (f"# Training iteration: torch vs ucudnn.torch (limit {args.limit}, {args.iters} timed "
              f"iterations after {args.warmup} warm-up)\n\n")
    (out / "train_step.md").write_text(header + table(rows) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")


def parent(args) -> None:
    started = time.perf_counter()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    plan = [(net, int(batch), precision, variant)
            for net, batch in (item.split(":") for item in args.nets.split(","))
            for precision in args.precisions.split(",") for variant in args.variants.split(",")]
    rows = []
    for i, (net, batch, precision, variant) in enumerate(plan, 1):
        left = args.deadline - (time.perf_counter() - started)
        if left < 30:
            rows.append(dict(net=net, batch=batch, precision=precision, variant=variant,
                             error="skipped: deadline"))
            continue
        log(f"[{i}/{len(plan)}] {net} B={batch} {precision} {variant} ({left:.0f} s left)")
        row = run_variant(args, net, batch, precision, variant, min(args.variant_timeout, left - 10))
        rows.append(row)
        log(f"    error: {row['error']}" if "error" in row else
            f"    {row['median_ms']:.1f} ms/iter, peak {row['peak_mib']:.0f} MiB, first iteration {row['first_iter_s']:.1f} s")
        write(args, rows, started)
    write(args, rows, started)
    log((Path(args.out) / "train_step.md").read_text())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--nets", default="alexnet:256,resnet50:64")
    parser.add_argument("--precisions", default="fp32,amp")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--limit", default="64MiB", help="WR limit per kernel, torch's cap, WD's per-kernel share")
    parser.add_argument("--wd-total", default=None, help="WD's total limit (default: --limit x kernels)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--cache", default=None, help="ucudnn benchmark database (default OUT/ucudnn-bench.db)")
    parser.add_argument("--deadline", type=float, default=540, help="seconds for the whole run")
    parser.add_argument("--variant-timeout", type=float, default=240)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--net", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from ucudnn.config import parse_size

    args.limit_bytes = parse_size(args.limit, "--limit")
    args.cache = args.cache or str(Path(args.out) / "ucudnn-bench.db")
    unknown = set(args.variants.split(",")) - set(VARIANTS) | set(args.precisions.split(",")) - {"fp32", "amp"}
    if unknown:
        parser.error(f"unknown variant(s) or precision(s): {sorted(unknown)}")
    if args.child:
        result = child(args)
        Path(args.result).write_text(json.dumps(result, indent=1))
    else:
        parent(args)


if __name__ == "__main__":
    main()
