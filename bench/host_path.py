"""What a converted convolution costs beyond its kernels, per layer (issue 13).

For every distinct convolution of torchvision AlexNet B=256 and ResNet-50 B=64 (with how many
layers share it), fp32 NCHW and AMP fp16 channels_last, one training step of the layer alone
(F with bias, BD, BF; gradients set to None as zero_grad(set_to_none=True) does) runs through
torch (cudnn.benchmark) and through ucudnn.torch WR at each --limits value. Per variant:

  host_us      host time to issue one step, the GPU kept busy by a sleeping kernel so nothing
               waits for it (mean of back-to-back steps); fwd_us: the forward alone
  synced_ms    wall time of one step synchronized after it (median)
  kernels_ms   sum of the step's GPU kernel times (torch.profiler, CUDA activity), with the
               kernels by name
  over_ms      synced_ms - kernels_ms: the bar is <= 0.15 ms on every layer
  busy_ms      the step timed by CUDA events with the host hidden (kernels back to back)

Then cProfile's top of the ucudnn path of one ResNet-50 AMP layer. Results: OUT/host_path.json
and OUT/host_path.md, rewritten after every layer, so a run cut by --deadline keeps what it measured.

    PYTHONPATH=. python3 bench/host_path.py --out OUT [--deadline 220] [--limits 4GiB,64MiB]
        [--nets resnet50:64,alexnet:256] [--precisions amp,fp32]
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import shutil
import statistics
import time
import traceback
from pathlib import Path

import torch
import torchvision
from torch import nn

import ucudnn.torch as ut
from conv_step import Case
from probe_setup import write_report
from ucudnn.measure.cache.paths import recorded_path

BAR_MS = 0.15
SPEC = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups")


def log(message: str) -> None:
    print(message, flush=True)


# --- the layers ------------------------------------------------------------------------------------

def distinct_layers(net: str) -> list[dict]:
    """Every distinct nn.Conv2d of `net` with its input's (C, H, W): first name, count, spec."""
    model = torchvision.models.get_model(net, weights=None).eval()
    layers, names = {}, {m: n for n, m in model.named_modules()}

    def hook(module, inputs, output):
        spec = {k: getattr(module, k) for k in SPEC}
        spec["bias"] = module.bias is not None
        key = (tuple(spec.items()), tuple(inputs[0].shape[1:]))
        layers.setdefault(key, dict(name=names[module], count=0, spec=spec, chw=tuple(inputs[0].shape[1:])))
        layers[key]["count"] += 1

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        model(torch.randn(1, 3, 224, 224))
    for handle in handles:
        handle.remove()
    return list(layers.values())


# --- timing ------------------------------------------------------------------------------------------

class Sleeper:
    """Keeps the GPU busy for a while (torch.cuda._sleep), calibrated once."""

    def __init__(self):
        torch.cuda._sleep(1000)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        torch.cuda._sleep(10**7)
        end.record()
        end.synchronize()
        self.cycles_per_ms = 10**7 / max(begin.elapsed_time(end), 1e-3)

    def __call__(self, ms: float) -> None:
        torch.cuda._sleep(int(ms * self.cycles_per_ms))


def host_us(run, sleeper: Sleeper, calls: int) -> float:
    """Mean host microseconds per run(), queued behind a sleeping kernel (nothing waits for the GPU)."""
    torch.cuda.synchronize()
    sleeper(20 + 5 * calls)
    began = time.perf_counter()
    for _ in range(calls):
        run()
    spent = time.perf_counter() - began
    torch.cuda.synchronize()
    return spent / calls * 1e6


def synced_ms(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def busy_ms(run, sleeper: Sleeper, repeats: int) -> float:
    """Median CUDA-event time of run() with the host hidden behind a sleeping kernel."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    torch.cuda.synchronize()
    sleeper(20 + 5 * repeats)
    for begin, end in events:
        begin.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(end) for begin, end in events)


def kernels(run, steps: int) -> tuple[float, list]:
    """(milliseconds of GPU kernels per step, [(kernel, us per step)] longest first), torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    by_name: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_name[event.name] = by_name.get(event.name, 0.0) + event.device_time_total / steps
    if not by_name or not sum(by_name.values()):
        raise RuntimeError("torch.profiler reported no GPU kernel time")
    ranked = sorted(by_name.items(), key=lambda item: -item[1])
    return sum(by_name.values()) / 1e3, [(name[:90], round(us, 1)) for name, us in ranked[:6]]


def measure(case: Case, module: nn.Module, sleeper: Sleeper, args) -> dict:
    step = lambda: case.step(module)  # noqa: E731
    forward = lambda: case.forward(module)  # noqa: E731
    for _ in range(args.warmup):  # ucudnn plans on first sight and captures graphs on second
        step()
    torch.cuda.synchronize()
    row = dict(host_us=host_us(step, sleeper, args.calls), fwd_us=host_us(forward, sleeper, args.calls),
               synced_ms=synced_ms(step, args.repeats), busy_ms=busy_ms(step, sleeper, args.repeats))
    try:
        row["kernels_ms"], row["kernels"] = kernels(step, 3)
        row["over_ms"] = row["synced_ms"] - row["kernels_ms"]
    except Exception as exc:  # the profiler is optional: busy_ms still bounds the kernels' sum
        row["kernels_error"] = f"{type(exc).__name__}: {exc}"
    return row


# --- the run -----------------------------------------------------------------------------------------

def contexts(args) -> dict[str, ut.Context]:
    """One WR context per limit, planning from a copy of the shipped measurements where there is one."""
    cache = Path(args.out) / "ucudnn-bench.db"
    shipped = recorded_path()
    if shipped is not None and not cache.exists():
        shutil.copy(shipped, cache)
    return {limit: ut.Context(workspace_limit=limit, optimizer="wr", cache_path=str(cache), delegate=False,
                       planning="first_call")  # steady state: planned on the first (warm-up) call
            for limit in args.limits.split(",")}


def run_case(layer: dict, batch: int, amp: bool, contexts_by_limit, sleeper, args) -> dict:
    case = Case(layer["spec"], (batch, *layer["chw"]), amp)
    variants = {"torch": case.module}
    for limit, context in contexts_by_limit.items():
        variants[f"ucudnn@{limit}"] = ut.convert(copy.deepcopy(case.module), context=context)
    results = {}
    for name, module in variants.items():
        try:
            results[name] = measure(case, module, sleeper, args)
        except Exception as exc:
            results[name] = dict(error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=3))
    return results


def profile_layer(layers: list[dict], batch: int, contexts_by_limit, args) -> str:
    """cProfile's top of the ucudnn path: steps of one ResNet-50 AMP layer, at the last limit."""
    layer = next((lay for lay in layers if lay["spec"]["kernel_size"] == (3, 3)), layers[0])
    case = Case(layer["spec"], (batch, *layer["chw"]), amp=True)
    module = ut.convert(copy.deepcopy(case.module), context=list(contexts_by_limit.values())[-1])
    for _ in range(args.warmup):
        case.step(module)
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(100):
        case.step(module)
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    return f"{layer['name']} {layer['chw']} AMP fp16 channels_last, 100 steps (per step: /100)\n" + text.getvalue()


def table(rows: list[dict]) -> str:
    lines = ["| net | precision | layer (count) | variant | host us/step (fwd) | synced ms | kernels ms | "
             "over kernels ms | bar | busy ms | longest kernels (us/step) |", "|---|" * 1 + "---|" * 10]
    for r in rows:
        for variant, m in r["results"].items():
            head = f"| {r['net']} | {r['precision']} | {r['layer']} {r['chw']} (x{r['count']}) | {variant} |"
            if "error" in m:
                lines.append(f"{head} {m['error']} | | | | | | |")
                continue
            over = m.get("over_ms")
            verdict = "-" if over is None else ("ok" if over <= BAR_MS else "OVER")
            top = "; ".join(f"{name} {us}" for name, us in m.get("kernels", [])[:3])
            lines.append(f"{head} {m['host_us']:.0f} ({m['fwd_us']:.0f}) | {m['synced_ms']:.3f} | "
                         f"{m.get('kernels_ms', float('nan')):.3f} | {over if over is None else round(over, 3)} | "
                         f"{verdict} | {m['busy_ms']:.3f} | {top} |")
    return "\n".join(lines)


def totals(rows: list[dict]) -> list[str]:
    """Per net and precision: what each ucudnn variant loses to torch, summed over the network's
    layers (x count), split into host time (over kernels) and kernel choice (kernels' sum)."""
    sums: dict[tuple, dict] = {}
    for r in rows:
        theirs = r["results"].get("torch", {})
        for variant, m in r["results"].items():
            if variant == "torch" or "over_ms" not in m or "over_ms" not in theirs:
                continue
            s = sums.setdefault((r["net"], r["precision"], variant), dict(host=0.0, kernels=0.0, synced=0.0, layers=0))
            s["host"] += r["count"] * (m["over_ms"] - theirs["over_ms"])
            s["kernels"] += r["count"] * (m["kernels_ms"] - theirs["kernels_ms"])
            s["synced"] += r["count"] * (m["synced_ms"] - theirs["synced_ms"])
            s["layers"] += r["count"]
    return [f"{net} {precision} {variant}: over torch per synced step of every layer: {s['synced']:+.2f} ms = "
            f"host {s['host']:+.2f} ms + kernel choice {s['kernels']:+.2f} ms ({s['layers']} layers)"
            for (net, precision, variant), s in sums.items()]


def write(out: Path, meta: dict, rows: list[dict], profile_text: str) -> None:
    bars = [f"{r['net']} {r['precision']} {r['layer']} {v}: {m['over_ms']:.3f} ms over its kernels"
            for r in rows for v, m in r["results"].items() if m.get("over_ms", 0) > BAR_MS and v != "torch"]
    write_report(out, "host_path.json", dict(meta=meta, rows=rows, totals=totals(rows), over_bar=bars,
                                             profile=profile_text))
    text = (f"# Host path per layer: torch vs ucudnn.torch ({meta['device']}, torch {meta['torch']})\n\n"
            f"{table(rows)}\n\n## Split over the network\n\n" + "\n".join(f"- {t}" for t in totals(rows))
            + f"\n\n## Over the bar ({BAR_MS} ms)\n\n" + ("\n".join(f"- {b}" for b in bars) or "- none")
            + "\n\n## cProfile of the ucudnn path\n\n```\n" + (profile_text or "(not reached)") + "\n```\n")
    (out / "host_path.md").write_text(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--nets", default="resnet50:64,alexnet:256")
    parser.add_argument("--precisions", default="amp,fp32")
    parser.add_argument("--limits", default="4GiB,64MiB")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10, help="steps queued back to back for host_us")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--deadline", type=float, default=220, help="seconds for the whole run")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                limits=args.limits, warmup=args.warmup, calls=args.calls, repeats=args.repeats, bar_ms=BAR_MS)
    sleeper, by_limit, rows, profile_text = Sleeper(), contexts(args), [], ""
    plan = [(net, int(batch), precision) for net, batch in (item.split(":") for item in args.nets.split(","))
            for precision in args.precisions.split(",")]
    layers = {net: distinct_layers(net) for net in {net for net, _, _ in plan}}
    for net, batch, precision in plan:
        for layer in layers[net]:
            left = args.deadline - (time.perf_counter() - started)
            if left < 15:
                meta["skipped"] = meta.get("skipped", 0) + 1
                continue
            log(f"{net} B={batch} {precision} {layer['name']} {layer['chw']} x{layer['count']} ({left:.0f} s left)")
            results = run_case(layer, batch, precision == "amp", by_limit, sleeper, args)
            rows.append(dict(net=net, batch=batch, precision=precision, layer=layer["name"], chw=layer["chw"],
                             count=layer["count"], spec={k: str(v) for k, v in layer["spec"].items()},
                             results=results))
            meta["elapsed_s"] = time.perf_counter() - started
            write(out, meta, rows, profile_text)
        if net == "resnet50" and precision == "amp" and not profile_text:
            try:
                profile_text = profile_layer(layers[net], batch, by_limit, args)
            except Exception as exc:
                profile_text = f"cProfile failed: {type(exc).__name__}: {exc}"
    meta["elapsed_s"] = time.perf_counter() - started
    meta["ucudnn"] = {limit: {k: v for k, v in context.summary().items() if k != "kernels"}
                      for limit, context in by_limit.items()}
    write(out, meta, rows, profile_text)
    log((out / "host_path.md").read_text())


if __name__ == "__main__":
    main()
