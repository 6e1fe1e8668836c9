"""A converted layer in a traced graph (torch.compile, torch.export): its call is decided when the
graph is traced, and the graph holds the decision.

- A layer left to torch's own convolution (delegated), or one ucudnn cannot run (a fallback),
  traces as torch's layer: the graph is the one torch's model gives, and Inductor compiles it so.
- A layer ucudnn runs traces as its operands' packing (call.pack), ucudnn's custom op (ops.py:
  one node, with its fake kernel and autograd formula) and the unpacking of its output.

A layer not decided yet is planned when traced, whatever `planning` says (a graph has no
iterations to plan between): Planner.settle, outside any tracing mode, so that timing and sweeping
run on real tensors. Tracing runs the layer's Python with fake tensors (torch.export, and
aot_autograd), or symbolically (dynamo, which torch.compile and a strict torch.export use): dynamo
hands the input's metadata over as constants to _decided_on_stand_in, which it calls once as
plain Python (torch._dynamo.assume_constant_result) and whose answer it keeps as a constant. So
the answer holds for the shapes, dtypes, grad mode and autocast the graph was traced for (dynamo
recompiles when they change); where dynamo traces sizes as symbols (dynamic shapes) it cannot
hand them over, and graph-breaks at the layer, which then runs eagerly.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

from ...fallback import fall_back
from . import ops
from .call import pack, resolve, unpacked
from .context import default_context
from .kernels import TorchFramework
from .sites import Site, signature

Decision = tuple[int, torch.dtype, torch.memory_format]  # ucudnn runs it: the site's handle, dtype, format


def decision(module: nn.Module, input: Tensor) -> Optional[Decision]:
    """How a traced call of `module` on `input` runs: None for torch's own layer, else ucudnn's op
    on the site its Decision names."""
    if torch.compiler.is_dynamo_compiling():
        # dynamo guards its graph on grad mode, autocast and torch's deterministic mode, and on
        # cuDNN's flags where read as here: a change retraces, and the answer is asked again
        cudnn = torch.backends.cudnn
        return _decided_on_stand_in(module, tuple(input.shape), input.stride(), input.dtype, input.device,
                                    input.requires_grad, cudnn.allow_tf32, cudnn.deterministic)
    return _decided(module, input)


def run(module: nn.Module, input: Tensor, decided: Decision) -> Tensor:
    """The layer's output through ucudnn's op, as the graph records it."""
    handle, dtype, fmt = decided
    x, weight, bias = pack(module, input, dtype, fmt)
    return unpacked(module, input, torch.ops.ucudnn.convolution(x, weight, bias, handle))


@torch._dynamo.assume_constant_result
def _decided_on_stand_in(module: nn.Module, shape: tuple, stride: tuple, dtype: torch.dtype, device: torch.device,
                         requires_grad: bool, *guarded: bool) -> Optional[Decision]:
    """_decided, called by dynamo with a traced input's metadata: on a fake tensor of it
    (`guarded`: global flags handed over for dynamo to guard on, read again where they are used)."""
    return _on_stand_in(module, shape, stride, dtype, device, requires_grad)


@torch.compiler.disable  # where dynamo cannot call it as a constant (symbolic sizes), it runs eagerly, not traced
def _on_stand_in(module: nn.Module, shape: tuple, stride: tuple, dtype: torch.dtype, device: torch.device,
                 requires_grad: bool) -> Optional[Decision]:
    with FakeTensorMode():
        stand_in = torch.empty_strided(shape, stride, dtype=dtype, device=device, requires_grad=requires_grad)
    return _decided(module, stand_in)


def _decided(module: nn.Module, input: Tensor) -> Optional[Decision]:
    """The call's site (resolved as an eager call's), decided now (Planner.settle), with every
    tracing mode set aside: nothing it does is recorded, and planning meets real tensors."""
    with _disable_current_modes():
        context = module.ucudnn_context or default_context()
        site = resolve(module, input, context, signature(module, input))
        if isinstance(site, str):
            fall_back(TorchFramework.own, site)
        if not isinstance(site, Site) or context.settle(site):
            return None
        return ops.handle(context, site), site.dtype, site.memory_format
