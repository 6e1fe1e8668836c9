"""Layers whose samples sit off the 256-byte slice alignment, under memory pressure (bar: Caffe
AlexNet conv1 fp16 >= 20x over torch with L free, the Inception-v3 stem fp16 >= 3x).

For each layer, one training step (F with bias, BD, BF; bench/conv_step.py), in one process:
  torch free      - torch's own step, memory free (cudnn.benchmark on)
  torch pressure  - the same with only L free beyond the step's own tensors (a blocker allocation)
  ucudnn          - the layer through ucudnn.torch at L per kernel, under the same blocker
The step's own tensors are its peak with a copy converted at zero workspace; the layer is planned
(its kernels benchmarked into the database) before the blocker, so the timed copy plans from
the database, as a second process would. Results (y, dx, dw)
of ucudnn and of torch are compared with a float64 step on the GPU. Also: the copy model of
ucudnn.core.staging against device-to-device copies replayed in a CUDA graph.

    python3 bench/slices.py --out OUT [--free 8MiB] [--layers caffe_conv1,inception_stem,inception_stem_fp32]
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conv_step import Case  # noqa: E402
from probe_setup import median_ms  # noqa: E402
from train_step import block  # noqa: E402

import ucudnn.torch  # noqa: E402
from ucudnn import parse_size  # noqa: E402
from ucudnn.plan.config import Settings  # noqa: E402
from ucudnn.integrations.torch import TorchFramework  # noqa: E402
from ucudnn.integrations.torch.layers import TWINS  # noqa: E402
from ucudnn.core.staging import copy_ms  # noqa: E402

MiB = 2**20
LAYERS = {  # name: (nn.Conv2d keywords, input shape, AMP fp16 channels_last)
    "caffe_conv1": (dict(in_channels=3, out_channels=96, kernel_size=11, stride=4), (256, 3, 227, 227), True),
    "inception_stem": (dict(in_channels=3, out_channels=32, kernel_size=3, stride=2), (128, 3, 299, 299), True),
    "inception_stem_fp32": (dict(in_channels=3, out_channels=32, kernel_size=3, stride=2), (128, 3, 299, 299), False),
}


def log(message: str) -> None:
    print(message, flush=True)


def step_ms(case: Case, module: nn.Module) -> float:
    """Median of CUDA-event timings of 10 training steps after 3 of warm-up."""
    return median_ms(lambda: case.step(module), torch.cuda.current_stream().cuda_stream, 3, 10)


def converted(case: Case, limit: int, cache: str, delegate: bool = True, search: str = "pruned") -> nn.Module:
    """A copy of the case's layer through ucudnn.torch at `limit` per kernel: its converted twin
    (layers.TWINS), whether convert() swaps that kind yet or not, planned on its first (warm-up) call."""
    module = copy.deepcopy(case.module)
    module.__class__ = TWINS[type(case.module)]
    settings = Settings.load(workspace_limit=limit, cache_path=cache, planning="first_call", search=search)
    module.ucudnn_context = ucudnn.torch.Context(settings, delegate=delegate)
    return module


def pressed(case: Case, free: int, peak: int, result: dict) -> torch.Tensor:
    """The blocker (train_step.block) with torch's step run once under it, placed again once where
    that step ran out: the first steps under pressure load cuDNN's kernels for the plans torch
    tries, and the loaded code takes device memory that the first placement counted as free."""
    for attempt in (1, 2):
        blocker = block(SimpleNamespace(footprint_of="allocated", footprint=torch.cuda.memory_allocated() + peak,
                                        free_bytes=free), torch.device("cuda"), result)
        try:
            case.step(case.module)
            torch.cuda.synchronize()
            return blocker
        except torch.cuda.OutOfMemoryError:
            if attempt == 2:
                raise
            del blocker
            torch.cuda.empty_cache()


def phase_peaks(case: Case, module: nn.Module) -> tuple[int, int]:
    """Bytes one step of `module` allocates at its peak in the forward and in the backward pass,
    beyond what is held as each begins. Against a copy at zero workspace, the workspace each pass
    took: torch's benchmark mode takes what is free at that moment, which under a blocker leaving
    L beyond the step's peak includes the room of the tensors the step has not made yet."""
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = case.forward(module)
    torch.cuda.synchronize()
    forward, held = torch.cuda.max_memory_allocated() - held, torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y.backward(case.dy)
    torch.cuda.synchronize()
    backward = torch.cuda.max_memory_allocated() - held
    del y
    case.clear(module)
    return forward, backward


def swept(case: Case, limit: int, cache: str) -> None:
    """Every kernel of the case's layer at `limit` swept into the database with memory free, as
    `ucudnn bench` sweeps (the full search): the benchmarker needs the operands' memory, which a
    blocker leaves no room for. What the sweep cached goes back to the device."""
    case.step(converted(case, limit, cache, delegate=False, search="full"))
    torch.cuda.empty_cache()


def alike(case: Case, free: int, peak: int, limit: int, cache: str, result: dict) -> torch.Tensor:
    """ucudnn's step at `limit` per kernel (the most workspace a pass of torch's step took), its
    kernels swept with memory free first, timed under a blocker placed again (returned); the
    kernels it had to plan again within less (shrinks) are listed, as ucudnn_shrinks lists them."""
    torch.cuda.empty_cache()
    swept(case, limit, cache)
    blocker = pressed(case, free, peak, {})
    module = converted(case, limit, cache)
    case.step(module)
    result["ucudnn_alike_ms"] = step_ms(case, module)
    result["ucudnn_alike_beyond_tensors_mib"] = (step_peak(case, module) - peak) / MiB
    result["ucudnn_alike_shrinks"] = ucudnn.torch.context_of(module).summary()["shrinks"]
    return blocker


def tensors_peaks(case: Case, cache: str) -> tuple[int, tuple[int, int]]:
    """Bytes a step allocates beyond what is held with no workspace (a copy at zero workspace,
    planned first), at its peak and in each pass (phase_peaks)."""
    module = converted(case, 0, cache)
    case.step(module)
    return step_peak(case, module), phase_peaks(case, module)


def step_peak(case: Case, module: nn.Module) -> int:
    """Bytes one step of `module` allocates at its peak beyond what is held before it."""
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    case.step(module)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - held


def errors(case: Case, outputs: dict) -> dict[str, float]:
    """Relative error (norm of the difference over the norm) of each output against the layer
    run in float64."""
    m = copy.deepcopy(case.module).double()
    x = case.x.detach().double().requires_grad_()
    y = m(x)
    y.backward(case.dy.double())
    reference = {"y": y.detach(), "dx": x.grad, "dw": m.weight.grad}
    return {k: float((outputs[k].double() - ref).norm() / ref.norm()) for k, ref in reference.items()}


def layer(name: str, free: int, cache: str) -> dict:
    spec, shape, amp = LAYERS[name]
    result = dict(layer=name, input=list(shape), precision="amp fp16 channels_last" if amp else "fp32 nchw")
    return measured(Case(spec, shape, amp), free, cache, result)


def measured(case: Case, free: int, cache: str, result: dict) -> dict:
    """`result` with one training step of the case's layer timed: torch's with memory free and
    with `free` bytes free beyond the step's own tensors (a blocker), a second copy of torch's
    layer under the blocker (the A/A control), and ucudnn.torch's at `free` per kernel under it;
    the errors of ucudnn's and torch's outputs against float64."""
    torch.backends.cudnn.benchmark = True
    result["free_mib"] = free / MiB
    result["torch_free_ms"] = step_ms(case, case.module)
    result["torch_errors"] = errors(case, case.outputs(case.module))
    peak, zero = tensors_peaks(case, cache)
    swept(case, free, cache)
    blocker = pressed(case, free, peak, result)
    result["tensors_mib"] = peak / MiB
    result["torch_pressure_ms"] = step_ms(case, case.module)
    # beyond the step's tensors: at the step's peak, and the most any pass took (its workspace),
    # which may exceed L where the step's later tensors were not allocated yet when a kernel ran
    result["torch_beyond_tensors_mib"] = (step_peak(case, case.module) - peak) / MiB
    result["torch_workspace_mib"] = max(0, *(t - z for t, z in zip(phase_peaks(case, case.module), zero))) / MiB
    result["control_pressure_ms"] = step_ms(case, copy.deepcopy(case.module))
    settled = functools.partial(TorchFramework().settled_memory, torch.device("cuda"))
    before = settled()
    start = time.perf_counter()
    module = converted(case, free, cache)
    case.step(module)
    torch.cuda.synchronize()
    result["ucudnn_first_step_s"] = time.perf_counter() - start
    after = settled()
    # what ucudnn's planned step keeps after it (graphs, handles, buffers): taken out of L
    result["ucudnn_held_mib"] = {"device": (before.free - after.free) / MiB,
                                 "torch_tensors": (after.allocated - before.allocated) / MiB}
    result["ucudnn_ms"] = step_ms(case, module)
    result["ucudnn_beyond_tensors_mib"] = (step_peak(case, module) - peak) / MiB
    outputs = case.outputs(module)
    summary = ucudnn.torch.context_of(module).summary()
    result["plans"], result["ucudnn_shrinks"] = summary["kernels"], summary["shrinks"]
    torch_bytes = int(result["torch_workspace_mib"] * MiB)
    if torch_bytes > free + MiB:  # torch took more than L: ucudnn given as much, like for like
        del module, blocker
        blocker = alike(case, free, peak, torch_bytes, cache, result)
    del blocker
    torch.cuda.empty_cache()
    result["ucudnn_errors"] = errors(case, outputs)
    result["speedup_under_pressure"] = result["torch_pressure_ms"] / result["ucudnn_ms"]
    log(f"{result['layer']}: torch free {result['torch_free_ms']:.2f} ms, torch at {free / MiB:.0f} MiB free "
        f"{result['torch_pressure_ms']:.2f} ms, ucudnn {result['ucudnn_ms']:.2f} ms "
        f"({result['speedup_under_pressure']:.1f}x); dW error ucudnn {result['ucudnn_errors']['dw']:.1e} "
        f"torch {result['torch_errors']['dw']:.1e}")
    return result


def copies(sizes_mib=(0.25, 1, 4, 16, 64), per_graph: int = 20) -> list[dict]:
    """Device-to-device copies replayed in a CUDA graph, ms per copy, beside ucudnn.core.staging's model."""
    rows = []
    for mib in sizes_mib:
        n = int(mib * MiB)
        src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream):
            dst.copy_(src)
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(per_graph):
                    dst.copy_(src)
        measured = median_ms(graph.replay, torch.cuda.current_stream().cuda_stream, 2, 10) / per_graph
        rows.append(dict(mib=mib, measured_ms=measured, model_ms=copy_ms(n)))
        log(f"copy {mib} MiB: {rows[-1]['measured_ms']:.4f} ms, model {rows[-1]['model_ms']:.4f} ms")
    return rows


def markdown(report: dict) -> str:
    lines = [f"Device: {report['device']}; {report['date']}", "",
             "| layer | precision | torch, memory free | torch, L free | ucudnn.torch at L | speedup | dW error ucudnn / torch |",
             "|---|---|---|---|---|---|---|"]
    for r in report["layers"]:
        lines.append(f"| {r['layer']} {tuple(r['input'])} | {r['precision']} | {r['torch_free_ms']:.2f} ms | "
                     f"{r['torch_pressure_ms']:.2f} ms | {r['ucudnn_ms']:.2f} ms | {r['speedup_under_pressure']:.1f}x | "
                     f"{r['ucudnn_errors']['dw']:.1e} / {r['torch_errors']['dw']:.1e} |")
    lines += ["", "| copy | measured ms | model ms |", "|---|---|---|"]
    lines += [f"| {c['mib']} MiB | {c['measured_ms']:.4f} | {c['model_ms']:.4f} |" for c in report["copies"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out")
    parser.add_argument("--free", default="8MiB", help="memory left free beyond the step's tensors, and ucudnn's limit")
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--cache", default=None, help="benchmark database (default OUT/slices.db)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = args.cache or str(out / "slices.db")
    report = dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), copies=copies(), layers=[])
    for name in args.layers.split(","):
        report["layers"].append(layer(name, parse_size(args.free), cache))
        (out / "slices.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "slices.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
