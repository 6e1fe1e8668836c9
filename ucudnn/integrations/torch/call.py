"""What one call of a converted layer is: its geometry, data type, math and layout (a Call);
resolve(), which decides once per signature whether ucudnn runs it (see sites), and pack(), which
casts and packs its operands. `context` below is the layer's Context (context.py), which imports
this module: only its framework and sites are read here."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod as math_prod
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from ...core.problem import ConvKind, ConvProblem, default_math, lift_1d, output_size, transposed_size
from ...core.staging import is_aligned
from .sites import Site, autocast_dtype

if TYPE_CHECKING:  # what a converted layer is to torch: torch's base of its convolution layers
    from torch.nn.modules.conv import _ConvNd

DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
INDEX_LIMIT = 2**31 - 1  # cuDNN's legacy API describes tensors with 32-bit ints


@dataclass(frozen=True)
class Geometry:
    """The convolution's pads (after any F.pad of a non-zeros padding mode), strides, dilations
    (one each per spatial dimension), groups."""

    pads: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    groups: int

    def output_size(self, size: tuple[int, ...], kernel: tuple[int, ...]) -> tuple[int, ...]:
        return output_size(size, kernel, self.pads, self.strides, self.dilations)

    def transposed_size(self, size: tuple[int, ...], kernel: tuple[int, ...],
                        output_padding: tuple[int, ...]) -> tuple[int, ...]:
        """The output size of the transposed convolution of a `size` input (problem.transposed_size)."""
        return transposed_size(size, kernel, self.pads, self.strides, self.dilations, output_padding)

    def lifted(self) -> Geometry:
        """A 1-D convolution's geometry as the 2-D one cuDNN runs (problem.lift_1d)."""
        return Geometry(*lift_1d(self.pads, self.strides, self.dilations), self.groups)


def spatial_dims(module: _ConvNd) -> int:
    """The layer's spatial dimensions: 1 (Conv1d), 2 (Conv2d) or 3 (Conv3d)."""
    return len(module.kernel_size)


def lifts(module: _ConvNd) -> bool:
    """Whether ucudnn runs the layer as a convolution of one more spatial dimension: a 1-D layer
    runs as 2-D of height 1 (cuDNN's tensors have at least 4 dimensions; torch does the same)."""
    return spatial_dims(module) == 1


def memory_format(layout: str, ndim: int) -> torch.memory_format:
    """torch's memory format of a packed `ndim`-dimensional tensor stored as `layout`."""
    if layout != "nhwc":
        return torch.contiguous_format
    return torch.channels_last_3d if ndim == 5 else torch.channels_last


def geometry(module: _ConvNd) -> Geometry | str:
    """The layer's Geometry in its own dimensions, or why ucudnn cannot run it (a fallback reason)."""
    pads = module.padding
    if module.padding_mode != "zeros" or pads == "valid":
        pads = (0,) * spatial_dims(module)  # other padding modes: the input is padded by F.pad first, as torch does
    elif isinstance(pads, str):  # "same"
        totals = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size)]
        if any(t % 2 for t in totals):
            return "padding='same' with an even effective kernel size pads asymmetrically"
        pads = tuple(t // 2 for t in totals)
    return Geometry(tuple(pads), tuple(module.stride), tuple(module.dilation), module.groups)


def deterministic_algorithms() -> bool:
    """Whether torch asks for deterministic convolutions: torch.use_deterministic_algorithms(True)
    (warn_only too) or torch.backends.cudnn.deterministic. ucudnn then plans only candidates cuDNN
    reports deterministic (ConvProblem.deterministic); micro-batched sums stay in a fixed order."""
    return torch.are_deterministic_algorithms_enabled() or bool(torch.backends.cudnn.deterministic)


def math_type(dtype: str) -> str:
    """cuDNN math type matching torch: half types on tensor cores; float32 uses TF32 tensor
    cores only where torch allows them."""
    if dtype == "float32" and not torch.backends.cudnn.allow_tf32:
        return "fma"
    return default_math(dtype)


@dataclass(frozen=True)
class Call:
    """One convolution as ucudnn sees it: hashable, so a Context memoizes its kernels by it."""

    device: torch.device
    x_shape: tuple[int, ...]  # after any F.pad
    w_shape: tuple[int, ...]
    geometry: Geometry
    dtype: str
    math: str
    layout: str  # "nchw" or "nhwc" (channels_last, channels_last_3d)
    deterministic: bool = False  # deterministic_algorithms() when the call was resolved
    # A transposed layer (nn.ConvTranspose*d) runs the convolution it transposes backwards: x_shape
    # is the layer's output, y_shape its input, and its forward is that convolution's BD
    transposed: bool = False

    @property
    def memory_format(self) -> torch.memory_format:
        return memory_format(self.layout, len(self.x_shape))

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The shape of the layer's output: y's, or for a transposed layer x's."""
        return self.x_shape if self.transposed else self.y_shape

    @property
    def y_shape(self) -> tuple[int, ...]:
        return (self.x_shape[0], self.w_shape[0],
                *self.geometry.output_size(self.x_shape[2:], self.w_shape[2:]))

    def problem(self, kind: ConvKind) -> ConvProblem:
        g = self.geometry
        return ConvProblem(kind, self.x_shape, self.w_shape, g.pads, g.strides, g.dilations, g.groups,
                           dtype=self.dtype, math=self.math, layout=self.layout, deterministic=self.deterministic)


def compute_dtype(input: Tensor) -> tuple[torch.dtype, bool]:
    """What torch's conv2d computes in, and whether autocast casts to it: the autocast dtype for
    eligible inputs (whatever the weight's dtype), else the input's own."""
    cast = autocast_dtype(input.device.type)
    if cast is not None and input.is_floating_point() and input.dtype != torch.float64:
        return cast, True
    return input.dtype, False


def _suggests_channels_last(t: Tensor) -> bool:
    """Whether torch's suggest_memory_format() says channels_last or channels_last_3d (c10's
    is_channels_last_strides_2d_s4 and _3d_s5), so that tensors packed both ways get torch's choice."""
    if t.dim() not in (4, 5) or t.stride(1) == 0:
        return False
    low = 0
    for d in (1, *range(t.dim() - 1, 1, -1), 0):
        if t.shape[d] == 0 or t.stride(d) < low or (d == 0 and low == t.stride(1)):
            return False
        low = t.stride(d) * max(t.shape[d], 1)
    return True


def _padded_size(module: _ConvNd, input: Tensor) -> tuple[int, ...]:
    """Spatial size after the F.pad of a non-zeros padding mode (unchanged for zeros)."""
    dims = spatial_dims(module)
    size = tuple(input.shape[-dims:])
    if module.padding_mode == "zeros":
        return size
    pads = module._reversed_padding_repeated_twice  # (last's left, last's right, ..., first's left, first's right)
    return tuple(n + pads[2 * (dims - 1 - i)] + pads[2 * (dims - 1 - i) + 1] for i, n in enumerate(size))


def _is_valid(module: _ConvNd, input: Tensor, autocast: bool, shape: Geometry | str) -> bool:
    """False for calls torch itself rejects: they go to torch, which raises its usual error."""
    weight, dims = module.weight, spatial_dims(module)
    if not (input.dim() in (dims + 1, dims + 2) and input.shape[-dims - 1] == module.in_channels
            and min(input.shape[-dims:]) > 0 and input.device == weight.device
            and (autocast or input.dtype == weight.dtype)):
        return False
    return isinstance(shape, str) or min(_output_size(module, shape, _padded_size(module, input),
                                                      tuple(weight.shape[2:]))) > 0


def _output_size(module: _ConvNd, shape: Geometry, size: tuple[int, ...], kernel: tuple[int, ...]) -> tuple[int, ...]:
    """The spatial size of the layer's output from its input's `size` and the `kernel` size (in
    `shape`'s dimensions: the layer's own, or lifted)."""
    if not module.transposed:
        return shape.output_size(size, kernel)
    padding = (0,) * (len(size) - spatial_dims(module)) + tuple(module.output_padding)
    return shape.transposed_size(size, kernel, padding)


def _fallback_reason(module: _ConvNd, input: Tensor, dtype: torch.dtype, context) -> str | None:
    if not context.framework.runs_on(input.device):
        return f"input on {input.device.type} (ucudnn runs CUDA tensors only)"
    if dtype not in DTYPES:
        return f"dtype {dtype} (ucudnn runs float32, float16 and bfloat16)"
    if input.dim() == spatial_dims(module) + 2 and input.shape[0] == 0:
        return "an empty batch"
    return None


def _transpose_reason(module: _ConvNd) -> str | None:
    """Why a transposed layer is not the backward data of a convolution (else None): an
    output_padding of the stride or more (torch allows it below the dilation) makes an output
    from which that convolution gives a larger result than the layer's input."""
    if module.transposed and any(o >= s for o, s in zip(module.output_padding, module.stride)):
        return (f"output_padding={tuple(module.output_padding)} not below stride={tuple(module.stride)}: "
                "no convolution has this transposed layer as its backward data")
    return None


def resolve(module: _ConvNd, input: Tensor, context, key: tuple) -> Site | str | None:
    """The Site of this call, whose signature is `key` (sites.signature), when ucudnn runs it; a
    reason string when ucudnn cannot; None when torch should handle it because the call is
    invalid (torch raises the error users expect). Decided once per signature (see sites.py): a
    steady-state call looks the key up."""
    return context.sites.get(key, _resolve, module, input, context)


def pack(module: _ConvNd, input: Tensor, dtype: torch.dtype,
         fmt: torch.memory_format) -> tuple[Tensor, Tensor, Tensor | None]:
    """x, weight and bias cast to `dtype` (a site's) and packed in `fmt` (its layout's memory
    format), in the dimensions cuDNN runs (lifts): a no-op for packed tensors of that dtype, a
    copy otherwise (as in torch). Torch operations only, which a traced graph records; x starts
    where torch put it (a view may start off the slice alignment: aligned())."""
    bias = module.bias
    return (_padded(module, input).to(dtype).contiguous(memory_format=fmt),
            _weight(module).to(dtype).contiguous(memory_format=fmt), None if bias is None else bias.to(dtype))


def unpacked(module: _ConvNd, input: Tensor, y: Tensor) -> Tensor:
    """The layer's output from `y` of the convolution cuDNN ran: back to the layer's own
    dimensions (lifts), and unbatched where the input was."""
    if lifts(module):
        y = y.squeeze(-2)
    return y if input.dim() == spatial_dims(module) + 2 else y.squeeze(0)


def sliceable(tensor: Tensor, fmt: torch.memory_format) -> Tensor:
    """`tensor` packed in `fmt` and starting on the slice alignment, as micro-batched calls need
    (ucudnn.core.staging): a no-op for tensors torch allocated, a copy of a view that starts elsewhere."""
    return aligned(tensor.contiguous(memory_format=fmt), fmt)


def aligned(packed: Tensor, fmt: torch.memory_format) -> Tensor:
    """`packed` (packed in `fmt`), or a copy of it where it starts off the slice alignment."""
    return packed if is_aligned(packed.data_ptr()) else packed.clone(memory_format=fmt)


def kinds_needed(input: Tensor, weight: Tensor, transposed: bool = False) -> tuple[ConvKind, ...]:
    """The kernels a call runs: its forward kernel, and in a training step its input's gradient
    kernel where the input needs a gradient and BF where the weight does (layer_kinds)."""
    forward, input_gradient = layer_kinds(transposed)
    grad = torch.is_grad_enabled()
    return ((forward,) + ((input_gradient,) if grad and input.requires_grad else ())
            + ((ConvKind.BACKWARD_FILTER,) if grad and weight.requires_grad else ()))


def layer_kinds(transposed: bool) -> tuple[ConvKind, ConvKind]:
    """The kernels of a layer's forward and of its input's gradient: F and BD, or for a
    transposed layer BD and F (it runs the convolution it transposes backwards)."""
    return (ConvKind.BACKWARD_DATA, ConvKind.FORWARD) if transposed else (ConvKind.FORWARD, ConvKind.BACKWARD_DATA)


def _padded(module: _ConvNd, input: Tensor) -> Tensor:
    """The input batched, padded by F.pad for a non-zeros padding mode, and lifted (lifts)."""
    x = input if input.dim() == spatial_dims(module) + 2 else input.unsqueeze(0)
    if module.padding_mode != "zeros":
        x = F.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode)
    return x.unsqueeze(-2) if lifts(module) else x


def _weight(module: _ConvNd) -> Tensor:
    """The layer's weight in the dimensions cuDNN runs (lifts): a view, through which autograd
    takes the weight's gradient back."""
    return module.weight.unsqueeze(-2) if lifts(module) else module.weight


def _resolve(module: _ConvNd, input: Tensor, context) -> tuple[Call, tuple[ConvKind, ...]] | str | None:
    """resolve()'s decision for a new signature: the Call and the kernels it runs, a fallback
    reason, or None."""
    dtype, autocast = compute_dtype(input)
    deterministic = deterministic_algorithms()
    shape = geometry(module)
    if not _is_valid(module, input, autocast, shape):
        return None
    reason = _fallback_reason(module, input, dtype, context) or _transpose_reason(module)
    if reason:
        return reason
    if isinstance(shape, str):
        return shape
    shape = shape.lifted() if lifts(module) else shape
    x, weight = _padded(module, input), _weight(module)
    out = _output_size(module, shape, tuple(x.shape[2:]), tuple(weight.shape[2:]))
    if max(x.numel(), weight.numel(), x.shape[0] * module.out_channels * math_prod(out)) > INDEX_LIMIT:
        return "a tensor with 2**31 or more elements (cuDNN's legacy API indexes with 32-bit ints)"
    # torch's rule for cuDNN: channels_last when the input or the weight suggests it.
    layout = "nhwc" if _suggests_channels_last(x) or _suggests_channels_last(weight) else "nchw"
    # the convolution's x: the layer's input, or for a transposed layer its output
    conv_x = (x.shape[0], module.out_channels, *out) if module.transposed else tuple(x.shape)
    return Call(x.device, conv_x, tuple(weight.shape), shape, DTYPES[dtype], math_type(DTYPES[dtype]), layout,
                deterministic, module.transposed), kinds_needed(input, module.weight, module.transposed)
