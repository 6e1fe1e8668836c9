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
recompiles when they change); where dynamo traces sizes as symbols (dynamic shapes) there are no
constants to hand over: the graph breaks at the layer (eager), which then runs eagerly.
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._python_dispatch import _disable_current_modes

from ...core.fallback import fall_back
from . import ops
from .call import pack, resolve, unpacked
from .context import Context, default_context
from .kernels import TorchFramework
from .sites import Site, signature

if TYPE_CHECKING:
    from torch.nn.modules.conv import _ConvNd

Decision = tuple[int, torch.dtype, torch.memory_format]  # ucudnn runs it: the site's handle, dtype, format


def decision(module: _ConvNd, input: Tensor) -> Decision | None:
    """How a traced call of `module` on `input` runs: None for torch's own layer, else ucudnn's op
    on the site its Decision names. Under dynamo, for an input of constant sizes (sizes_known)."""
    if torch.compiler.is_dynamo_compiling():
        # dynamo guards its graph on grad mode, autocast and torch's deterministic mode, and on
        # cuDNN's flags where read as here: a change retraces, and the answer is asked again. The
        # layer goes by its id: before torch 2.13 dynamo hands no module over as a constant
        cudnn = torch.backends.cudnn
        return _decided_on_stand_in(id(module), tuple(input.shape), input.stride(), input.dtype, input.device,
                                    input.requires_grad, cudnn.allow_tf32, cudnn.deterministic)
    return _decided(module, input)


def sizes_known(input: Tensor) -> bool:
    """Whether a traced input's sizes and strides are constants, not symbols (dynamic shapes: one
    graph for many sizes, where no one plan holds): every one's parity is known."""
    return all(statically_known_true(n % 2 == 0) or statically_known_true(n % 2 == 1)
               for n in (*input.shape, *input.stride()))


@torch.compiler.disable  # a graph break: the layer runs eagerly, planned for the sizes it meets
def eager(module: _ConvNd, input: Tensor) -> Tensor:
    """The layer's eager call, for an input whose sizes dynamo traces as symbols (sizes_known)."""
    return module(input)


def run(module: _ConvNd, input: Tensor, decided: Decision) -> Tensor:
    """The layer's output through ucudnn's op, as the graph records it."""
    handle, dtype, fmt = decided
    x, weight, bias = pack(module, input, dtype, fmt)
    return unpacked(module, input, torch.ops.ucudnn.convolution(x, weight, bias, handle))


@torch._dynamo.assume_constant_result
def _decided_on_stand_in(layer: int, shape: tuple, stride: tuple, dtype: torch.dtype, device: torch.device,
                         requires_grad: bool, *guarded: bool) -> Decision | None:
    """_decided, called by dynamo with a traced layer's id and its input's metadata: on a fake
    tensor of it (`guarded`: global flags handed over for dynamo to guard on, read again where they
    are used). Dynamo calls it while tracing the layer, which is alive then: its id is its address."""
    module = ctypes.cast(layer, ctypes.py_object).value
    with FakeTensorMode():
        stand_in = torch.empty_strided(shape, stride, dtype=dtype, device=device, requires_grad=requires_grad)
    return _decided(module, stand_in)


def _decided(module: _ConvNd, input: Tensor) -> Decision | None:
    """The call's site (resolved as an eager call's), decided now (Planner.settle), with every
    tracing mode set aside: nothing it does is recorded, and planning meets real tensors."""
    with _disable_current_modes():
        own = module.ucudnn_context  # convert()'s, or None
        context = own if isinstance(own, Context) else default_context()
        site = resolve(module, input, context, signature(module, input))
        if isinstance(site, str):
            fall_back(TorchFramework.own, site)
        if not isinstance(site, Site) or context.planner.settle(site):
            return None
        return ops.handle(context, site), site.dtype, site.memory_format
