"""Settings: keyword arguments first, then UCUDNN_* environment variables, then defaults."""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

from ..core.device import EXECUTIONS
from ..core.errors import ConfigError, unknown
from ..core.problem import INT64_MAX, ConvProblem
from ..execute.backends import CHOICES as BACKEND_CHOICES
from ..measure.cache.paths import CACHE_VARIABLE, refuse_misnamed
from ..optimizers import DIVIDING, OPTIMIZERS as REGISTRY, PER_KERNEL, Optimizer
from ..optimizers.search import SEARCHES, Search, named
from ..optimizers.solvers import FIRST_INSTALLED, SOLVERS
from .memory import AUTO

POLICIES = ("all", "powerOfTwo", "undivided")
OPTIMIZERS = tuple(REGISTRY)
# When ucudnn.torch plans a layer: on its first call, which waits for it; or between iterations,
# the layer running torch's own convolution until its plan is ready (integrations/torch/context.py)
PLANNINGS = ("first_call", "between_iterations")

# The variables of the workspace limits; either may be AUTO, which ucudnn.torch reads as limits from
# the memory timeline of a training step (ucudnn.plan.memory)
LIMIT_VARIABLES = ("UCUDNN_WORKSPACE_LIMIT", "UCUDNN_TOTAL_LIMIT")

_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kb": 10**3, "kib": 2**10,
    "m": 2**20, "mb": 10**6, "mib": 2**20,
    "g": 2**30, "gb": 10**9, "gib": 2**30,
    "t": 2**40, "tb": 10**12, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
SIZE_FORMS = 'a byte count ("67108864") or a number with a unit ("64MiB", "1.5GiB", "512KiB", "1GB")'


def parse_size(value: str | int, name: str = "size") -> int:
    """Bytes from an int or a string such as "64MiB", "1.5GiB", "1048576"."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a size; use {SIZE_FORMS}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}={value} is negative; use {SIZE_FORMS}")
        return _int64(value, value, name)
    if str(value).strip().startswith("-"):
        raise ConfigError(f"{name}={value!r} is negative; sizes are >= 0: use {SIZE_FORMS}")
    match = _SIZE.match(str(value))
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS:
        raise ConfigError(f"{name}={value!r} is not a size; use {SIZE_FORMS}")
    size = Fraction(Decimal(match.group(1))) * _UNITS[unit]  # exact: no float rounding above 2**53
    if size.denominator != 1:
        raise ConfigError(f"{name}={value!r} is not a whole number of bytes; use {SIZE_FORMS}")
    return _int64(int(size), value, name)


def _int64(size: int, value, name: str) -> int:
    if size > INT64_MAX:
        raise ConfigError(f"{name}={value!r} is more than int64 holds ({INT64_MAX} bytes); use a smaller size")
    return size


def timeline_limits(env: Mapping[str, str]) -> list[str]:
    """The limit variables of `env` set to AUTO. Planning without a memory timeline (ucudnn.torch's
    alone) reads them as unset, so that the defaults hold."""
    return [v for v in LIMIT_VARIABLES if env.get(v, "").strip().lower() == AUTO]


def format_size(nbytes: int) -> str:
    """A short human form: 67108864 -> '64.0 MiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def batch_sizes(policy: str, batch: int) -> tuple[int, ...]:
    """The micro-batch sizes S a policy benchmarks for a mini-batch of `batch`, ascending."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch={batch!r} must be a positive integer")
    if policy == "all":
        return tuple(range(1, batch + 1))
    if policy == "powerOfTwo":
        powers = {1 << i for i in range(batch.bit_length()) if 1 << i <= batch}
        return tuple(sorted(powers | {batch}))
    if policy == "undivided":
        return (batch,)
    raise unknown(policy, POLICIES, "policy")


def choice(value: str, choices: tuple[str, ...], name: str = "") -> str:
    """The one of `choices` that `value` names, in any case (as settings are read from variables
    and flags alike); else a ConfigError naming it and them."""
    lowered = {c.lower(): c for c in choices}
    if str(value).lower() not in lowered:
        raise unknown(value, choices, name)
    return lowered[str(value).lower()]


def _flag(value: str | bool, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={value!r} is not a flag; use 1/0, true/false, yes/no or on/off")


@dataclass(frozen=True)
class Settings:
    """What the handle and the optimizers are told to do. Build with `Settings.load(...)`."""

    policy: str = "powerOfTwo"
    workspace_limit: int = 64 * 2**20  # per kernel, WR
    total_limit: int | None = None  # whole network, WD; None: workspace_limit x kernels
    optimizer: str = PER_KERNEL.name
    execution: str = "graph"  # how a kernel's calls run, and so how it is benchmarked (ucudnn.execute.graphs)
    backend: str = ""  # candidates from: all, engines, legacy; "": all where the frontend imports (ucudnn.execute.backends)
    search: str = "pruned"  # how much of the candidate space a benchmark times (ucudnn.optimizers.search)
    solver: str = FIRST_INSTALLED  # WD's ILP solver; "": the first installed (ucudnn.optimizers.solvers)
    progress: bool = True  # a line on stderr while planning takes long (ucudnn.core.progress)
    planning: str = "between_iterations"  # ucudnn.torch: when a layer is planned (PLANNINGS)
    # ucudnn.torch: a converted layer's BF on a side stream beside its BD (each with a workspace of
    # its own; a delegated layer's torch kernels too), joined before the layer's backward returns;
    # off: it pays only where kernels leave the GPU room (GoogLeNet's training step on streams) and is
    # slower on ResNet-50 in a CUDA graph (docs/results.md, "Stop 45")
    concurrent_backward: bool = False
    # ucudnn.plan.planner, WR: a stride-1 layer's BD also planned as a forward convolution of dy, the faster
    # plan kept (ucudnn.core.transposition): faster N-d layers under pressure, and no planning time
    # visible on cold timm models (docs/results.md, "Stop 44: both limits in one run")
    bd_as_forward: bool = True
    verbose: bool = False  # each kernel's plan on stderr as it is made (ucudnn.plan.assignment)
    cache_path: str | None = None  # None: as ucudnn.measure.cache.paths.cache_path decides

    @property
    def optimizing(self) -> Optimizer:
        """The optimizer the `optimizer` setting names (ucudnn.optimizers)."""
        return REGISTRY[self.optimizer]

    @property
    def searching(self) -> Search:
        """The search the `search` setting names, for this optimizer: one dividing a total measures
        every size of the policy (its cap, the total, says nothing of one kernel's share)."""
        return named(self.search, walk=not self.optimizing.divides)

    def sizes(self, batch: int) -> tuple[int, ...]:
        """The micro-batch sizes the batch size policy considers for a mini-batch of `batch`."""
        return batch_sizes(self.policy, batch)

    def backends(self, *, gpu: bool = True) -> tuple[str, ...]:
        """The backends whose candidates are considered. Offline (gpu=False) the unset default
        is every backend, whatever is installed: measurements of any can be used."""
        from ..execute.backends import resolve

        return resolve(self.backend, frontend=None if gpu else True)

    def sizes_for(self, problem: ConvProblem) -> tuple[int, ...]:
        """sizes() of a kernel's batch (what benchmark.ensure_tables asks for)."""
        return self.sizes(problem.batch)

    def limit(self, kernels: int) -> int:
        """The optimizer's limit in bytes: per kernel (WR), or for `kernels` distinct kernels
        together (WD)."""
        return self.total(kernels) if self.optimizing.divides else self.workspace_limit

    def total(self, kernels: int) -> int:
        """WD's total for a network of `kernels` distinct kernels: total_limit, else the
        per-kernel limit times the kernels."""
        total = self.total_limit
        return self.workspace_limit * kernels if total is None else total

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Keyword arguments win over UCUDNN_* variables, which win over the defaults. An argument
        also wins over a variable that contradicts it (_contradicted): `workspace_limit` or a
        per-kernel `optimizer` given drops a total from UCUDNN_TOTAL_LIMIT, a `total_limit` given
        drops a per-kernel UCUDNN_OPTIMIZER."""
        env = os.environ if env is None else env
        names = {f.name for f in fields(cls)}
        unknown = set(overrides) - names
        if unknown:
            raise ConfigError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(names)}")
        # each value with the name an error should show: the variable the user set, or the argument
        refuse_misnamed(env)
        variables = {CACHE_VARIABLE if name == "cache_path" else f"UCUDNN_{name.upper()}": name for name in names}
        from_env = {name: (env[variable], variable) for variable, name in variables.items() if variable in env}
        given = {k: (v, k) for k, v in overrides.items() if v is not None}
        parsed = {k: _PARSERS[k](value, label) for k, (value, label) in (from_env | given).items()}
        for name in [name for name in from_env if name not in given and _contradicted(name, parsed, given)]:
            del from_env[name], parsed[name]
        return _with_total_meaning_wd(replace(cls(), **parsed), from_env | given)


def _contradicted(name: str, parsed: Mapping, given: Mapping) -> bool:
    """Whether the arguments `given` contradict setting `name`'s value from its variable: a total
    limit is WD's, so the per-kernel limit (WR's) or a per-kernel optimizer given contradicts one;
    a total given contradicts a per-kernel optimizer."""
    per_kernel = not REGISTRY[parsed.get("optimizer", PER_KERNEL.name)].divides
    if name == "total_limit":
        return "workspace_limit" in given or ("optimizer" in given and per_kernel)
    return name == "optimizer" and "total_limit" in given and per_kernel


def _with_total_meaning_wd(settings: Settings, labels: Mapping[str, tuple]) -> Settings:
    """A total workspace limit is WD's: given one, the optimizer is WD, and a per-kernel one named
    too is an error that names both where they were set (argument or variable)."""
    if settings.total_limit is None or settings.optimizing.divides:
        return settings
    if "optimizer" in labels:
        (total, total_label), (optimizer, optimizer_label) = labels["total_limit"], labels["optimizer"]
        raise ConfigError(f"{total_label}={total!r} is the WD optimizer's limit, but {optimizer_label}="
                          f"{optimizer!r} plans each kernel alone; drop one of them, or use "
                          f"{optimizer_label}={DIVIDING.name!r}")
    return replace(settings, optimizer=DIVIDING.name)


_PARSERS: dict[str, Callable[[Any, str], Any]] = {  # (value, the name an error shows) -> the setting
    "policy": lambda v, n: choice(v, POLICIES, n),
    "workspace_limit": parse_size,
    "total_limit": parse_size,
    "optimizer": lambda v, n: choice(v, OPTIMIZERS, n),
    "execution": lambda v, n: choice(v, EXECUTIONS, n),
    "backend": lambda v, n: choice(v, BACKEND_CHOICES, n),
    "search": lambda v, n: choice(v, tuple(SEARCHES), n),
    "solver": lambda v, n: choice(v, tuple(SOLVERS), n),
    "progress": _flag,
    "planning": lambda v, n: choice(v, PLANNINGS, n),
    "concurrent_backward": _flag,
    "bd_as_forward": _flag,
    "verbose": _flag,
    "cache_path": lambda v, n: str(v),
}
