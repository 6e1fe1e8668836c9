"""Call sites of converted layers: what one layer call resolves to, remembered between iterations.

A training step calls each layer with the same tensors' metadata every iteration. Everything
resolve() decides from that metadata (fallback or not, the Call, the kernels it needs, its output
shape and memory format), the planned kernels and whether the layer is delegated to torch are
found once per signature and kept in a Site, so a steady-state call only builds a small tuple,
looks it up, and runs its kernels (or torch's layer).

A signature holds everything that decision reads and the layer itself: a layer's kernels run at
moments of the step of their own, which the Planner may plan for (ucudnn.memory), so each layer
has sites of its own; layers of one shape share their kernels' plans through the Planner.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

import torch
from torch import Tensor, nn

MAX_SITES = 4096  # per Context: beyond it (inputs of ever new shapes) the cache starts afresh
_UNSEEN = object()  # Sites.get's miss: None is a site's value (a call torch must reject)


def signature(module: nn.Conv2d, input: Tensor) -> tuple:
    """What resolve() reads of `module`, `input` and torch's global state (autocast, TF32,
    determinism, grad mode), as a cheap key: raw state only, so that a steady-state call derives
    nothing (the dtype, math and kernels are derived from it once, on a miss)."""
    weight = module._parameters.get("weight")  # nn.Module.__getattr__ costs 0.4 us a call
    if weight is None:  # a parametrized weight (torch.nn.utils.parametrize) is a property
        weight = module.weight
    device = input.device
    return (id(module), input.shape, input.stride(), input.dtype, device, input.requires_grad, weight.shape, weight.stride(),
            weight.dtype, weight.device, weight.requires_grad, module.padding, module.stride, module.dilation,
            module.groups, module.padding_mode, module.in_channels, module.out_channels,
            torch.is_grad_enabled(), autocast_dtype("cuda" if input.is_cuda else device.type), _cudnn_allow_tf32(),
            _deterministic(), _cudnn_deterministic())


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype in force for `device_type`, or None when autocast is off."""
    try:
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    except (AttributeError, TypeError):  # torch < 2.4 knows only CUDA's autocast state
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        return None


# torch's own getters behind torch.backends.cudnn.allow_tf32 / .deterministic and
# torch.are_deterministic_algorithms_enabled: C calls, no Python property in between
_cudnn_allow_tf32 = torch._C._get_cudnn_allow_tf32
_cudnn_deterministic = torch._C._get_cudnn_deterministic
_deterministic = torch._C._get_deterministic_algorithms


class Site:
    """A Call ucudnn runs, with what each of its calls needs: the kernels it runs (`kinds`), the
    dtype, the output's shape and memory format, its planned kernels by kind (filled by the
    Context on first run), whether the Context delegates it to torch (None: not decided yet), the
    bytes free as each kernel started (`free`, by kind: the least seen) and the calls it made
    waiting for its plan (`observed`; the first ucudnn.memory.RECORDED_CALLS are observed,
    ucudnn.planner.Planner.observe)."""

    __slots__ = ("call", "kinds", "dtype", "out_shape", "memory_format", "kernels", "delegated", "free", "observed")

    def __init__(self, call: Any, kinds: tuple = ()):
        self.call, self.kinds = call, kinds
        self.dtype = getattr(torch, call.dtype)
        self.out_shape = call.out_shape
        self.memory_format = call.memory_format
        self.kernels: dict = {}
        self.delegated: bool | None = None
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
        self._sites.clear()

    def __len__(self) -> int:
        return len(self._sites)
