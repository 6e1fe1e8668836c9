"""Networks as ucudnn sees them: the geometry of their 1-D, 2-D and 3-D convolution layers, no weights."""
from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..problem import INT64_MAX, ConvKind, ConvProblem, Kernel, SizesLike, check_unique_names, transposed_size

Sizes = tuple[int, ...]  # one per spatial dimension
_SIZES = {"kernel": 1, "input_size": 1, "stride": 1, "pad": 0, "dilation": 1, "output_padding": 0}  # each one's smallest value
_AXES = {1: "[length]", 2: "[height, width]", 3: "[depth, height, width]"}
_COUNTS = ("in_channels", "out_channels", "groups", "count")  # positive integers
DEFAULT_BATCH = 256  # of a network that names none


def _is_int(value, smallest: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and smallest <= value <= INT64_MAX


def _range(smallest: int) -> str:
    return f"from {smallest} to 2**63 - 1"


def spatial_dims(sizes: dict[str, object]) -> int:
    """A layer's spatial dimensions: the length of the longest list among its sizes (by name),
    else 2 (every size one integer: a 2-D layer). A list of a length no layer has (1 to 3) is a
    ConfigError naming it."""
    lists = {name: list(v) for name, v in sizes.items() if isinstance(v, (list, tuple))}
    for name, values in lists.items():
        if len(values) not in _AXES:
            raise ConfigError(f"{name}={values} has {len(values)} values; a size is an integer or a list of 1, 2 "
                              "or 3 integers, one per spatial dimension: [length], [height, width] or "
                              "[depth, height, width]")
    return max(map(len, lists.values()), default=2)


def _sizes(value, name: str, dims: int) -> Sizes:
    smallest = _SIZES[name]
    values = (value,) * dims if isinstance(value, int) else tuple(value) if isinstance(value, (list, tuple)) else ()
    if dims not in _AXES or len(values) != dims or not all(_is_int(v, smallest) for v in values):
        axes = _AXES.get(dims, "[height, width]")
        raise ConfigError(f"{name}={value!r} must be an integer or {axes.count(',') + 1} integers {axes}, "
                          f"each {_range(smallest)} (a layer has 1, 2 or 3 spatial dimensions, as its longest "
                          "list of sizes says)")
    return values


def _positive(value, name: str) -> int:
    if not _is_int(value):
        raise ConfigError(f"{name}={value!r} must be an integer {_range(1)}")
    return value


@dataclass(frozen=True)
class ConvLayer:
    """One convolution layer; `count` layers of the network have exactly this geometry. A
    `transposed` layer (nn.ConvTranspose*d, `output_padding` below its stride) has the kernels of
    the convolution it transposes: that convolution's BD is the layer's forward, its F the layer's
    input gradient, its BF the weight gradient; a file names them by that convolution's kinds."""

    # Sizes are tuples, one per spatial dimension; the constructor (__init__ below) also takes one
    # int for every dimension, as each default is, and __post_init__ makes the tuple
    name: str
    in_channels: int
    out_channels: int
    kernel: Sizes
    input_size: Sizes  # of the input feature map: (length), (height, width) or (depth, height, width)
    stride: Sizes = 1  # type: ignore[assignment]
    pad: Sizes = 0  # type: ignore[assignment]
    dilation: Sizes = 1  # type: ignore[assignment]
    groups: int = 1
    count: int = 1
    transposed: bool = False
    output_padding: Sizes = 0  # type: ignore[assignment]  # transposed layers only

    if TYPE_CHECKING:  # the generated constructor's arguments, which __post_init__ converts and checks
        def __init__(self, name: str, in_channels: int, out_channels: int, kernel: SizesLike, input_size: SizesLike,
                     stride: SizesLike = 1, pad: SizesLike = 0, dilation: SizesLike = 1, groups: int = 1,
                     count: int = 1, transposed: bool = False, output_padding: SizesLike = 0) -> None: ...

    def __post_init__(self) -> None:
        try:
            dims = spatial_dims({name: getattr(self, name) for name in _SIZES})
            for name in _SIZES:
                object.__setattr__(self, name, _sizes(getattr(self, name), name, dims))
            for name in _COUNTS:
                _positive(getattr(self, name), name)
            self._check_transposed()
            self.problem(ConvKind.FORWARD, 1)
        except ConfigError as exc:
            raise ConfigError(f"layer {self.name}: {exc}") from None

    def _check_transposed(self) -> None:
        if not isinstance(self.transposed, bool):
            raise ConfigError(f"transposed={self.transposed!r} must be true or false")
        if any(self.output_padding) and not self.transposed:
            raise ConfigError(f"output_padding={list(self.output_padding)} is a transposed layer's; "
                              "set transposed or drop it")
        if any(o >= s for o, s in zip(self.output_padding, self.stride)):
            raise ConfigError(f"output_padding={list(self.output_padding)} must be below stride={list(self.stride)} "
                              "(then the layer is the backward data of a convolution)")

    @property
    def geometry(self) -> tuple:
        """Everything but the name and count: layers with equal geometry share their kernels."""
        return tuple(getattr(self, f.name) for f in fields(self) if f.name not in ("name", "count"))

    @property
    def output_size(self) -> Sizes:
        """The spatial size of the layer's output (a transposed layer's: its convolution's input)."""
        problem = self._problem(ConvKind.FORWARD, 1, "float32", "", "nchw")
        return problem.x_shape[2:] if self.transposed else problem.y_shape[2:]

    def problem(self, kind: ConvKind | str, batch: int, dtype: str = "float32", math: str = "",
                layout: str = "nchw") -> ConvProblem:
        """The layer's kernel at mini-batch `batch`; a 1-D layer's as the 2-D one cuDNN runs
        (ConvProblem.lifted)."""
        return self._problem(kind, batch, dtype, math, layout).lifted()

    def _problem(self, kind: ConvKind | str, batch: int, dtype: str, math: str, layout: str) -> ConvProblem:
        """The kernel in the layer's own dimensions: of the convolution, or of the one a transposed
        layer transposes (its x the layer's output, its w the layer's weight)."""
        if self.transposed:
            out = transposed_size(self.input_size, self.kernel, self.pad, self.stride, self.dilation,
                                  self.output_padding)
            x_shape, w_shape = (batch, self.out_channels, *out), (self.in_channels, self.out_channels // self.groups)
        else:
            x_shape, w_shape = (batch, self.in_channels, *self.input_size), (self.out_channels,
                                                                              self.in_channels // self.groups)
        return ConvProblem(kind, x_shape=x_shape, w_shape=(*w_shape, *self.kernel), pads=self.pad,
                           strides=self.stride, dilations=self.dilation, groups=self.groups, dtype=dtype,
                           math=math, layout=layout)

    def to_json(self) -> dict:
        """The layer as a network file writes it: sizes of equal values as one integer, but for a
        layer that is not 2-D its input size as a list (which says its dimensions)."""
        d = asdict(self)
        for name in _SIZES:
            values = list(d[name])
            d[name] = values[0] if len(set(values)) == 1 and (len(values) == 2 or name != "input_size") else values
        if not self.transposed:  # files of convolutions stay as they were
            del d["transposed"], d["output_padding"]
        return d

    @classmethod
    def from_json(cls, d: dict) -> ConvLayer:
        known = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING}
        keys = f"a layer has the keys {sorted(required)} and optionally {sorted(known - required)}"
        if not isinstance(d, dict):
            raise ConfigError(f"layer {d!r} is not a JSON object; {keys}")
        missing, unknown = sorted(required - set(d)), sorted(set(d) - known)
        if missing or unknown:
            wrong = [f"lacks {', '.join(missing)}"] if missing else []
            wrong += [f"has an unknown key {', '.join(unknown)}"] if unknown else []
            raise ConfigError(f"layer {d.get('name', d)} {' and '.join(wrong)}; {keys}")
        return cls(**d)


def find_kernel(kernels, name: str) -> Kernel:
    """The kernel called `name` ("conv2/F")."""
    for kernel in kernels:
        if kernel.name == name:
            return kernel
    names = ", ".join(k.name for k in kernels[:6])
    raise ConfigError(f"kernel {name!r} is not in this network; use LAYER/F, LAYER/BD or LAYER/BF, "
                      f"e.g. {names}, ... (`ucudnn nets NAME` lists the layers)")


def merge_identical(layers) -> tuple[ConvLayer, ...]:
    """Layers of equal geometry as one, named after the first, counted, not duplicated."""
    merged: dict[tuple, ConvLayer] = {}
    for layer in layers:
        first = merged.get(layer.geometry)
        merged[layer.geometry] = replace(first, count=first.count + layer.count) if first else layer
    return tuple(merged.values())


@dataclass(frozen=True)
class Network:
    """A named network; its layers are merged by geometry on construction."""

    name: str
    layers: tuple[ConvLayer, ...]
    description: str = ""
    default_batch: int = DEFAULT_BATCH  # the mini-batch size commands use when given none

    def __post_init__(self):
        _positive(self.default_batch, f"network {self.name}: default_batch")
        object.__setattr__(self, "layers", merge_identical(self.layers))
        if not self.layers:
            raise ConfigError(f"network {self.name!r} has no convolution layers")
        # layers of one name and one shape are one layer, counted (merge_identical); of one name
        # and two shapes, their kernels would share one name, and so one plan
        check_unique_names((layer.name for layer in self.layers), "layer")

    @property
    def conv_layers(self) -> int:
        """Convolution layers in the network, identical ones included."""
        return sum(layer.count for layer in self.layers)

    def problems(self, batch: int, dtype: str = "float32", math: str = "", layout: str = "nchw",
                 kinds=tuple(ConvKind)) -> list[Kernel]:
        """Every kernel of every distinct layer at mini-batch `batch`."""
        return [Kernel(f"{layer.name}/{kind}", layer.problem(kind, batch, dtype, math, layout), layer.count)
                for layer in self.layers for kind in kinds]

    def to_json(self) -> dict:
        return {"name": self.name, "description": self.description, "default_batch": self.default_batch,
                "layers": [layer.to_json() for layer in self.layers]}

    @classmethod
    def from_json(cls, d: dict) -> Network:
        if not isinstance(d, dict) or not isinstance(d.get("layers"), list):
            raise ConfigError('a network file is a JSON object {"name": ..., "layers": [...]}; '
                              '`ucudnn nets --help` describes it, `ucudnn nets alexnet --json` writes one')
        return cls(str(d.get("name", "custom")), tuple(ConvLayer.from_json(x) for x in d["layers"]),
                   str(d.get("description", "")), d.get("default_batch", DEFAULT_BATCH))
