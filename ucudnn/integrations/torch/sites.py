"""Call sites of converted layers: what one layer call resolves to, remembered between iterations.

A training step calls each layer with the same tensors' metadata every iteration. Everything
resolve() decides from that metadata (fallback or not, the Call, the kernels it needs, its output
shape and memory format), the planned kernels and whether the layer is delegated to torch are
found once per signature and kept in a Site, so a steady-state call only builds a small tuple,
looks it up, and runs its kernels (or torch's layer). A layer left to torch's own convolution
goes further: it keeps its last signature and site (Steady), and while the Planner has nothing
for its calls to do (Site.steady) a call that builds the same signature runs torch's layer at
once, with no lookup and no routing.

A signature holds everything that decision reads and the layer itself: a layer's kernels run at
moments of the step of their own, which the Planner may plan for (ucudnn.plan.memory), so each layer
has sites of its own; layers of one shape share their kernels' plans through the Planner.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from torch.nn.modules.conv import _ConvNd

MAX_SITES = 4096  # per Context: beyond it (inputs of ever new shapes) the cache starts afresh


class _Unseen(Enum):
    UNSEEN = 0


_UNSEEN = _Unseen.UNSEEN  # Sites.get's miss: None is a site's value (a call torch must reject)


def signature(module: _ConvNd, input: Tensor) -> tuple:
    """What resolve() reads of `module`, `input` and torch's global state (autocast, TF32,
    determinism, grad mode), as a cheap key: raw state only, so that a steady-state call derives
    nothing (the dtype, math and kernels are derived from it once, on a miss)."""
    weight: Tensor | None = module._parameters.get("weight")  # nn.Module.__getattr__ costs more
    if weight is None:  # a parametrized weight (torch.nn.utils.parametrize) is a property
        weight = module.weight
    device = input.device
    return (id(module), input.shape, input.stride(), input.dtype, device, input.requires_grad, weight.shape, weight.stride(),
            weight.dtype, weight.device, weight.requires_grad, module.padding, module.stride, module.dilation,
            module.groups, module.padding_mode, module.in_channels, module.out_channels,
            torch.is_grad_enabled(), autocast_dtype(device.type), _cudnn_allow_tf32(), _deterministic(),
            _cudnn_deterministic())


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype in force for `device_type`, or None when autocast is off (asked of
    every device type at once first: one C call where no autocast is on)."""
    if not _any_autocast() or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


# torch's own getters behind torch.backends.cudnn.allow_tf32 / .deterministic and
# torch.are_deterministic_algorithms_enabled: C calls, no Python property in between
_cudnn_allow_tf32 = torch._C._get_cudnn_allow_tf32
_cudnn_deterministic = torch._C._get_cudnn_deterministic
_deterministic = torch._C._get_deterministic_algorithms
_any_autocast = torch._C._is_any_autocast_enabled


class Site:
    """A Call ucudnn runs, with what each of its calls needs: the kernels it runs (`kinds`), the
    dtype, the output's shape and memory format, its planned kernels by kind (filled by the
    Context on first run), whether the Context delegates it to torch (None: not decided yet),
    whether its calls may skip the Planner (`steady`: ucudnn.plan.planner.Planner.steady), the bytes
    free as each kernel started (`free`, by kind: the least seen) and the calls it made waiting
    for its plan (`observed`; the first ucudnn.plan.memory.RECORDED_CALLS are observed,
    ucudnn.plan.planner.Planner.observe)."""

    __slots__ = ("call", "kinds", "dtype", "out_shape", "memory_format", "kernels", "delegated", "steady", "free",
                 "observed")

    def __init__(self, call: Any, kinds: tuple = ()):
        self.call, self.kinds = call, kinds
        self.dtype = getattr(torch, call.dtype)
        self.out_shape = call.out_shape
        self.memory_format = call.memory_format
        self.kernels: dict = {}
        self.delegated: bool | None = None
        self.steady = False
        self.free: dict = {}
        self.observed = 0


class Sites:
    """signature -> Site, or the fallback reason (str), or None (a call torch must reject)."""

    def __init__(self, max_sites: int = MAX_SITES):
        self._sites: dict[Hashable, Site | str | None] = {}
        self.max_sites = max_sites
        self.resolved = 0  # signatures resolved (cache misses): what tests and benchmarks check

    def get(self, key: Hashable, resolve: Callable, *args) -> Site | str | None:
        """The site of `key`, from `resolve(*args)` (a Call and its kinds, a reason or None) on first sight."""
        site = self._sites.get(key, _UNSEEN)
        if site is not _UNSEEN:
            return site
        resolved = resolve(*args)
        site = resolved if resolved is None or isinstance(resolved, str) else Site(*resolved)
        if len(self._sites) >= self.max_sites:
            self.clear()
        self._sites[key] = site
        self.resolved += 1
        return site

    def clear(self) -> None:
        """Forget every site; a layer call still in flight (a backward after Context.reset())
        looks its kernels up again rather than running forgotten plans."""
        for site in self._sites.values():
            if isinstance(site, Site):
                site.kernels.clear()
                site.delegated = None
        self.reroute()
        self._sites.clear()

    def reroute(self) -> None:
        """Every site's calls go through the Planner again (none is steady) until it says otherwise."""
        for site in self._sites.values():
            if isinstance(site, Site):
                site.steady = False

    def __len__(self) -> int:
        return len(self._sites)


class Steady:
    """A layer's call that ran torch's own layer with nothing to decide (its Site `steady`), kept
    on the layer: while a later call holds() to it, the layer runs torch's layer at once and
    counts the call in `runs[counted]`, with no signature, lookup or routing.

    holds() compares the part of signature() that can change while the layer does not see it
    (the input's shape, strides, dtype and requires_grad, the weight's requires_grad, the layer's
    geometry, grad mode, autocast, TF32 and determinism) and checks that the layer still has its
    context and weight. The rest changes only with the weight: replaced (a new Parameter), or
    moved or cast by nn.Module._apply (to(), half(), cuda(), channels_last), after which the layer
    drops its Steady; the input must be on the weight's device, else torch's layer raises. A change
    made behind torch's back (`weight.data = ...`) is seen only at the next other change: the
    layer runs torch's own convolution meanwhile, which is right, if not re-examined."""

    __slots__ = ("site", "owner", "weight", "device_type", "key", "runs", "counted", "held")

    def __init__(self, module: _ConvNd, input: Tensor, site: Site, runs: Counter, counted: tuple):
        weight = module._parameters["weight"]
        assert weight is not None  # the layer's own parameter (Converted._forward keeps a Steady for no other)
        self.site, self.weight = site, weight
        self.owner: Any = module.ucudnn_context  # the layer's Context (context.py imports this module)
        self.device_type, self.runs, self.counted = site.call.device.type, runs, counted
        self.key = self._key(module, input)
        self.held = 0  # later calls it held for (the layer retires after RETIRE_AFTER: Context.retire)

    def holds(self, module: _ConvNd, input: Tensor) -> bool:
        """Whether calling `module` on `input` is this call again, with its site still steady."""
        return (self.site.steady and module.ucudnn_context is self.owner
                and module._parameters.get("weight") is self.weight and self.key == self._key(module, input))

    def _key(self, module: _ConvNd, input: Tensor) -> tuple:
        return (input.shape, input.stride(), input.dtype, input.requires_grad, self.weight.requires_grad, module.padding,
                module.stride, module.dilation, module.groups, module.padding_mode, torch.is_grad_enabled(),
                autocast_dtype(self.device_type), _cudnn_allow_tf32(), _deterministic(), _cudnn_deterministic())
