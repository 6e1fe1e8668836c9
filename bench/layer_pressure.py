"""One layer's training step (F with bias, BD, BF) under memory pressure, torch's against ucudnn's
twin of the layer, in one process: what bench/nd_layers.py measures per layer and limit.
`measured` says what is timed; `Case` is the layer, its input and a fixed output gradient."""
from __future__ import annotations

import copy
import functools
import time

import torch
from torch import Tensor, nn

import ucudnn.torch
from bench.common import MiB, block, median_ms, relative_error
from ucudnn.integrations.torch import TorchPool
from ucudnn.integrations.torch.layers import TWINS
from ucudnn.plan.config import Settings


class Case:
    """One layer (keyword arguments of `layer`, nn.Conv2d by default) at one input shape and
    precision: its module, an input that needs a gradient, a fixed output gradient, and a
    training step of a module. `amp`: float16 channels-last input and module (channels_last_3d
    for 3-D layers; 1-D ones have none), run under autocast; else float32, packed."""

    def __init__(self, spec: dict, input_shape: tuple[int, ...], amp: bool, device: str = "cuda", seed: int = 0,
                 layer: type = nn.Conv2d):
        self.amp = amp
        self.device = torch.device(device)
        last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(input_shape), torch.contiguous_format)
        fmt = last if amp else torch.contiguous_format
        dtype = torch.float16 if amp else torch.float32
        torch.manual_seed(seed)
        self.module = layer(**spec).to(self.device).to(memory_format=fmt)
        self.x = torch.randn(input_shape, device=self.device, dtype=dtype).contiguous(memory_format=fmt)
        self.x.requires_grad_()
        with torch.no_grad(), self.autocast():
            self.dy = torch.randn_like(self.module(self.x))

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.float16, enabled=self.amp)

    def forward(self, module: nn.Module) -> Tensor:
        with self.autocast():
            return module(self.x)

    def step(self, module: nn.Module) -> None:
        self.forward(module).backward(self.dy)
        self.clear(module)

    def outputs(self, module: nn.Module) -> dict[str, Tensor]:
        """y, dx, dw (and db where the layer has a bias) of one step of `module`."""
        y = self.forward(module)
        y.backward(self.dy)
        out = {"y": y.detach(), "dx": self.x.grad, "dw": module.weight.grad}
        if module.bias is not None:
            out["db"] = module.bias.grad
        self.clear(module)
        return out

    def clear(self, module: nn.Module) -> None:
        for p in (self.x, *module.parameters()):
            p.grad = None


def step_ms(case: Case, module: nn.Module) -> float:
    """Median of CUDA-event timings of 10 training steps after 3 of warm-up."""
    return median_ms(lambda: case.step(module))


def converted(case: Case, limit: int, cache: str, delegate: bool = True, search: str = "pruned") -> nn.Module:
    """A copy of the case's layer through ucudnn.torch at `limit` per kernel: its converted twin
    (layers.TWINS), whether convert() swaps that kind yet or not, planned on its first (warm-up) call."""
    module = copy.deepcopy(case.module)
    module.__class__ = TWINS[type(case.module)]
    settings = Settings.load(workspace_limit=limit, cache_path=cache, planning="first_call", search=search)
    module.ucudnn_context = ucudnn.torch.Context(settings, delegate=delegate)
    return module


def pressed(case: Case, free: int, peak: int, result: dict) -> torch.Tensor:
    """The blocker (common.block) with torch's step run once under it, placed again once where
    that step ran out: the first steps under pressure load cuDNN's kernels for the plans torch
    tries, and the loaded code takes device memory that the first placement counted as free."""
    for attempt in (1, 2):
        blocker = block(torch.device("cuda"), torch.cuda.memory_allocated() + peak, free, result)
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
    return {k: relative_error(outputs[k], ref) for k, ref in reference.items()}


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
    settled = functools.partial(TorchPool.settled_memory, torch.device("cuda"))
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
    print(f"{result['layer']}: torch free {result['torch_free_ms']:.2f} ms, torch at {free / MiB:.0f} MiB free "
          f"{result['torch_pressure_ms']:.2f} ms, ucudnn {result['ucudnn_ms']:.2f} ms "
          f"({result['speedup_under_pressure']:.1f}x); dW error ucudnn {result['ucudnn_errors']['dw']:.1e} "
          f"torch {result['torch_errors']['dw']:.1e}", flush=True)
    return result
