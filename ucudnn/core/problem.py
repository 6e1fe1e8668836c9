"""The problem model: one convolution kernel, immutable, with a key of everything that changes the answer."""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from .errors import ConfigError, unknown

INT64_MAX = 2**63 - 1  # no size or count is larger: NumPy and SQLite hold them as int64


class ConvKind(str, Enum):
    """Forward (F), BackwardData (BD) or BackwardFilter (BF)."""

    FORWARD = "F"
    BACKWARD_DATA = "BD"
    BACKWARD_FILTER = "BF"

    def __str__(self) -> str:
        return self.value


DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": None, "float64": np.float64}
MATH_TYPES = ("default", "tensor_op", "tensor_op_allow_conversion", "fma")
# Half types run on tensor cores only with tensor-op math: with `default` math cuDNN picks
# non-tensor-core kernels, many times slower than torch's (docs/results.md, "Half precision on
# tensor cores"). float32 keeps `default`, which allows TF32 where cuDNN may use it.
HALF_TYPES = ("float16", "bfloat16")
TRAINING_DTYPES = ("float32", *HALF_TYPES)  # what networks are planned in (float64 is for checks)
LAYOUTS = ("nchw", "nhwc")
MODES = ("cross_correlation", "convolution")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# What `deterministic` adds to a shape key: nothing when False, so every key (and cache row)
# written before the field existed reads as deterministic=False with no migration.
DETERMINISTIC_KEY = {False: (), True: ("deterministic",)}


SizesLike = int | Sequence[int]  # what constructors take for sizes: one for every spatial dimension, or one each

_SMALLEST = {"x_shape": 1, "w_shape": 1, "pads": 0, "strides": 1, "dilations": 1}  # of every dimension


def _tuple(value: SizesLike, n: int, name: str) -> tuple[int, ...]:
    values = (value,) * n if isinstance(value, int) else tuple(int(v) for v in value)
    if len(values) != n:
        raise ConfigError(f"{name}={value!r} needs {n} values, one per spatial dimension")
    return values


def _check(value: str, name: str, choices: Iterable[str]) -> str:
    if value not in choices:
        raise unknown(value, choices, name)
    return value


def default_math(dtype: str) -> str:
    """The math type ucudnn uses for `dtype` unless told otherwise: tensor_op for half types."""
    return "tensor_op" if dtype in HALF_TYPES else "default"


_WRITTEN = {ConvKind.FORWARD: 2, ConvKind.BACKWARD_DATA: 0, ConvKind.BACKWARD_FILTER: 1}  # ConvProblem.written


@dataclass(frozen=True)
class ConvProblem:
    """One convolution kernel. Shapes are logical (N, C, *spatial) and (K, C/groups, *kernel)
    whatever the memory layout; `layout` says how the packed tensors are stored."""

    # Sizes are tuples, one per spatial dimension; the constructor (__init__ below) also takes one
    # int for every dimension, as each default is, and __post_init__ makes the tuple
    kind: ConvKind
    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    pads: tuple[int, ...] = 0  # type: ignore[assignment]
    strides: tuple[int, ...] = 1  # type: ignore[assignment]
    dilations: tuple[int, ...] = 1  # type: ignore[assignment]
    groups: int = 1
    dtype: str = "float32"
    compute_type: str = ""  # "": float32 (float64 for float64 data)
    math: str = ""  # "": default_math(dtype)
    layout: str = "nchw"
    mode: str = "cross_correlation"
    # Only candidates cuDNN reports deterministic (bitwise equal results run to run) may be timed
    # or chosen. It lives here, with `math`, rather than in Settings: like the math type it
    # changes which candidates a kernel has and so the answer, and a field of the kernel reaches
    # every place that must agree on it (the backends' candidate filters, the cache key, plans
    # memoized by key) through the one object they already share.
    deterministic: bool = False

    if TYPE_CHECKING:  # the generated constructor's arguments, which __post_init__ converts and checks
        def __init__(self, kind: ConvKind | str, x_shape: Sequence[int], w_shape: Sequence[int], pads: SizesLike = 0,
                     strides: SizesLike = 1, dilations: SizesLike = 1, groups: int = 1, dtype: str = "float32",
                     compute_type: str = "", math: str = "", layout: str = "nchw", mode: str = "cross_correlation",
                     deterministic: bool = False) -> None: ...

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if self.kind not in tuple(k.value for k in ConvKind):  # members equal their str values
            raise unknown(self.kind, [k.value for k in ConvKind], "kind")
        set_("kind", ConvKind(self.kind))
        set_("x_shape", tuple(int(v) for v in self.x_shape))
        set_("w_shape", tuple(int(v) for v in self.w_shape))
        nd = len(self.x_shape) - 2
        if nd < 1 or len(self.w_shape) != nd + 2:
            raise ConfigError(f"x_shape={self.x_shape} and w_shape={self.w_shape} must both be (N, C, *spatial)")
        for name in ("pads", "strides", "dilations"):
            set_(name, _tuple(getattr(self, name), nd, name))
        _check(self.dtype, "dtype", DTYPES)
        set_("compute_type", self.compute_type or ("float64" if self.dtype == "float64" else "float32"))
        _check(self.compute_type, "compute_type", DTYPES)
        set_("math", self.math or default_math(self.dtype))
        _check(self.math, "math", MATH_TYPES)
        _check(self.layout, "layout", LAYOUTS)
        _check(self.mode, "mode", MODES)
        if not isinstance(self.deterministic, bool):
            raise ConfigError(f"deterministic={self.deterministic!r} is not a bool; pass True or False")
        n, c = self.x_shape[:2]
        k, cg = self.w_shape[:2]
        for name, smallest in _SMALLEST.items():
            if min(getattr(self, name)) < smallest:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= {smallest} in every dimension")
        if self.groups < 1 or c != cg * self.groups or k % self.groups:
            raise ConfigError(
                f"x has {c} channels and w has {cg} per group with groups={self.groups}: "
                f"need C == w_shape[1] * groups and K divisible by groups"
            )
        if min(self.y_shape[2:]) < 1:
            raise ConfigError(f"the output of {self.describe()} would be empty; check pads, strides and kernel size")

    @property
    def batch(self) -> int:
        return self.x_shape[0]

    @property
    def spatial_dims(self) -> int:
        return len(self.x_shape) - 2

    @functools.cached_property  # asked on every run of a framework's kernel (Planner.run); fields are frozen
    def y_shape(self) -> tuple[int, ...]:
        out = output_size(self.x_shape[2:], self.w_shape[2:], self.pads, self.strides, self.dilations)
        return (self.batch, self.w_shape[0], *out)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    def with_batch(self, batch: int) -> ConvProblem:
        """The same kernel on a micro-batch of `batch` samples."""
        return replace(self, x_shape=(batch, *self.x_shape[1:]))

    def with_kind(self, kind: ConvKind | str) -> ConvProblem:
        return replace(self, kind=ConvKind(kind))

    def sample_bytes(self, tensor: str) -> int:
        """Bytes between consecutive samples of x or y (N is outermost in both layouts)."""
        shape = {"x": self.x_shape, "y": self.y_shape}[tensor]
        return math.prod(shape[1:]) * self.itemsize

    def operand_bytes(self) -> int:
        """Bytes of x, w and y together."""
        return sum(math.prod(shape) for shape in (self.x_shape, self.w_shape, self.y_shape)) * self.itemsize

    @property
    def written(self) -> int:
        """Which of (x, w, y) the kernel writes, by position: y for F, x (dx) for BD, w (dw) for BF."""
        return _WRITTEN[self.kind]

    @property
    def written_shape(self) -> tuple[int, ...]:
        return (self.x_shape, self.w_shape, self.y_shape)[self.written]

    def written_bytes(self) -> int:
        """Bytes of the operand the kernel writes."""
        return math.prod(self.written_shape) * self.itemsize

    def shape_key(self) -> str:
        """Everything that changes a measurement except the batch size: measurements of
        micro-batch b are shared by every kernel with this shape key."""
        dims = lambda t: "x".join(map(str, t))  # noqa: E731
        return "|".join([
            self.kind.value, f"x={dims(self.x_shape[1:])}", f"w={dims(self.w_shape)}",
            f"pad={dims(self.pads)}", f"str={dims(self.strides)}", f"dil={dims(self.dilations)}",
            f"g={self.groups}", f"{self.dtype}/{self.compute_type}", f"math={self.math}",
            self.layout, self.mode, *DETERMINISTIC_KEY[self.deterministic],
        ])

    @property
    def key(self) -> str:
        """Stable identity of the kernel, batch included: equal keys get equal configurations."""
        return f"{self.shape_key()}|n={self.batch}"

    def flops(self) -> int:
        """Multiply-adds x 2 of the direct convolution (the same for F, BD and BF)."""
        k, cg, *kernel = self.w_shape
        return 2 * math.prod(self.y_shape) * cg * math.prod(kernel)

    def to_dict(self) -> dict:
        """Plain JSON-able fields; `ConvProblem.from_dict` inverts it."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["kind"] = self.kind.value
        if not self.deterministic:  # as before the field existed, so older ucudnn reads these rows
            del d["deterministic"]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> ConvProblem:
        return cls(**d)

    def lifted(self) -> ConvProblem:
        """A 1-D problem as the 2-D one cuDNN runs on the same memory (lift_1d); others as they are."""
        if len(self.x_shape) != 3:
            return self
        pads, strides, dilations = lift_1d(self.pads, self.strides, self.dilations)
        return replace(self, x_shape=(*self.x_shape[:2], 1, self.x_shape[2]),
                       w_shape=(*self.w_shape[:2], 1, self.w_shape[2]), pads=pads, strides=strides, dilations=dilations)

    def describe(self) -> str:
        return self._described

    @functools.cached_property
    def _described(self) -> str:
        """describe()'s text, made once: messages name the kernel on paths run at every call."""
        return (f"{self.kind.value} x={self.x_shape} w={self.w_shape} pad={self.pads} "
                f"stride={self.strides} dil={self.dilations} groups={self.groups} "
                f"{self.dtype} math={self.math} {self.layout}{' deterministic' if self.deterministic else ''}")


def output_size(size: Sequence[int], kernel: Sequence[int], pads: Sequence[int], strides: Sequence[int],
                dilations: Sequence[int]) -> tuple[int, ...]:
    """The spatial size of a convolution's output from its input's `size`."""
    return tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, p, s, d in zip(size, kernel, pads, strides, dilations))


def transposed_size(size: Sequence[int], kernel: Sequence[int], pads: Sequence[int], strides: Sequence[int],
                    dilations: Sequence[int], output_padding: Sequence[int]) -> tuple[int, ...]:
    """The spatial size of a transposed convolution's output from its input's `size` (torch's
    formula): the input size of the convolution it transposes, whose output_size() is `size`
    where each output_padding is below its stride."""
    return tuple((n - 1) * s - 2 * p + d * (k - 1) + o + 1
                 for n, k, p, s, d, o in zip(size, kernel, pads, strides, dilations, output_padding))


def lift_1d(pads: tuple[int, ...], strides: tuple[int, ...],
            dilations: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A 1-D convolution's geometry as 2-D with a height of 1 (no padding, stride and dilation 1
    across it), as torch and ucudnn run it: cuDNN's tensors have 4 or more dimensions."""
    return (0, *pads), (1, *strides), (1, *dilations)


@dataclass(frozen=True)
class Kernel:
    """A kernel of a network: a named ConvProblem ("conv2/F") that `count` identical layers run.
    The one type networks, the solve, the optimizers and reports share."""

    name: str
    problem: ConvProblem
    count: int = 1

    @property
    def layer(self) -> str:
        """The layer's name: the kernel's up to its kind ("conv2")."""
        return self.name.rsplit("/", 1)[0]


def check_kernels(kernels: Iterable[Kernel]) -> None:
    """The kernels of one plan: each named once (a plan is a configuration by kernel name), each
    count a positive integer; else a ConfigError naming the kernel."""
    kernels = list(kernels)
    check_unique_names((k.name for k in kernels), "kernel")
    for k in kernels:
        if isinstance(k.count, bool) or not isinstance(k.count, int) or k.count < 1:
            raise ConfigError(f"kernel {k.name!r} has count={k.count!r}; it must be a positive integer")


def check_unique_names(names: Iterable[str], what: str) -> None:
    """ConfigError naming the `what`s (kernels, layers) whose name occurs more than once: each
    thing a plan is made for is known by its name, and identical occurrences are one, counted."""
    names = list(names)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{what} names {twice} occur more than once; give every {what} its own "
                          f"name, or one {what} a count for identical occurrences")
